// The generic path's asynchronous half, part 3: the trial run
// (RememberedOutputs.h says when it runs and why).
//
// The op's CPU kernel run once on the host, over zeroed host memory laid
// out like the arguments' device memory: the CPU's own answer for a call
// signature (outputs, and how it changes its arguments), found at the call
// and without waiting for the stream. Each phantom storage becomes one
// zeroed buffer covering the bytes the call's tensors span in it (calloc:
// pages nobody touches cost nothing), so views keep their overlaps; a
// tensor passed twice is one CPU tensor twice. Random ops draw from a
// fresh generator, not the device's or the CPU's. An error the kernel
// raises here is a property of the arguments (a dimension out of range, a
// dtype it refuses), or of zeros (pivots of 0, probabilities that sum to
// 0): a second trial then runs with ones in floating-point tensors, and if
// that raises too the call takes the synchronous path, where the real data
// decides. A trial may also run on other values (twos; 2+2i in complex
// tensors) to check that an op's outputs are the same whatever the
// floating-point data (HostChecks.h, ShapeEvidence::kTwoTrials).
//
// Integer and boolean tensors hold zeros in every trial. The trial cannot
// see the caller's values (they are on the device), and many CPU kernels
// trust their index-like arguments: segment_reduce's backward walks its
// `lengths` without checking that they sum to the data's length, so any
// other value can send it past the end of the trial's buffers and corrupt
// the heap. Zeros are the one value that is in range for every index into
// a non-empty dimension, sums to nothing and is ordered, and they are the
// value the first trial passed anyway. A floating-point tensor that shares
// its memory with an integer one keeps its zeros too (its bytes are the
// integers'); such a trial is not `varied()`. Elementwise ops (each
// output element computed from the inputs' elements at the same place;
// HostChecks.h) use no value as an index or a length, so their trial on
// ones fills integer tensors too, and a trial on other values after it
// keeps them at one: an integer division by zero then runs on ones, and
// `a // b` is queued.
#pragma once

#include <phantom/ops/GenericPath.h>
#include <phantom/ops/MetaMirror.h>
#include <phantom/ops/RememberedOutputs.h>
#include <phantom/KernelThreads.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/CPUAllocator.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace phantom {
namespace async_path {

class TrialRun {
 public:
  // `fill`: the value every floating-point and complex phantom tensor
  // holds (0, or 1 after a trial on zeros raised, or another value to
  // compare answers). `integer_fill`: the value of integer and boolean
  // ones, 0 but for an elementwise op's trial after zeros raised (1).
  TrialRun(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args,
           int fill = 0, int integer_fill = 0)
      : fill_(fill), integer_fill_(integer_fill) {
    for (const c10::IValue& arg : args) {
      std::vector<at::Tensor> tensors;
      flatten(arg, tensors);
      if (arg.isOptionalTensorList()) {
        for (const std::optional<at::Tensor>& t : arg.toOptionalTensorList()) {
          if (t.has_value()) tensors.push_back(*t);
        }
      }
      for (const at::Tensor& t : tensors) span(t);
    }
    int64_t total = 0;
    for (const auto& [key, buffer] : buffers_) {
      if (buffer.hi > buffer.lo) total += buffer.hi - buffer.lo;
    }
    if (total > kMaxBytes) {
      feasible_ = false;
      return;
    }
    for (auto& [key, buffer] : buffers_) allocate(buffer);
    stack_.reserve(args.size());
    for (size_t i = 0; i < args.size(); ++i) {
      // A random op draws from a fresh generator, given or not (None would
      // draw from the CPU's default one).
      stack_.push_back(isGeneratorArgument(schema.arguments()[i])
                           ? c10::IValue(at::detail::createCPUGenerator())
                           : trialOf(args[i]));
    }
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i].isTensor() && isPhantom(args[i].toTensor()) &&
          args[i].toTensor().layout() == c10::kStrided) {
        const at::Tensor& trial = stack_[i].toTensor();
        before_.push_back(ArgumentGeometry::of(i, trial));
        arguments_.emplace_back(i, trial);
        if (!schema.arguments()[i].is_out()) read_.insert(trial.unsafeGetTensorImpl());
      }
    }
  }

  // Largest argument memory a trial copies (the buffers' total); a call
  // over more waits instead: the trial would cost as much as the kernel,
  // and a kernel that writes its arguments would fault in that much host
  // memory.
  static constexpr int64_t kMaxBytes = int64_t{64} << 20;

  // False when the arguments span more than kMaxBytes: no trial runs.
  bool feasible() const { return feasible_; }

  // False when a floating-point or complex tensor could not be given
  // `fill` (its memory is an integer tensor's too, or it is a host tensor,
  // passed as it is): a trial on other values then shows nothing about it.
  bool varied() const { return varied_; }

  // Runs the CPU kernel; false (with its message) if it raised.
  bool run(const c10::OperatorHandle& op, std::string* error) {
    if (!supported_) {
      *error = "an argument is not a strided tensor";
      return false;
    }
    try {
      // On one OpenMP thread: a trial's outputs are read for their
      // geometry, never their values, and a parallel region here would
      // give the dispatching thread (autograd's device thread in
      // backward) an OpenMP team of its own (KernelThreads.h).
      const OneThreadScope one_thread(true);
      if (op.hasKernelForDispatchKey(c10::DispatchKey::CPU)) {
        op.callBoxedForDispatchKey(c10::DispatchKey::CPU, stack_);
      } else {
        op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack_);
      }
    } catch (const c10::Error& e) {
      *error = e.what_without_backtrace();
      return false;
    } catch (const std::exception& e) {
      *error = e.what();
      return false;
    }
    return true;
  }

  // After run(): true when the kernel resized an argument it was passed
  // other than as out=, and so may have read it first. Queued work resizes
  // before the kernel runs, which repeats the CPU only if it did not:
  // `addbmm_` on a self of one element broadcasts self into the product,
  // then resizes it to the product's shape.
  bool resizedAnArgumentItReads() const {
    for (size_t k = 0; k < arguments_.size(); ++k) {
      const ArgumentGeometry& was = before_[k];
      const ArgumentGeometry now = ArgumentGeometry::of(was.index, arguments_[k].second);
      if ((now.sizes != was.sizes || now.strides != was.strides) &&
          read_.count(arguments_[k].second.unsafeGetTensorImpl())) {
        return true;
      }
    }
    return false;
  }

  // After run(): the CPU's answer, as queued work can carry it out; false
  // when it cannot (a result that is a view of an argument, an argument
  // whose storage or conj/neg bit the kernel changed).
  bool answer(Remembered* out) const {
    for (size_t k = 0; k < arguments_.size(); ++k) {
      const ArgumentGeometry& was = before_[k];
      const ArgumentGeometry now = ArgumentGeometry::of(was.index, arguments_[k].second);
      if (now.storage != was.storage || now.conj != was.conj || now.neg != was.neg) {
        return false;
      }
      if (now.sizes != was.sizes || now.strides != was.strides || now.offset != was.offset) {
        // Resized (out=), once per tensor; in device terms, undoing the
        // buffer's shift.
        const c10::TensorImpl* impl = arguments_[k].second.unsafeGetTensorImpl();
        if (std::none_of(arguments_.begin(), arguments_.begin() + k, [&](const auto& a) {
              return a.second.unsafeGetTensorImpl() == impl;
            })) {
          ArgumentGeometry resize = now;
          resize.offset += shifts_.at(impl);
          out->resizes.push_back(std::move(resize));
        }
      }
    }
    return rememberResults(stack_, out, [&](const at::Tensor& t, RememberedOutput* result) {
      for (const auto& [index, trial] : arguments_) {
        if (trial.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
          *result = RememberedOutput::argumentAt(index);
          return true;
        }
      }
      if (t.layout() != c10::kStrided) return false;
      if (t.has_storage() && buffers_by_storage_.count(t.storage().unsafeGetStorageImpl())) {
        return false;  // a view of an argument
      }
      for (const c10::IValue& host : hosts_) {
        if (t.has_storage() && host.toTensor().has_storage() &&
            t.storage().is_alias_of(host.toTensor().storage())) {
          return false;  // a view of a host argument
        }
      }
      *result = RememberedOutput::freshLike(t);
      return true;
    });
  }

 private:
  struct Buffer {
    int64_t lo = std::numeric_limits<int64_t>::max();  // bytes
    int64_t hi = 0;
    bool integral = false;  // an integer or boolean tensor lies in it
    c10::Storage storage;
  };

  static constexpr int64_t kAlignment = 64;

  // Fills `t`, a floating-point or complex tensor, with `value`; from 2
  // up a complex tensor's elements get an imaginary part as well (2+2i),
  // as a complex value a kernel converts to a real type (masked_fill's)
  // must refuse on other data than zeros. An expanded view (overlapping
  // elements) is filled through the span of memory it covers. False if
  // it could not be filled.
  static bool fillWith(const at::Tensor& t, int value) {
    const c10::Scalar scalar = value >= 2 && t.is_complex()
                                   ? c10::Scalar(c10::complex<double>(value, value))
                                   : c10::Scalar(value);
    try {
      t.fill_(scalar);
      return true;
    } catch (const std::exception&) {
    }
    try {
      int64_t last = t.storage_offset();
      for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
      t.as_strided({last - t.storage_offset() + 1}, {1}).fill_(scalar);
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }

  void span(const at::Tensor& t) {
    if (!isPhantom(t) || t.layout() != c10::kStrided) return;
    Buffer& buffer = buffers_[t.storage().unsafeGetStorageImpl()];
    buffer.integral = buffer.integral ||
                      c10::isIntegralType(t.scalar_type(), /*includeBool=*/true);
    if (t.numel() == 0) return;
    const int64_t itemsize = static_cast<int64_t>(t.dtype().itemsize());
    int64_t last = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
    buffer.lo = std::min(buffer.lo, t.storage_offset() * itemsize);
    buffer.hi = std::max(buffer.hi, (last + 1) * itemsize);
  }

  void allocate(Buffer& buffer) {
    if (buffer.hi <= buffer.lo) {
      buffer.lo = 0;
      buffer.hi = 0;
    }
    buffer.lo -= buffer.lo % kAlignment;
    const size_t nbytes = static_cast<size_t>(buffer.hi - buffer.lo);
    void* data = nbytes == 0 ? nullptr : std::calloc(nbytes, 1);
    TORCH_CHECK(nbytes == 0 || data != nullptr, "phantom: cannot allocate ",
                nbytes, " bytes of host memory for the trial run of a call");
    buffer.storage = c10::Storage(
        c10::Storage::use_byte_size_t(), nbytes,
        c10::DataPtr(data, data, &std::free, c10::Device(c10::kCPU)),
        c10::GetCPUAllocator(), /*resizable=*/true);
    buffers_by_storage_.insert(buffer.storage.unsafeGetStorageImpl());
  }

  at::Tensor trialOf(const at::Tensor& t) {
    if (!isPhantom(t)) {
      if (t.defined()) {
        hosts_.emplace_back(t);
        // A host tensor is passed with its own values, which a trial on
        // other values does not change.
        if (fill_ != 0 && (c10::isFloatingType(t.scalar_type()) ||
                           c10::isComplexType(t.scalar_type()))) {
          varied_ = false;
        }
      }
      return t;
    }
    const auto known = by_impl_.find(t.unsafeGetTensorImpl());
    if (known != by_impl_.end()) return known->second;
    at::Tensor trial;
    if (t.layout() != c10::kStrided) {
      supported_ = false;  // run() declines
      trial = t;
    } else {
      const Buffer& buffer = buffers_.at(t.storage().unsafeGetStorageImpl());
      const int64_t itemsize = static_cast<int64_t>(t.dtype().itemsize());
      const int64_t shift = t.numel() == 0 ? t.storage_offset() : buffer.lo / itemsize;
      trial = at::detail::make_tensor<c10::TensorImpl>(
          c10::Storage(buffer.storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
          t.dtype());
      trial.unsafeGetTensorImpl()->set_sizes_and_strides(
          t.sizes(), t.strides(), t.storage_offset() - shift);
      trial.unsafeGetTensorImpl()->_set_conj(t.is_conj());
      trial.unsafeGetTensorImpl()->_set_neg(t.is_neg());
      shifts_.emplace(trial.unsafeGetTensorImpl(), shift);
      const c10::ScalarType dtype = t.scalar_type();
      if (c10::isIntegralType(dtype, /*includeBool=*/true)) {
        if (integer_fill_ != 0 && t.numel() > 0) fillWith(trial, integer_fill_);
      } else if (fill_ != 0 && t.numel() > 0) {
        const bool filled = (c10::isFloatingType(dtype) || c10::isComplexType(dtype)) &&
                            !buffer.integral && fillWith(trial, fill_);
        varied_ = varied_ && filled;
      }
    }
    by_impl_.emplace(t.unsafeGetTensorImpl(), trial);
    return trial;
  }

  c10::IValue trialOf(const c10::IValue& value) {
    if (std::optional<c10::IValue> mapped = mapTensors(
            value, [this](const at::Tensor& t) { return trialOf(t); })) {
      return *mapped;
    }
    if (value.isDevice() && value.toDevice().type() == c10::DeviceType::PrivateUse1) {
      return c10::Device(c10::kCPU);
    }
    return value;
  }

  std::unordered_map<const c10::StorageImpl*, Buffer> buffers_;  // by phantom storage
  std::unordered_set<const c10::StorageImpl*> buffers_by_storage_;  // trial storages
  std::unordered_map<const c10::TensorImpl*, at::Tensor> by_impl_;  // phantom -> trial
  std::unordered_map<const c10::TensorImpl*, int64_t> shifts_;  // trial -> offset shift
  std::vector<c10::IValue> hosts_;  // host tensors passed as they are
  std::vector<std::pair<size_t, at::Tensor>> arguments_;  // index, trial tensor
  std::vector<ArgumentGeometry> before_;  // of arguments_, before the run
  std::unordered_set<const c10::TensorImpl*> read_;  // passed other than as out=
  torch::jit::Stack stack_;
  int fill_;
  int integer_fill_;
  bool feasible_ = true;
  bool supported_ = true;
  bool varied_ = true;
};

}  // namespace async_path
}  // namespace phantom
