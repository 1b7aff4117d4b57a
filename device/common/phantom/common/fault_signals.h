// What the SIGSEGV/SIGBUS handlers of the drivers and the runtime share:
// building a message without allocating, and handing a fault on.
//
// Design. Three handlers catch host accesses to memory the host must not
// touch: the fake driver's and the remote driver's (device memory: one
// line saying what to do, then the process dies with the signal) and the
// runtime's copy guard (the destination of a non_blocking copy: recorded,
// then the access is let through). Each handles only its own addresses and
// hands any other fault to the handler installed before it. Everything
// here is async-signal-safe (no allocation, no lock, only write(2) and
// sigaction(2)) and header-only, so each library keeps a private copy and
// no dependency appears between layers.
#ifndef PHANTOM_COMMON_FAULT_SIGNALS_H_
#define PHANTOM_COMMON_FAULT_SIGNALS_H_

#include <signal.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

namespace phantom::fault_signals {

// Appends `text` to buffer[*length], never past `capacity` (keeping room
// for a terminating zero).
inline void Append(char* buffer, size_t capacity, size_t* length,
                   const char* text) {
  while (*text != '\0' && *length + 1 < capacity) buffer[(*length)++] = *text++;
}

// Appends `value` in base 16 (with "0x") or 10.
inline void AppendNumber(char* buffer, size_t capacity, size_t* length,
                         uintptr_t value, unsigned base) {
  char reversed[2 * sizeof(uintptr_t) + 1];
  int count = 0;
  do {
    reversed[count++] = "0123456789abcdef"[value % base];
    value /= base;
  } while (value != 0);
  if (base == 16) Append(buffer, capacity, length, "0x");
  while (count > 0 && *length + 1 < capacity) {
    buffer[(*length)++] = reversed[--count];
  }
}

inline void WriteToStderr(const char* text, size_t length) {
  ssize_t ignored = write(STDERR_FILENO, text, length);
  (void)ignored;
}

// Restores the signal's default action: returning from the handler then
// runs the faulting instruction again, which ends the process with the
// original signal.
inline void EndWithTheSignal(int signal_number) {
  struct sigaction default_action = {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(signal_number, &default_action, nullptr);
}

// Hands a fault that is not ours to `previous`, the handler installed
// before ours: calls it, or, when it was the default action or "ignore",
// restores it, so the fault recurs and takes its default course (the
// kernel does not let a synchronous fault be ignored).
inline void ForwardFault(int signal_number, siginfo_t* info, void* context,
                         const struct sigaction& previous) {
  if ((previous.sa_flags & SA_SIGINFO) != 0) {
    previous.sa_sigaction(signal_number, info, context);
  } else if (previous.sa_handler == SIG_DFL ||
             previous.sa_handler == SIG_IGN) {
    sigaction(signal_number, &previous, nullptr);
  } else {
    previous.sa_handler(signal_number);
  }
}

}  // namespace phantom::fault_signals

#endif  // PHANTOM_COMMON_FAULT_SIGNALS_H_
