#include "ops/check_tensor.h"

namespace rn {

void check_tensor(const Tensor& t, const Shape& shape, DType dtype, Layout layout, const char* what,
                  const std::string& op) {
  RN_CHECK(t.data != nullptr || shape.numel() == 0) << op << ": " << what << " has no data";
  RN_CHECK(t.shape == shape) << op << ": " << what << " has shape " << t.shape.str() << ", expected "
                             << shape.str();
  RN_CHECK(t.dtype == dtype) << op << ": " << what << " has dtype " << dtype_name(t.dtype) << ", expected "
                             << dtype_name(dtype);
  if (shape.rank() == 4) {
    RN_CHECK(t.layout == layout) << op << ": " << what << " has layout " << layout_name(t.layout) << ", expected "
                                 << layout_name(layout);
  }
}

}  // namespace rn
