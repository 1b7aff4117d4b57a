// Phantom storages and events shared with other processes, as PyTorch
// shares CUDA ones (torch/multiprocessing/reductions.py and
// torch/csrc/CudaIPCTypes.cpp), over hal.h's "Interprocess sharing"
// section.
//
// Sending (shareStorage). The caching allocator hands out pieces of driver
// allocations ("segments"), and a handle names a whole allocation, so what
// is sent is the segment's handle, the storage's offset in the segment and
// its size. The storage's DataPtr is then wrapped in a SentBlock that owns
// the previous one; each send wraps again. A SentBlock holds one slot of a
// reference-counter file (shared memory every receiver can open by name, as
// CUDA's; here an anonymous memfd named by process and descriptor, so a
// process that dies leaves no file behind), set to 1 when sent, and an
// interprocess event recorded on the sending thread's current stream, so
// the receiver waits for the work queued before the send. When the sender
// frees the storage, a SentBlock whose counter is still above 0 is kept in
// the limbo list instead of freeing its memory; ipcCollect() (also run at
// each such free, and by the caching allocator before it reports out of
// memory) frees those whose receivers are done.
//
// Receiving (newSharedStorage). The segment is opened once per process
// (a cache of weak references by handle) and the storage is a
// non-resizable view of it at the offset. Its deleter decrements the
// sender's counter, and closes the segment when its last storage goes, as
// a host task on the current stream of the thread that frees it: the
// sender may reuse the memory only after this process's work queued so far
// on that stream is done (CUDA synchronizes that stream instead). A
// receiver that already holds the storage (torch's shared_cache) releases
// the new counter at once (releaseIpcCounter).
//
// A driver that cannot export memory (PH_ERROR_UNIMPLEMENTED) makes
// shareStorage throw c10::NotImplementedError at once, saying to send
// tensor.cpu() instead. One that cannot share events makes the sender wait
// for its current stream instead (CUDA does the same when it runs out of
// interprocess events).
#pragma once

#include <phantom/Stream.h>
#include <phantom/hal.h>

#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <string>

namespace phantom {

// Slots per reference-counter file; a new file is made when one is used up.
constexpr int64_t kIpcRefCounterSlots = 10000;

// What torch's _share_cuda_ returns, for a phantom storage.
struct SharedStorage {
  c10::DeviceIndex device = 0;
  std::string memory_handle;  // ph_ipc_mem_handle_t bytes; empty: no data
  size_t storage_bytes = 0;
  size_t offset_bytes = 0;  // of the storage in the segment the handle names
  std::string ref_counter_handle;  // the counter file's name
  int64_t ref_counter_offset = 0;  // the slot
  std::string event_handle;  // ph_ipc_event_handle_t bytes, or empty
  bool event_sync_required = false;
};

// Sends `storage` (see above). Throws c10::NotImplementedError when the
// driver cannot share memory, and c10::Error for a storage received from
// another process (send a clone, as with CUDA).
SharedStorage shareStorage(c10::StorageImpl* storage);

// The storage a SharedStorage names, in this process.
c10::intrusive_ptr<c10::StorageImpl> newSharedStorage(const SharedStorage& shared);

// Releases one send's counter slot (a receiver that already had the storage).
// Best effort: the sender may have exited.
void releaseIpcCounter(const std::string& ref_counter_handle,
                       int64_t ref_counter_offset);

// Frees sent memory whose receivers have all released it. True if any was.
bool ipcCollect();

// Sent blocks this process keeps alive for receivers (the limbo's size).
size_t ipcBlocksInLimbo();

// For a DataPtr that shareStorage wrapped, the DataPtr it wraps (so that
// record_stream reaches the allocator's block); nullptr for any other.
const c10::DataPtr* ipcWrappedDataPtr(const c10::DataPtr& ptr);

// An interprocess event (torch.phantom.Event(interprocess=True)): created
// here, or opened from another process's handle.
class IpcEvent {
 public:
  explicit IpcEvent(c10::DeviceIndex device);
  IpcEvent(c10::DeviceIndex device, const std::string& handle);
  ~IpcEvent();
  IpcEvent(const IpcEvent&) = delete;
  IpcEvent& operator=(const IpcEvent&) = delete;

  c10::DeviceIndex device() const { return device_; }
  std::string handle() const;
  void record(const PhantomStream& stream);
  void wait(const PhantomStream& stream);
  bool query();
  void synchronize();

 private:
  c10::DeviceIndex device_;
  ph_event_t event_ = nullptr;
};

}  // namespace phantom
