"""pccl: torch.distributed on phantom tensors.

Importing torch_phantom registers the c10d backend ``"pccl"`` for the
``phantom`` device (``torch.distributed.Backend.register_backend``), so
that, as with NCCL on CUDA::

    torch.distributed.init_process_group()                      # phantom: pccl
    torch.distributed.init_process_group(device_id=torch.device("phantom", i))
    torch.distributed.init_process_group("cpu:gloo,phantom:pccl")  # both
    torch.distributed.init_process_group("pccl")                # phantom only

and ``torchrun`` launches it. The backend itself is C++
(device/distributed: the c10d backend, the collective-library seam and
phantom's Gloo staging behind it); its extension module is imported only
when the first group is made, so importing torch_phantom costs nothing
more. ``import torch`` already imports torch.distributed.

Each group gets two Gloo process groups of its own over the group's store:
one moves the data (device memory in place through the driver's kernel
view, or staged through pinned memory without one), the other carries the
per-collective agreement check (see
device/distributed/gloo/phantom/gloo_staging/GlooStaging.h).
Set ``GLOO_SOCKET_IFNAME`` to choose the network interface, as for Gloo.
See docs/distributed.md.
"""

import torch

from ._name import BACKEND_NAME

__all__ = ["C10D_BACKEND_NAME"]

C10D_BACKEND_NAME = "pccl"


def _make_gloo_backends(store, rank, size, timeout):
    """A group's two Gloo process groups over its store: one for the data,
    one for the agreement check. Called from C++ when a group is made
    and when it is split (a DeviceMesh over a group bound to a device)."""
    import torch.distributed as dist

    return (
        dist.ProcessGroupGloo(dist.PrefixStore("pccl/data/", store), rank, size, timeout),
        dist.ProcessGroupGloo(dist.PrefixStore("pccl/control/", store), rank, size, timeout),
    )


def _create_backend(options, backend_options):
    """The creator torch.distributed calls for every new group
    (``extended_api=True``: ``options`` is a
    ``torch._C._distributed_c10d._DistributedBackendOptions``)."""
    from . import _c10d

    if backend_options is not None:
        raise ValueError(
            f"the {C10D_BACKEND_NAME} backend takes no backend options "
            f"(got {backend_options!r}); set the timeout with "
            f"init_process_group(timeout=...)"
        )
    _c10d._set_gloo_factory(_make_gloo_backends)
    return _c10d._new_group(
        options.store, options.group_rank, options.group_size, options.timeout,
        str(options.group_id),
    )


def _register() -> None:
    import torch.distributed as dist

    if not dist.is_available() or C10D_BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(
        C10D_BACKEND_NAME, _create_backend, extended_api=True, devices=[BACKEND_NAME]
    )


_register()
