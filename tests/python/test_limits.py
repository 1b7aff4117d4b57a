"""What phantom does not do (README, "Limits"): each limit raises the error
the README quotes, and the way around it the README gives works."""

import numpy as np
import pytest
import torch


def test_quantized_tensors_are_refused_and_dequantized_copies_work():
    q = torch.quantize_per_tensor(torch.tensor([0.5, 1.0]), 0.1, 0, torch.quint8)
    with pytest.raises(NotImplementedError,
                       match="'aten::empty_quantized' with arguments from the "
                             "'Quantizedphantom' backend"):
        q.to("phantom")
    with pytest.raises(NotImplementedError,
                       match="'aten::empty_strided' with arguments from the "
                             "'Quantizedphantom' backend"):
        torch.quantize_per_tensor(torch.ones(2, device="phantom"), 0.1, 0, torch.quint8)
    assert torch.equal(q.dequantize().to("phantom").cpu(), q.dequantize())


def test_a_nested_op_whose_kernel_reads_the_host_is_refused_and_jagged_runs_it():
    parts = [torch.arange(2.0), torch.arange(3.0)]
    strided = torch.nested.nested_tensor(parts, device="phantom")
    with pytest.raises(NotImplementedError,
                       match="aten::sum.dim_IntList is not supported on strided nested "
                             "tensors on phantom"):
        strided.sum(-1, keepdim=True)
    assert torch.equal((strided + 1).cpu().unbind()[1], torch.tensor([1.0, 2.0, 3.0]))
    jagged = torch.nested.nested_tensor(parts, layout=torch.jagged, device="phantom")
    assert torch.equal(jagged.sum(-1).cpu(), torch.tensor([1.0, 3.0]))
    padded = torch.nested.to_padded_tensor(torch.nested.nested_tensor(parts), 0.0)
    assert torch.equal(padded.to("phantom").cpu(), padded)


def test_dlpack_export_is_refused_and_a_cpu_copy_exports():
    t = torch.arange(3.0, device="phantom")
    with pytest.raises(ValueError, match="Unknown device type phantom for Dlpack"):
        t.__dlpack_device__()
    with pytest.raises(ValueError, match="Unknown device type phantom for Dlpack"):
        torch.from_dlpack(t)
    with pytest.raises(RuntimeError, match="Unsupported device in DLTensor"):
        np.from_dlpack(t)
    assert np.from_dlpack(t.cpu()).tolist() == [0.0, 1.0, 2.0]
