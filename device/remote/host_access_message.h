// The message host code gets when it dereferences a device pointer
// (host_access_message.cc has the design).
#ifndef PHANTOM_REMOTE_HOST_ACCESS_MESSAGE_H_
#define PHANTOM_REMOTE_HOST_ACCESS_MESSAGE_H_

namespace phantom::remote {

// Installs, once, the SIGSEGV/SIGBUS handler that names a fault inside a
// device range (after ReserveDeviceRanges, which it reads) and passes every
// other fault to the handler installed before it.
void InstallHostAccessMessage();

}  // namespace phantom::remote

#endif  // PHANTOM_REMOTE_HOST_ACCESS_MESSAGE_H_
