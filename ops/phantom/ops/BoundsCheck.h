// Moved to the CPU-kernel execution layer: device/hostexec/phantom/BoundsCheck.h.
// Kept for ops/Copy.cpp, which includes it by this name; include
// <phantom/BoundsCheck.h> instead, and delete this file once nothing names it.
#pragma once

#include <phantom/BoundsCheck.h>
