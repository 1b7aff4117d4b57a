// Memory handles of the fake driver; see ipc.h.
#include "ipc.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>

#include "config.h"
#include "device_memory.h"
#include "errors.h"
#include "fault_handler.h"

namespace phantom::fake {
namespace {

// The bytes of a memory handle. Plain data, no pointers.
struct MemoryHandleBytes {
  char magic[8];
  int32_t pid;       // the exporting process
  int32_t fd;        // its descriptor of the device memory file
  uint64_t inode;    // the file's identity
  uint64_t dev;
  uint64_t offset;   // the allocation in the file
  uint64_t size;
  int32_t device;
  uint32_t checksum;  // of everything above
};
static_assert(sizeof(MemoryHandleBytes) <= PH_IPC_HANDLE_SIZE,
              "the handle fits in ph_ipc_mem_handle_t");
constexpr char kMemoryMagic[8] = {'p', 'h', 'm', 'e', 'm', '0', '0', '1'};

// FNV-1a: enough to tell a handle from bytes that are not one.
uint32_t Checksum(const void* data, size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint32_t hash = 2166136261u;
  for (size_t i = 0; i < size; ++i) {
    hash = (hash ^ bytes[i]) * 16777619u;
  }
  return hash;
}

ph_status_t NotAHandle() {
  return Fail(PH_ERROR_INVALID_HANDLE,
              "ph_ipc_open_mem_handle: these bytes are not a phantom memory "
              "handle (ph_ipc_get_mem_handle makes one; was it truncated or "
              "changed on the way?)");
}

}  // namespace

ph_status_t CheckIpcOffered(const char* function) {
  if (GetConfig().ipc) return PH_SUCCESS;
  return Fail(PH_ERROR_UNIMPLEMENTED,
              std::string(function) +
                  ": this driver cannot share device memory or events with "
                  "other processes (the fake driver runs with "
                  "PHANTOM_FAKE_NO_IPC=1, a test switch that plays a driver "
                  "without the capability)");
}

int OpenExporterFile(const char* function, int pid, int fd, uint64_t inode,
                     uint64_t dev, ph_status_t* status) {
  const std::string path =
      "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const int opened = open(path.c_str(), O_RDWR | O_CLOEXEC);
  const std::string process = "process " + std::to_string(pid);
  if (opened < 0) {
    const int error = errno;
    std::string why;
    if (error == ENOENT || error == ESRCH) {
      why = process + ", which shared it, has exited or closed it; keep the "
                      "sending process alive until the receiver has opened "
                      "what it sent";
    } else {
      why = "cannot open " + process + "'s shared memory (" + path + ": " +
            std::strerror(error) + "); both processes must run as one user";
    }
    *status = Fail(PH_ERROR_INVALID_HANDLE, std::string(function) + ": " + why);
    return -1;
  }
  struct stat info = {};
  if (fstat(opened, &info) != 0 || static_cast<uint64_t>(info.st_ino) != inode ||
      static_cast<uint64_t>(info.st_dev) != dev) {
    close(opened);
    *status = Fail(PH_ERROR_INVALID_HANDLE,
                   std::string(function) + ": " + process +
                       " no longer has what this handle names (it closed "
                       "the file, or the process id was reused)");
    return -1;
  }
  *status = PH_SUCCESS;
  return opened;
}

ph_status_t ExportMemory(const void* device_ptr, ph_ipc_mem_handle_t* out) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(device_ptr);
  const int device = DeviceOfAddress(address);
  if (device < 0) {
    char text[200];
    std::snprintf(text, sizeof text,
                  "ph_ipc_get_mem_handle: %p is not device memory", device_ptr);
    return Fail(PH_ERROR_INVALID_ARGUMENT, text);
  }
  ExportedAllocation exported;
  const ph_status_t status = GetDeviceMemory(device).Export(address, &exported);
  if (status != PH_SUCCESS) return status;
  MemoryHandleBytes bytes{};
  std::memcpy(bytes.magic, kMemoryMagic, sizeof bytes.magic);
  bytes.pid = static_cast<int32_t>(getpid());
  bytes.fd = exported.fd;
  bytes.inode = exported.inode;
  bytes.dev = exported.dev;
  bytes.offset = exported.offset;
  bytes.size = exported.size;
  bytes.device = device;
  bytes.checksum = Checksum(&bytes, offsetof(MemoryHandleBytes, checksum));
  std::memcpy(out->reserved, &bytes, sizeof bytes);
  return PH_SUCCESS;
}

ph_status_t OpenMemory(const ph_ipc_mem_handle_t& handle, void** out_ptr) {
  MemoryHandleBytes bytes;
  std::memcpy(&bytes, handle.reserved, sizeof bytes);
  if (std::memcmp(bytes.magic, kMemoryMagic, sizeof bytes.magic) != 0 ||
      bytes.checksum != Checksum(&bytes, offsetof(MemoryHandleBytes, checksum)) ||
      bytes.size == 0) {
    return NotAHandle();
  }
  if (bytes.pid == static_cast<int32_t>(getpid())) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                "ph_ipc_open_mem_handle: this process exported the handle; "
                "use the device pointer it was made from");
  }
  const int count = GetConfig().device_count;
  if (bytes.device < 0 || bytes.device >= count) {
    return Fail(PH_ERROR_INVALID_DEVICE,
                "ph_ipc_open_mem_handle: the memory is on phantom device " +
                    std::to_string(bytes.device) + ", but this process has " +
                    std::to_string(count) +
                    " phantom devices (PHANTOM_DEVICE_COUNT)");
  }
  ph_status_t status = PH_SUCCESS;
  const int fd = OpenExporterFile("ph_ipc_open_mem_handle", bytes.pid,
                                  bytes.fd, bytes.inode, bytes.dev, &status);
  if (fd < 0) return status;
  struct stat info = {};
  if (fstat(fd, &info) != 0 ||
      bytes.offset > static_cast<uint64_t>(info.st_size) ||
      bytes.size > static_cast<uint64_t>(info.st_size) - bytes.offset) {
    close(fd);
    return NotAHandle();
  }
  ImportKey key;
  key.pid = bytes.pid;
  key.inode = bytes.inode;
  key.dev = bytes.dev;
  key.offset = bytes.offset;
  key.size = bytes.size;
  status = GetDeviceMemory(bytes.device).OpenImport(key, fd, out_ptr);
  close(fd);  // the mapping holds the file from now on
  return status;
}

ph_status_t CloseMemory(void* device_ptr) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(device_ptr);
  const int device = DeviceOfAddress(address);
  if (device < 0) {
    char text[200];
    std::snprintf(text, sizeof text,
                  "ph_ipc_close_mem_handle: %p is not device memory",
                  device_ptr);
    return Fail(PH_ERROR_INVALID_HANDLE, text);
  }
  return GetDeviceMemory(device).CloseImport(address);
}

}  // namespace phantom::fake
