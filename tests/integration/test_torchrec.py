"""TorchRec with fbgemm-gpu-cpu on phantom, against the CPU.

An EmbeddingBagCollection over a KeyedJaggedTensor and TorchRec's DLRM run
forward and backward on both devices and must agree bit for bit. fbgemm's
operators have no phantom kernels: they take phantom's generic path, which
queues each op's CPU kernel when it can tell its outputs ahead. The ops
report (torch_phantom.ops_report) says which ops made the host wait: none
may, in these models and in the KeyedJaggedTensor operations TorchRec's
pipelines use (permute, offsets, to_dict, padding, KeyedTensor.regroup).
"""
import copy

import pytest
import torch
import torch_phantom
from torchrec import (EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor,
                      KeyedTensor)
from torchrec.models.dlrm import DLRM

from conftest import assert_same_tensors


def _collection(is_weighted=False):
    torch.manual_seed(0)
    return EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name="t1", embedding_dim=8, num_embeddings=20, feature_names=["f1"]),
            EmbeddingBagConfig(name="t2", embedding_dim=8, num_embeddings=30, feature_names=["f2"]),
        ],
        is_weighted=is_weighted,
        device=torch.device("cpu"),
    )


def _features(device, weighted=False):
    """Two features over a batch of four: f1 has bags of 2, 0, 1, 1 ids."""
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["f1", "f2"],
        values=torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 1, 29], device=device),
        lengths=torch.tensor([2, 0, 1, 1, 1, 3, 1, 1], device=device),
        weights=torch.linspace(0.5, 2.0, 10, device=device) if weighted else None,
    )


def _waits():
    """Ops that made the host wait since the last reset: {op: reason}."""
    return {r["op"]: r["sync_reason"] for r in torch_phantom.ops_report() if r["sync"]}


@pytest.mark.parametrize("weighted", [False, True])
def test_embedding_bag_collection_matches_the_cpu(weighted):
    cpu = _collection(weighted)
    phantom = copy.deepcopy(cpu).to("phantom")
    expected = cpu(_features("cpu", weighted))
    torch_phantom.reset_ops_report()
    got = phantom(_features("phantom", weighted))
    assert got.keys() == expected.keys()
    assert_same_tensors([got.values().detach()], [expected.values().detach()], "pooled embeddings")
    expected.values().pow(2).sum().backward()
    got.values().pow(2).sum().backward()
    assert_same_tensors([p.grad for p in phantom.parameters()],
                        [p.grad for p in cpu.parameters()], "embedding gradients")
    assert _waits() == {}


def test_dlrm_forward_and_backward_match_the_cpu():
    def dlrm():
        return DLRM(embedding_bag_collection=_collection(), dense_in_features=4,
                    dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[16, 1])

    cpu = dlrm()
    phantom = copy.deepcopy(cpu).to("phantom")
    dense = torch.randn(4, 4, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([[1.0], [0.0], [0.0], [1.0]])
    expected = cpu(dense, _features("cpu"))
    torch.nn.functional.binary_cross_entropy_with_logits(expected, labels).backward()
    torch_phantom.reset_ops_report()
    got = phantom(dense.to("phantom"), _features("phantom"))
    torch.nn.functional.binary_cross_entropy_with_logits(got, labels.to("phantom")).backward()
    assert _waits() == {}
    assert_same_tensors([got.detach()], [expected.detach()], "logits")
    assert_same_tensors([p.grad for p in phantom.parameters()],
                        [p.grad for p in cpu.parameters()], "gradients")


@pytest.mark.parametrize("weighted", [False, True])
def test_keyed_jagged_tensor_operations_are_queued_and_match_the_cpu(weighted):
    def operations(device):
        features = _features(device, weighted)
        permuted = features.permute([1, 0])
        padded = features.to_dict()["f1"].to_padded_dense(3)
        a = KeyedTensor(keys=["a", "b"], length_per_key=[2, 3],
                        values=torch.arange(10.0, device=device).reshape(2, 5))
        c = KeyedTensor(keys=["c"], length_per_key=[1], values=torch.ones(2, 1, device=device))
        regrouped = KeyedTensor.regroup([a, c], [["a", "c"], ["b"]])
        results = [features.offsets(), permuted.values(), permuted.lengths(), padded, *regrouped]
        return results + ([permuted.weights()] if weighted else [])

    expected = operations("cpu")
    torch_phantom.reset_ops_report()
    got = operations("phantom")
    paths = {r["op"]: r for r in torch_phantom.ops_report() if r["op"].startswith("fbgemm::")}
    # permute_2D_sparse_data returns its weights as `Tensor?`: None here when
    # the features are unweighted. Its outputs are known ahead all the same.
    assert {"fbgemm::permute_2D_sparse_data", "fbgemm::asynchronous_complete_cumsum",
            "fbgemm::jagged_to_padded_dense_forward"} <= set(paths)
    for op, row in paths.items():
        assert (row["async"], row["sync"]) == (1, 0), (op, row["sync_reason"])
    assert _waits() == {}
    assert_same_tensors(got, expected, "results")
