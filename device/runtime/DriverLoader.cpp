// See phantom/DriverLoader.h: opening the driver library, reading its
// table and checking it once, with one sentence for each way it can fail.
#include <phantom/DriverLoader.h>
#include <phantom/common/settings.h>

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstddef>
#include <cstring>

#ifndef PHANTOM_DEFAULT_DRIVER
#define PHANTOM_DEFAULT_DRIVER "libphantom_fake.so"
#endif

namespace phantom::driver {
namespace {

// Every member of ph_driver_table_t: its offset, the HAL call it stands
// for, and whether a driver may leave it NULL (OPTIONAL in hal.h).
struct Member {
  size_t offset;
  const char* call;
  bool optional;
};

#define PH_MEMBER(name, optional) \
  Member{offsetof(ph_driver_table_t, name), "ph_" #name, optional}

constexpr Member kMembers[] = {
    // ABI 1000
    PH_MEMBER(status_name, false),
    PH_MEMBER(last_error_message, false),
    PH_MEMBER(device_count, false),
    PH_MEMBER(get_device, false),
    PH_MEMBER(set_device, false),
    PH_MEMBER(device_get_properties, false),
    PH_MEMBER(device_synchronize, false),
    PH_MEMBER(mem_get_info, false),
    PH_MEMBER(malloc, false),
    PH_MEMBER(free, false),
    PH_MEMBER(host_malloc, false),
    PH_MEMBER(host_free, false),
    PH_MEMBER(pointer_get_attributes, false),
    PH_MEMBER(kernel_address, true),
    PH_MEMBER(stream_create, false),
    PH_MEMBER(stream_destroy, false),
    PH_MEMBER(stream_query, false),
    PH_MEMBER(stream_synchronize, false),
    PH_MEMBER(stream_get_device, false),
    PH_MEMBER(stream_get_priority, false),
    PH_MEMBER(stream_wait_event, false),
    PH_MEMBER(launch_host_func, false),
    PH_MEMBER(memcpy, false),
    PH_MEMBER(memcpy_async, false),
    PH_MEMBER(memset_async, false),
    PH_MEMBER(event_create, false),
    PH_MEMBER(event_destroy, false),
    PH_MEMBER(event_record, false),
    PH_MEMBER(event_query, false),
    PH_MEMBER(event_synchronize, false),
    PH_MEMBER(event_elapsed_time, false),
    // ABI 1001
    PH_MEMBER(run_host_func, true),
    // ABI 1002
    PH_MEMBER(device_get_telemetry, true),
    PH_MEMBER(ipc_get_mem_handle, true),
    PH_MEMBER(ipc_open_mem_handle, true),
    PH_MEMBER(ipc_close_mem_handle, true),
    PH_MEMBER(ipc_get_event_handle, true),
    PH_MEMBER(ipc_open_event_handle, true),
    // ABI 1004
    PH_MEMBER(stream_begin_capture, true),
    PH_MEMBER(stream_end_capture, true),
    PH_MEMBER(stream_get_capture_info, true),
    PH_MEMBER(graph_get_node_count, true),
    PH_MEMBER(graph_instantiate, true),
    PH_MEMBER(graph_launch, true),
    PH_MEMBER(graph_exec_destroy, true),
    PH_MEMBER(graph_destroy, true),
    PH_MEMBER(graph_debug_dump, true),
    // ABI 1005
    PH_MEMBER(activity_enable, true),
    PH_MEMBER(activity_disable, true),
    PH_MEMBER(activity_get_timestamp, true),
    PH_MEMBER(activity_push_correlation, true),
    PH_MEMBER(activity_pop_correlation, true),
    PH_MEMBER(activity_flush, true),
};

#undef PH_MEMBER

// Every member is listed: a member added to the table without a line here
// fails to compile.
static_assert(sizeof(kMembers) / sizeof(kMembers[0]) ==
                  (sizeof(ph_driver_table_t) -
                   offsetof(ph_driver_table_t, status_name)) /
                      sizeof(void (*)()),
              "list every ph_driver_table_t member in kMembers");

constexpr uint32_t kMajor = PH_HAL_ABI_VERSION / 1000;

std::string Version(uint32_t version) {
  return std::to_string(version) + " (major " + std::to_string(version / 1000) +
         ", minor " + std::to_string(version % 1000) + ")";
}

bool IsFile(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

// The folder this code was loaded from (libphantom_runtime.so's, or the
// test program's), with a trailing '/', or "" if unknown.
std::string OwnFolder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&defaultDriverName), &info) == 0 ||
      info.dli_fname == nullptr) {
    return "";
  }
  const std::string file = info.dli_fname;
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? "" : file.substr(0, slash + 1);
}

// The absolute path of the loaded library that defines `symbol`.
std::string LoadedFrom(void* symbol, const std::string& fallback) {
  Dl_info info{};
  if (dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) {
    return fallback;
  }
  char resolved[PATH_MAX];
  if (::realpath(info.dli_fname, resolved) != nullptr) {
    return resolved;
  }
  return info.dli_fname;
}

const char kWhatToDo[] =
    "set PHANTOM_DRIVER to the file name or path of a phantom driver "
    "library, or unset it for the default ";

}  // namespace

const char* defaultDriverName() noexcept {
  return PHANTOM_DEFAULT_DRIVER;
}

LoadedDriver loadDriver(const std::string& name) noexcept {
  LoadedDriver result;
  result.library = name;
  try {
    // A bare file name: the runtime's own folder first (where the package
    // installs the fake), then the dynamic loader's search.
    std::string to_open = name;
    if (name.find('/') == std::string::npos) {
      const std::string beside = OwnFolder() + name;
      if (!OwnFolder().empty() && IsFile(beside)) to_open = beside;
    }
    void* handle = dlopen(to_open.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      result.error = "cannot load the phantom driver '" + name + "': " +
                     (why != nullptr ? why : "dlopen failed") + "; " +
                     kWhatToDo + defaultDriverName();
      return result;
    }
    dlerror();
    void* entry = dlsym(handle, PH_DRIVER_ENTRY_POINT);
    if (entry == nullptr) {
      result.library = to_open;
      result.error = "'" + to_open +
                     "' is not a phantom driver: it does not export " +
                     PH_DRIVER_ENTRY_POINT +
                     " (phantom/hal.h, \"The driver table\"); " + kWhatToDo +
                     defaultDriverName();
      return result;
    }
    result.library = LoadedFrom(entry, to_open);
    const std::string& file = result.library;
    const auto get_table = reinterpret_cast<ph_driver_get_table_fn>(entry);
    const ph_driver_table_t* table = get_table(PH_HAL_ABI_VERSION);
    if (table == nullptr) {
      result.error = "the phantom driver '" + file +
                     "' refused this runtime's HAL ABI " +
                     Version(PH_HAL_ABI_VERSION) +
                     " (ph_driver_get_table returned NULL); use a driver "
                     "built for HAL ABI major " + std::to_string(kMajor);
      return result;
    }
    constexpr size_t kHeader =
        offsetof(ph_driver_table_t, abi_version) + sizeof(uint32_t);
    if (table->struct_size < kHeader) {
      result.error = "the phantom driver '" + file + "' returned a table of " +
                     std::to_string(table->struct_size) +
                     " bytes, too small to hold its struct_size and "
                     "abi_version; the driver must set struct_size to "
                     "sizeof(ph_driver_table_t)";
      return result;
    }
    const uint32_t version = table->abi_version;
    if (version / 1000 != kMajor) {
      result.error = "the phantom driver '" + file + "' implements HAL ABI " +
                     Version(version) + ", but this runtime needs major " +
                     std::to_string(kMajor) + " (it is built for " +
                     Version(PH_HAL_ABI_VERSION) +
                     "); rebuild the driver against this runtime's "
                     "phantom/hal.h, or " + kWhatToDo + defaultDriverName();
      return result;
    }
    // Members past the driver's struct (a table of an older minor) stay
    // NULL; members past ours (a newer minor's) are not read.
    const size_t size = table->struct_size < sizeof(ph_driver_table_t)
                            ? table->struct_size
                            : sizeof(ph_driver_table_t);
    std::memcpy(&result.table, table, size);
    result.table.struct_size = size;
    std::string missing;
    for (const Member& member : kMembers) {
      void* value = nullptr;
      std::memcpy(&value, reinterpret_cast<const char*>(&result.table) +
                              member.offset, sizeof value);
      if (value == nullptr && !member.optional) {
        missing += std::string(missing.empty() ? "" : ", ") + member.call;
      }
    }
    if (!missing.empty()) {
      result.error = "the phantom driver '" + file + "' (HAL ABI " +
                     Version(version) +
                     ") leaves required calls out of its table: " + missing +
                     "; only the calls marked OPTIONAL in phantom/hal.h may "
                     "be NULL, so the driver must implement these";
      return result;
    }
  } catch (const std::exception& e) {  // std::bad_alloc from the strings
    result.error = std::string("cannot load the phantom driver '") + name +
                   "': " + e.what();
  }
  return result;
}

const LoadedDriver& activeDriver() noexcept {
  static const LoadedDriver driver = [] {
    settings::Value value;
    std::string error;
    if (!settings::ReadEnvironment(settings::kDriver, &value, &error)) {
      LoadedDriver refused;
      refused.library = std::getenv(settings::kDriver.name);
      refused.error = error;
      return refused;
    }
    // The catalogue's default names the fake; the build's driver wins.
    return loadDriver(value.set ? value.text : defaultDriverName());
  }();
  return driver;
}

}  // namespace phantom::driver
