// Framing of wire.h: a header, its text, and at most one descriptor.
//
// Writes use sendmsg with MSG_NOSIGNAL, so a dead peer is an error return
// (EPIPE), never SIGPIPE in the user's process. Reads loop until the
// whole header and text have arrived; EINTR is retried.
#include "wire.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

namespace phantom::remote {
namespace {

bool WriteAll(int socket, const char* data, size_t size, int fd) {
  bool fd_pending = fd >= 0;
  while (size > 0) {
    iovec io{const_cast<char*>(data), size};
    msghdr header{};
    header.msg_iov = &io;
    header.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    if (fd_pending) {
      std::memset(control, 0, sizeof control);
      header.msg_control = control;
      header.msg_controllen = sizeof control;
      cmsghdr* cmsg = CMSG_FIRSTHDR(&header);
      cmsg->cmsg_level = SOL_SOCKET;
      cmsg->cmsg_type = SCM_RIGHTS;
      cmsg->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
    }
    const ssize_t sent = ::sendmsg(socket, &header, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    fd_pending = false;
    data += sent;
    size -= static_cast<size_t>(sent);
  }
  return true;
}

bool ReadAll(int socket, char* data, size_t size, int* fd) {
  while (size > 0) {
    iovec io{data, size};
    msghdr header{};
    header.msg_iov = &io;
    header.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    header.msg_control = control;
    header.msg_controllen = sizeof control;
    const ssize_t got = ::recvmsg(socket, &header, MSG_CMSG_CLOEXEC);
    if (got < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (got == 0) return false;  // the peer closed
    for (cmsghdr* cmsg = CMSG_FIRSTHDR(&header); cmsg != nullptr;
         cmsg = CMSG_NXTHDR(&header, cmsg)) {
      if (cmsg->cmsg_level == SOL_SOCKET && cmsg->cmsg_type == SCM_RIGHTS) {
        int passed = -1;
        std::memcpy(&passed, CMSG_DATA(cmsg), sizeof(int));
        if (fd != nullptr && *fd < 0) {
          *fd = passed;
        } else {
          ::close(passed);  // not asked for: never leak it
        }
      }
    }
    data += got;
    size -= static_cast<size_t>(got);
  }
  return true;
}

}  // namespace

bool SendMessage(int socket, Message message, const std::string& text,
                 int fd) {
  const uint32_t length =
      text.size() > kMaxText ? kMaxText : static_cast<uint32_t>(text.size());
  message.text_len = length;
  std::string frame(sizeof message + length, '\0');
  std::memcpy(&frame[0], &message, sizeof message);
  if (length > 0) std::memcpy(&frame[sizeof message], text.data(), length);
  return WriteAll(socket, frame.data(), frame.size(), fd);
}

bool ReceiveMessage(int socket, Message* out, std::string* text, int* fd) {
  if (fd != nullptr) *fd = -1;
  if (!ReadAll(socket, reinterpret_cast<char*>(out), sizeof *out, fd)) {
    return false;
  }
  if (out->text_len > kMaxText) return false;
  text->assign(out->text_len, '\0');
  return out->text_len == 0 || ReadAll(socket, &(*text)[0], out->text_len, fd);
}

int ConnectTo(const std::string& path, std::string* error) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof address.sun_path) {
    *error = "the socket path '" + path + "' is longer than " +
             std::to_string(sizeof address.sun_path - 1) + " bytes";
    return -1;
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = std::string("socket() failed: ") + std::strerror(errno);
    return -1;
  }
  int result;
  do {
    result = ::connect(fd, reinterpret_cast<sockaddr*>(&address),
                       sizeof address);
  } while (result != 0 && errno == EINTR);
  if (result != 0) {
    *error = "cannot connect to the phantom remote server at '" + path +
             "': " + std::strerror(errno);
    ::close(fd);
    return -1;
  }
  return fd;
}

const char* OpName(Op op) {
  switch (op) {
    case Op::kHelloSession: return "hello-session";
    case Op::kHelloRequest: return "hello-request";
    case Op::kHelloCallback: return "hello-callback";
    case Op::kDeviceProperties: return "device-properties";
    case Op::kDeviceSynchronize: return "device-synchronize";
    case Op::kMemInfo: return "mem-info";
    case Op::kMalloc: return "malloc";
    case Op::kFree: return "free";
    case Op::kPinnedRegister: return "pinned-register";
    case Op::kPinnedUnregister: return "pinned-unregister";
    case Op::kStagingAttach: return "staging-attach";
    case Op::kStreamCreate: return "stream-create";
    case Op::kStreamDestroy: return "stream-destroy";
    case Op::kStreamQuery: return "stream-query";
    case Op::kStreamSynchronize: return "stream-synchronize";
    case Op::kStreamWaitEvent: return "stream-wait-event";
    case Op::kLaunch: return "launch";
    case Op::kCopy: return "copy";
    case Op::kMemset: return "memset";
    case Op::kBarrier: return "barrier";
    case Op::kEventCreate: return "event-create";
    case Op::kEventDestroy: return "event-destroy";
    case Op::kEventRecord: return "event-record";
    case Op::kEventQuery: return "event-query";
    case Op::kEventSynchronize: return "event-synchronize";
    case Op::kEventElapsed: return "event-elapsed";
    case Op::kRunTask: return "run-task";
    case Op::kReleaseTask: return "release-task";
    case Op::kReply: return "reply";
  }
  return "unknown";
}

}  // namespace phantom::remote
