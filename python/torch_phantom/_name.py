"""The backend's name: the device type string torch knows the device by
(``torch.device(BACKEND_NAME)``, ``torch.<BACKEND_NAME>``,
``Tensor.<BACKEND_NAME>()``). The build chooses it (CMake's
``PHANTOM_BACKEND_NAME``, default ``"phantom"``; ``bash
scripts/build_python.sh --backend-name NAME``) and writes it into
``_backend_name.py`` beside this file, so the package and the C++ runtime,
which registers the same name with c10, cannot disagree. Every module of
the package takes the name from here; ``torch.device("privateuseone")``
names the device whatever it is called."""

from ._backend_name import BACKEND_NAME

__all__ = ["BACKEND_NAME"]
