// The client driver's link to its server: starting it, per-thread
// connections, errors, and the device-lost state.
//
// Design. The first call that needs the device starts the session once
// (Start): with PHANTOM_REMOTE_SOCKET set it connects to that server,
// otherwise it spawns phantom_remote_server (PHANTOM_REMOTE_SERVER, or the
// file of that name next to this library) on a private socket in a fresh
// temporary folder, handing it one end of a socketpair as the session
// connection. The spawned server exits when that connection closes, i.e.
// when this process exits, however it exits: no server outlives its client.
//
// Each client thread then talks to the server over a connection of its own
// (Call), opened at its first request, with a shared-memory staging block
// attached on demand for pageable copies. A request never waits for another
// thread's, and a blocking request (synchronize) holds only its thread's.
//
// Device lost. When any read or write fails, the server is gone: the
// driver records one sentence saying so (with the server's exit status or
// signal when it was ours to reap), and from then on every call returns
// PH_ERROR_DEVICE with it (sticky, as hal.h's device errors). Calls blocked
// in the server at that moment wake, because the kernel closed the
// server's end of their sockets.
#ifndef PHANTOM_REMOTE_CLIENT_LINK_H_
#define PHANTOM_REMOTE_CLIENT_LINK_H_

#include <cstddef>
#include <cstdint>
#include <exception>
#include <new>
#include <string>

#include "phantom/hal.h"
#include "wire.h"

namespace phantom::remote {

// Stores `message` as the calling thread's last error; returns `status`.
ph_status_t Fail(ph_status_t status, std::string message);
const char* LastErrorMessage();

// What the session hello told.
struct SessionInfo {
  int device_count = 0;
  uint64_t device_memory = 0;
};

// PH_SUCCESS once the session runs; else the failure, with the message set:
// PH_ERROR_NOT_INITIALIZED (the server could not be started or refused its
// configuration; cached) or PH_ERROR_DEVICE (the device was lost).
ph_status_t Start();
const SessionInfo& Info();  // valid after Start() succeeded

// The number of devices, without starting the session when it has not
// started and the driver would spawn its own server (no
// PHANTOM_REMOTE_SOCKET): that server serves the PHANTOM_DEVICE_COUNT of
// this process's environment, so the setting is the answer. Counting
// devices then does not start the device, and a process may still fork
// and use it in the child, as CUDA counts devices without creating a
// context. Otherwise (a server to connect to, a server program that
// cannot be run, a setting that does not parse, a session already started
// or tried) the session's answer, or Start's error.
ph_status_t DeviceCount(int* out_count);

// Sends `request` on the calling thread's connection and receives the
// reply. Returns the reply's status and sets the last error to its text
// on failure; PH_ERROR_DEVICE (device lost) if the server is gone.
ph_status_t Call(Op op, Message request, Message* reply = nullptr,
                 std::string* reply_text = nullptr, int fd = -1);

// The calling thread's staging block (mapped by the server too), or
// nullptr with the last error set.
char* Staging(size_t* out_size);

// A new connection of `hello` kind (a0 = session, a1 = `argument`) whose
// hello was answered with success, or -1 with the last error set.
int OpenConnection(Op hello, uint64_t argument);

// The device-lost state.
bool Lost();
ph_status_t LostError();  // PH_ERROR_DEVICE with the lost sentence
void MarkLost();

// The stream whose host work the calling thread is running (0: none).
uint64_t CurrentStream();
int CurrentStreamDevice();
void SetCurrentStream(uint64_t stream, int device);

// Runs `body` and turns escaping exceptions into a status: none may cross
// the C ABI.
template <typename Body>
ph_status_t Guarded(const char* function, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Fail(PH_ERROR_OUT_OF_MEMORY,
                std::string(function) + ": the host ran out of memory");
  } catch (const std::exception& e) {
    return Fail(PH_ERROR_DEVICE,
                std::string(function) + ": internal driver error: " + e.what());
  } catch (...) {
    return Fail(PH_ERROR_DEVICE,
                std::string(function) + ": unknown internal driver error");
  }
}

}  // namespace phantom::remote

#endif  // PHANTOM_REMOTE_CLIENT_LINK_H_
