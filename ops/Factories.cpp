// Factories: empty and empty_strided, the two ops every other factory
// (zeros, randn, arange, ...) is built from. Memory comes from the phantom
// device allocator on the requested device. Before the first phantom
// tensor exists, a driver without a kernel view makes the native kernels
// step aside (CopyingFallback.cpp).
#include <phantom/Device.h>
#include <phantom/ops/GenericPath.h>
#include <phantom/ops/OutputGeometry.h>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace phantom {
namespace {

c10::Device targetDevice(std::optional<c10::Device> device) {
  c10::DeviceIndex index = device.has_value() ? device->index() : -1;
  if (index < 0) {
    index = currentDevice();
  }
  checkDeviceIndex(index);
  return {c10::DeviceType::PrivateUse1, index};
}

void checkLayoutAndPinning(std::optional<c10::Layout> layout,
                           std::optional<bool> pin_memory) {
  TORCH_CHECK(layout.value_or(c10::Layout::Strided) == c10::Layout::Strided,
              c10::get_privateuse1_backend(),
              " supports only strided (dense) tensors, got layout ",
              layout.value_or(c10::Layout::Strided));
  TORCH_CHECK(!pin_memory.value_or(false),
              "pin_memory=True applies only to CPU tensors; create the tensor "
              "on the CPU and call .pin_memory() instead");
}

at::Tensor empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                 std::optional<c10::Layout> layout,
                 std::optional<c10::Device> device,
                 std::optional<bool> pin_memory,
                 std::optional<c10::MemoryFormat> memory_format) {
  checkLayoutAndPinning(layout, pin_memory);
  stepAsideWithoutKernelView();
  const c10::DeviceGuard guard(targetDevice(device));
  return emptyOnCurrentDevice(size, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype,
                         std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  checkLayoutAndPinning(layout, pin_memory);
  stepAsideWithoutKernelView();
  const c10::DeviceGuard guard(targetDevice(device));
  return emptyOnCurrentDevice(size, stride, c10::dtype_or_default(dtype));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty));
  m.impl("empty_strided", TORCH_FN(empty_strided));
}

}  // namespace phantom
