// The switch that ends PyTorch's GPU trace hooks at exit (GpuTrace.h).
#include <phantom/GpuTrace.h>

#include <atomic>

namespace phantom::gpu_trace {
namespace {
std::atomic<bool> stopped{false};
}  // namespace

void stopTracing() noexcept { stopped.store(true, std::memory_order_release); }

bool tracingStopped() noexcept { return stopped.load(std::memory_order_acquire); }

}  // namespace phantom::gpu_trace
