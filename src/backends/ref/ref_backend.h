// The reference backend: plain loops in fp32 (fp64 accumulation for reductions), NCHW
// and NHWC, the oracle every other backend is tested against. It refuses any dtype but
// fp32 (rn::Unsupported): tests run it on values already rounded to the half type.
#pragma once

#include <memory>

#include "ops/backend.h"

namespace rn {
std::unique_ptr<Backend> make_ref_backend();
}
