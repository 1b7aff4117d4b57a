// One OpenMP thread for small kernels that split over whole outputs; the
// design is in phantom/KernelThreads.h.
#include <phantom/KernelThreads.h>

#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE
#include <ATen/core/operator_name.h>

#include <dlfcn.h>

namespace phantom {
namespace {

// libgomp's per-thread count, from the copy libtorch_cpu already loaded
// (RTLD_NOLOAD: never a second OpenMP runtime in the process).
struct OpenMp {
  int (*get)() = nullptr;
  void (*set)(int) = nullptr;

  OpenMp() {
    void* gomp = dlopen("libgomp.so.1", RTLD_NOLOAD | RTLD_NOW);
    if (gomp == nullptr) {
      return;
    }
    get = reinterpret_cast<int (*)()>(dlsym(gomp, "omp_get_max_threads"));
    set = reinterpret_cast<void (*)(int)>(dlsym(gomp, "omp_set_num_threads"));
    if (get == nullptr || set == nullptr) {
      get = nullptr;
      set = nullptr;
    }
  }
};

const OpenMp& openMp() {
  static const OpenMp instance;
  return instance;
}

int64_t numelOf(const c10::IValue& value) {
  return value.isTensor() ? value.toTensor().numel() : 0;
}

}  // namespace

bool runsOnOneThread(const c10::OperatorName& op, c10::ArrayRef<c10::IValue> args) {
  static const c10::OperatorName bag("aten::_embedding_bag", "");
  static const c10::OperatorName bag_forward_only("aten::_embedding_bag_forward_only", "");
  static const c10::OperatorName log_sigmoid("aten::log_sigmoid_forward", "");
  int64_t work = 0;
  if (op == bag || op == bag_forward_only) {
    // Rows gathered times their width: (weight, indices, ...).
    if (args.size() < 2 || !args[0].isTensor() || args[0].toTensor().dim() != 2) {
      return false;
    }
    work = numelOf(args[1]) * args[0].toTensor().size(1);
  } else if (op == log_sigmoid) {
    if (args.empty()) {
      return false;
    }
    work = numelOf(args[0]);
  } else {
    return false;
  }
  return work < at::internal::GRAIN_SIZE;
}

OneThreadScope::OneThreadScope(bool active) {
  if (!active || openMp().set == nullptr) {
    return;
  }
  // ATen sets a thread's count on its first parallel call; make that
  // happen now, so it cannot undo the change below.
  (void)at::get_num_threads();
  const int threads = openMp().get();
  if (threads > 1) {
    saved_ = threads;
    openMp().set(1);
  }
}

OneThreadScope::~OneThreadScope() {
  if (saved_ > 0) {
    openMp().set(saved_);
  }
}

}  // namespace phantom
