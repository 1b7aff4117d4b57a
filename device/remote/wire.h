// The wire protocol between the remote driver (client) and its server.
//
// Design. Every message is one fixed-size header (Message) followed by
// `text_len` bytes of text (an error sentence, a device name), and may
// carry one file descriptor as SCM_RIGHTS ancillary data (a shared-memory
// block). A connection is a Unix-domain stream socket; its first message
// says what it is (Op::kHelloSession, kHelloRequest, kHelloCallback).
//
//  - Request connections (one per client thread) are strictly request ->
//    reply: the thread that sends waits for the one reply, so no message
//    needs an id and a blocking request (synchronize) blocks only its own
//    connection. The server serves each connection on a thread of its own.
//  - Callback connections (one per stream) run the other way: the stream's
//    worker in the server sends kRunTask / kReleaseTask when its queue
//    reaches a host task, and waits for the client's reply before it goes
//    on, which is what keeps host work in stream order.
//  - The session connection is the first the client opens (spawned
//    servers get it as an inherited socketpair end). The server ends the
//    session when it closes: a spawned server exits, a shared one frees
//    what the session owned. Nothing else is sent on it after the hello.
//
// A read or write that fails (EOF, ECONNRESET, EPIPE) means the peer is
// gone; no call waits on a dead socket because the kernel closes every
// descriptor of a process that dies, which ends every blocked read.
#ifndef PHANTOM_REMOTE_WIRE_H_
#define PHANTOM_REMOTE_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace phantom::remote {

// Bumped whenever Message or an op's meaning changes; client and server
// must agree (checked in the session hello).
constexpr uint32_t kProtocolVersion = 1;

enum class Op : uint32_t {
  kHelloSession = 1,  // -> a0: session id, a1: device count, a2: capacity
  kHelloRequest,      // a0: session id
  kHelloCallback,     // a0: session id, a1: stream id
  kDeviceProperties,  // a0: device -> a0 memory, a1 cores, a2 low, a3 high
  kDeviceSynchronize, // a0: device
  kMemInfo,           // a0: device -> a0 free, a1 total
  kMalloc,            // a0: device, a1: size -> a0: offset
  kFree,              // a0: device, a1: offset
  kPinnedRegister,    // fd; a0: client address, a1: size
  kPinnedUnregister,  // a0: client address
  kStagingAttach,     // fd; a0: size
  kStreamCreate,      // a0: device, a1: priority -> a0 id, a1 priority
  kStreamDestroy,     // a0: stream
  kStreamQuery,       // a0: stream
  kStreamSynchronize, // a0: stream
  kStreamWaitEvent,   // a0: stream, a1: event
  kLaunch,            // a0: stream, a1: task id, a2: 1 to wait for it
  kCopy,              // a0: stream (0: now), a1/a2 dst, a3/a4 src, a5 size
  kMemset,            // a0: stream, a1: device, a2: offset, a3: byte, a4 size
  kBarrier,           // a0: stream; replies once earlier work has finished
  kEventCreate,       // a0: flags -> a0: event id
  kEventDestroy,      // a0: event
  kEventRecord,       // a0: event, a1: stream
  kEventQuery,        // a0: event
  kEventSynchronize,  // a0: event
  kEventElapsed,      // a0: start, a1: end -> a0: float bits of the ms
  kRunTask,           // server -> client on a callback connection: a0 task
  kReleaseTask,       // likewise: a0 task, status/text: why it did not run
  kReply,             // status, a0..a5, text
};

// One side of a copy: where the bytes are, as the server sees them.
enum class Place : uint64_t {
  kDevice = 1,   // address: (device << 56) | offset
  kPinned = 2,   // address: the client's address inside a pinned block
  kStaging = 3,  // address: offset in the connection's staging block
};

// Flag of the copy's a1 (dst place): the caller waits for the copy.
constexpr uint64_t kCopyBlocking = uint64_t{1} << 32;

constexpr int kDeviceShift = 56;
constexpr uint64_t kOffsetMask = (uint64_t{1} << kDeviceShift) - 1;

struct Message {
  uint32_t op = 0;
  int32_t status = 0;        // replies: a ph_status_t
  uint64_t caller_stream = 0;  // the stream whose host work makes the call
  uint64_t a[6] = {};
  uint32_t text_len = 0;
  uint32_t reserved = 0;
};

// Texts longer than this are cut (error sentences are short).
constexpr uint32_t kMaxText = 64 * 1024;

// Sends `message` with `text` (and `fd` if >= 0). False if the peer is gone.
bool SendMessage(int socket, Message message, const std::string& text = "",
                 int fd = -1);

// Receives one message into *out and its text into *text, and a passed
// descriptor into *fd (-1 if none; pass nullptr to refuse descriptors).
// False if the peer is gone or sent something malformed.
bool ReceiveMessage(int socket, Message* out, std::string* text,
                    int* fd = nullptr);

// A connected Unix-domain socket to `path`, or -1 with *error set.
int ConnectTo(const std::string& path, std::string* error);

// "PH_ERROR_DEVICE"-style names are the driver's; this is for logs.
const char* OpName(Op op);

}  // namespace phantom::remote

#endif  // PHANTOM_REMOTE_WIRE_H_
