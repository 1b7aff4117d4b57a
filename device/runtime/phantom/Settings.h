// The PHANTOM_* settings as the runtime and ops read them.
//
// The catalogue and the parser are device/common's (phantom/common/settings.h,
// linked into the runtime privately): every value follows the same rules and
// a refused one gets the same sentence as in the fake driver and in Python.
// What is the runtime's own is what a refusal does: it throws
// c10::ValueError with that sentence, at the first use of the device
// (deviceCountOrThrow calls checkRuntimeSettings) and at every later one, so
// a LibTorch program gets the error at its first phantom call and nothing
// runs with a setting silently ignored. Python's `import torch_phantom` checks
// the same settings earlier, before it loads the runtime.
//
// The settings the fake driver reads (device count and memory) are not
// checked here: the driver refuses to start and says why through
// ph_last_error_message(), which the runtime passes on.
#pragma once

#include <cstddef>
#include <string>

namespace phantom {

// The 0/1 setting `name` (e.g. "PHANTOM_SYNC_GENERIC"), read from the
// environment. Throws c10::ValueError (the settings sentence) if it is
// malformed. An internal error if `name` is not a switch of the catalogue.
bool switchSetting(const char* name);

// The word-valued setting `name` (e.g. "PHANTOM_CPU_FALLBACK"): the index
// of its word in the catalogue's list. Throws like switchSetting.
size_t choiceSetting(const char* name);

// The first malformed setting among those the runtime and ops read, as the
// settings sentence, or "" if all are well formed. Checked once per process.
const std::string& runtimeSettingsError() noexcept;

// Throws c10::ValueError with runtimeSettingsError() unless it is empty.
void checkRuntimeSettings();

}  // namespace phantom
