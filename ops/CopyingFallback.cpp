// The copying CPU fallback: the generic path for a driver without a kernel
// view (ph_kernel_address is OPTIONAL in phantom/hal.h; a discrete device's
// memory is on the other side of a bus and its driver leaves it NULL).
//
// Design. With a kernel view, the generic path runs the CPU kernel as work
// on the current stream over CPU aliases of device memory (Fallback.cpp,
// KernelAliases.h). Without one no host code can address device memory, so
// the op runs on the calling thread over host copies instead:
//   1. every device storage an argument uses is copied whole into a host
//      buffer, through the HAL's copies on the current stream: a copy into
//      pageable memory returns once the bytes have arrived, after the
//      stream's earlier work, so the copies are in stream order;
//   2. each phantom argument becomes a CPU tensor with its sizes, strides
//      and offset over its storage's copy (two views of one storage stay
//      two views of one host buffer; a tensor passed twice is one CPU
//      tensor twice, as KernelAliases does, so the CPU kernel sees the
//      aliasing and identities the user created);
//   3. the op's CPU kernel runs there, with the device generator's CPU
//      generator for `Generator?` arguments (after the draws queued
//      before);
//   4. the storages of the arguments the schema marks as written (in-place
//      and out= ops, `Tensor(a!)`), and of any other argument whose bytes
//      the kernel changed (compared with a host snapshot: a few schemas
//      do not declare their writes), are copied back into device memory on
//      the current stream, grown first if the kernel resized an out=
//      argument; a result living in an argument's storage is that argument
//      or a phantom view of it; a result the kernel allocated is copied
//      into new device memory.
// Host buffers are plain CPU storages: an exception at any step (an
// out-of-memory device allocation, a driver error, the kernel's own)
// frees them and leaves no device memory behind but what the caching
// allocator owns. The call waits (a host wait, told to
// torch.phantom.set_sync_debug_mode), is counted in the ops report, and by
// PHANTOM_CPU_FALLBACK warns once per op (the default), stays silent, or
// refuses the op.
//
// Native kernels queue the CPU kernel over the kernel view, so without one
// they step aside: the first phantom allocation (Factories.cpp) re-registers
// every aten op with a phantom kernel of its own, except the ones that
// never touch device memory from the host (factories, views, copies,
// item()), to the generic path, which then takes this fallback.
#include <phantom/Exception.h>
#include <phantom/Generator.h>
#include <phantom/Settings.h>
#include <phantom/Stream.h>
#include <phantom/SyncDebug.h>
#include <phantom/hal.h>
#include <phantom/BoundsCheck.h>
#include <phantom/ops/GenericPath.h>
#include <phantom/KernelAliases.h>  // phantomViewLike
#include <phantom/ops/OpsReport.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace phantom {
namespace {

// PHANTOM_CPU_FALLBACK's words, in the catalogue's order.
enum class Policy { kWarn = 0, kSilent = 1, kError = 2 };

Policy policy() {
  // Throws (on every call) if the value is malformed: phantom/Settings.h.
  static const Policy value =
      static_cast<Policy>(choiceSetting("PHANTOM_CPU_FALLBACK"));
  return value;
}

void applyPolicy(const std::string& op) {
  const Policy chosen = policy();
  TORCH_CHECK_NOT_IMPLEMENTED(
      chosen != Policy::kError, op,
      ": the driver has no kernel view (ph_kernel_address), so this op "
      "would run on host copies of its tensors, copied to the CPU and "
      "back, and PHANTOM_CPU_FALLBACK=error refuses that. Unset "
      "PHANTOM_CPU_FALLBACK (or set it to warn or silent) to run it through "
      "the copying CPU fallback");
  if (chosen != Policy::kWarn) {
    return;
  }
  static std::mutex warned_mutex;
  static auto* warned = new std::unordered_set<std::string>();
  {
    std::lock_guard<std::mutex> lock(warned_mutex);
    if (!warned->insert(op).second) {
      return;
    }
  }
  TORCH_WARN(op, ": driver has no kernel view; copying to the CPU (each "
             "call copies its tensors to host memory and its results back, "
             "in stream order; slower than a kernel of the device's own). "
             "Warned once per op; PHANTOM_CPU_FALLBACK=silent hides this, "
             "PHANTOM_CPU_FALLBACK=error refuses such ops.");
}

// Host copies of the device storages an op's arguments use (steps 1, 2
// and 4 of the file comment).
class HostCopies {
 public:
  explicit HostCopies(const PhantomStream& stream) : stream_(stream) {}

  // A CPU tensor with `tensor`'s geometry over the host copy of its
  // storage. `tensor` is a phantom tensor or undefined.
  at::Tensor copyOf(const at::Tensor& tensor) {
    if (!tensor.defined()) {
      return tensor;
    }
    const auto known = by_impl_.find(tensor.unsafeGetTensorImpl());
    if (known != by_impl_.end()) {
      return tensors_[known->second].cpu;
    }
    checkInsideStorage(tensor);
    Entry& entry = entryFor(tensor.storage());
    auto cpu = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(entry.host), c10::DispatchKeySet(c10::DispatchKey::CPU),
        tensor.dtype());
    c10::TensorImpl* impl = cpu.unsafeGetTensorImpl();
    impl->set_sizes_and_strides(tensor.sizes(), tensor.strides(),
                                tensor.storage_offset());
    impl->_set_conj(tensor.is_conj());
    impl->_set_neg(tensor.is_neg());
    by_impl_.emplace(tensor.unsafeGetTensorImpl(), tensors_.size());
    tensors_.push_back(Copied{tensor, cpu, &entry});
    return cpu;
  }

  // The kernel may write `tensor` (copied before): its storage goes back.
  void markWritten(const at::Tensor& tensor) {
    const auto known = by_impl_.find(tensor.unsafeGetTensorImpl());
    if (known != by_impl_.end()) {
      tensors_[known->second].written = true;
      tensors_[known->second].entry->written = true;
    }
  }

  // Before the kernel: a snapshot of every copy no argument marked as
  // written, so that a kernel writing an argument its schema does not
  // declare (native_batch_norm updates running_mean and running_var, typed
  // `Tensor?`) is caught and its storage copied back all the same.
  void snapshotUnwritten() {
    for (auto& [key, entry] : by_key_) {
      const size_t nbytes = entry.host.nbytes();
      if (entry.written || nbytes == 0) {
        continue;
      }
      entry.pristine.assign(static_cast<const uint8_t*>(entry.host.data()),
                            static_cast<const uint8_t*>(entry.host.data()) + nbytes);
    }
  }

  // The phantom storage whose host copy `cpu` lives in, or nullptr.
  const c10::Storage* phantomStorageOf(const at::Tensor& cpu) const {
    if (!cpu.defined() || !cpu.has_storage()) {
      return nullptr;
    }
    const auto it = by_host_.find(cpu.storage().unsafeGetStorageImpl());
    return it == by_host_.end() ? nullptr : &it->second->phantom;
  }

  // After the kernel: written storages back to the device, and the
  // geometry a kernel gave out= arguments (resizes, conj and neg bits).
  void writeBack() {
    for (Copied& copied : tensors_) {
      if (!copied.written) {
        continue;
      }
      const at::Tensor& cpu = copied.cpu;
      if (cpu.storage().unsafeGetStorageImpl() !=
          copied.entry->host.unsafeGetStorageImpl()) {
        adoptStorage(copied.phantom, cpu);
      }
      c10::TensorImpl* impl = copied.phantom.unsafeGetTensorImpl();
      if (copied.phantom.sizes() != cpu.sizes() ||
          copied.phantom.strides() != cpu.strides() ||
          copied.phantom.storage_offset() != cpu.storage_offset()) {
        impl->set_sizes_and_strides(cpu.sizes(), cpu.strides(),
                                    cpu.storage_offset());
      }
      if (copied.phantom.is_conj() != cpu.is_conj()) {
        impl->_set_conj(cpu.is_conj());
      }
      if (copied.phantom.is_neg() != cpu.is_neg()) {
        impl->_set_neg(cpu.is_neg());
      }
    }
    for (auto& [key, entry] : by_key_) {
      if (!entry.written) {
        const bool changed =
            !entry.pristine.empty() &&
            (entry.host.nbytes() != entry.pristine.size() ||
             std::memcmp(entry.host.data(), entry.pristine.data(),
                         entry.pristine.size()) != 0);
        if (!changed) {
          continue;
        }
      }
      c10::StorageImpl* phantom = entry.phantom.unsafeGetStorageImpl();
      const c10::Storage& host = entry.host;
      if (host.nbytes() != phantom->nbytes()) {
        // The kernel grew an out= argument: new device memory of the size.
        TORCH_CHECK(phantom->resizable(),
                    "an operation tried to resize a phantom tensor whose "
                    "storage is not resizable");
        phantom->set_data_ptr_noswap(
            phantom->allocator()->allocate(host.nbytes()));
        phantom->set_nbytes(host.nbytes());
      }
      toDevice(phantom->mutable_data(), host.data(), host.nbytes());
    }
  }

  // A result the kernel allocated (not in any argument's storage): a new
  // device tensor with its strides when they are dense, and its value,
  // copied over by Copy.cpp (one transfer). A result phantom cannot hold
  // (a quantized tensor) raises here as with the kernel view.
  static at::Tensor newDeviceTensor(const at::Tensor& cpu, c10::Device device) {
    at::Tensor out = cpu.is_non_overlapping_and_dense()
                         ? at::empty_strided(cpu.sizes(), cpu.strides(),
                                             cpu.options().device(device))
                         : at::empty(cpu.sizes(), cpu.options().device(device));
    out.copy_(cpu);
    return out;
  }

 private:
  struct Entry {
    c10::Storage phantom;
    c10::Storage host;
    bool written = false;
    std::vector<uint8_t> pristine;  // snapshotUnwritten()
  };
  struct Copied {
    at::Tensor phantom;
    at::Tensor cpu;
    Entry* entry;
    bool written = false;
  };

  Entry& entryFor(const c10::Storage& storage) {
    // Keyed by the StorageImpl: two tensors of one storage share a copy.
    const c10::StorageImpl* key = storage.unsafeGetStorageImpl();
    auto it = by_key_.find(key);
    if (it != by_key_.end()) {
      return it->second;
    }
    const size_t nbytes = storage.nbytes();
    c10::Allocator* cpu_allocator = c10::GetCPUAllocator();
    c10::Storage host(c10::Storage::use_byte_size_t(), nbytes,
                      cpu_allocator->allocate(nbytes), cpu_allocator,
                      /*resizable=*/true);
    if (nbytes > 0 && storage.data() != nullptr) {
      toHost(host.mutable_data(), storage.data(), nbytes);
    }
    Entry& entry =
        by_key_.emplace(key, Entry{storage, std::move(host), false, {}})
            .first->second;
    by_host_.emplace(entry.host.unsafeGetStorageImpl(), &entry);
    return entry;
  }

  // Copies into pageable memory return once done, after the stream's
  // earlier work; sticky errors and the driver's message: Stream.h.
  void toHost(void* host, const void* device, size_t nbytes) {
    const ph_stream_t handle = stream_.handle();
    stream_.check(ph_memcpy_async(host, device, nbytes,
                                  PH_MEMCPY_DEVICE_TO_HOST, handle),
                  handle);
  }
  void toDevice(void* device, const void* host, size_t nbytes) {
    if (nbytes == 0) {
      return;
    }
    const ph_stream_t handle = stream_.handle();
    stream_.check(ph_memcpy_async(device, host, nbytes,
                                  PH_MEMCPY_HOST_TO_DEVICE, handle),
                  handle);
  }

  // A written argument the kernel pointed at other memory (resize_ of an
  // out= argument into a fresh buffer, or set_ to another argument).
  void adoptStorage(const at::Tensor& phantom, const at::Tensor& cpu) {
    c10::TensorImpl* impl = phantom.unsafeGetTensorImpl();
    if (const c10::Storage* known = phantomStorageOf(cpu)) {
      impl->set_storage_keep_dtype(*known);
      return;
    }
    const c10::Storage& host = cpu.storage();
    c10::Allocator* allocator = phantom.storage().allocator();
    c10::Storage fresh(c10::Storage::use_byte_size_t(), host.nbytes(),
                       allocator->allocate(host.nbytes()), allocator,
                       /*resizable=*/true);
    toDevice(fresh.mutable_data(), host.data(), host.nbytes());
    impl->set_storage_keep_dtype(std::move(fresh));
  }

  const PhantomStream& stream_;
  std::vector<Copied> tensors_;
  std::unordered_map<const c10::TensorImpl*, size_t> by_impl_;
  std::unordered_map<const c10::StorageImpl*, Entry> by_key_;
  std::unordered_map<const c10::StorageImpl*, Entry*> by_host_;
};

bool writes(const c10::Argument& argument) {
  const c10::AliasInfo* info = argument.alias_info();
  if (info == nullptr) {
    return false;
  }
  if (info->isWrite()) {
    return true;
  }
  for (const c10::AliasInfo& contained : info->containedTypes()) {
    if (contained.isWrite()) {
      return true;
    }
  }
  return false;
}

template <typename Visit>
void forEachPhantom(const c10::IValue& arg, Visit&& visit) {
  if (arg.isTensor()) {
    if (isPhantom(arg.toTensor())) visit(arg.toTensor());
  } else if (arg.isTensorList()) {
    for (const at::Tensor& t : arg.toTensorList()) {
      if (isPhantom(t)) visit(t);
    }
  } else if (arg.isOptionalTensorList()) {
    for (const std::optional<at::Tensor>& t : arg.toOptionalTensorList()) {
      if (t.has_value() && isPhantom(*t)) visit(*t);
    }
  }
}

// A result of the CPU kernel as a phantom value (step 4).
class ResultsToDevice {
 public:
  ResultsToDevice(HostCopies& copies, c10::ArrayRef<c10::IValue> args,
                  c10::Device device)
      : copies_(copies), device_(device) {
    for (const c10::IValue& arg : args) {
      forEachPhantom(arg, [&](const at::Tensor& t) { inputs_.push_back(t); });
    }
  }

  c10::IValue map(const c10::IValue& result) {
    if (result.isTensor()) {
      return mapTensor(result.toTensor());
    }
    if (result.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : result.toTensorList()) {
        list.push_back(mapTensor(t));
      }
      return list;
    }
    return result;
  }

 private:
  at::Tensor mapTensor(const at::Tensor& cpu) {
    if (!cpu.defined() || !cpu.device().is_cpu()) {
      return cpu;
    }
    if (const c10::Storage* storage = copies_.phantomStorageOf(cpu)) {
      for (const at::Tensor& input : inputs_) {
        if (input.storage().is_alias_of(*storage) &&
            input.sizes() == cpu.sizes() && input.strides() == cpu.strides() &&
            input.storage_offset() == cpu.storage_offset() &&
            input.dtype() == cpu.dtype()) {
          return input;  // in-place or out=: the argument itself
        }
      }
      return phantomViewLike(*storage, cpu);  // a view of an argument
    }
    return HostCopies::newDeviceTensor(cpu, device_);
  }

  HostCopies& copies_;
  c10::Device device_;
  std::vector<at::Tensor> inputs_;
};

// Ops with no CPU kernel whose phantom kernel runs a CPU op in their place
// (Convolution.cpp): the copying mode calls that op on the host copies.
// convolution_backward takes bias_sizes, which the overrideable form lacks
// (only the bias gradient's shape follows from it: grad_output's channels).
bool callHostEquivalent(const c10::OperatorName& name, torch::jit::Stack* stack) {
  const char* equivalent = nullptr;
  if (name.name == "aten::convolution_overrideable") {
    equivalent = "aten::convolution";
  } else if (name.name == "aten::convolution_backward_overrideable") {
    equivalent = "aten::convolution_backward";
    stack->insert(stack->begin() + 3, c10::IValue());  // bias_sizes: None
  } else {
    return false;
  }
  const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(equivalent, "");
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  return true;
}

}  // namespace

bool hasHostEquivalent(const c10::OperatorName& name) {
  return name.name == "aten::convolution_overrideable" ||
         name.name == "aten::convolution_backward_overrideable";
}

bool kernelViewAvailable() {
  // Outside device work a driver with a kernel view refuses a null
  // address (PH_ERROR_INVALID_ARGUMENT); one without answers
  // PH_ERROR_UNIMPLEMENTED, also when its table member is NULL
  // (HalDispatch.cpp).
  static const bool available = [] {
    void* address = nullptr;
    return ph_kernel_address(nullptr, &address) != PH_ERROR_UNIMPLEMENTED;
  }();
  return available;
}

void runCopyingFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                        c10::Device device, bool composite_cpu_kernel) {
  const auto& schema = op.schema();
  applyPolicy(schema.name());
  // torch.phantom.set_sync_debug_mode: warn, or refuse before anything
  // is counted, copied or run.
  noteHostWait(schema.name().c_str(),
               "the driver has no kernel view: the op runs on host copies");
  recordOpPath(schema.name(), OpPath::kCopyingFallback);
  const size_t num_args = schema.arguments().size();
  const c10::ArrayRef<c10::IValue> args = torch::jit::last(stack, num_args);
  for (size_t i = 0; i < num_args; ++i) {
    if (isGeneratorArgument(schema.arguments()[i])) {
      // Draws queued before this one (perhaps on another stream) come first.
      std::optional<at::Generator> given;
      if (args[i].isGenerator()) {
        given = args[i].toGenerator();
      }
      phantomGeneratorFor(given, device.index())->waitForQueuedDraws();
    }
  }
  const PhantomStream stream = getCurrentPhantomStream(device.index());
  HostCopies copies(stream);
  torch::jit::Stack kernel_stack;
  kernel_stack.reserve(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    kernel_stack.push_back(cpuKernelArgument(
        args[i], schema.arguments()[i], device.index(),
        [&](const at::Tensor& t) { return copies.copyOf(t); }));
  }
  for (size_t i = 0; i < num_args; ++i) {
    if (writes(schema.arguments()[i])) {
      forEachPhantom(args[i], [&](const at::Tensor& t) { copies.markWritten(t); });
    }
  }
  copies.snapshotUnwritten();
  if (callHostEquivalent(op.operator_name(), &kernel_stack)) {
    // done: an op without a CPU kernel of its own
  } else if (composite_cpu_kernel) {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &kernel_stack);
  } else {
    op.callBoxedForDispatchKey(c10::DispatchKey::CPU, kernel_stack);
  }
  copies.writeBack();
  ResultsToDevice mapper(copies, args, device);
  std::vector<c10::IValue> results;
  results.reserve(kernel_stack.size());
  for (const c10::IValue& result : kernel_stack) {
    results.push_back(mapper.map(result));
  }
  torch::jit::drop(stack, num_args);
  for (c10::IValue& result : results) {
    stack->push_back(std::move(result));
  }
}

namespace {

// The phantom kernels that never address device memory from the host:
// they keep their registration without a kernel view.
bool worksWithoutKernelView(const c10::OperatorName& name) {
  static const std::unordered_set<std::string> kept = {
      "aten::empty.memory_format", "aten::empty_strided",
      "aten::as_strided", "aten::view", "aten::_reshape_alias", "aten::unfold",
      "aten::view_as_real", "aten::view_as_complex", "aten::resize_",
      "aten::set_.source_Storage_storage_offset", "aten::set_.source_Storage",
      "aten::set_.source_Tensor", "aten::set_", "aten::_local_scalar_dense",
      "aten::_copy_from", "aten::_has_compatible_shallow_copy_type",
      "aten::record_stream",
      // Scalars.cpp: the driver's memset, or this fallback.
      "aten::fill_.Scalar", "aten::fill_.Tensor", "aten::zero_",
      // Dropout.cpp: ATen ops, the mask drawn from the device's generator
      // (the CPU kernel would draw from the CPU's); its direct loop is
      // taken only with a kernel view.
      "aten::native_dropout", "aten::native_dropout_backward",
      // NestedTensors.cpp: ATen ops on the nested tensor's buffer.
      "aten::_nested_from_padded", "aten::_nested_view_from_buffer",
      "aten::_nested_tensor_from_mask",
      "aten::_nested_tensor_from_mask_left_aligned"};
  const std::string full =
      name.overload_name.empty() ? name.name
                                 : name.name + "." + name.overload_name;
  return kept.count(full) != 0;
}

class DiscardWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

}  // namespace

void stepAsideWithoutKernelView() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (kernelViewAvailable()) {
      return;
    }
    // Leaked on purpose: the registrations live as long as the process.
    auto* library = new torch::Library(torch::Library::IMPL, "aten",
                                       c10::DispatchKey::PrivateUse1,
                                       __FILE__, __LINE__);
    // The dispatcher warns that each registration overrides another: that
    // is the point here.
    DiscardWarnings discard;
    const c10::WarningUtils::WarningHandlerGuard guard(&discard);
    c10::Dispatcher& dispatcher = c10::Dispatcher::singleton();
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0 || worksWithoutKernelView(name)) {
        continue;
      }
      const std::optional<c10::OperatorHandle> handle = dispatcher.findOp(name);
      // An op without a CPU kernel keeps its phantom kernel (the generic
      // path could not run it) unless the copying mode knows a CPU op
      // that computes it.
      if (!handle.has_value() ||
          !handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
          !(handle->hasComputedKernelForDispatchKey(c10::DispatchKey::CPU) ||
            hasHostEquivalent(name))) {
        continue;
      }
      const std::string unqualified = name.name.substr(6);
      const std::string registered =
          name.overload_name.empty() ? unqualified
                                     : unqualified + "." + name.overload_name;
      library->impl(registered.c_str(),
                    torch::CppFunction::makeFromBoxedFunction<&genericFallback>());
    }
  });
}

}  // namespace phantom
