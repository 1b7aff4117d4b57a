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

``bind_to_cores()`` gives each of a machine's ranks cores of its own, as
``torchrun --numa-binding=exclusive`` does for CUDA ranks (which it finds
through ``torch.cuda``, so not for phantom): a rank's host thread,
autograd's device thread and the stream workers then share that rank's
cores instead of migrating across every core with the other ranks' threads.
See docs/distributed.md.
"""

import os
from typing import Dict, FrozenSet, List, Optional, Set

import torch

from ._name import BACKEND_NAME

__all__ = ["C10D_BACKEND_NAME", "bind_to_cores"]

# The CPUs the process could run on before its first bind_to_cores(): later
# calls split these again, so that a second call gives the same cores.
_unbound_cpus: Optional[FrozenSet[int]] = None


def _siblings(cpu: int) -> FrozenSet[int]:
    """The logical CPUs of `cpu`'s physical core (itself when the kernel
    does not say)."""
    path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return frozenset({cpu})
    cpus = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def _cores(cpus: FrozenSet[int]) -> List[FrozenSet[int]]:
    """`cpus` grouped by physical core, in the order of their first CPU."""
    cores: Dict[FrozenSet[int], None] = {}
    for cpu in sorted(cpus):
        cores.setdefault(_siblings(cpu) & cpus, None)
    return list(cores)


def _local_value(value: Optional[int], argument: str, variable: str) -> int:
    if value is None:
        text = os.environ.get(variable)
        if text is None:
            raise ValueError(
                f"bind_to_cores() needs {argument}: pass {argument}=, or launch "
                f"with torchrun, which sets {variable}"
            )
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"bind_to_cores(): {variable}={text!r} is not an integer") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"bind_to_cores(): {argument} must be an int, got {value!r}")
    return value


def bind_to_cores(local_rank: Optional[int] = None,
                  local_world_size: Optional[int] = None) -> Set[int]:
    """Binds every thread of this process to a share of the machine's cores
    of its own, and returns the CPUs of that share.

    The process's CPUs (``os.sched_getaffinity`` before the first call) are
    grouped by physical core and split into `local_world_size` contiguous
    shares, as evenly as whole cores allow; local rank r gets share r, so
    the machine's ranks never share a core. The threads started afterwards
    (Gloo's, the stream workers', OpenMP's) inherit the binding. The
    arguments default to ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``, which
    torchrun sets. Call it at the top of each rank's script, before the
    training loop; calling it again with the same arguments binds the same
    cores. Raises ValueError, binding nothing, when there are fewer cores
    than local ranks or the rank is out of range.
    """
    global _unbound_cpus
    rank = _local_value(local_rank, "local_rank", "LOCAL_RANK")
    size = _local_value(local_world_size, "local_world_size", "LOCAL_WORLD_SIZE")
    if size < 1 or not 0 <= rank < size:
        raise ValueError(
            f"bind_to_cores(): local_rank must be in 0..local_world_size-1 and "
            f"local_world_size at least 1, got local_rank={rank}, "
            f"local_world_size={size}"
        )
    allowed = _unbound_cpus if _unbound_cpus is not None else frozenset(os.sched_getaffinity(0))
    cores = _cores(allowed)
    if len(cores) < size:
        raise ValueError(
            f"bind_to_cores(): cannot give each of {size} local ranks a core of its "
            f"own: this process may run on {len(cores)} cores (CPUs "
            f"{sorted(allowed)}); launch at most {len(cores)} ranks per machine, "
            f"or do not bind"
        )
    base, extra = divmod(len(cores), size)
    start = rank * base + min(rank, extra)
    share = cores[start:start + base + (1 if rank < extra else 0)]
    cpus = set().union(*share)
    _unbound_cpus = allowed
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass  # the thread ended since the listing
    return cpus

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
