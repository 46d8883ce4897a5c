// Tensors are non-owning views: a pointer, a shape, a dtype, a layout and a device.
// Storage is owned elsewhere: by an Arena (the planned activation/gradient memory),
// by the flat parameter buffers, or by a HostTensor in tests and tools.
//
// 4-D activation shapes are always given in logical NCHW order; `layout` says how the
// elements are laid out in memory (NCHW or NHWC). Tensors of other ranks are dense
// row-major and their layout is ignored.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "core/check.h"
#include "core/dtype.h"

namespace rn {

enum class Layout : uint8_t { nchw, nhwc };
enum class Device : uint8_t { cpu, cuda };

std::string_view layout_name(Layout l);
std::string_view device_name(Device d);

class Shape {
 public:
  static constexpr int kMaxRank = 5;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t& operator[](int i) { return dims_[static_cast<size_t>(i)]; }
  // Throws rn::Error naming the shape when the product of the dims does not fit in int64_t.
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;  // "[2, 3, 224, 224]"

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

// numel() * dtype_size(dtype): throws rn::Error naming the shape when the byte count does not
// fit in int64_t (a batch or image size no memory could hold; every size computation wraps past it).
size_t shape_bytes(const Shape& shape, DType dtype);
// Whether shape_bytes(shape, dtype) fits, for checks that name the layer themselves.
bool shape_bytes_fit(const Shape& shape, DType dtype);

struct Tensor {
  void* data = nullptr;
  Shape shape;
  DType dtype = DType::f32;
  Layout layout = Layout::nchw;
  Device device = Device::cpu;

  int64_t numel() const { return shape.numel(); }
  size_t bytes() const { return shape_bytes(shape, dtype); }

  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }

  // Element offset of logical (n, c, h, w) in a 4-D tensor, honouring the layout.
  int64_t offset(int64_t n, int64_t c, int64_t h, int64_t w) const {
    const int64_t C = shape[1], H = shape[2], W = shape[3];
    return layout == Layout::nchw ? ((n * C + c) * H + h) * W + w : ((n * H + h) * W + w) * C + c;
  }

  std::string str() const;  // "bf16[2, 64, 56, 56] nhwc"
};

// Aligned host allocation (64 bytes, so that vector loads and oneDNN are happy).
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t bytes);
  void* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }
  void zero();

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;
  size_t bytes_ = 0;
};

// A tensor that owns its host memory: for tests, tools and small host-side state.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(Shape shape, DType dtype, Layout layout = Layout::nchw);
  const Tensor& view() const { return view_; }
  operator const Tensor&() const { return view_; }
  template <typename T>
  T* ptr() const {
    return view_.ptr<T>();
  }
  int64_t numel() const { return view_.numel(); }

 private:
  HostBuffer buffer_;
  Tensor view_;
};

// One aligned block carved into views at planned offsets. A training step allocates
// nothing: every activation and gradient is a view into the arena.
// The block lives in host memory, or in a device backend's MemorySpace (memory_space.h);
// views carry its device.
class MemorySpace;
class Arena {
 public:
  static constexpr size_t kAlignment = 64;
  Arena() = default;
  explicit Arena(size_t bytes);
  Arena(size_t bytes, MemorySpace& space);
  ~Arena();
  Arena(Arena&&) noexcept;
  Arena& operator=(Arena&&) noexcept;
  size_t bytes() const { return bytes_; }
  void* base() const { return base_; }
  Device device() const { return device_; }
  Tensor view(size_t offset, Shape shape, DType dtype, Layout layout = Layout::nchw) const;

 private:
  void release() noexcept;
  MemorySpace* space_ = nullptr;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::cpu;
};

inline size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace rn
