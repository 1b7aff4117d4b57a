// Creates tensors on the phantom device from C++, computes on it and checks
// the result against the CPU.
#include <ATen/ATen.h>

#include <iostream>

int main() {
  const c10::Device phantom("phantom:0");
  at::Tensor a = at::randn({64, 32});
  at::Tensor b = at::randn({32, 16});
  at::Tensor on_device = at::relu(at::mm(a.to(phantom), b.to(phantom)));
  at::Tensor on_cpu = at::relu(at::mm(a, b));
  const bool same = at::allclose(on_device.cpu(), on_cpu);
  std::cout << "result on " << on_device.device() << ", matches CPU: "
            << (same ? "yes" : "no") << std::endl;
  return same ? 0 : 1;
}
