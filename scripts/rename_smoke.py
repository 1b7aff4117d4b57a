"""Smoke test of a build under another backend name (scripts/test_rename.sh).

    python3 scripts/rename_smoke.py NAME PACKAGE_DIR

Run with the renamed package first on PYTHONPATH (PACKAGE_DIR is where it
was installed, to check that it, and not another install, is what loaded).
Checks what a user of the renamed backend relies on: ``import torch``
loads it under NAME (``torch.device("NAME:1")``, ``torch.NAME``,
``Tensor.NAME()``, ``privateuseone`` as an alias), "phantom" is then no
device name at all, and tensors, ops, copies, streams, random numbers,
memory statistics, a backward pass, Dynamo's device interface and the
``python -m torch_phantom`` self-test work under it. Prints one line per
check; exits non-zero at the first failure.
"""

import os
import subprocess
import sys


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    name, package_dir = sys.argv[1], os.path.realpath(sys.argv[2])

    import torch  # autoloads the backend through the torch.backends entry point

    import torch_phantom

    def check(label, condition, detail=""):
        if not condition:
            raise AssertionError(f"{label}: {detail}")
        print(f"ok  {label}")

    check("the renamed package is what loaded",
          os.path.realpath(torch_phantom.__file__).startswith(package_dir + os.sep),
          f"{torch_phantom.__file__} is not under {package_dir}")
    check("the package and c10 agree on the name",
          torch_phantom.BACKEND_NAME == name == torch._C._get_privateuse1_backend_name(),
          f"{torch_phantom.BACKEND_NAME!r}, {torch._C._get_privateuse1_backend_name()!r}")
    module = getattr(torch, name, None)
    check(f"torch.{name} is the device module", module is not None
          and module is torch.get_device_module(name))
    check("torch.phantom does not exist", not hasattr(torch, "phantom"))
    try:
        torch.device("phantom")
        phantom_parses = True
    except RuntimeError:
        phantom_parses = False
    check("'phantom' is not a device name", not phantom_parses)
    check("privateuseone names the same device",
          torch.device("privateuseone:1") == torch.device(f"{name}:1"))

    x = torch.arange(6.0, device=name).reshape(2, 3)
    y = (x * 2 + 1).sum(dim=0)  # native kernels, then a generic-path op
    check("a tensor, ops and .cpu()",
          torch.equal(y.cpu(), (torch.arange(6.0).reshape(2, 3) * 2 + 1).sum(dim=0)))
    check(f"Tensor.{name}() and is_{name}",
          getattr(torch.ones(2), name)().device.type == name
          and getattr(x, f"is_{name}"))
    linear = getattr(torch.nn.Linear(2, 2), name)()
    with torch.autocast(name, dtype=torch.bfloat16):
        out = linear(torch.ones(1, 2, device=name))
    check(f"Module.{name}() and torch.autocast({name!r})",
          out.dtype == torch.bfloat16 and out.device.type == name)
    count = module.device_count()
    check(f"torch.{name}.device_count()", count >= 1, str(count))
    module.synchronize()
    module.synchronize(f"{name}:0")
    check(f"torch.{name}.synchronize()", True)
    if count > 1:
        with module.device(1):
            z = torch.ones(3, device=name)
        check("the device context and device strings with an index",
              z.device == torch.device(name, 1)
              and torch.equal(z.to(f"{name}:0").cpu(), torch.ones(3)))
    try:
        module.synchronize("cpu")
        refused = ""
    except ValueError as error:
        refused = str(error)
    check("device arguments are read under the new name",
          refused.startswith(f"expected a {name} device, got 'cpu'"), refused)
    try:
        torch.ones(1, device=f"{name}:{count}")
        out_of_range = ""
    except RuntimeError as error:
        out_of_range = str(error)
    check("the runtime's errors name the device under the new name",
          out_of_range.startswith(f"{name} device index {count} is out of range")
          and f" {name} device" in out_of_range, out_of_range)

    stream = module.Stream()
    with module.stream(stream):
        w = x @ x.t()
    stream.synchronize()
    check("a stream", torch.equal(w.cpu(), x.cpu() @ x.cpu().t())
          and f"torch.{name}.Stream" in repr(stream))
    module.manual_seed(7)
    state = module.get_rng_state()
    a = torch.rand(4, device=name)
    module.set_rng_state(state)
    check("random numbers and the default device of get/set_rng_state",
          torch.equal(a.cpu(), torch.rand(4, device=name).cpu()))
    check("memory statistics", module.memory_allocated(0) > 0
          and f"PyTorch {name} memory summary" in module.memory_summary())

    weight = torch.randn(3, 3, device=name, requires_grad=True)
    (weight * weight).sum().backward()  # autograd's device thread; exit hook
    check("backward", torch.allclose(weight.grad.cpu(), 2 * weight.detach().cpu()))

    from torch._dynamo import device_interface

    interface = device_interface.get_interface_for_device(name)
    check("Dynamo's device interface", interface.device_count() == count
          and interface.current_stream() == module.current_stream())

    from torch_phantom.testing import faults

    faults.reset()
    torch.ones(1, device=name).add_(1)
    check("torch_phantom.testing.faults", faults.kernel_count() >= 1)

    diagnose = subprocess.run([sys.executable, "-m", "torch_phantom"],
                              capture_output=True, text=True, timeout=120)
    last = diagnose.stdout.rstrip().splitlines()[-1] if diagnose.stdout.strip() else ""
    check("python -m torch_phantom", diagnose.returncode == 0
          and last.startswith(f"{name} self-test: all checks passed"),
          diagnose.stdout[-2000:] + diagnose.stderr[-2000:])
    print(f"rename smoke test passed: the backend is '{name}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
