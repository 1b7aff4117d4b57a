// Random number generators of phantom devices.
//
// A phantom generator wraps a CPU (Philox-free, mt19937) generator: the fake
// device runs the CPU's random kernels, so with the same seed a phantom
// device draws exactly the numbers the CPU draws, and a model run on
// phantom can be compared with CPU bit for bit. Each device has a default
// generator, seeded like the CPU's default (67280421310721) until
// manual_seed changes it. Operators hand cpuGenerator() to the CPU kernels.
//
// Queued draws. A random op is queued like any other (the generic path does
// not wait for it), so the CPU generator is advanced by the stream's worker,
// later. Two rules keep that invisible:
//   - Draws happen in the order the host called the ops, even across
//     streams: queueDraw makes a draw on a stream other than the previous
//     draw's wait for that draw (an event the generator records after each
//     one), so phantom keeps drawing the CPU's numbers in the CPU's order.
//   - The host sees the state after every draw it has queued: each host-side
//     access (get_state, set_state, manual_seed, seed, offsets, clone) first
//     waits for the queued draws. That wait is not an error-reporting sync:
//     a draw that failed leaves its error on its stream for the next sync.
#pragma once

#include <phantom/Stream.h>

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <functional>
#include <mutex>

namespace phantom {

class PhantomGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit PhantomGeneratorImpl(c10::DeviceIndex device,
                                at::Generator cpu_generator = {});
  ~PhantomGeneratorImpl() override;

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

  // Calls `queue`, which queues work drawing from this generator on
  // `stream`, ordered after every draw queued before (see the top).
  void queueDraw(const PhantomStream& stream, const std::function<void()>& queue);
  // Blocks until every queued draw has run. A no-op inside device work.
  void waitForQueuedDraws() const;

 private:
  PhantomGeneratorImpl* clone_impl() const override;

  at::Generator cpu_generator_;
  mutable std::mutex draws_mutex_;
  ph_event_t last_draw_ = nullptr;      // recorded after each queued draw
  ph_stream_t last_stream_ = nullptr;   // the stream of the last queued draw
  mutable bool draws_pending_ = false;  // last_draw_ may not be reached yet
};

const at::Generator& defaultGenerator(c10::DeviceIndex device = -1);
at::Generator newGenerator(c10::DeviceIndex device = -1);

// The CPU generator to hand a CPU kernel for a `Generator?` argument of an
// op running on `device`: the argument's own if given, else the device's
// default. Throws if the argument is a generator of another device.
at::Generator cpuGeneratorFor(const std::optional<at::Generator>& generator,
                              c10::DeviceIndex device);

// The phantom generator behind cpuGeneratorFor(generator, device).
PhantomGeneratorImpl* phantomGeneratorFor(
    const std::optional<at::Generator>& generator, c10::DeviceIndex device);

}  // namespace phantom
