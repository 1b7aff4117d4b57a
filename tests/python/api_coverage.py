"""Builds docs/api-coverage.md: every name of ``torch.cuda.__all__`` with
``torch.phantom``'s answer, and why where phantom has none.

A name is *present* when ``torch.phantom`` has it; otherwise it must be
classified below, as *CUDA-only* (it names something only NVIDIA's stack
has: the CUDA runtime, cuBLAS, NCCL, compiled architectures), *legacy*
(the typed tensor and storage classes), or *missing* (device-generic, not
done yet; with the issue that covers it, if one does). A name torch adds
that nobody classified fails tests/python/test_api_surface.py, as does a
name classified absent that phantom now has.

Regenerate the page after changing either side (from tests/python, with
the package installed):

    python api_coverage.py --write
"""

import argparse
import os
import sys

import torch

import torch_phantom  # noqa: F401  (installs torch.phantom)

PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                    "docs", "api-coverage.md")

CUDA_ONLY = {
    "CudaError": "an error of the CUDA runtime API (a cudaError_t); phantom's "
                 "device errors are torch.AcceleratorError",
    "DeferredCudaCallError": "raised when a call queued before CUDA's lazy "
                             "initialisation fails at it; phantom queues no "
                             "calls before initialisation",
    "GreenContext": "CUDA green contexts (partitioning a GPU's "
                    "multiprocessors)",
    "amp": "the deprecated torch.cuda.amp namespace; use "
           "torch.amp.autocast(\"phantom\") and torch.amp.GradScaler(\"phantom\")",
    "CUDAGraph": "the class under its CUDA name; phantom's is torch.phantom.Graph "
                 "(also PhantomGraph), and torch.accelerator.Graph works",
    "check_error": "checks a cudaError_t",
    "cudaStatus": "cudaError_t constants",
    "cudart": "the CUDA runtime library's bindings",
    "current_blas_handle": "the cuBLAS handle",
    "current_solver_handle": "the cuSOLVER handle",
    "get_arch_list": "the CUDA architectures this build compiled for",
    "get_gencode_flags": "the nvcc flags this build compiled with",
    "has_magma": "whether the MAGMA library was built in",
    "jiterator": "NVRTC-compiled elementwise kernels",
    "nccl": "NCCL collectives; a phantom collective backend would be its own",
    "sparse": "the legacy typed sparse tensor classes of CUDA",
    "tunable": "TunableOp, the cuBLAS/hipBLASLt GEMM tuner",
}

LEGACY = {
    name: "a legacy typed tensor or storage class; use "
          "torch.tensor(..., dtype=..., device=\"phantom\")"
    for name in (
        "BFloat16Storage", "BFloat16Tensor", "BoolStorage", "BoolTensor",
        "ByteStorage", "ByteTensor", "CharStorage", "CharTensor",
        "ComplexDoubleStorage", "ComplexFloatStorage", "DoubleStorage",
        "DoubleTensor", "FloatStorage", "FloatTensor", "HalfStorage",
        "HalfTensor", "IntStorage", "IntTensor", "LongStorage", "LongTensor",
        "ShortStorage", "ShortTensor",
    )
}

# name: (the open issue that covers it, or None; what it is)
_SWAP = (None, "swapping the device allocator for one loaded from a shared "
               "library; a vendor replaces device/runtime/DeviceAllocator.cpp "
               "in C++")
MISSING = {
    "profiler": (23, "the profiler's capture range (a device timeline)"),
    "CUDAPluggableAllocator": _SWAP,
    "change_current_allocator": _SWAP,
}


def _missing_reason(name: str) -> str:
    issue, what = MISSING[name]
    return f"{what}: issue {issue}" if issue is not None else f"{what} (no issue yet)"


def uncovered_missing():
    """Device-generic names phantom lacks that no open issue covers."""
    return sorted(name for name, (issue, _) in MISSING.items()
                  if issue is None and not hasattr(torch.phantom, name))

# Where phantom's answer differs from what a GPU would say.
NOTES = {
    "get_device_capability": "the driver's HAL ABI version, e.g. (1, 2)",
    "get_device_properties": "name, total_memory, multi_processor_count, "
                             "major/minor, is_integrated, is_multi_gpu_board",
    "is_tf32_supported": "False: float32 is computed in full float32",
    "can_device_access_peer": "True between two different devices",
    "temperature": "raises NotImplementedError on the fake driver (no sensor)",
    "power_draw": "raises NotImplementedError on the fake driver (no sensor)",
    "clock_rate": "raises NotImplementedError on the fake driver (no sensor)",
    "utilization": "measured by the fake: its stream workers' busy time",
    "memory_usage": "measured by the fake: its copies' busy time",
    "list_gpu_processes": "this process (the HAL has no process query)",
    "ipc_collect": "frees memory other processes are done with (docs/multiprocessing.md)",
    "memory_snapshot": "segments and blocks, with the stacks that allocated "
                       "them while memory history records; the history is "
                       "torch.phantom.memory._snapshot() (docs/profiling.md)",
    "get_allocator_backend": "\"native\"",
    "set_sync_debug_mode": "also reports the waits phantom itself makes",
}


def classify():
    """[(name, status, reason)] for every name of torch.cuda.__all__, and
    the problems found (unclassified or stale names)."""
    rows, problems = [], []
    for name in sorted(torch.cuda.__all__, key=str.lower):
        present = hasattr(torch.phantom, name)
        absent_reason = name in CUDA_ONLY or name in LEGACY or name in MISSING
        if present:
            if absent_reason:
                problems.append(f"{name}: classified absent but torch.phantom has it; "
                                "remove it from api_coverage.py")
            rows.append((name, "present", NOTES.get(name, "")))
        elif name in CUDA_ONLY:
            rows.append((name, "CUDA-only", CUDA_ONLY[name]))
        elif name in LEGACY:
            rows.append((name, "legacy", LEGACY[name]))
        elif name in MISSING:
            rows.append((name, "missing", _missing_reason(name)))
        else:
            problems.append(f"{name}: torch.cuda has it, torch.phantom does not, and "
                            "api_coverage.py does not say why")
            rows.append((name, "missing", "unclassified"))
    return rows, problems


def render() -> str:
    rows, _ = classify()
    counts = {}
    for _, status, _ in rows:
        counts[status] = counts.get(status, 0) + 1
    uncovered = uncovered_missing()
    own = sorted(set(torch.phantom.__all__) - set(torch.cuda.__all__), key=str.lower)
    lines = [
        "# torch.cuda's API on torch.phantom",
        "",
        "Generated by `tests/python/api_coverage.py` from `torch.cuda.__all__` of",
        f"torch {torch.__version__.split('+')[0]}; "
        "`tests/python/test_api_surface.py` fails when this page is out of",
        "date. Regenerate it with `cd tests/python && python api_coverage.py --write`.",
        "",
        "Device-agnostic code reaches the device module as",
        "`getattr(torch, device_type)`; on phantom that is `torch.phantom`, with",
        "torch.cuda's names and signatures. *present*: `torch.phantom` has it;",
        "*CUDA-only*: it names something only NVIDIA's stack has; *legacy*: a",
        "typed tensor or storage class; *missing*: device-generic and not there",
        "yet, with the issue that covers it.",
        "",
        "| status | names |",
        "|---|---|",
    ]
    for status in ("present", "CUDA-only", "legacy", "missing"):
        lines.append(f"| {status} | {counts.get(status, 0)} |")
    lines += [
        "",
        f"Missing and covered by no issue: {len(uncovered)} "
        f"({', '.join(f'`{n}`' for n in uncovered) or 'none'}).",
        "",
        "| name | status | notes |",
        "|---|---|---|",
    ]
    for name, status, why in rows:
        lines.append(f"| `{name}` | {status} | {why} |")
    lines += [
        "",
        "## phantom's own",
        "",
        "Names of `torch.phantom.__all__` that `torch.cuda` does not have:",
        ", ".join(f"`{name}`" for name in own) + ".",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true",
                        help=f"write {os.path.normpath(PAGE)} (default: print)")
    args = parser.parse_args()
    _, problems = classify()
    for problem in problems:
        print(f"api_coverage: {problem}", file=sys.stderr)
    text = render()
    if args.write:
        with open(PAGE, "w") as page:
            page.write(text)
    else:
        sys.stdout.write(text)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
