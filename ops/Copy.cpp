// Copies between the host and phantom devices, and between phantom devices
// (_copy_from, behind every copy_, .to() and .cpu()).
//
//   host -> device   dtype conversion and broadcasting happen on the host;
//                    the bytes go over as one dense transfer on the current
//                    stream. From pinned memory with non_blocking=True the
//                    call returns before the transfer completes (a
//                    conversion is staged in pinned memory too).
//   device -> host   a dense transfer after the stream's earlier work, then
//                    dtype/stride conversion on the host. Into dense pinned
//                    memory the conversion is queued on the device instead,
//                    and with non_blocking=True the call returns at once.
//   Pinned blocks used by a non_blocking transfer are recorded with the
//   host allocator (recordPinnedUse): freeing them at once is safe.
//   same device      on the current stream, returning at once: the driver's
//                    device-to-device transfer for two buffers of the same
//                    dense layout up to 4 MiB, else a copy kernel (any
//                    dtype, any strides, broadcasting, overlapping views;
//                    without a kernel view: the driver's transfer for any
//                    size, and the copying CPU fallback for the rest).
//   across devices   staged dense on the source device, then a blocking
//                    device-to-device transfer after both devices' current
//                    streams have finished their earlier work.
// Every copy that makes the host wait (all but same-device copies and
// non_blocking ones with pinned host memory) first tells
// torch.phantom.set_sync_debug_mode (phantom/SyncDebug.h).
#include <phantom/Exception.h>
#include <phantom/FaultInjection.h>
#include <phantom/HostAllocator.h>
#include <phantom/Launch.h>
#include <phantom/Stream.h>
#include <phantom/SyncDebug.h>
#include <phantom/BoundsCheck.h>
#include <phantom/KernelAliases.h>
#include <phantom/ops/GenericPath.h>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace phantom {
namespace {

// True when `a` and `b` can be copied as one run of bytes.
bool sameDenseLayout(const at::Tensor& a, const at::Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes() == b.sizes() &&
         a.strides() == b.strides() && a.is_non_overlapping_and_dense() &&
         a.is_conj() == b.is_conj() && a.is_neg() == b.is_neg();
}

size_t byteSize(const at::Tensor& tensor) {
  return static_cast<size_t>(tensor.numel()) * tensor.element_size();
}

// A CPU tensor with `like`'s sizes and strides in pinned memory from the
// caching host allocator: the staging buffer of an asynchronous transfer.
at::Tensor emptyPinnedLike(const at::Tensor& like) {
  return at::detail::empty_strided_generic(
      like.sizes(), like.strides(), pinnedHostAllocator(),
      c10::DispatchKeySet(c10::DispatchKey::CPU), like.scalar_type());
}

// After queueing an asynchronous transfer that reads or writes the pinned
// `host` tensor: blocking copies wait for it; non_blocking ones tell the
// host allocator that the stream uses the block, so freeing the tensor at
// once does not let the block be reused before the transfer is done (as
// CUDA's CachingHostAllocator_recordEvent does).
void finishPinnedTransfer(const at::Tensor& host, const PhantomStream& stream,
                          bool non_blocking) {
  if (!non_blocking) {
    stream.synchronize();
    return;
  }
  recordPinnedUse(host.storage(), stream);
}

void copyHostToDevice(const at::Tensor& src, const at::Tensor& dst,
                      bool non_blocking) {
  const c10::DeviceGuard guard(dst.device());
  const PhantomStream stream = getCurrentPhantomStream(dst.device().index());
  const bool pinned = isPinnedPointer(src.const_data_ptr());
  if (!(pinned && non_blocking)) {
    noteHostWait("aten::copy_ from host memory to phantom",
                 pinned ? "non_blocking=False"
                        : "the source is pageable memory, which the copy "
                          "must read before returning");
  }
  if (sameDenseLayout(src, dst) && !src.is_conj() && !src.is_neg()) {
    // From pageable memory the call returns once the bytes have been read;
    // from pinned memory it returns at once.
    const ph_stream_t handle = stream.handle();  // sticky errors: Stream.h
    stream.check(ph_memcpy_async(dst.data_ptr(), src.const_data_ptr(),
                                 byteSize(dst), PH_MEMCPY_HOST_TO_DEVICE, handle),
                 handle);
    if (pinned) {
      finishPinnedTransfer(src, stream, non_blocking);
    }
    return;
  }
  // Convert on the host into dst's dtype and (dense) layout, then transfer.
  at::Tensor target = dst;
  if (!dst.is_non_overlapping_and_dense()) {
    target = at::empty(dst.sizes(), dst.options());
  }
  // A non_blocking copy from pinned memory stays asynchronous: the staging
  // buffer is pinned too, and is released to the cache with an event.
  const bool async = pinned && non_blocking;
  at::Tensor staged =
      async ? emptyPinnedLike(target)
            : at::empty_strided(target.sizes(), target.strides(),
                                target.options().device(c10::kCPU));
  staged.copy_(src);
  const ph_stream_t handle = stream.handle();  // sticky errors: Stream.h
  stream.check(ph_memcpy_async(target.data_ptr(), staged.const_data_ptr(),
                               byteSize(target), PH_MEMCPY_HOST_TO_DEVICE, handle),
               handle);
  if (async) {
    recordPinnedUse(staged.storage(), stream);
  }
  if (!target.is_same(dst)) {
    dst.copy_(target);
  }
}

void copyOnDevice(const at::Tensor& src, const at::Tensor& dst);

void copyDeviceToHost(const at::Tensor& src, const at::Tensor& dst,
                      bool non_blocking) {
  const c10::DeviceGuard guard(src.device());
  const PhantomStream stream = getCurrentPhantomStream(src.device().index());
  const bool dst_dense =
      dst.is_non_overlapping_and_dense() && !dst.is_conj() && !dst.is_neg();
  const bool pinned = dst_dense && isPinnedPointer(dst.const_data_ptr());
  if (!(pinned && non_blocking)) {
    noteHostWait("aten::copy_ from phantom to host memory",
                 pinned ? "non_blocking=False"
                        : ".cpu(), .tolist(), .numpy() or a copy into "
                          "pageable memory, which waits for the bytes");
  }
  const bool src_dense =
      src.is_non_overlapping_and_dense() && !src.is_conj() && !src.is_neg();
  at::Tensor dense;
  if (src_dense && sameDenseLayout(src, dst)) {
    dense = src;
  } else if (pinned) {
    // Into pinned memory, convert on the device (queued) into dst's dtype
    // and layout, so that the transfer is one dense asynchronous copy.
    dense = at::empty_strided(dst.sizes(), dst.strides(),
                              src.options().dtype(dst.dtype()));
    copyOnDevice(src.expand_as(dst), dense);
  } else {
    dense = src_dense ? src : src.contiguous().resolve_conj().resolve_neg();
  }
  if (dst_dense && sameDenseLayout(dense, dst)) {
    const ph_stream_t handle = stream.handle();  // sticky errors: Stream.h
    stream.check(ph_memcpy_async(dst.data_ptr(), dense.const_data_ptr(),
                                 byteSize(dst), PH_MEMCPY_DEVICE_TO_HOST, handle),
                 handle);
    if (pinned) {
      finishPinnedTransfer(dst, stream, non_blocking);
    }
    return;
  }
  at::Tensor staged = at::empty_strided(dense.sizes(), dense.strides(),
                                        dense.options().device(c10::kCPU));
  // Pageable destination: returns once the bytes have arrived.
  const ph_stream_t handle = stream.handle();  // sticky errors: Stream.h
  stream.check(ph_memcpy_async(staged.data_ptr(), dense.const_data_ptr(),
                               byteSize(dense), PH_MEMCPY_DEVICE_TO_HOST, handle),
               handle);
  dst.copy_(staged);
}

// Above this a same-device copy uses the copy kernel: it splits the copy
// across the intra-op threads, which pays once the copy takes longer than
// waking them (measured: 1 MiB 0.32 of memcpy as a kernel, 1.0 as a
// memcpy; 16 MiB 1.3-1.5 as a kernel, 0.75-0.85 as a memcpy).
constexpr size_t kDriverCopyMaxBytes = size_t{4} << 20;

void copyOnDevice(const at::Tensor& src, const at::Tensor& dst) {
  const c10::DeviceGuard guard(dst.device());
  const bool kernel_view = kernelViewAvailable();
  if (sameDenseLayout(src, dst) && !src.storage().is_alias_of(dst.storage()) &&
      (byteSize(dst) <= kDriverCopyMaxBytes || !kernel_view)) {
    // One run of bytes between two buffers, small enough that the driver's
    // single memcpy beats the copy kernel, whose threads must be woken.
    const PhantomStream stream = getCurrentPhantomStream(dst.device().index());
    const ph_stream_t handle = stream.handle();
    stream.check(ph_memcpy_async(dst.data_ptr(), src.const_data_ptr(),
                                 byteSize(dst), PH_MEMCPY_DEVICE_TO_DEVICE, handle),
                 handle);
    return;
  }
  if (!kernel_view) {
    // No copy kernel over device memory: the copying CPU fallback copies
    // both to the host, converts there and copies dst back.
    torch::jit::Stack stack = boxArguments(dst, src, false);
    runGenericBoxed("aten::copy_", "", &stack);
    return;
  }
  const PhantomStream stream = getCurrentPhantomStream(dst.device().index());
  launchAsync(stream, "aten::copy_",
              [from = DeviceTensorRef(src), to = DeviceTensorRef(dst),
               aliases = NodeAliases::forStream(stream)] {
                aliases.run({&to, &from}, [](c10::ArrayRef<at::Tensor> cpu) {
                  // As the CPU's autograd kernel calls the CPU kernel.
                  const at::AutoDispatchBelowADInplaceOrView below_autograd;
                  at::Tensor(cpu[0]).copy_(cpu[1]);
                });
              });
}

void copyAcrossDevices(const at::Tensor& src, const at::Tensor& dst) {
  noteHostWait("aten::copy_ between two phantom devices",
               "the host waits for both devices' streams");
  at::Tensor staged = src;
  if (!sameDenseLayout(src, dst) || src.is_conj() || src.is_neg()) {
    const c10::DeviceGuard guard(src.device());
    staged = at::empty(dst.sizes(), src.options().dtype(dst.dtype()));
    copyOnDevice(src, staged);
  }
  at::Tensor target = dst;
  if (!sameDenseLayout(staged, dst)) {
    const c10::DeviceGuard guard(dst.device());
    target = at::empty(dst.sizes(), dst.options());
  }
  getCurrentPhantomStream(src.device().index()).synchronize();
  getCurrentPhantomStream(dst.device().index()).synchronize();
  PHANTOM_CHECK(ph_memcpy(target.data_ptr(), staged.const_data_ptr(),
                          byteSize(target), PH_MEMCPY_DEVICE_TO_DEVICE));
  if (!target.is_same(dst)) {
    copyOnDevice(target, dst);
  }
}

at::Tensor copyFrom(const at::Tensor& src, const at::Tensor& dst,
                    bool non_blocking) {
  if (dst.numel() == 0) {
    return dst;
  }
  faultHookCopy(src.device(), dst.device());  // injected latency, if set
  TORCH_CHECK(isPhantom(src) || src.device().is_cpu(),
              "cannot copy from ", src.device(), " to ", dst.device(),
              ": phantom copies to and from the CPU and phantom devices only");
  TORCH_CHECK(isPhantom(dst) || dst.device().is_cpu(),
              "cannot copy from ", src.device(), " to ", dst.device(),
              ": phantom copies to and from the CPU and phantom devices only");
  if (isPhantom(src)) checkInsideStorage(src, "a copy (copy_, to, cpu)");
  if (isPhantom(dst)) checkInsideStorage(dst, "a copy (copy_, to, cpu)");
  // src broadcast to dst's shape. Broadcasting makes a view (and a copy of
  // src a reference count, which for a tensor Python holds takes the GIL);
  // a copy between equal shapes, nearly every one, binds src itself.
  at::Tensor expanded;
  const at::Tensor& broadcast =
      src.sizes() == dst.sizes() ? src : (expanded = src.expand_as(dst));
  if (!isPhantom(src)) {
    copyHostToDevice(broadcast, dst, non_blocking);
  } else if (!isPhantom(dst)) {
    copyDeviceToHost(src, dst, non_blocking);
  } else if (src.device() == dst.device()) {
    copyOnDevice(src, dst);
  } else {
    copyAcrossDevices(broadcast, dst);
  }
  return dst;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_copy_from", TORCH_FN(copyFrom));
}

}  // namespace phantom
