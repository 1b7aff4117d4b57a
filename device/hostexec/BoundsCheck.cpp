// See phantom/BoundsCheck.h.
#include <phantom/BoundsCheck.h>

#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

namespace phantom {

void raiseOutsideStorage(const at::Tensor& tensor, int64_t begin, int64_t end,
                         const char* where) {
  TORCH_CHECK(false, "a ", c10::get_privateuse1_backend(), " tensor",
              where != nullptr ? std::string(" passed to ") + where
                               : std::string(),
              " is a view that needs bytes [", begin, ", ", end,
              ") of its storage (shape ", tensor.sizes(), ", strides ",
              tensor.strides(), ", offset ", tensor.storage_offset(), ", ",
              tensor.dtype(), "), but its storage has ",
              tensor.storage().nbytes(),
              " bytes; was the storage resized under a view "
              "(untyped_storage().resize_())? Make the view again from a "
              "tensor whose storage holds it");
}

}  // namespace phantom
