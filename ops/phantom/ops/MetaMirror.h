// The generic path's asynchronous half, part 1: the meta mirror, which
// computes an op's output metadata on the host before its CPU kernel runs.
//
// The host has to return an op's outputs before the queued CPU kernel has
// run, so it must know their sizes, strides and dtypes ahead. The op's
// Meta kernel computes them from meta tensors that mirror the phantom
// arguments: same sizes, strides, offsets, dtype and conj/neg bits, and the
// same storage sharing (two views of one phantom storage are two views of
// one meta storage), but no memory. What the Meta kernel returns is then
// read back against the mirror: a result that is a mirror itself is that
// argument (in-place, out=), a result inside a mirrored storage is a view
// of that argument's storage, any other result is fresh; a mirror the Meta
// kernel resized is an out= argument the op resizes (applyResizes does it
// to the phantom argument). The helpers below find arguments and flatten
// results the same way for the mirror, the remembered outputs
// (RememberedOutputs.h) and the queued work (AsyncFallback.cpp).
#pragma once

#include <phantom/ops/GenericPath.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <unordered_map>
#include <utility>
#include <vector>

namespace phantom {
namespace async_path {

// Gives phantom tensor `t` this geometry (an out= argument the op resizes),
// growing its storage if it is too small. Nothing if it has it already.
void resizeArgument(const at::Tensor& t, c10::IntArrayRef sizes,
                    c10::IntArrayRef strides, int64_t offset);

// The index of the argument that is `t` itself (not a tensor inside a
// list), or args.size() if none is.
size_t argumentIndexOf(c10::ArrayRef<c10::IValue> args, const at::Tensor& t);

// True when another argument (or a tensor in a list) shares argument
// `index`'s storage.
bool sharesStorageWithAnother(c10::ArrayRef<c10::IValue> args, size_t index);

// Appends the tensors of `value` (a tensor or a tensor list) to `out`.
void flatten(const c10::IValue& value, std::vector<at::Tensor>& out);

// An op's results, flattened as flatten() does, except that a None result
// (a `Tensor?` return) takes a place too, as an undefined tensor: result
// indices then mean the same on the host (Meta kernel, trial run) and in
// the queued work.
void flattenResults(c10::ArrayRef<c10::IValue> results, std::vector<at::Tensor>& out);

// Mirrors phantom tensors as meta tensors, keeping storage sharing and
// identity: a tensor passed twice (self and out of an in-place op routed
// through its out= form) is mirrored once, so the Meta kernel sees an
// output that is also an input and refuses, as the CPU kernel does, to
// resize it to the broadcast shape.
class MetaMirror {
 public:
  // `empty`: the mirror has no elements (an out= argument; see
  // runGenericAsync).
  at::Tensor mirror(const at::Tensor& tensor, bool empty = false);

  c10::IValue mirror(const c10::IValue& value);

  // The phantom argument whose mirror is `meta` itself, if any.
  const at::Tensor* argumentFor(const at::Tensor& meta) const;

  // The phantom storage whose mirror `meta` lives in, if any.
  const c10::Storage* storageFor(const at::Tensor& meta) const;

  // The resizes the Meta kernel made to mirrors (out= arguments of the
  // wrong shape), by argument index; false if a resized tensor is not an
  // argument itself (it is inside a list).
  bool resizes(c10::ArrayRef<c10::IValue> args,
               std::vector<ArgumentGeometry>* out) const;

  // Applies to phantom arguments the resizes the Meta kernel made to their
  // mirrors.
  void applyResizes();

 private:
  struct Mirrored {
    c10::Storage phantom;
    c10::Storage meta;
  };
  std::unordered_map<const c10::StorageImpl*, Mirrored> storages_;
  std::unordered_map<const c10::StorageImpl*, const Mirrored*> by_meta_;
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs_;  // phantom, meta
};

}  // namespace async_path
}  // namespace phantom
