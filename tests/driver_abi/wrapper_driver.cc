// Test drivers for tests/driver_abi: the fake driver behind a table that
// a differently built driver would return. Compiled once per kind, each
// into a library of its own exporting ph_driver_get_table only:
//
//   WRAPPER_OLDER_MINOR      a table as a driver of ABI 1000 returns it:
//                            struct_size ends before run_host_func, so
//                            every later member (run_host_func, telemetry,
//                            interprocess) counts as NULL
//   WRAPPER_UNIMPLEMENTED    the current ABI, but its run_host_func answers
//                            PH_ERROR_UNIMPLEMENTED (after releasing the
//                            task, as hal.h requires)
//   WRAPPER_OTHER_MAJOR      abi_version 2003
//   WRAPPER_NULL_REQUIRED    ph_memcpy and ph_event_query left NULL
//   WRAPPER_REFUSES          returns NULL: refuses the runtime's version
//
// The fake itself (FAKE_DRIVER_PATH) is opened privately on the first call
// and its table copied, so every wrapper runs the real fake underneath.
#include <phantom/hal.h>

#include <dlfcn.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>

namespace {

ph_status_t RefuseHostFunc(ph_stream_t, const ph_host_task_t* task) {
  if (task != nullptr && task->release != nullptr) {
    task->release(task->user_data);
  }
  return PH_ERROR_UNIMPLEMENTED;
}

ph_driver_table_t MakeTable() {
  void* fake = dlopen(FAKE_DRIVER_PATH, RTLD_NOW | RTLD_LOCAL);
  if (fake == nullptr) {
    std::fprintf(stderr, "wrapper driver: %s\n", dlerror());
    std::abort();
  }
  const auto get = reinterpret_cast<ph_driver_get_table_fn>(
      dlsym(fake, PH_DRIVER_ENTRY_POINT));
  ph_driver_table_t table = *get(PH_HAL_ABI_VERSION);
#if defined(WRAPPER_OLDER_MINOR)
  table.abi_version = 1000;
  table.struct_size = offsetof(ph_driver_table_t, run_host_func);
  // What an ABI 1000 driver's struct does not hold, it does not set.
  table.run_host_func = nullptr;
  table.device_get_telemetry = nullptr;
  table.ipc_get_mem_handle = nullptr;
  table.ipc_open_mem_handle = nullptr;
  table.ipc_close_mem_handle = nullptr;
  table.ipc_get_event_handle = nullptr;
  table.ipc_open_event_handle = nullptr;
#elif defined(WRAPPER_UNIMPLEMENTED)
  table.run_host_func = &RefuseHostFunc;
#elif defined(WRAPPER_OTHER_MAJOR)
  table.abi_version = 2003;
#elif defined(WRAPPER_NULL_REQUIRED)
  table.memcpy = nullptr;
  table.event_query = nullptr;
#endif
  return table;
}

}  // namespace

extern "C" PH_API const ph_driver_table_t* ph_driver_get_table(
    uint32_t runtime_abi_version) {
  (void)runtime_abi_version;
#if defined(WRAPPER_REFUSES)
  return nullptr;
#else
  static const ph_driver_table_t table = MakeTable();
  return &table;
#endif
}
