// Native kernels for the hottest elementwise ops: add, sub, mul, div (the
// functional, in-place and out= forms) and relu, relu_.
//
// These are most of a model's small ops, so what the host pays to queue one
// is what a chain of small ops costs. The boxed generic path would box the
// arguments, walk the schema, compute the outputs, and queue a closure that
// aliases every argument, calls the op through the dispatcher and copies a
// fresh CPU result into the device output. Here the host instead checks
// the arguments, takes the output's shape and dtype from broadcasting and
// type promotion, allocates it, and queues a small closure. The closure
// runs the CPU kernel (at::cpu::*_out, no dispatcher) straight into the
// device output, over CPU aliases of device memory (KernelAliases.h).
//
// Only cases where the CPU kernel can neither fail nor resize are queued
// here, so no error that the CPU raises at the call is deferred: a floating
// result dtype; every phantom input on the op's device; outputs of exactly
// the broadcast shape and result dtype, dense and not partly overlapping an
// input; for fresh outputs, contiguous inputs (the CPU kernel would give a
// fresh output the layout of strided inputs). Functional calls outside
// these cases (integer results, strided inputs) take their output from
// ATen's C++ meta function instead (at::meta::add, ...), which also makes
// the CPU's argument checks at the call. What the CPU kernels check beyond
// that (the dtypes they are compiled for: no float8 add, no uint16 add; an
// alpha that overflows the dtype) is asked of them once per call signature
// (CpuAdmission.h); a call they refuse is declined. A CPU scalar (a Python number,
// or a 0-dim CPU tensor) is read when the op is called, as CUDA passes it
// by value to the kernel. Every other case goes to the generic path
// (Fallback.cpp), which keeps the CPU's behaviour, errors included.
#include <phantom/Launch.h>
#include <phantom/Stream.h>
#include <phantom/CpuAdmission.h>
#include <phantom/ops/DirectLoops.h>
#include <phantom/ops/GenericPath.h>
#include <phantom/BoundsCheck.h>
#include <phantom/KernelAliases.h>
#include <phantom/ops/OpsReport.h>
#include <phantom/ops/OutputGeometry.h>
#include <phantom/Exception.h>
#include <phantom/hal.h>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ExpandUtils.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/TypeProperties.h>
#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/add_meta_dispatch.h>
#include <ATen/ops/clamp_min_cpu_dispatch.h>
#include <ATen/ops/div_cpu_dispatch.h>
#include <ATen/ops/div_meta_dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/mul_cpu_dispatch.h>
#include <ATen/ops/mul_meta_dispatch.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/sub_cpu_dispatch.h>
#include <ATen/ops/sub_meta_dispatch.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <optional>
#include <type_traits>

namespace phantom {
namespace {

enum class Binary { kAdd, kSub, kMul, kDiv };

const char* nameOf(Binary op) {
  switch (op) {
    case Binary::kAdd: return "aten::add";
    case Binary::kSub: return "aten::sub";
    case Binary::kMul: return "aten::mul";
    case Binary::kDiv: return "aten::div";
  }
  return "?";
}

// A CPU scalar's value, read directly for the dtypes Python numbers take.
at::Scalar valueOf(const at::Tensor& cpu_scalar) {
  const void* data = cpu_scalar.const_data_ptr();
  switch (cpu_scalar.scalar_type()) {
    case c10::kDouble: return *static_cast<const double*>(data);
    case c10::kFloat: return *static_cast<const float*>(data);
    case c10::kLong: return *static_cast<const int64_t*>(data);
    case c10::kBool: return *static_cast<const bool*>(data);
    default: return cpu_scalar.item();
  }
}

// An input as the queued kernel receives it: device memory by reference,
// or a CPU scalar by value.
class Input {
 public:
  static std::optional<Input> from(const at::Tensor& t, c10::Device device) {
    if (!t.defined() || t.layout() != c10::kStrided || t.is_conj() ||
        t.is_neg()) {
      return std::nullopt;
    }
    if (t.device() == device) {
      return Input(DeviceTensorRef(t));
    }
    if (t.device().is_cpu() && t.dim() == 0) {
      return Input(valueOf(t), t.scalar_type(),
                   t.unsafeGetTensorImpl()->is_wrapped_number());
    }
    return std::nullopt;  // another device: the generic path says so
  }

  // The input as a probe of the CPU kernel receives it (CpuAdmission.h).
  at::Tensor toProbe(const at::Tensor& given) const {
    return device_ ? probeTensor(given) : scalarTensor();
  }

  // Device memory, or nullptr for a CPU scalar.
  const DeviceTensorRef* deviceRef() const {
    return device_ ? &*device_ : nullptr;
  }

  // A CPU scalar converted to the op's dtype T as the CPU kernel converts
  // it (one static_cast from the value's own type). Only for real values.
  template <typename T>
  T scalarAs() const {
    return value_.isFloatingPoint() ? static_cast<T>(value_.toDouble())
                                    : static_cast<T>(value_.toLong());
  }

  bool realScalar() const {
    return !device_ && (value_.isFloatingPoint() || value_.isIntegral(false));
  }

  // A CPU scalar input as the CPU kernel receives it.
  at::Tensor scalarTensor() const {
    at::Tensor t = at::scalar_tensor(value_, at::TensorOptions(dtype_));
    t.unsafeGetTensorImpl()->set_wrapped_number(wrapped_);
    return t;
  }

 private:
  explicit Input(DeviceTensorRef ref) : device_(std::move(ref)) {}
  Input(const at::Scalar& value, c10::ScalarType dtype, bool wrapped)
      : value_(value), dtype_(dtype), wrapped_(wrapped) {}

  std::optional<DeviceTensorRef> device_;
  at::Scalar value_;
  c10::ScalarType dtype_ = c10::kFloat;
  bool wrapped_ = false;
};

bool sameView(const at::Tensor& a, const at::Tensor& b) {
  return a.storage().is_alias_of(b.storage()) &&
         a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() &&
         a.strides() == b.strides() && a.dtype() == b.dtype();
}

// `out` may be written by a queued kernel reading `inputs`: it is exactly
// the result's shape and dtype, dense, and shares memory with an input only
// if it is that very view (x.add_(y), x.mul_(x)).
bool writable(const at::Tensor& out, c10::Device device, c10::ScalarType dtype,
              c10::IntArrayRef shape,
              std::initializer_list<const at::Tensor*> inputs) {
  if (out.device() != device || out.scalar_type() != dtype ||
      out.sizes() != shape || !out.is_contiguous() || out.is_conj() ||
      out.is_neg()) {
    return false;
  }
  for (const at::Tensor* input : inputs) {
    if (input->device() == device &&
        input->storage().is_alias_of(out.storage()) && !sameView(*input, out)) {
      return false;
    }
  }
  return true;
}

// The device the op runs on: the first phantom input's. None: not ours.
// The helpers here take tensors by pointer, never by value: a second
// reference to a tensor Python owns makes torch take the GIL to add it
// (TensorImpl::incref_pyobject) and again to drop it.
std::optional<c10::Device> deviceOf(std::initializer_list<const at::Tensor*> inputs) {
  for (const at::Tensor* t : inputs) {
    if (t->defined() && t->device().type() == c10::DeviceType::PrivateUse1) {
      return t->device();
    }
  }
  return std::nullopt;
}

// The floating dtypes the CPU's elementwise kernels compute in. Not the
// float8 ones: the CPU refuses them ("add_stub" not implemented), and a
// native kernel only queues what the CPU kernel cannot refuse; the generic
// path raises the CPU's error at the call.
bool computedFloatingType(c10::ScalarType dtype) {
  return c10::isFloatingType(dtype) && !c10::isFloat8Type(dtype);
}

// Result dtype and shape by ATen's rules; nullopt unless floating.
struct ResultMeta {
  c10::ScalarType dtype;
  at::DimVector shape;
};

// Promotions ATen refuses (float8 with another type, uint16 with bool) and
// shapes that do not broadcast are declined too: the CPU may check
// something else first (sub of a bool), and the generic path raises
// whichever error the CPU raises.
std::optional<ResultMeta> resultOf(const at::Tensor& a, const at::Tensor* b) {
  try {
    at::native::ResultTypeState state;
    state = at::native::update_result_type_state(a, state);
    if (b != nullptr) {
      state = at::native::update_result_type_state(*b, state);
    }
    const c10::ScalarType dtype = at::native::result_type(state);
    if (!computedFloatingType(dtype)) {
      return std::nullopt;
    }
    if (b == nullptr) {
      return ResultMeta{dtype, at::DimVector(a.sizes())};
    }
    return ResultMeta{dtype, at::infer_size_dimvector(a.sizes(), b->sizes())};
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}

void runBinary(Binary op, at::Tensor& out, const at::Tensor& a,
               const at::Tensor& b, const at::Scalar& alpha) {
  switch (op) {
    case Binary::kAdd: at::cpu::add_out(out, a, b, alpha); return;
    case Binary::kSub: at::cpu::sub_out(out, a, b, alpha); return;
    case Binary::kMul: at::cpu::mul_out(out, a, b); return;
    case Binary::kDiv: at::cpu::div_out(out, a, b); return;
  }
}

// The direct loop. Most of a small-op chain is float or double operands of
// one dtype, contiguous, of the output's shape (or a CPU scalar), too small
// for the CPU kernel to go parallel. For those the queued kernel needs
// neither CPU aliases nor a TensorIterator (which cost more on the worker
// than the arithmetic: a graph replay of such a chain is that cost alone,
// docs/graphs.md): it computes each element with the one IEEE operation
// the CPU kernel does (add with alpha 1: a + b; mul; true division), so
// results are bit-identical. sub is left to the CPU kernel, which computes
// it as a + (-1) * b (a NaN's sign bit could differ).
bool fitsDirectLoop(Binary op, const at::Tensor& out, const Input& a,
                    const Input& b, const at::Scalar& alpha) {
  if (op == Binary::kSub) {
    return false;
  }
  if (op == Binary::kAdd &&
      !(alpha.isIntegral(false) ? alpha.toLong() == 1
                                : alpha.isFloatingPoint() && alpha.toDouble() == 1.0)) {
    return false;
  }
  if (!fitsDirectOutput(out)) {
    return false;
  }
  for (const Input* input : {&a, &b}) {
    const DeviceTensorRef* ref = input->deviceRef();
    if (ref == nullptr ? !input->realScalar()
                       : ref->dtype != out.dtype() || ref->is_conj ||
                             ref->is_neg || ref->sizes != out.sizes() ||
                             ref->strides != out.strides()) {
      return false;
    }
  }
  return true;
}

// What the direct loop's queued kernel needs, and no more: where each
// operand starts and how many elements, or a CPU scalar's value already
// converted to the op's dtype (the conversion the CPU kernel makes, made
// at the call instead of on the worker). A few plain words, so the launch
// copies no sizes or strides (a DeviceTensorRef's inline vectors).
struct DirectOperand {
  void* storage_data = nullptr;  // null: the scalar below
  int64_t storage_offset = 0;
  float scalar_float = 0;
  double scalar_double = 0;

  static DirectOperand of(const Input& input) {
    DirectOperand operand;
    if (const DeviceTensorRef* ref = input.deviceRef()) {
      operand.storage_data = ref->storage_data;
      operand.storage_offset = ref->storage_offset;
    } else {
      operand.scalar_float = input.scalarAs<float>();
      operand.scalar_double = input.scalarAs<double>();
    }
    return operand;
  }
  template <typename T>
  T scalar() const {
    if constexpr (std::is_same_v<T, float>) {
      return scalar_float;
    } else {
      return scalar_double;
    }
  }
};

struct DirectBinary {
  Binary op;
  bool is_float;
  int64_t numel;
  void* out_data;
  int64_t out_offset;
  DirectOperand a;
  DirectOperand b;

  template <typename T, typename Op>
  void loop(Op op) const {
    const int64_t n = numel;
    T* o = kernelPointer<T>(out_data, out_offset);
    // `out` is an input itself (x.add_(y)) or overlaps none (writable()):
    // no element is read after another one is written.
    if (a.storage_data && b.storage_data) {
      const T* x = kernelPointer<T>(a.storage_data, a.storage_offset);
      const T* y = kernelPointer<T>(b.storage_data, b.storage_offset);
#pragma GCC ivdep
      for (int64_t i = 0; i < n; ++i) {
        o[i] = op(x[i], y[i]);
      }
    } else if (a.storage_data) {
      const T* x = kernelPointer<T>(a.storage_data, a.storage_offset);
      const T y = b.scalar<T>();
#pragma GCC ivdep
      for (int64_t i = 0; i < n; ++i) {
        o[i] = op(x[i], y);
      }
    } else {
      const T x = a.scalar<T>();
      const T* y = kernelPointer<T>(b.storage_data, b.storage_offset);
#pragma GCC ivdep
      for (int64_t i = 0; i < n; ++i) {
        o[i] = op(x, y[i]);
      }
    }
  }

  template <typename T>
  void run() const {
    switch (op) {
      case Binary::kAdd: return loop<T>([](T x, T y) { return x + y; });
      case Binary::kMul: return loop<T>([](T x, T y) { return x * y; });
      case Binary::kDiv: return loop<T>([](T x, T y) { return x / y; });
      case Binary::kSub: break;  // never direct (fitsDirectLoop)
    }
  }

  void operator()() const {
    if (is_float) {
      run<float>();
    } else {
      run<double>();
    }
  }
};

// Queues `out = op(a, b, alpha)` on the current stream of `device`.
void queueBinary(Binary op, const at::Tensor& out, Input a, Input b,
                 const at::Scalar& alpha, c10::Device device) {
  if (fitsDirectLoop(op, out, a, b, alpha)) {
    checkInsideStorage(out);  // as DeviceTensorRef(out) would
    const DirectBinary work{op,
                            out.scalar_type() == c10::kFloat,
                            out.numel(),
                            out.storage().mutable_data(),
                            out.storage_offset(),
                            DirectOperand::of(a),
                            DirectOperand::of(b)};
    launchAsync(getCurrentPhantomStream(device.index()), nameOf(op), work);
    return;
  }
  const PhantomStream stream = getCurrentPhantomStream(device.index());
  launchAsync(stream, nameOf(op),
              [op, out = DeviceTensorRef(out), a = std::move(a),
               b = std::move(b), alpha, aliases = NodeAliases::forStream(stream)] {
                // [out, a?, b?]: a CPU scalar input is made at each run.
                c10::SmallVector<const DeviceTensorRef*, 3> refs{&out};
                if (a.deviceRef()) refs.push_back(a.deviceRef());
                if (b.deviceRef()) refs.push_back(b.deviceRef());
                aliases.run(refs, [&](c10::ArrayRef<at::Tensor> cpu) {
                  // As the CPU's autograd kernel calls the CPU kernel.
                  const at::AutoDispatchBelowADInplaceOrView below_autograd;
                  size_t next = 1;
                  const at::Tensor a_cpu = a.deviceRef() ? cpu[next++] : a.scalarTensor();
                  const at::Tensor b_cpu = b.deviceRef() ? cpu[next++] : b.scalarTensor();
                  at::Tensor result = cpu[0];
                  runBinary(op, result, a_cpu, b_cpu, alpha);
                });
              });
}

// How a call gets its output; each form has its own CPU admission.
enum class Form { kFresh, kByMeta, kInPlace, kOut };

CpuAdmission& admissionFor(Binary op, Form form) {
  static CpuAdmission admissions[4][4];
  return admissions[static_cast<int>(op)][static_cast<int>(form)];
}

// The output a probe writes: `self`'s probe for an in-place call, `out`'s
// for an out= call, else a fresh one computed by `fresh` from the inputs.
template <typename Fresh>
bool binaryAdmittedByCpu(Binary op, Form form, const at::Tensor& self,
                         const at::Tensor& other, const at::Scalar& alpha,
                         const at::Tensor& out, const Input& a,
                         const Input& b, Fresh fresh) {
  CallSignature signature;  // short enough to need no allocation
  signature.tensor(self).tensor(other).scalarKind(alpha);
  if (form == Form::kOut) {
    signature.tensor(out);
  }
  if (!scalarsFit(alpha, {self.scalar_type(), other.scalar_type()}) ||
      (out.defined() && !scalarsFit(alpha, {out.scalar_type()}))) {
    return false;
  }
  return admissionFor(op, form).admits(signature, [&] {
    const at::Tensor pa = a.toProbe(self);
    const at::Tensor pb = b.toProbe(other);
    at::Tensor result = form == Form::kInPlace ? pa
                        : form == Form::kOut   ? probeTensor(out)
                                               : fresh(pa, pb);
    runBinary(op, result, pa, pb, alpha);
  });
}

// Tries the native path for out = op(self, other, alpha); `out` undefined
// means a fresh output, returned in `*fresh` (null when `out` is given).
// False: declined.
bool tryBinary(Binary op, const at::Tensor& self, const at::Tensor& other,
               const at::Scalar& alpha, const at::Tensor& out, bool in_place,
               at::Tensor* fresh) {
  TORCH_INTERNAL_ASSERT(out.defined() != (fresh != nullptr));
  const std::optional<c10::Device> device = deviceOf({&self, &other});
  if (!device) {
    return false;
  }
  std::optional<Input> a = Input::from(self, *device);
  std::optional<Input> b = Input::from(other, *device);
  if (!a || !b || (in_place && self.device() != *device)) {
    return false;
  }
  const std::optional<ResultMeta> meta = resultOf(self, &other);
  if (!meta) {
    return false;
  }
  // add and sub refuse a boolean or complex alpha for a floating result:
  // the generic path raises that at the call.
  if (alpha.isBoolean() || alpha.isComplex()) {
    return false;
  }
  if (out.defined()) {
    if (!writable(out, *device, meta->dtype, meta->shape, {&self, &other})) {
      return false;
    }
  } else {
    for (const at::Tensor* t : {&self, &other}) {
      if (t->dim() != 0 && !t->is_contiguous()) {
        return false;  // the CPU would give the output the inputs' layout
      }
    }
  }
  const Form form = in_place ? Form::kInPlace
                    : out.defined() ? Form::kOut
                                    : Form::kFresh;
  const c10::ScalarType dtype = meta->dtype;
  const bool admitted = binaryAdmittedByCpu(
      op, form, self, other, alpha, out, *a, *b,
      [dtype](const at::Tensor& pa, const at::Tensor& pb) {
        return at::empty(at::infer_size_dimvector(pa.sizes(), pb.sizes()),
                         at::TensorOptions(dtype));
      });
  if (!admitted) {
    return false;
  }
  const c10::DeviceGuard guard(*device);
  if (out.defined()) {
    queueBinary(op, out, std::move(*a), std::move(*b), alpha, *device);
  } else {
    *fresh = emptyOnCurrentDevice(meta->shape, meta->dtype);
    queueBinary(op, *fresh, std::move(*a), std::move(*b), alpha, *device);
  }
  return true;
}

// One native-call counter per op form, for the ops report.
NativeOpCounter& counterFor(Binary op) {
  static NativeOpCounter counters[] = {
      NativeOpCounter("aten::add"), NativeOpCounter("aten::sub"),
      NativeOpCounter("aten::mul"), NativeOpCounter("aten::div")};
  return counters[static_cast<int>(op)];
}

// A meta tensor like `t`; CPU scalars stay as they are (TensorIterator
// accepts them next to tensors of any device).
at::Tensor metaOf(const at::Tensor& t) {
  return isPhantom(t) ? metaLike(t) : t;
}

// The same for a probe's input: a host tensor, or a CPU scalar.
at::Tensor metaOfProbe(const at::Tensor& t) {
  return t.unsafeGetTensorImpl()->is_wrapped_number() ? t : metaLike(t);
}

at::Tensor metaResult(Binary op, const at::Tensor& a, const at::Tensor& b,
                      const at::Scalar& alpha) {
  switch (op) {
    case Binary::kAdd: return at::meta::add(a, b, alpha);
    case Binary::kSub: return at::meta::sub(a, b, alpha);
    case Binary::kMul: return at::meta::mul(a, b);
    case Binary::kDiv: return at::meta::div(a, b);
  }
  return {};
}

// Functional forms the fast checks decline (integer or bool results,
// strided inputs): ATen's C++ meta function gives the output, with the
// layout the CPU kernel would give it, and makes the CPU's checks. The
// CPU kernel of a functional op that passed them cannot fail. Undefined:
// declined (arguments the meta function refuses, other devices).
at::Tensor tryBinaryByMeta(Binary op, const at::Tensor& self,
                           const at::Tensor& other, const at::Scalar& alpha) {
  const std::optional<c10::Device> device = deviceOf({&self, &other});
  if (!device) {
    return {};
  }
  std::optional<Input> a = Input::from(self, *device);
  std::optional<Input> b = Input::from(other, *device);
  if (!a || !b) {
    return {};
  }
  // Remembered per op (OutputGeometry.h): gradients summed by autograd
  // from a transposed and a plain input come here on every step.
  static OutputGeometryMemo geometries[4];
  GeometryKey key({});
  key.tensor(self).tensor(other).scalar(alpha);
  const std::optional<OutputGeometry> geometry =
      geometries[static_cast<int>(op)].outputOf(key, [&]() -> std::optional<at::Tensor> {
        at::Tensor meta;
        try {
          meta = metaResult(op, metaOf(self), metaOf(other), alpha);
        } catch (const c10::Error&) {
          return std::nullopt;  // the generic path raises the CPU's own error
        }
        if (c10::isFloat8Type(meta.scalar_type())) {
          return std::nullopt;  // refused by the CPU kernel, not by the meta function
        }
        const bool admitted = binaryAdmittedByCpu(
            op, Form::kByMeta, self, other, alpha, at::Tensor(), *a, *b,
            [op, &alpha](const at::Tensor& pa, const at::Tensor& pb) {
              const at::Tensor m =
                  metaResult(op, metaOfProbe(pa), metaOfProbe(pb), alpha);
              return at::empty_strided(m.sizes(), m.strides(),
                                       at::TensorOptions(m.scalar_type()));
            });
        if (!admitted) {
          return std::nullopt;
        }
        return meta;
      });
  if (!geometry) {
    return {};
  }
  const c10::DeviceGuard guard(*device);
  at::Tensor result =
      emptyOnCurrentDevice(geometry->sizes, geometry->strides, geometry->dtype);
  queueBinary(op, result, std::move(*a), std::move(*b), alpha, *device);
  return result;
}

template <Binary Op>
at::Tensor functional(const at::Tensor& self, const at::Tensor& other,
                      const at::Scalar& alpha) {
  at::Tensor result;
  if (!tryBinary(Op, self, other, alpha, {}, false, &result)) {
    result = tryBinaryByMeta(Op, self, other, alpha);
  }
  if (result.defined()) {
    counterFor(Op).count();
    return result;
  }
  torch::jit::Stack stack = Op == Binary::kMul || Op == Binary::kDiv
                                ? boxArguments(self, other)
                                : boxArguments(self, other, alpha);
  runGenericBoxed(nameOf(Op), "Tensor", &stack);
  return stack.back().toTensor();
}

template <Binary Op>
at::Tensor& inPlace(at::Tensor& self, const at::Tensor& other,
                    const at::Scalar& alpha) {
  if (tryBinary(Op, self, other, alpha, self, true, nullptr)) {
    counterFor(Op).count();
    return self;
  }
  torch::jit::Stack stack = Op == Binary::kMul || Op == Binary::kDiv
                                ? boxArguments(self, other)
                                : boxArguments(self, other, alpha);
  const std::string name = std::string(nameOf(Op)) + "_";
  runGenericBoxed(name.c_str(), "Tensor", &stack);
  return self;
}

template <Binary Op>
at::Tensor& outForm(const at::Tensor& self, const at::Tensor& other,
                    const at::Scalar& alpha, at::Tensor& out) {
  if (tryBinary(Op, self, other, alpha, out, false, nullptr)) {
    counterFor(Op).count();
    return out;
  }
  torch::jit::Stack stack = Op == Binary::kMul || Op == Binary::kDiv
                                ? boxArguments(self, other, out)
                                : boxArguments(self, other, alpha, out);
  runGenericBoxed(nameOf(Op), "out", &stack);
  return out;
}

// mul and div take no alpha.
template <Binary Op>
at::Tensor functional2(const at::Tensor& self, const at::Tensor& other) {
  return functional<Op>(self, other, 1);
}
template <Binary Op>
at::Tensor& inPlace2(at::Tensor& self, const at::Tensor& other) {
  return inPlace<Op>(self, other, 1);
}
template <Binary Op>
at::Tensor& outForm2(const at::Tensor& self, const at::Tensor& other,
                     at::Tensor& out) {
  return outForm<Op>(self, other, 1, out);
}

// relu is clamp_min(self, 0) on the CPU (ATen's Activation.cpp), so the
// queued kernel calls clamp_min_out into the device output.
NativeOpCounter relu_counter("aten::relu");
NativeOpCounter relu_inplace_counter("aten::relu_");

CpuAdmission relu_admission;

// relu's direct loop, for float and double tensors too small for the CPU
// kernel to go parallel. The CPU's clamp_min kernel computes max(a, 0) as
// a < 0 ? 0 : a, in its vector lanes (max_ps(0, a) returns a when a is
// NaN or a zero) and in its scalar tail (std::max(a, 0)) alike, so this
// loop is bit-identical to it: NaNs keep their payload and sign, -0 stays
// -0 (tests/python/test_graphs_nodes.py compares the bits).
struct DirectRelu {
  bool is_float;
  int64_t numel;
  void* in_data;
  int64_t in_offset;
  void* out_data;
  int64_t out_offset;

  template <typename T>
  void loop() const {
    const int64_t n = numel;
    const T* x = kernelPointer<T>(in_data, in_offset);
    T* o = kernelPointer<T>(out_data, out_offset);
    // `out` is `in` itself (relu_) or a fresh tensor.
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) {
      o[i] = x[i] < T(0) ? T(0) : x[i];
    }
  }

  void operator()() const {
    if (is_float) {
      loop<float>();
    } else {
      loop<double>();
    }
  }
};

bool reluQueued(const at::Tensor& self, const at::Tensor& out) {
  if (!isPlainPhantom(self) || !computedFloatingType(self.scalar_type())) {
    return false;
  }
  const bool admitted =
      relu_admission.admits(CallSignature().tensor(self), [&] {
        const at::Tensor probe = probeTensor(self);
        at::Tensor result = at::empty_like(probe);
        at::cpu::clamp_min_out(result, probe, 0);
      });
  if (!admitted) {
    return false;
  }
  // The callers hold a guard of self's device (relu's for its output).
  const PhantomStream stream = getCurrentPhantomStream(self.device().index());
  if (fitsDirectOutput(self)) {
    // Both contiguous (the callers' condition): out is self or fresh.
    checkInsideStorage(self);  // as DeviceTensorRef would
    checkInsideStorage(out);
    const DirectRelu work{self.scalar_type() == c10::kFloat,
                          self.numel(),
                          self.storage().mutable_data(),
                          self.storage_offset(),
                          out.storage().mutable_data(),
                          out.storage_offset()};
    launchAsync(stream, "aten::relu", work);
    return true;
  }
  launchAsync(stream, "aten::relu",
              [in = DeviceTensorRef(self), out = DeviceTensorRef(out),
               aliases = NodeAliases::forStream(stream)] {
                aliases.run({&out, &in}, [](c10::ArrayRef<at::Tensor> cpu) {
                  const at::AutoDispatchBelowADInplaceOrView below_autograd;
                  at::Tensor result = cpu[0];
                  at::cpu::clamp_min_out(result, cpu[1], 0);
                });
              });
  return true;
}

at::Tensor relu(const at::Tensor& self) {
  if (isPhantom(self) && self.is_contiguous() &&
      c10::isFloatingType(self.scalar_type())) {
    const c10::DeviceGuard guard(self.device());
    at::Tensor out = emptyOnCurrentDevice(self.sizes(), self.scalar_type());
    if (reluQueued(self, out)) {
      relu_counter.count();
      return out;
    }
  }
  torch::jit::Stack stack = boxArguments(self);
  runGenericBoxed("aten::relu", "", &stack);
  return stack.back().toTensor();
}

at::Tensor& reluInPlace(at::Tensor& self) {
  bool queued = false;
  if (isPhantom(self) && self.is_contiguous()) {
    const c10::DeviceGuard guard(self.device());
    queued = reluQueued(self, self);
  }
  if (queued) {
    relu_inplace_counter.count();
    return self;
  }
  torch::jit::Stack stack = boxArguments(self);
  runGenericBoxed("aten::relu_", "", &stack);
  return self;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("add.Tensor", TORCH_FN(functional<Binary::kAdd>));
  m.impl("add_.Tensor", TORCH_FN(inPlace<Binary::kAdd>));
  m.impl("add.out", TORCH_FN(outForm<Binary::kAdd>));
  m.impl("sub.Tensor", TORCH_FN(functional<Binary::kSub>));
  m.impl("sub_.Tensor", TORCH_FN(inPlace<Binary::kSub>));
  m.impl("sub.out", TORCH_FN(outForm<Binary::kSub>));
  m.impl("mul.Tensor", TORCH_FN(functional2<Binary::kMul>));
  m.impl("mul_.Tensor", TORCH_FN(inPlace2<Binary::kMul>));
  m.impl("mul.out", TORCH_FN(outForm2<Binary::kMul>));
  m.impl("div.Tensor", TORCH_FN(functional2<Binary::kDiv>));
  m.impl("div_.Tensor", TORCH_FN(inPlace2<Binary::kDiv>));
  m.impl("div.out", TORCH_FN(outForm2<Binary::kDiv>));
  m.impl("relu", TORCH_FN(relu));
  m.impl("relu_", TORCH_FN(reluInPlace));
}

}  // namespace phantom
