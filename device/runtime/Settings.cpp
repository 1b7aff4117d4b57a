// See phantom/Settings.h.
#include <phantom/Settings.h>

#include <phantom/common/settings.h>

#include <c10/util/Exception.h>

namespace phantom {

bool switchSetting(const char* name) {
  const settings::Spec* spec = settings::Find(name);
  TORCH_INTERNAL_ASSERT(spec != nullptr && spec->kind == settings::Kind::kSwitch,
                        name, " is not a switch of the settings catalogue");
  settings::Value value;
  std::string error;
  TORCH_CHECK_VALUE(settings::ReadEnvironment(*spec, &value, &error), error);
  return value.number == 1;
}

size_t choiceSetting(const char* name) {
  const settings::Spec* spec = settings::Find(name);
  TORCH_INTERNAL_ASSERT(spec != nullptr && spec->kind == settings::Kind::kChoice,
                        name, " is not a choice of the settings catalogue");
  settings::Value value;
  std::string error;
  TORCH_CHECK_VALUE(settings::ReadEnvironment(*spec, &value, &error), error);
  return static_cast<size_t>(value.number);
}

const std::string& runtimeSettingsError() noexcept {
  // Leaked on purpose, like the rest of the start-up state: read at any time.
  static const std::string* const error = [] {
    for (const settings::Spec* spec : settings::kAll) {
      if (spec->reader != settings::Reader::kRuntime &&
          spec->reader != settings::Reader::kOps) {
        continue;  // the driver's own, or Python's
      }
      settings::Value value;
      std::string message;
      if (!settings::ReadEnvironment(*spec, &value, &message)) {
        return new std::string(std::move(message));
      }
    }
    return new std::string();
  }();
  return *error;
}

void checkRuntimeSettings() {
  const std::string& error = runtimeSettingsError();
  TORCH_CHECK_VALUE(error.empty(), error);
}

}  // namespace phantom
