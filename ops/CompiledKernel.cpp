// See phantom/ops/CompiledKernel.h.
#include <phantom/Exception.h>
#include <phantom/Launch.h>
#include <phantom/ops/CompiledKernel.h>

#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

namespace phantom {
namespace {

// Arguments of one launch, carried to the worker. Inductor's fused
// kernels rarely take more than a dozen arguments; more spill to the heap.
using ArgWords = c10::SmallVector<uint64_t, 16>;
using HostValues = c10::SmallVector<HostValue, 1>;

}  // namespace

const CompiledKernel* internCompiledKernel(CompiledKernelEntry entry,
                                           const std::string& name,
                                           std::vector<uint16_t> pointer_args,
                                           size_t num_args) {
  TORCH_CHECK(entry != nullptr, "compiled kernel '", name,
              "' has no entry point");
  for (const uint16_t position : pointer_args) {
    TORCH_CHECK(position < num_args, "compiled kernel '", name,
                "': pointer argument ", position, " is past its ", num_args,
                " arguments");
  }
  using Key = std::tuple<CompiledKernelEntry, std::string,
                         std::vector<uint16_t>, size_t>;
  static std::mutex mutex;
  // Leaked on purpose: queued work refers to the kernels (header).
  static auto* kernels = new std::map<Key, std::unique_ptr<CompiledKernel>>;
  const std::lock_guard<std::mutex> lock(mutex);
  Key key{entry, name, pointer_args, num_args};
  auto found = kernels->find(key);
  if (found == kernels->end()) {
    auto kernel = std::make_unique<CompiledKernel>(
        CompiledKernel{entry, name, std::move(pointer_args), num_args});
    found = kernels->emplace(std::move(key), std::move(kernel)).first;
  }
  return found->second.get();
}

void launchCompiledKernel(const CompiledKernel& kernel,
                          c10::ArrayRef<uint64_t> args,
                          const PhantomStream& stream,
                          c10::ArrayRef<HostValue> host_values) {
  TORCH_CHECK(args.size() == kernel.num_args, "compiled kernel '",
              kernel.name, "' takes ", kernel.num_args, " arguments, got ",
              args.size());
  for (const HostValue& value : host_values) {
    TORCH_CHECK(value.position < args.size() && args[value.position] == 0,
                "compiled kernel '", kernel.name, "': host value for argument ",
                value.position, " must replace a null pointer argument");
  }
  launchAsync(stream, kernel.name.c_str(),
              [kernel = &kernel, words = ArgWords(args.begin(), args.end()),
               values = HostValues(host_values.begin(),
                                   host_values.end())]() mutable {
                // On the worker: device addresses become kernel-view
                // addresses, valid only inside device work.
                for (const uint16_t position : kernel->pointer_args) {
                  if (words[position] == 0) {
                    continue;  // an empty tensor or a host value
                  }
                  void* view = nullptr;
                  PHANTOM_CHECK(ph_kernel_address(
                      reinterpret_cast<const void*>(words[position]), &view));
                  words[position] = reinterpret_cast<uintptr_t>(view);
                }
                for (HostValue& value : values) {
                  words[value.position] =
                      reinterpret_cast<uintptr_t>(value.bytes);
                }
                kernel->entry(words.data());
              });
}

}  // namespace phantom
