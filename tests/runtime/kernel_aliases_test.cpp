// PooledAliases (phantom/KernelAliases.h): the CPU aliases a queued
// kernel computes on are reused from one run to the next on the thread
// that runs kernels, and a reused alias is exactly the alias a fresh one
// would be: the kernel view of the new memory, the new dtype, geometry and
// bits; one CPU storage per device storage within a run, and none shared
// between runs.
#include <phantom/KernelAliases.h>
#include <phantom/Launch.h>
#include <phantom/Stream.h>

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <vector>

namespace {

// Part of phantom_runtime_tests, whose runtime_test.cpp sets the devices up.
const c10::Device kPhantom0(c10::DeviceType::PrivateUse1, 0);

// The kernel view of `tensor`'s storage (ph_kernel_address), from inside
// device work.
void* kernelViewOf(const at::Tensor& tensor) {
  void* view = nullptr;
  EXPECT_EQ(ph_kernel_address(tensor.storage().mutable_data(), &view), PH_SUCCESS);
  return view;
}

// What a fresh alias of `tensor` is; checked against a pooled one.
void expectAliases(const at::Tensor& cpu, const at::Tensor& device) {
  EXPECT_EQ(cpu.device(), c10::Device(c10::kCPU));
  EXPECT_EQ(cpu.storage().data(), kernelViewOf(device));
  EXPECT_EQ(cpu.storage().nbytes(), device.storage().nbytes());
  EXPECT_EQ(cpu.dtype(), device.dtype());
  EXPECT_EQ(cpu.sizes(), device.sizes());
  EXPECT_EQ(cpu.strides(), device.strides());
  EXPECT_EQ(cpu.storage_offset(), device.storage_offset());
  EXPECT_EQ(cpu.is_conj(), device.is_conj());
  EXPECT_EQ(cpu.is_neg(), device.is_neg());
  EXPECT_EQ(cpu.is_contiguous(), device.is_contiguous());
}

TEST(PooledAliases, ARunReusesTheAliasesOfTheRunBeforeOnItsThread) {
  // The current stream: the device tensors were made on it, in stream order.
  const auto stream = phantom::getCurrentPhantomStream(0);
  const at::Tensor a = at::arange(12, at::TensorOptions(at::kFloat).device(kPhantom0));
  const at::Tensor b = at::zeros({3, 5}, at::TensorOptions(at::kDouble).device(kPhantom0));
  const phantom::DeviceTensorRef ref_a(a);
  const phantom::DeviceTensorRef ref_b(b);
  const c10::TensorImpl* first = nullptr;
  const c10::StorageImpl* first_storage = nullptr;
  phantom::launchAndWait(stream, "first", [&] {
    phantom::PooledAliases aliases;
    const at::Tensor cpu = aliases.alias(ref_a);
    expectAliases(cpu, a);
    first = cpu.unsafeGetTensorImpl();
    first_storage = cpu.storage().unsafeGetStorageImpl();
  });
  phantom::launchAndWait(stream, "second", [&] {
    phantom::PooledAliases aliases;
    const at::Tensor cpu = aliases.alias(ref_b);
    EXPECT_EQ(cpu.unsafeGetTensorImpl(), first) << "not taken from the pool";
    EXPECT_EQ(cpu.storage().unsafeGetStorageImpl(), first_storage);
    expectAliases(cpu, b);  // every property the alias of `a` had is reset
    // And the CPU kernel computes on the device memory through it.
    cpu.fill_(2.5);
  });
  EXPECT_TRUE(b.cpu().eq(2.5).all().item<bool>());
}

TEST(PooledAliases, ReusedAliasesTakeTheNewGeometryBitsAndMemory) {
  // The current stream: the device tensors were made on it, in stream order.
  const auto stream = phantom::getCurrentPhantomStream(0);
  const at::Tensor base = at::randn({4, 6}, at::TensorOptions(at::kComplexFloat).device(kPhantom0));
  // A strided, offset, conjugated view, and a negated one.
  const at::Tensor view = base.slice(1, 1, 5, 2).t().conj();
  const at::Tensor negated = at::_neg_view(base.select(0, 2));
  const at::Tensor plain = at::ones({7}, at::TensorOptions(at::kLong).device(kPhantom0));
  for (int round = 0; round < 3; ++round) {
    phantom::launchAndWait(stream, "kernel", [&] {
      phantom::PooledAliases aliases;
      expectAliases(aliases.alias(phantom::DeviceTensorRef(view)), view);
      expectAliases(aliases.alias(phantom::DeviceTensorRef(negated)), negated);
      expectAliases(aliases.alias(phantom::DeviceTensorRef(plain)), plain);
    });
  }
}

TEST(PooledAliases, RefsOfOneStorageShareOneCpuStorageWithinARun) {
  // The current stream: the device tensors were made on it, in stream order.
  const auto stream = phantom::getCurrentPhantomStream(0);
  const at::Tensor x = at::arange(10, at::TensorOptions(at::kFloat).device(kPhantom0));
  const at::Tensor y = at::arange(10, at::TensorOptions(at::kFloat).device(kPhantom0));
  const at::Tensor empty1 = at::empty({0}, at::TensorOptions(at::kFloat).device(kPhantom0));
  const at::Tensor empty2 = at::empty({0}, at::TensorOptions(at::kFloat).device(kPhantom0));
  for (int round = 0; round < 3; ++round) {
    phantom::launchAndWait(stream, "kernel", [&] {
      phantom::PooledAliases aliases;
      const at::Tensor head = aliases.alias(phantom::DeviceTensorRef(x.narrow(0, 0, 6)));
      const at::Tensor other = aliases.alias(phantom::DeviceTensorRef(y));
      const at::Tensor tail = aliases.alias(phantom::DeviceTensorRef(x.narrow(0, 4, 6)));
      EXPECT_TRUE(head.storage().is_alias_of(tail.storage()));
      EXPECT_FALSE(head.storage().is_alias_of(other.storage()));
      // The CPU kernels see the overlap the user made.
      EXPECT_EQ(at::get_overlap_status(head, tail), at::MemOverlapStatus::Partial);
      EXPECT_THROW(at::add_out(const_cast<at::Tensor&>(tail), head, head), c10::Error);
      // Storages without memory stay storages of their own.
      const at::Tensor e1 = aliases.alias(phantom::DeviceTensorRef(empty1));
      const at::Tensor e2 = aliases.alias(phantom::DeviceTensorRef(empty2));
      EXPECT_NE(e1.storage().unsafeGetStorageImpl(), e2.storage().unsafeGetStorageImpl());
    });
  }
}

TEST(PooledAliases, AnAliasSomeoneStillHoldsIsNotReused) {
  // The current stream: the device tensors were made on it, in stream order.
  const auto stream = phantom::getCurrentPhantomStream(0);
  const at::Tensor a = at::arange(8, at::TensorOptions(at::kFloat).device(kPhantom0));
  const at::Tensor b = at::arange(8, at::TensorOptions(at::kFloat).device(kPhantom0)) + 100;
  at::Tensor kept;
  phantom::launchAndWait(stream, "keeps its alias", [&] {
    phantom::PooledAliases aliases;
    kept = aliases.alias(phantom::DeviceTensorRef(a));
  });
  phantom::launchAndWait(stream, "next", [&] {
    phantom::PooledAliases aliases;
    const at::Tensor cpu = aliases.alias(phantom::DeviceTensorRef(b));
    EXPECT_NE(cpu.unsafeGetTensorImpl(), kept.unsafeGetTensorImpl());
    EXPECT_NE(cpu.storage().unsafeGetStorageImpl(),
              kept.storage().unsafeGetStorageImpl());
    // The kept alias still describes `a`.
    EXPECT_EQ(kept.storage().data(), kernelViewOf(a));
    EXPECT_EQ(kept.sizes(), a.sizes());
  });
}

TEST(PooledAliases, AStorageAKernelGrewIsPointedBackAtDeviceMemory) {
  // The current stream: the device tensors were made on it, in stream order.
  const auto stream = phantom::getCurrentPhantomStream(0);
  const at::Tensor out = at::zeros({4}, at::TensorOptions(at::kFloat).device(kPhantom0));
  const at::Tensor next = at::zeros({16}, at::TensorOptions(at::kFloat).device(kPhantom0));
  phantom::launchAndWait(stream, "resizes its out", [&] {
    phantom::PooledAliases aliases;
    at::Tensor cpu = aliases.alias(phantom::DeviceTensorRef(out));
    cpu.resize_({1024});  // grows into CPU memory, as an out= kernel may
    EXPECT_NE(cpu.storage().data(), kernelViewOf(out));
  });
  phantom::launchAndWait(stream, "next", [&] {
    phantom::PooledAliases aliases;
    at::Tensor cpu = aliases.alias(phantom::DeviceTensorRef(next));
    expectAliases(cpu, next);
    cpu.fill_(3);
  });
  EXPECT_TRUE(next.cpu().eq(3).all().item<bool>());
  EXPECT_TRUE(out.cpu().eq(0).all().item<bool>()) << "the device tensor was not resized";
}

TEST(PooledAliases, ThePoolKeepsAtMostItsSize) {
  // The current stream: the device tensors were made on it, in stream order.
  const auto stream = phantom::getCurrentPhantomStream(0);
  const at::Tensor t = at::zeros({2}, at::TensorOptions(at::kFloat).device(kPhantom0));
  const size_t many = phantom::PooledAliases::kPoolSize + 10;
  size_t pooled_after = 0;
  phantom::launchAndWait(stream, "lends many", [&] {
    {
      phantom::PooledAliases aliases;
      std::vector<at::Tensor> held;
      for (size_t i = 0; i < many; ++i) {
        held.push_back(aliases.alias(phantom::DeviceTensorRef(t)));
      }
      // Every alias is a tensor of its own over one CPU storage.
      for (size_t i = 1; i < held.size(); ++i) {
        EXPECT_NE(held[i].unsafeGetTensorImpl(), held[i - 1].unsafeGetTensorImpl());
        EXPECT_TRUE(held[i].storage().is_alias_of(held[0].storage()));
      }
    }
    pooled_after = phantom::PooledAliases::pooled();
  });
  EXPECT_EQ(pooled_after, phantom::PooledAliases::kPoolSize);
}

}  // namespace
