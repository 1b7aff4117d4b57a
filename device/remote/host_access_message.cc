// A sentence for host code that touches device memory.
//
// Design. Device pointers are addresses inside ranges this process reserved
// PROT_NONE (client_memory.h), so host code that dereferences one (a custom
// op reading data_ptr(), ctypes, numpy over the pointer) faults at once.
// The fault alone says nothing a user can act on; as the fake driver does,
// a SIGSEGV/SIGBUS handler installed with the ranges writes one line naming
// the address, the device and what to do, then lets the fault take its
// default course (the process still dies with the signal, so nothing is
// hidden). A fault outside the ranges goes to the handler that was there
// before, untouched. Only async-signal-safe work runs in the handler: the
// ranges are written once before it is installed and only read here.
#include "host_access_message.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <mutex>

#include <phantom/common/fault_signals.h>

#include "client_memory.h"

namespace phantom::remote {
namespace {

using fault_signals::Append;
using fault_signals::AppendNumber;
using fault_signals::EndWithTheSignal;
using fault_signals::ForwardFault;
using fault_signals::WriteToStderr;

struct sigaction g_previous_segv;
struct sigaction g_previous_bus;

void OnFault(int signal_number, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const int device = DeviceOfAddress(info->si_addr);
  if (device >= 0) {
    char message[384];
    size_t length = 0;
    Append(message, sizeof message, &length,
           "phantom: host code touched device memory at ");
    AppendNumber(message, sizeof message, &length,
                 reinterpret_cast<uintptr_t>(info->si_addr), 16);
    Append(message, sizeof message, &length, " (phantom device ");
    AppendNumber(message, sizeof message, &length,
                 static_cast<uintptr_t>(device), 10);
    Append(message, sizeof message, &length,
           ", which lives in the remote driver's server process). Device "
           "memory is not host-addressable: copy the tensor to the host "
           "first (e.g. tensor.cpu()).\n");
    WriteToStderr(message, length);
    EndWithTheSignal(signal_number);
    errno = saved_errno;
    return;
  }
  ForwardFault(signal_number, info, context,
               signal_number == SIGBUS ? g_previous_bus : g_previous_segv);
  errno = saved_errno;
}

}  // namespace

void InstallHostAccessMessage() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action = {};
    action.sa_sigaction = OnFault;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &g_previous_segv);
    sigaction(SIGBUS, &action, &g_previous_bus);
  });
}

}  // namespace phantom::remote
