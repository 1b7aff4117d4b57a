// Phantom's PHANTOM_* settings: the one catalogue of them and the one
// parser every layer reads them with.
//
// Design. Each environment variable the backend reads is described once,
// below, by a Spec: its name, the kind of value it takes (a count, a size,
// a 0/1 switch, the allocator's option list), its range, its default, what
// it does and which layer reads it. Every reading site parses its variable
// with Parse() and the same Spec, so every value follows the same rules and
// a refused one gets the same sentence wherever it is read:
//
//   - Whitespace (spaces, tabs, newlines) around a value is ignored, and so
//     is whitespace around each option, key and value of a list and between
//     a number and its unit. A value that is empty or only whitespace counts
//     as unset (the default applies). Whitespace inside a number is refused.
//   - Numbers are whole, decimal and unsigned: no sign, no fraction (except
//     where a fraction is asked for), no exponent; leading zeros are fine.
//     A number outside its range is refused, however many digits it has: a
//     value never wraps around or is clamped.
//   - Letters are matched ignoring case: size units and option names.
//     Size units are powers of 1024: K, M, G or T, optionally followed by
//     "iB" or "B" ("512MiB", "4g", "2GB"), or "B" alone for bytes.
//   - Ranges are inclusive, and a list names each option at most once.
//   - A refusal is one sentence:
//       PHANTOM_X='value' is not <what>; accepted: <what is>; unset it for
//       the default <default>
//
// The library is torch-free (the fake driver links it and knows nothing of
// torch) and stateless: it never caches the environment. Each reading site
// decides when it reads (once per process) and what a refusal does: the
// fake driver refuses to start and says so through ph_last_error_message(),
// the runtime throws c10::ValueError, and `import torch_phantom` raises
// ValueError before it loads anything (python/csrc/Settings.cpp).
//
// The catalogue also feeds the Python tests (every setting is tried with a
// bad value) and the README's settings table, so a setting added here is
// covered and documented without further lists to keep in step.
#ifndef PHANTOM_COMMON_SETTINGS_H_
#define PHANTOM_COMMON_SETTINGS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace phantom::settings {

enum class Kind {
  kCount,     // a whole number in [min, max]
  kSize,      // bytes in [min, max], with an optional binary unit
  kSwitch,    // 0 or 1
  kFraction,  // a decimal fraction strictly between 0 and 1
  kOptions,   // comma-separated key:value options, each a Spec of its own
  kLibrary,   // a shared library: a file name or a path to one
  kChoice,    // one word of a fixed list (any case); its index is the number
};

// The layer that reads a setting (shown in the README table).
enum class Reader { kDriver, kRuntime, kOps, kPython };

constexpr uint64_t kUnbounded = INT64_MAX;  // a count with no upper limit
constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kTiB = uint64_t{1} << 40;

struct Spec {
  const char* name;
  Kind kind;
  uint64_t min;              // kCount, kSize: smallest accepted value
  uint64_t max;              // kCount, kSize: largest (kUnbounded: none)
  uint64_t default_number;   // the value when unset (0 also means "off")
  const char* default_text;  // the default as users read it
  const char* unit;          // kCount: what is counted ("MiB"), or nullptr
  Reader reader;
  const char* meaning;       // one line, for the README and diagnostics
  const Spec* const* options = nullptr;  // kOptions: its options
  size_t option_count = 0;
  const char* const* choices = nullptr;  // kChoice: the accepted words
  size_t choice_count = 0;
};

constexpr Spec Count(const char* name, uint64_t min, uint64_t max,
                     uint64_t default_number, const char* default_text,
                     const char* unit, Reader reader, const char* meaning) {
  return Spec{name, Kind::kCount, min, max, default_number, default_text,
              unit, reader, meaning};
}

constexpr Spec Size(const char* name, uint64_t min, uint64_t max,
                    uint64_t default_number, const char* default_text,
                    Reader reader, const char* meaning) {
  return Spec{name, Kind::kSize, min, max, default_number, default_text,
              nullptr, reader, meaning};
}

constexpr Spec Switch(const char* name, Reader reader, const char* meaning) {
  return Spec{name, Kind::kSwitch, 0, 1, 0, "0 (off)", nullptr, reader,
              meaning};
}

// ---------------------------------------------------------------------------
// The catalogue.

// The fake driver (device/fake/config.h).
inline constexpr Spec kDeviceCount = Count(
    "PHANTOM_DEVICE_COUNT", 0, 64, 2, "2", nullptr, Reader::kDriver,
    "number of devices");
// 1 MiB works because the caching allocator's segments shrink to fit a
// small device (docs/allocator.md, "Small devices").
inline constexpr Spec kDeviceMemory = Size(
    "PHANTOM_DEVICE_MEMORY", kMiB, kTiB, 8 * kGiB, "8GiB", Reader::kDriver,
    "capacity of each device");

// The caching allocator's options (device/runtime/DeviceAllocator.cpp). The
// smallest max_split_size_mb is one more than the 20 MiB large-pool
// segment, which DeviceAllocator.cpp checks; the largest is the largest
// device.
inline constexpr Spec kMaxSplitSizeMb = Count(
    "max_split_size_mb", 21, kTiB / kMiB, 0, "(no limit)", "MiB",
    Reader::kRuntime, "blocks of N MiB or more are never split");
inline constexpr Spec kGarbageCollectionThreshold{
    "garbage_collection_threshold", Kind::kFraction, 0, 0, 0, "(off)",
    nullptr, Reader::kRuntime,
    "when reserved memory would pass F x capacity, cached segments are "
    "freed first"};
// Memory history from start-up, as _record_memory_history(max_entries=N,
// stacks="python") (device/runtime/AllocatorHistory.cpp).
inline constexpr Spec kRecordMemoryHistory = Count(
    "record_memory_history", 1, kUnbounded, 0, "(off)", "entries",
    Reader::kRuntime,
    "records memory history from start-up, keeping the last N entries "
    "(docs/profiling.md)");
inline constexpr const Spec* kAllocatorOptions[] = {
    &kMaxSplitSizeMb, &kGarbageCollectionThreshold, &kRecordMemoryHistory};
inline constexpr Spec kAllocConf{
    "PHANTOM_ALLOC_CONF", Kind::kOptions, 0, 0, 0, "(no options)", nullptr,
    Reader::kRuntime, "caching allocator options (docs/allocator.md)",
    kAllocatorOptions, sizeof(kAllocatorOptions) / sizeof(kAllocatorOptions[0])};

// Fault injection (device/runtime/FaultInjection.cpp). 0 means off.
inline constexpr Spec kFaultAlloc = Count(
    "PHANTOM_FAULT_ALLOC", 1, kUnbounded, 0, "(off)", nullptr,
    Reader::kRuntime,
    "the k-th device allocation fails (docs/fault-injection.md)");
inline constexpr Spec kFaultKernel = Count(
    "PHANTOM_FAULT_KERNEL", 1, kUnbounded, 0, "(off)", nullptr,
    Reader::kRuntime, "the k-th kernel fails (docs/fault-injection.md)");
inline constexpr Spec kFaultLatencyUs = Count(
    "PHANTOM_FAULT_LATENCY_US", 0, 10'000'000, 0, "0", "microseconds",
    Reader::kRuntime,
    "latency added to every kernel and copy (docs/fault-injection.md)");

// Switches.
inline constexpr Spec kNoLending = Switch(
    "PHANTOM_NO_LENDING", Reader::kRuntime,
    "1 stops lending a device output's memory to the CPU kernel that "
    "computes it: results are computed aside and copied (docs/allocator.md)");
inline constexpr Spec kSyncGeneric = Switch(
    "PHANTOM_SYNC_GENERIC", Reader::kOps,
    "1 makes every generic-path op wait (debugging)");
inline constexpr Spec kDebugMemo = Switch(
    "PHANTOM_DEBUG_MEMO", Reader::kOps,
    "1 prints each call signature whose trial run raised or whose Meta "
    "kernel's answer was not the CPU's (docs/architecture.md)");
inline constexpr Spec kOpsReport = Switch(
    "PHANTOM_OPS_REPORT", Reader::kPython,
    "1 prints, at exit, which path each op took");
inline constexpr Spec kRaceDetector = Count(
    "PHANTOM_RACE_DETECTOR", 0, 2, 0, "0 (off)", nullptr, Reader::kPython,
    "1 reports races between streams as warnings, 2 as errors "
    "(docs/race-detector.md)");
// The driver the runtime loads (device/runtime/DriverLoader.cpp). The
// default is the driver the build chose, the fake unless a vendor's build
// names another (CMakeLists.txt, PHANTOM_DRIVER).
inline constexpr Spec kDriver{
    "PHANTOM_DRIVER", Kind::kLibrary, 0, 0, 0, "libphantom_fake.so",
    nullptr, Reader::kRuntime,
    "the HAL driver library the runtime loads (docs/fake-driver.md, "
    "\"Loading\")"};

// What the generic path does when the driver has no kernel view and an op
// runs through the copying CPU fallback (ops/CopyingFallback.cpp,
// docs/operators.md). The number is the index of the word.
inline constexpr const char* kCpuFallbackChoices[] = {"warn", "silent",
                                                      "error"};
inline constexpr Spec kCpuFallback{
    "PHANTOM_CPU_FALLBACK", Kind::kChoice, 0, 2, 0, "warn", nullptr,
    Reader::kOps,
    "without a kernel view, an op copied to the CPU and back: warn (once "
    "per op), silent, or error (refuse it) (docs/operators.md)",
    nullptr, 0, kCpuFallbackChoices,
    sizeof(kCpuFallbackChoices) / sizeof(kCpuFallbackChoices[0])};

// Test-only: plays a driver without a kernel view (device/fake/config.h,
// docs/fake-driver.md).
inline constexpr Spec kFakeNoKernelView = Switch(
    "PHANTOM_FAKE_NO_KERNEL_VIEW", Reader::kDriver,
    "test-only: 1 makes the fake driver's table leave ph_kernel_address "
    "NULL, as a discrete device's driver does; ops then take the copying "
    "CPU fallback (docs/fake-driver.md)");

// Test-only: plays a driver that cannot share memory between processes
// (device/fake/ipc.h, docs/multiprocessing.md).
inline constexpr Spec kFakeNoIpc = Switch(
    "PHANTOM_FAKE_NO_IPC", Reader::kDriver,
    "test-only: 1 makes the fake driver refuse interprocess sharing, as a "
    "driver without that capability does (docs/multiprocessing.md)");

// The remote driver (device/remote/client_link.h, docs/remote-driver.md).
// Text kinds: the parser only refuses what cannot name a file.
inline constexpr Spec kRemoteServer{
    "PHANTOM_REMOTE_SERVER", Kind::kLibrary, 0, 0, 0,
    "(next to the driver)", nullptr, Reader::kDriver,
    "the remote driver's server program, which it starts on first use "
    "(docs/remote-driver.md)"};
inline constexpr Spec kRemoteSocket{
    "PHANTOM_REMOTE_SOCKET", Kind::kLibrary, 0, 0, 0,
    "(unset: the driver starts its own)", nullptr, Reader::kDriver,
    "the socket of a running phantom_remote_server the remote driver "
    "connects to instead of starting one (docs/remote-driver.md)"};

// Every setting, in the order the README lists them.
inline constexpr const Spec* kAll[] = {
    &kDeviceCount, &kDeviceMemory, &kAllocConf,  &kFaultAlloc,
    &kFaultKernel, &kFaultLatencyUs, &kNoLending, &kSyncGeneric,
    &kDebugMemo,   &kCpuFallback,   &kOpsReport,     &kRaceDetector,
    &kDriver,      &kFakeNoIpc,     &kFakeNoKernelView, &kRemoteServer,
    &kRemoteSocket};

// The setting called `name` (a top-level PHANTOM_* one), or nullptr.
const Spec* Find(const char* name);

// ---------------------------------------------------------------------------
// Parsing.

struct Value {
  bool set = false;      // false: unset, the default applies
  uint64_t number = 0;   // kCount, kSize (bytes), kSwitch (0 or 1)
  double fraction = 0;   // kFraction
  struct Option {
    const Spec* spec;
    uint64_t number;
    double fraction;
  };
  std::vector<Option> options;  // kOptions, in the order given
  std::string text;  // kLibrary: the value, trimmed (the default if unset);
                     // kChoice: the accepted word, as the catalogue spells it

  // The option `spec` if it was given, else nullptr.
  const Option* option(const Spec& spec) const;
};

// Parses `text` (nullptr: unset) as a value of `spec`. On success returns
// true and fills *out (with the default when unset). On failure returns
// false, leaves *out alone and sets *error to the refusal sentence.
bool Parse(const Spec& spec, const char* text, Value* out, std::string* error);

// Parse() of the environment variable spec.name.
bool ReadEnvironment(const Spec& spec, Value* out, std::string* error);

// What `spec` accepts, as the refusal sentence says it after "accepted: ".
std::string Accepted(const Spec& spec);

// "Fake driver", "runtime", "ops" or "python".
const char* ReaderName(Reader reader);

// "count", "size", "switch", "fraction", "options" or "library".
const char* KindName(Kind kind);

// A size as the settings spell it: "1MiB", "8GiB", "1536KiB", "1000B".
std::string FormatSize(uint64_t bytes);

}  // namespace phantom::settings

#endif  // PHANTOM_COMMON_SETTINGS_H_
