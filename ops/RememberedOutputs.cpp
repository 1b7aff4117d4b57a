// See phantom/ops/RememberedOutputs.h: the memo of call signatures, the
// signature of a call, and how the CPU's real answer (of a waited call)
// confirms or replaces what was remembered.
#include <phantom/ops/RememberedOutputs.h>

#include <phantom/KernelWarnings.h>
#include <phantom/Settings.h>

#include <algorithm>
#include <complex>
#include <cstdint>

namespace phantom {
namespace async_path {
namespace {

template <typename T>
void put(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof value);
}

// Appends `t`'s signature; `storages` numbers the storages seen so far.
// False for a host mask (a boolean or uint8 CPU tensor that is not a
// scalar, which indexing ops accept): the kernel reads it on the host and
// its count of True decides the outputs' shapes.
bool putTensor(std::string& key, const at::Tensor& t,
               std::vector<const c10::StorageImpl*>& storages) {
  if (!t.defined()) {
    key += 'u';
    return true;
  }
  if (!isPhantom(t) && t.dim() > 0 &&
      (t.scalar_type() == at::kBool || t.scalar_type() == at::kByte)) {
    return false;
  }
  key += isPhantom(t) ? 'P' : 'C';
  put(key, static_cast<int16_t>(t.device().index()));
  put(key, static_cast<int8_t>(t.scalar_type()));
  put(key, static_cast<int8_t>(t.layout()));
  put(key, static_cast<uint8_t>(t.is_conj() | (t.is_neg() << 1) |
                                (t.unsafeGetTensorImpl()->is_wrapped_number() << 2)));
  put(key, static_cast<int32_t>(t.dim()));
  for (int64_t v : t.sizes()) put(key, v);
  if (t.layout() == c10::kStrided) {
    for (int64_t v : t.strides()) put(key, v);
    put(key, t.storage_offset());
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    const auto it = std::find(storages.begin(), storages.end(), storage);
    put(key, static_cast<int32_t>(it - storages.begin()));
    if (it == storages.end()) storages.push_back(storage);
  }
  return true;
}

}  // namespace

std::mutex& memoMutex() {
  static std::mutex mutex;
  return mutex;
}
std::unordered_map<std::string, Remembered>& memo() {
  static auto* table = new std::unordered_map<std::string, Remembered>();
  return *table;
}

bool signatureOf(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                 std::string* key) {
  key->reserve(256);
  put(*key, &op.schema());
  // The name too: a schema freed with its library (torch.library ops in
  // tests) can be reused at the same address by another op.
  *key += op.schema().name();
  *key += '\0';
  const bool pointwise = op.hasTag(at::Tag::pointwise);
  std::vector<const c10::StorageImpl*> storages;
  for (const c10::IValue& arg : args) {
    if (arg.isTensor()) {
      if (!putTensor(*key, arg.toTensor(), storages)) return false;
    } else if (arg.isTensorList()) {
      *key += 'L';
      put(*key, arg.toTensorList().size());
      for (const at::Tensor& t : arg.toTensorList()) {
        if (!putTensor(*key, t, storages)) return false;
      }
    } else if (arg.isOptionalTensorList()) {
      *key += 'O';
      for (const std::optional<at::Tensor>& t : arg.toOptionalTensorList()) {
        if (!t.has_value()) {
          *key += 'n';
        } else if (!putTensor(*key, *t, storages)) {
          return false;
        }
      }
    } else if (arg.isNone()) {
      *key += 'N';
    } else if (arg.isInt()) {
      *key += 'I';
      put(*key, arg.toInt());
    } else if (arg.isDouble()) {
      *key += 'D';
      if (!pointwise) put(*key, arg.toDouble());
    } else if (arg.isBool()) {
      *key += arg.toBool() ? 'T' : 'F';
    } else if (arg.isIntList()) {
      *key += 'i';
      for (int64_t v : arg.toIntList()) put(*key, v);
      *key += ';';
    } else if (arg.isString()) {
      *key += 'S';
      *key += arg.toStringRef();
      *key += '\0';
    } else if (arg.isDevice()) {
      *key += 'V';
      put(*key, static_cast<int16_t>(arg.toDevice().type()));
      put(*key, static_cast<int16_t>(arg.toDevice().index()));
    } else if (arg.isBoolList()) {
      *key += 'b';
      for (bool v : arg.toBoolList()) *key += v ? '1' : '0';
      *key += ';';
    } else if (arg.isGenerator()) {
      *key += 'G';  // outputs do not depend on which generator draws
    } else if (arg.isComplexDouble()) {
      *key += 'Z';
      if (!pointwise) {
        const c10::complex<double> z = arg.toComplexDouble();
        put(*key, z.real());
        put(*key, z.imag());
      }
    } else if (arg.isDoubleList()) {
      *key += 'd';
      for (double v : arg.toDoubleList()) put(*key, v);
      *key += ';';
    } else {
      return false;  // other lists
    }
  }
  return true;
}

bool rememberable(const MetaMirror& mirror, c10::ArrayRef<c10::IValue> args,
                  const torch::jit::Stack& meta_stack, Remembered* out) {
  if (!mirror.resizes(args, &out->resizes)) return false;
  return rememberResults(meta_stack, out, [&](const at::Tensor& meta,
                                              RememberedOutput* result) {
    if (const at::Tensor* argument = mirror.argumentFor(meta)) {
      const size_t i = argumentIndexOf(args, *argument);
      *result = RememberedOutput::argumentAt(i);
      return i < args.size();
    }
    *result = RememberedOutput::freshLike(meta);
    return mirror.storageFor(meta) == nullptr;  // a view is not remembered
  });
}

bool sameAnswer(const Remembered& a, const Remembered& b) {
  if (a.returns != b.returns || a.outputs.size() != b.outputs.size() ||
      a.resizes.size() != b.resizes.size()) {
    return false;
  }
  for (size_t i = 0; i < a.outputs.size(); ++i) {
    const RememberedOutput& x = a.outputs[i];
    const RememberedOutput& y = b.outputs[i];
    if (x.kind != y.kind || x.argument != y.argument || x.dtype != y.dtype ||
        x.sizes != y.sizes || x.strides != y.strides) {
      return false;
    }
  }
  for (size_t i = 0; i < a.resizes.size(); ++i) {
    if (a.resizes[i].index != b.resizes[i].index || a.resizes[i].sizes != b.resizes[i].sizes ||
        a.resizes[i].strides != b.resizes[i].strides ||
        a.resizes[i].offset != b.resizes[i].offset) {
      return false;
    }
  }
  return true;
}

bool debugMemo() {
  // Throws (on every call) if the value is malformed: phantom/Settings.h.
  static const bool on = switchSetting("PHANTOM_DEBUG_MEMO");
  return on;
}

bool observed(c10::ArrayRef<c10::IValue> args, c10::ArrayRef<c10::IValue> results,
              Remembered* out) {
  auto sharesArgumentStorage = [&](const at::Tensor& t) {
    for (const c10::IValue& arg : args) {
      std::vector<at::Tensor> tensors;
      flatten(arg, tensors);
      for (const at::Tensor& a : tensors) {
        if (a.defined() && a.has_storage() && t.storage().is_alias_of(a.storage())) {
          return true;
        }
      }
    }
    return false;
  };
  return rememberResults(results, out, [&](const at::Tensor& t,
                                           RememberedOutput* result) {
    if (t.layout() != c10::kStrided) return false;
    const size_t i = argumentIndexOf(args, t);
    if (i < args.size()) {
      *result = RememberedOutput::argumentAt(i);
      return true;
    }
    *result = RememberedOutput::freshLike(t);
    return !sharesArgumentStorage(t);
  });
}

}  // namespace async_path

using namespace async_path;

void verifyRemembered(const std::string& signature,
                      c10::ArrayRef<c10::IValue> args,
                      c10::ArrayRef<c10::IValue> results,
                      const std::vector<ArgumentGeometry>& before,
                      const std::vector<c10::Warning>& warnings) {
  std::lock_guard<std::mutex> lock(memoMutex());
  auto it = memo().find(signature);
  if (it == memo().end() || it->second.state != Remembered::State::kVerifying) {
    return;
  }
  Remembered& entry = it->second;
  for (const ArgumentGeometry& was : before) {
    // What the argument must look like now: resized as remembered, or as
    // it was, with the same bits and storage object either way.
    ArgumentGeometry want = was;
    for (const ArgumentGeometry& resize : entry.resizes) {
      if (resize.index == was.index) {
        want.sizes = resize.sizes;
        want.strides = resize.strides;
        want.offset = resize.offset;
      }
    }
    const ArgumentGeometry now = ArgumentGeometry::of(was.index, args[was.index].toTensor());
    if (now.sizes != want.sizes || now.strides != want.strides ||
        now.offset != want.offset || now.conj != want.conj ||
        now.neg != want.neg || now.storage != want.storage) {
      entry.state = Remembered::State::kWait;
      return;
    }
  }
  bool same = results.size() == entry.returns.size();
  std::vector<at::Tensor> real;
  for (size_t i = 0; same && i < results.size(); ++i) {
    const c10::IValue& value = results[i];
    if (entry.returns[i] == kNoneReturn) {
      same = value.isNone();
    } else if (entry.returns[i] == kTensorReturn) {
      same = value.isTensor();
    } else {
      same = value.isTensorList() &&
             value.toTensorList().size() == static_cast<size_t>(entry.returns[i]);
    }
    if (same) {
      flattenResults(value, real);
    }
  }
  same = same && real.size() == entry.outputs.size();
  for (size_t i = 0; same && i < real.size(); ++i) {
    const RememberedOutput& want = entry.outputs[i];
    const at::Tensor& got = real[i];
    switch (want.kind) {
      case RememberedOutput::Kind::kUndefined:
        same = !got.defined();
        break;
      case RememberedOutput::Kind::kArgument:
        same = got.defined() && args[want.argument].isTensor() &&
               args[want.argument].toTensor().unsafeGetTensorImpl() ==
                   got.unsafeGetTensorImpl();
        break;
      case RememberedOutput::Kind::kFresh:
        same = got.defined() && got.scalar_type() == want.dtype &&
               got.sizes() == c10::IntArrayRef(want.sizes) &&
               got.strides() == c10::IntArrayRef(want.strides);
        break;
    }
  }
  if (same && !entry.warnings_seen && !warnings.empty()) {
    // Queued calls will raise the warnings the kernel raises at every
    // call: one more waited call tells them from TORCH_WARN_ONCE's.
    entry.warnings = warnings;
    entry.warnings_seen = true;
    entry.state = Remembered::State::kConfirming;
    return;
  }
  if (same) {
    if (entry.warnings_seen) {
      entry.warnings = warningsRaisedAgain(entry.warnings, warnings);
    }
    entry.state = Remembered::State::kUsable;
    entry.wrong = std::make_shared<std::atomic<bool>>(false);
    return;
  }
  // The Meta kernel's answer was not the CPU's (or the CPU's changed from
  // one call to the next): the next call checks the CPU's answer against
  // the CPU's, once.
  Remembered cpu;
  if (!entry.from_cpu && observed(args, results, &cpu)) {
    entry.outputs = std::move(cpu.outputs);
    entry.returns = std::move(cpu.returns);
    entry.resizes.clear();  // an argument the CPU resized fails the next check
    entry.from_cpu = true;
    entry.warnings = warnings;  // the next call's run confirms them too
    entry.warnings_seen = true;
    entry.state = Remembered::State::kConfirming;
  } else {
    entry.state = Remembered::State::kWait;
  }
}

void forgetRemembered(const std::string& signature) noexcept {
  std::lock_guard<std::mutex> lock(memoMutex());
  memo().erase(signature);
}

}  // namespace phantom
