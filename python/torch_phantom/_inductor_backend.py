"""Phantom's Inductor backend: code generation (compile time).

Inductor splits a backend in two (``torch/_inductor/codegen/common.py``):
a *scheduling*, which turns fused IR nodes into kernels, and a *wrapper
codegen*, which writes the Python function that allocates buffers and
calls the kernels and the extern (ATen) ops in order. Phantom computes
with the host CPU's code, so its scheduling is Inductor's C++/OpenMP one,
with one addition; its wrapper is Inductor's Python wrapper, with three
changes. What runs the result is ``_inductor_kernels.py`` (Python) and
``python/csrc/Compile.cpp`` / ``ops/CompiledKernel.cpp`` (C++).

- ``PhantomCppScheduling`` generates each kernel as the CPU backend does
  and appends a *trampoline*, ``phantom_kernel_entry(const uint64_t*
  args)``, which unpacks one 64-bit word per argument and calls the
  kernel. The launcher can then call any kernel from a flat array of
  words, on a stream's worker, without knowing its signature.
- ``PhantomWrapperCodegen`` compiles kernels through
  ``PhantomAsyncCompile`` (the kernel name is bound to a launcher, not to
  a Python binding that would call the kernel on the host thread), calls
  each phantom kernel like a CPU kernel (``cpp_fused_0(buf0, arg0_1)``:
  the launcher queues it on the current stream), and allocates buffers
  with ``empty_strided_phantom`` on the graph's device.
- ``PhantomDeviceOpOverrides`` says how generated code spells the
  device's guard, current device, stream and synchronize.

A vendor with a real code generator replaces ``PhantomCppScheduling``
(with Triton's scheduling, or their own) and the launcher; the wrapper's
allocation and stream handling stay (docs/compile.md).

Registered when this module is imported, which ``_compile_hooks`` does
once ``torch._inductor.codegen.cpp`` and ``.wrapper`` have been imported.
"""

from torch._inductor.codegen.common import (
    DeviceOpOverrides,
    register_backend_for_device,
    register_device_op_overrides,
)
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.wrapper import (
    PythonWrapperCodegen,
    SubgraphPythonWrapperCodegen,
)
from torch._inductor.custom_graph_pass import CustomGraphModulePass, get_hash_for_files
from torch._inductor.utils import Placeholder

from ._name import BACKEND_NAME

# The trampoline's symbol, and the mark by which PhantomAsyncCompile tells
# a phantom kernel's source from a CPU kernel's in the same graph.
ENTRY_SYMBOL = "phantom_kernel_entry"
# The first line of the trampoline's block; DESCRIPTIVE_NAME becomes the
# kernel's name (cpp_fused_..._0), which names the work in stream errors.
ENTRY_MARK = f"// {ENTRY_SYMBOL} of "
_LINKAGE_MACRO = "PH_KERNEL_ENTRY_LINKAGE"


def argument_kinds(arg_types) -> str:
    """One letter per kernel argument, from Inductor's C++ argument types:
    ``p`` a pointer (a tensor), ``c`` a pointer to const (a tensor the
    kernel only reads), ``i`` an integer (a size), ``f`` a float."""
    kinds = []
    for arg_type in arg_types:
        bare = arg_type.replace("const ", "").strip()
        if bare.endswith("*"):
            kinds.append("c" if arg_type.strip().startswith("const ") else "p")
        elif bare == "float":
            kinds.append("f")
        elif bare in ("int64_t", "long", "int32_t", "int", "bool"):
            kinds.append("i")
        else:
            raise NotImplementedError(
                f"{BACKEND_NAME}'s Inductor backend cannot pass a kernel argument of "
                f"C++ type {arg_type!r}"
            )
    return "".join(kinds)


def trampoline_source(arg_types) -> str:
    """The C++ of the trampoline for a kernel taking ``arg_types``."""
    unpacked = []
    for position, (kind, arg_type) in enumerate(zip(argument_kinds(arg_types), arg_types)):
        word = f"args[{position}]"
        if kind in "pc":
            unpacked.append(f"reinterpret_cast<{arg_type}>({word})")
        elif kind == "i":
            unpacked.append(f"static_cast<{arg_type.replace('const ', '')}>({word})")
        else:  # a float travels as a double's bits
            unpacked.append(f"phantom_word_to_float({word})")
    call = ", ".join(unpacked)
    return (
        f"\n{ENTRY_MARK}{Placeholder.DESCRIPTIVE_NAME}\n"
        "static inline float phantom_word_to_float(uint64_t word) {\n"
        "    double value;\n"
        "    std::memcpy(&value, &word, sizeof value);\n"
        "    return static_cast<float>(value);\n"
        "}\n"
        f"{_LINKAGE_MACRO} void {ENTRY_SYMBOL}(const uint64_t* args) {{\n"
        f"    {Placeholder.KERNEL_NAME}({call});\n"
        "}\n"
    )


# Defined before the kernel: Inductor finds the kernel's declaration as the
# last `extern "C"` of the source, which the trampoline's must not be.
_PREAMBLE = (
    "#include <cstdint>\n#include <cstring>\n"
    f'#define {_LINKAGE_MACRO} extern "C" __attribute__((visibility("default")))\n'
)


class PhantomCppScheduling(CppScheduling):
    """Inductor's C++/OpenMP kernels, each with a trampoline the phantom
    launcher calls on a stream's worker.

    The C++ backend gathers consecutive nodes into one kernel function and
    writes it out later (at a flush); on the CPU, where it runs in the
    calling thread, that is only a matter of fewer calls. On phantom the
    call's place in the generated code decides its stream: in a graph with
    user streams, a kernel gathered across a stream switch, or written out
    after the stream's block, would run on another stream than its nodes
    (and use buffers allocated for the first one). So in such graphs each
    node's kernel is written out right after the node, inside its stream's
    block."""

    def ready_to_flush(self) -> bool:
        from torch._inductor.virtualized import V

        if V.graph.scheduler._has_multi_stream_nodes():
            return True
        return super().ready_to_flush()

    def define_kernel(self, src_code, nodes, kernel_args=None):
        args = self.kernel_group.args if kernel_args is None else kernel_args
        _, _, arg_types = args.cpp_argdefs()
        # The preamble goes right before the kernel, after cpp_prefix.h,
        # which Inductor compiles into a precompiled header.
        kernel_start = src_code.rfind('extern "C"')
        src_code = (src_code[:kernel_start] + _PREAMBLE + src_code[kernel_start:]
                    + trampoline_source(arg_types))
        return super().define_kernel(src_code, nodes, kernel_args)


class _PhantomWrapperMixin:
    """What phantom changes in Inductor's Python wrapper (see the module's
    docstring); shared by the graph's wrapper and its subgraphs'."""

    def make_allocation(self, name, device, dtype, shape, stride,
                        allocation_shape=None, is_pinned=False):
        if device.type != BACKEND_NAME:
            return super().make_allocation(name, device, dtype, shape, stride,
                                           allocation_shape, is_pinned)
        if allocation_shape is None:
            allocation_shape = shape
        codegen_shape = self.codegen_python_shape_tuple(shape)
        codegen_allocation_shape = self.codegen_python_shape_tuple(allocation_shape)
        codegen_stride = self.codegen_python_shape_tuple(stride)
        # The device index is explicit: Inductor emits no device guard for
        # devices it does not know as GPUs.
        index = device.index if device.index is not None else 0
        line = (f"{name} = empty_strided_phantom({codegen_allocation_shape}, "
                f"{codegen_stride}, {dtype}, {index})")
        if codegen_shape != codegen_allocation_shape:
            line += f".as_strided({codegen_shape}, {codegen_stride})"
        return line

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None,
                                     triton=True, **kwargs):
        from torch._inductor.virtualized import V

        device = device or V.graph.get_current_device_or_throw()
        if device.type == BACKEND_NAME and not triton:
            # The name is bound to a launcher (_C._CompiledKernel): calling
            # it queues the kernel on the current stream of its tensors'
            # device.
            self.writeline(self.wrap_kernel_call(kernel_name, call_args))
            return
        super()._generate_kernel_call_helper(kernel_name, call_args, device=device,
                                             triton=triton, **kwargs)


class PhantomWrapperCodegen(_PhantomWrapperMixin, PythonWrapperCodegen):
    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if is_subgraph:
            return PhantomSubgraphWrapperCodegen(
                subgraph_name, parent_wrapper, partition_signatures
            )
        return PhantomWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        self.header.splice(
            """
                from torch_phantom._inductor_kernels import PhantomAsyncCompile
                from torch_phantom._inductor_kernels import empty_strided_phantom
                from torch_phantom._inductor_kernels import PhantomDeviceGuard
                async_compile = PhantomAsyncCompile()
            """,
            strip=True,
        )


class PhantomSubgraphWrapperCodegen(_PhantomWrapperMixin, SubgraphPythonWrapperCodegen):
    """Subgraphs (torch.cond's branches, invoke_subgraph) share the root
    graph's header, so they need only the call and allocation changes."""


class PhantomCppWrapperRefusal:
    """Inductor's C++ wrapper (``cpp_wrapper=True``, and AOTInductor, which
    always uses it) for phantom: not supported, said at the call.

    The C++ wrapper calls kernels directly from the generated C++ on the
    calling thread, and AOTInductor's model runtime, compiled into every
    package (``torch/csrc/inductor/aoti_runtime/model_base.h``), accepts
    only ``cpu``, ``cuda``, ``xpu`` and ``mps`` devices for the model's
    constants and buffers. docs/compile.md says what supporting phantom
    would take."""

    supports_caching = False

    @staticmethod
    def create(*args, **kwargs):
        raise NotImplementedError(
            f"Inductor's C++ wrapper (cpp_wrapper=True, and AOTInductor) cannot "
            f"target the {BACKEND_NAME} device: AOTInductor's model runtime accepts "
            f"only cpu, cuda, xpu and mps, and the C++ wrapper would call kernels "
            f"on the host thread. Use torch.compile with the default Python "
            f"wrapper (for an exported program: torch.compile(ep.module())); "
            f"see docs/compile.md"
        )


class PhantomDeviceOpOverrides(DeviceOpOverrides):
    def import_get_raw_stream_as(self, name: str) -> str:
        return f"from torch_phantom._inductor_kernels import get_raw_stream as {name}"

    # The guard runs at every call of a compiled graph: it makes _C's calls,
    # not torch.phantom's (which check initialisation). Inductor writes a
    # set_device line right after entering the guard, which has already
    # made the device current.
    def set_device(self, device_idx: int) -> str:
        return "pass  # PhantomDeviceGuard made the device current"

    def synchronize(self) -> str:
        return f"torch.{BACKEND_NAME}.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"PhantomDeviceGuard({device_idx})"

    def current_stream(self) -> str:
        return f"torch.{BACKEND_NAME}.current_stream()"

    def stream_handle(self, stream_name: str) -> str:
        return f"{stream_name}.stream_id"


class PhantomCodegenIdentity(CustomGraphModulePass):
    """Keeps Inductor's caches honest about phantom's code generator.

    Inductor's FX graph cache stores the generated code of a graph under a
    key that covers torch and Inductor's configuration, not a backend's
    own code: after an upgrade of phantom, a graph compiled before would
    come back with the old trampolines, which the new launcher may call
    differently. A backend's custom pass is part of the key through its
    ``uuid()``, so phantom registers this pass, which changes nothing in
    the graph and whose uuid hashes the files that shape phantom's
    generated code and its launcher's calling convention.

    The uuid also carries the thread count the C++ kernels are generated
    for (``parallel_num_threads()``: per-thread accumulators and the
    cascade summation's depths depend on it). Inductor adds that count to
    the key only for graphs with CPU tensors, so without it a phantom graph
    compiled under 2 threads would be taken from the cache under 1 thread
    (a different summation than the CPU's), or under more threads than it
    has accumulators for."""

    FILES = ("_inductor_backend.py", "_inductor_kernels.py", "_inductor_patches.py")

    def __call__(self, gm) -> None:
        pass

    def __init__(self):
        self._uuid = None

    def uuid(self):
        if self._uuid is None:  # the files do not change while the process runs
            import os

            from . import _C

            here = os.path.dirname(os.path.abspath(__file__))
            paths = tuple(os.path.join(here, name) for name in self.FILES) + (_C.__file__,)
            self._uuid = get_hash_for_files(paths)
        from torch._inductor.utils import parallel_num_threads

        return (self._uuid, parallel_num_threads())


_registered = False


def register() -> None:
    """Registers the backend and the device op overrides. Idempotent; run
    when this module is imported."""
    global _registered
    if _registered:
        return
    from . import _inductor_patches

    _inductor_patches.apply()
    register_backend_for_device(BACKEND_NAME, PhantomCppScheduling, PhantomWrapperCodegen,
                                PhantomCppWrapperRefusal,
                                device_custom_pass=PhantomCodegenIdentity())
    register_device_op_overrides(BACKEND_NAME, PhantomDeviceOpOverrides())
    _registered = True


register()
