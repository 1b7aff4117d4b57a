"""The backend's name, defined once for Python (CMake's PHANTOM_BACKEND_NAME
is the C++ side). A vendor fork renames the backend by editing both."""

BACKEND_NAME = "phantom"
