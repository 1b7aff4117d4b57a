"""Entry point of the ``torch.backends`` group: ``import torch`` calls
``load()``. It lives outside the torch_phantom package so that a broken
installation can only warn: torch turns an exception raised here into a
failure of ``import torch`` itself, which must never happen."""

import warnings


def load() -> None:
    try:
        import torch_phantom  # noqa: F401
    except Exception as error:  # noqa: BLE001 - any failure must only warn
        warnings.warn(
            f"the phantom device is unavailable: torch_phantom failed to load "
            f"({type(error).__name__}: {error}). Reinstall it, or set "
            f"TORCH_DEVICE_BACKEND_AUTOLOAD=0 to stop torch from loading it.",
            RuntimeWarning,
            stacklevel=2,
        )
