"""Autograd's device threads at interpreter exit.

Design. On an accelerator, PyTorch runs ``backward()`` on autograd's
device thread for that device index (``pt_autograd_N``), and that thread
may drop the last reference to the finished graph task a moment after
``backward()`` has returned on the main thread. Torch 2.13's ``backward()``
stashes a copy of the ``contextvars`` context in the graph task, so that
drop decrefs a Python object and takes the GIL. If the main thread has
begun finalizing the interpreter by then, CPython ends the device thread
inside a ``noexcept`` frame and the process aborts with ``terminate called
without an active exception``, after all of the script's output
(docs/reliability.md, "An abort at exit right after backward()"). CUDA has
the same threads and the same race; the CPU runs backward on the caller.

The fix owns no PyTorch code: an ``atexit`` hook, registered at the end
of the package's import (so it runs after the user's own hooks, and never
for an import that failed, say on a malformed setting), runs one
scalar backward on every phantom device through the engine directly
(``Variable._execution_engine.run_backward``, which stashes nothing). A
device thread finishes its previous task, dropping that graph task, before
it takes the next one, and ``run_backward`` releases the GIL while it
waits, so the user's last graph task is released while the interpreter is
still whole. The hook's own graph task holds no Python object. It does
nothing in a process where no autograd device thread exists (none ran a
backward on a device, or a child after ``fork``), and an error in it (a
device made unusable by an injected fault, say) is ignored: exit goes on.
"""

import atexit
import os

import torch

from . import device_module
from ._name import BACKEND_NAME


def _autograd_device_threads_exist() -> bool:
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return True  # cannot tell: release anyway
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().startswith("pt_autograd"):
                    return True
        except OSError:
            continue  # the thread ended meanwhile
    return False


def release_autograd_graph_tasks() -> None:
    """Makes every autograd device thread that serves a phantom device
    finish, and release, the graph task it ran last."""
    if not device_module.is_initialized() or not _autograd_device_threads_exist():
        return
    from torch.autograd import Variable

    for index in range(device_module.device_count()):
        try:
            leaf = torch.zeros((), device=torch.device(BACKEND_NAME, index),
                               requires_grad=True)
            root = leaf * 1.0
            Variable._execution_engine.run_backward(
                (root,), (torch.ones_like(root),), False, False, (), True, True)
        except Exception:  # exit must go on whatever state the device is in
            pass


def install() -> None:
    """Registers the exit hooks; the package calls it once it has loaded.
    They run in reverse: graph tasks are released, then PyTorch's GPU trace
    hooks stop, so no later free on another thread takes the GIL."""
    atexit.register(device_module._C._stop_gpu_trace)
    atexit.register(release_autograd_graph_tasks)
