// Reference element-wise ops over dense storage, in parallel chunks. Outputs may alias
// their first input: every element is read before it is written, and chunks are disjoint.
//   relu:     y = max(x, 0) (NaN propagates);  dx = y > 0 ? dy : 0
//   add:      y = a + b
//   cast:     every conversion between fp32, bf16 and fp16 (core/dtype.h convert)
#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/ref/ref_kernels.h"
#include "core/thread_pool.h"

namespace rn::ref {
namespace {

// Chunks of at least this many elements per parallel task: element-wise work is cheap.
constexpr int64_t kChunk = 1 << 15;

template <typename Fn>
void parallel_chunks(int64_t n, Fn&& fn) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  ThreadPool::global().parallel_for(chunks,
                                    [&](int64_t begin, int64_t end) { fn(begin * kChunk, std::min(end * kChunk, n)); });
}

class RefRelu final : public ReluKernel {
 public:
  using ReluKernel::ReluKernel;

 protected:
  void do_forward(const Tensor& y, const Tensor& x) override {
    const float* xp = x.ptr<float>();
    float* yp = y.ptr<float>();
    parallel_chunks(desc_.numel, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) yp[i] = xp[i] < 0.0f ? 0.0f : xp[i];
    });
  }
  void do_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) override {
    const float* dyp = dy.ptr<float>();
    const float* yp = y.ptr<float>();
    float* dxp = dx.ptr<float>();
    parallel_chunks(desc_.numel, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dxp[i] = yp[i] > 0.0f ? dyp[i] : 0.0f;
    });
  }
};

class RefAdd final : public AddKernel {
 public:
  using AddKernel::AddKernel;

 protected:
  void do_forward(const Tensor& y, const Tensor& a, const Tensor& b) override {
    const float* ap = a.ptr<float>();
    const float* bp = b.ptr<float>();
    float* yp = y.ptr<float>();
    parallel_chunks(desc_.numel, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) yp[i] = ap[i] + bp[i];
    });
  }
};

class RefCast final : public CastKernel {
 public:
  using CastKernel::CastKernel;

 protected:
  void do_forward(const Tensor& y, const Tensor& x) override {
    const int64_t n = desc_.numel;
    const size_t src_size = dtype_size(desc_.src), dst_size = dtype_size(desc_.dst);
    const char* src = static_cast<const char*>(x.data);
    char* dst = static_cast<char*>(y.data);
    // Overlapping buffers of different element sizes would let one chunk overwrite what
    // another has yet to read: convert from a copy instead.
    std::vector<char> copy;
    const bool overlap = src < dst + n * dst_size && dst < src + n * src_size;
    if (overlap && src_size != dst_size) {
      copy.assign(src, src + n * src_size);
      src = copy.data();
    }
    parallel_chunks(n, [&](int64_t b, int64_t e) {
      convert(dst + b * dst_size, desc_.dst, src + b * src_size, desc_.src, static_cast<size_t>(e - b));
    });
  }
};

}  // namespace

std::unique_ptr<ReluKernel> make_relu(const EltwiseDesc& d) {
  d.validate();
  require_f32(d.dtype, "relu " + d.str());
  return std::make_unique<RefRelu>(d);
}

std::unique_ptr<AddKernel> make_add(const EltwiseDesc& d) {
  d.validate();
  require_f32(d.dtype, "add " + d.str());
  return std::make_unique<RefAdd>(d);
}

std::unique_ptr<CastKernel> make_cast(const CastDesc& d) {
  d.validate();
  return std::make_unique<RefCast>(d);
}

}  // namespace rn::ref
