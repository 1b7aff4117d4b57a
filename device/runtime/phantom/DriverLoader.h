// Loading the HAL driver at run time (phantom/hal.h, "The driver table").
//
// Design. The runtime links no driver: it opens the library the setting
// PHANTOM_DRIVER names (the build's driver, the fake, by default), asks its
// one entry point ph_driver_get_table for the table of functions, and
// checks it once: the ABI major, and that every required member is set.
// HalDispatch.cpp defines the ph_* functions of hal.h and forwards each
// through the table, so the runtime, ops and Python call ph_* as before and
// none of them links the driver. The table kept here is a copy, zero-filled
// past the driver's struct_size: a driver of an older minor simply has its
// later members NULL ("not supported"), and the dispatch applies the
// fallback hal.h documents for each.
//
// Torch-free: tests/driver_abi links these two files without torch.
#ifndef PHANTOM_DRIVER_LOADER_H_
#define PHANTOM_DRIVER_LOADER_H_

#include <phantom/hal.h>

#include <string>

namespace phantom::driver {

struct LoadedDriver {
  // The driver's table, members past its struct_size zeroed. Meaningful
  // only when error is empty.
  ph_driver_table_t table{};
  // The file the library was loaded from (absolute when the loader could
  // tell), or the name asked for when it could not be loaded.
  std::string library;
  // Empty when loaded; otherwise one sentence naming the file, what is
  // wrong and what to do.
  std::string error;

  bool ok() const noexcept { return error.empty(); }
};

// Opens `name` (a path when it contains '/', else a file name looked for
// next to the runtime library, then as the dynamic loader looks) and checks
// its table. Never throws; each call loads anew (the library stays
// loaded). For the process's driver use activeDriver().
LoadedDriver loadDriver(const std::string& name) noexcept;

// The library loaded when PHANTOM_DRIVER is unset: the build's driver.
const char* defaultDriverName() noexcept;

// The driver of this process: PHANTOM_DRIVER (or the default) loaded on
// the first call, the same object afterwards. A malformed PHANTOM_DRIVER
// is an error like a library that cannot be loaded.
const LoadedDriver& activeDriver() noexcept;

}  // namespace phantom::driver

#endif  // PHANTOM_DRIVER_LOADER_H_
