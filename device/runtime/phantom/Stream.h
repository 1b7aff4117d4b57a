// Streams as PyTorch sees them.
//
// A c10::Stream is a (device, id) pair; this file maps ids to driver
// streams. As in CUDA, each device has a default stream (id 0) and two pools
// of kStreamsPerPool streams, one per priority, handed out round-robin: a
// stream is never destroyed while the process runs, so a c10::Stream can be
// copied around freely. Driver streams are created lazily, on the first use
// of each id. The current stream is per thread and per device.
//
// External streams: a driver stream another library created
// (ph_stream_create) can be used as a c10 stream too
// (torch.phantom.get_stream_from_external, ExternalStream). Its id is its
// handle, as a negative number (-1 - handle), so a launch on it needs no
// table; the id is accepted once the handle has been registered (checked
// with the driver), and each device keeps its registered handles so that
// device synchronization and the allocator's waits include them. The
// runtime never destroys or replaces an external stream: its owner keeps
// it alive while torch uses it, and an error in its work is reported at
// every sync until the owner replaces it.
//
// Errors: work that fails makes its driver stream sticky, and so does a
// wait on an event recorded after failed work (hal.h's error model,
// docs/streams.md). The runtime reports a stream's error once, from the
// query, synchronize, copy or launch that finds it (the driver's message
// names the failed work; the runtime's work adds the stream it was queued
// on, Launch.cpp), and then replaces the driver stream behind the id, so
// the process goes on and the next work on that stream runs normally.
// Work queued behind the failure was discarded, as on a GPU after an
// asynchronous error. Each stream that inherited the failure reports it
// once in the same way; events keep it until recorded again.
#pragma once

#include <phantom/hal.h>

#include <c10/core/Stream.h>
#include <c10/macros/Macros.h>

#include <cstdint>
#include <ostream>

namespace phantom {

constexpr int kStreamsPerPool = 32;
constexpr int kLowPriority = 0;    // default
constexpr int kHighPriority = -1;  // numerically smaller is more urgent

class PhantomStream {
 public:
  explicit PhantomStream(c10::Stream stream);

  c10::Stream unwrap() const { return stream_; }
  c10::DeviceIndex device_index() const { return stream_.device_index(); }
  c10::Device device() const { return stream_.device(); }
  c10::StreamId id() const { return stream_.id(); }
  int priority() const;
  // A stream created outside the runtime (see the top of this file).
  bool is_external() const { return stream_.id() < 0; }

  // The driver stream; created on first use.
  ph_stream_t handle() const;

  // True when all work queued so far has finished. Raises the error of
  // failed work, if any (then the stream is reset, see above).
  bool query() const;
  // Blocks until all queued work has finished; raises the error of failed
  // work, if any (then the stream is reset, see above).
  void synchronize() const;

  // Raises `status`, returned by a driver call that queued work on
  // `handle` (this stream's driver stream). A PH_ERROR_DEVICE there is the
  // stream's sticky error, now reported, so the stream is reset as query()
  // and synchronize() do; without that the next sync would report the
  // same failure again. Use: `const ph_stream_t h = s.handle();
  // s.check(ph_memcpy_async(..., h), h);`
  void check(ph_status_t status, ph_stream_t handle) const {
    if (C10_UNLIKELY(status != PH_SUCCESS)) {
      raiseError(status, handle);
    }
  }

  bool operator==(const PhantomStream& other) const {
    return stream_ == other.stream_;
  }
  bool operator!=(const PhantomStream& other) const {
    return !(*this == other);
  }

 private:
  [[noreturn]] void raiseError(ph_status_t status, ph_stream_t handle) const;

  c10::Stream stream_;
};

// device == -1 means the current device.
PhantomStream getDefaultPhantomStream(c10::DeviceIndex device = -1);
PhantomStream getCurrentPhantomStream(c10::DeviceIndex device = -1);

// The id of the calling thread's current stream on `device`, which must be
// a valid device index: the allocator's per-allocation fast path.
c10::StreamId currentPhantomStreamId(c10::DeviceIndex device) noexcept;
PhantomStream getStreamFromPool(bool high_priority = false,
                                c10::DeviceIndex device = -1);
PhantomStream getStreamFromPool(int priority, c10::DeviceIndex device);

// The stream behind a driver handle: one of the runtime's own streams, or
// the handle registered as an external stream. Checks with the driver that
// the handle is a live stream, and that it belongs to `device` (-1: take
// the stream's own device); throws saying what is wrong otherwise.
PhantomStream streamFromHandle(ph_stream_t handle, c10::DeviceIndex device);
// Makes `stream` current on its device for this thread.
void setCurrentPhantomStream(PhantomStream stream);

// Waits for every stream of `device` that the runtime has created, except
// the one whose work the calling thread is running (its earlier work is
// done, by FIFO order). Safe from host threads and from device work alike;
// this is what must happen before device memory goes back to the driver.
// Sticky stream errors are not raised here (each stream's own sync does).
void synchronizeAllStreams(c10::DeviceIndex device);

std::ostream& operator<<(std::ostream& out, const PhantomStream& stream);

}  // namespace phantom
