// Random number generators of phantom devices.
//
// A phantom generator wraps a CPU (Philox-free, mt19937) generator: the fake
// device runs the CPU's random kernels, so with the same seed a phantom
// device draws exactly the numbers the CPU draws, and a model run on
// phantom can be compared with CPU bit for bit. Each device has a default
// generator, seeded like the CPU's default (67280421310721) until
// manual_seed changes it. Operators hand cpuGenerator() to the CPU kernels.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace phantom {

class PhantomGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit PhantomGeneratorImpl(c10::DeviceIndex device,
                                at::Generator cpu_generator = {});

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // The CPU generator that really draws the numbers.
  const at::Generator& cpuGenerator() const { return cpu_generator_; }

 private:
  PhantomGeneratorImpl* clone_impl() const override;

  at::Generator cpu_generator_;
};

const at::Generator& defaultGenerator(c10::DeviceIndex device = -1);
at::Generator newGenerator(c10::DeviceIndex device = -1);

// The CPU generator to hand a CPU kernel for a `Generator?` argument of an
// op running on `device`: the argument's own if given, else the device's
// default. Throws if the argument is a generator of another device.
at::Generator cpuGeneratorFor(const std::optional<at::Generator>& generator,
                              c10::DeviceIndex device);

}  // namespace phantom
