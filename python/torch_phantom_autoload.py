"""Entry point of the ``torch.backends`` group: ``import torch`` calls
``load()``. It lives outside the torch_phantom package so that a broken
installation can only warn: torch turns an exception raised here into a
failure of ``import torch`` itself, which must never happen.

Two failures are told apart. A malformed ``PHANTOM_*`` setting (the
package's ``SettingError``, a ValueError carrying the variable's name in
``setting``) is the user's to fix, and the package has loaded nothing: one
warning with the parser's sentence. Anything else is a broken installation:
the warning says to reinstall."""

import warnings


def load() -> None:
    try:
        import torch_phantom  # noqa: F401
    except Exception as error:  # noqa: BLE001 - any failure must only warn
        if isinstance(error, ValueError) and getattr(error, "setting", None):
            message = f"phantom is not loaded: {error}"
        else:
            message = (
                f"the phantom device is unavailable: torch_phantom failed to load "
                f"({type(error).__name__}: {error}). Reinstall it, or set "
                f"TORCH_DEVICE_BACKEND_AUTOLOAD=0 to stop torch from loading it."
            )
        warnings.warn(message, RuntimeWarning, stacklevel=2)
