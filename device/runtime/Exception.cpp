// See phantom/Exception.h for the mapping of HAL status codes to exceptions.
#include <phantom/Exception.h>

#include <c10/util/Exception.h>

#include <string>

namespace phantom {

void throwHalError(ph_status_t status, const char* expr, const char* file,
                   int line) {
  std::string message = ph_last_error_message();
  if (message.empty()) {
    message = std::string(ph_status_name(status)) + " from " + expr;
  }
  const c10::SourceLocation where{"phantom", file, static_cast<uint32_t>(line)};
  switch (status) {
    case PH_ERROR_OUT_OF_MEMORY:
      throw c10::OutOfMemoryError(where, message);
    case PH_ERROR_INVALID_ARGUMENT:
      throw c10::ValueError(where, message);
    case PH_ERROR_INVALID_DEVICE:
    case PH_ERROR_INVALID_HANDLE:
      throw c10::Error(where, message);
    case PH_ERROR_UNIMPLEMENTED:
      throw c10::NotImplementedError(where, message);
    default:
      throw c10::AcceleratorError(where, static_cast<int32_t>(status),
                                  "phantom " + std::string(ph_status_name(status)) +
                                      ": " + message);
  }
}

}  // namespace phantom
