#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/memory_space.h"

namespace rn {

std::string_view layout_name(Layout l) { return l == Layout::nchw ? "nchw" : "nhwc"; }
std::string_view device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

Shape::Shape(std::initializer_list<int64_t> dims) {
  RN_CHECK(dims.size() <= kMaxRank) << "rank " << dims.size() << " exceeds " << kMaxRank;
  for (int64_t d : dims) {
    RN_CHECK(d >= 0) << "negative dimension " << d;
    dims_[static_cast<size_t>(rank_++)] = d;
  }
}

int64_t Shape::numel() const {
  // Dims come from user input (batch, image size); a wrapped product would plan and allocate
  // a wrong size rather than fail.
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i)
    if (__builtin_mul_overflow(n, dims_[static_cast<size_t>(i)], &n))
      RN_FAIL() << "a tensor of shape " << str()
                << " has more elements than a 64-bit count holds: lower the batch size or the input size";
  return n;
}

size_t shape_bytes(const Shape& shape, DType dtype) {
  int64_t bytes = 0;
  if (__builtin_mul_overflow(shape.numel(), static_cast<int64_t>(dtype_size(dtype)), &bytes))
    RN_FAIL() << "a " << dtype_name(dtype) << " tensor of shape " << shape.str()
              << " needs more bytes than a 64-bit size holds: lower the batch size or the input size";
  return static_cast<size_t>(bytes);
}

bool shape_bytes_fit(const Shape& shape, DType dtype) {
  int64_t n = static_cast<int64_t>(dtype_size(dtype));
  for (int i = 0; i < shape.rank(); ++i)
    if (__builtin_mul_overflow(n, shape[i], &n)) return false;
  return true;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[static_cast<size_t>(i)] != o.dims_[static_cast<size_t>(i)]) return false;
  return true;
}

std::string Shape::str() const {
  std::ostringstream s;
  s << "[";
  for (int i = 0; i < rank_; ++i) s << (i ? ", " : "") << dims_[static_cast<size_t>(i)];
  s << "]";
  return s.str();
}

std::string Tensor::str() const {
  std::ostringstream s;
  s << dtype_name(dtype) << shape.str();
  if (shape.rank() == 4) s << " " << layout_name(layout);
  if (device != Device::cpu) s << " " << device_name(device);
  return s.str();
}

void HostBuffer::Free::operator()(void* p) const { std::free(p); }

HostBuffer::HostBuffer(size_t bytes) : bytes_(bytes) { data_.reset(host_allocate(bytes)); }

void HostBuffer::zero() {
  if (data_) std::memset(data_.get(), 0, bytes_);
}

HostTensor::HostTensor(Shape shape, DType dtype, Layout layout) {
  view_.shape = shape;
  view_.dtype = dtype;
  view_.layout = layout;
  buffer_ = HostBuffer(view_.bytes());
  buffer_.zero();
  view_.data = buffer_.data();
}

Arena::Arena(size_t bytes) : Arena(bytes, host_memory()) {}

Arena::Arena(size_t bytes, MemorySpace& space)
    : space_(&space), base_(space.allocate(bytes)), bytes_(bytes), device_(space.device()) {}

Arena::~Arena() { release(); }

Arena::Arena(Arena&& o) noexcept : space_(o.space_), base_(o.base_), bytes_(o.bytes_), device_(o.device_) {
  o.space_ = nullptr, o.base_ = nullptr, o.bytes_ = 0;
}

Arena& Arena::operator=(Arena&& o) noexcept {
  if (this != &o) {
    release();
    space_ = o.space_, base_ = o.base_, bytes_ = o.bytes_, device_ = o.device_;
    o.space_ = nullptr, o.base_ = nullptr, o.bytes_ = 0;
  }
  return *this;
}

void Arena::release() noexcept {
  if (space_ && base_) space_->free(base_);
  space_ = nullptr, base_ = nullptr, bytes_ = 0;
}

Tensor Arena::view(size_t offset, Shape shape, DType dtype, Layout layout) const {
  Tensor t;
  t.shape = shape;
  t.dtype = dtype;
  t.layout = layout;
  RN_CHECK(offset % kAlignment == 0) << "arena offset " << offset << " is not aligned";
  RN_CHECK(offset + t.bytes() <= bytes())
      << "view " << t.str() << " at offset " << offset << " overruns arena of " << bytes() << " bytes";
  t.data = static_cast<char*>(base()) + offset;
  t.device = device_;
  return t;
}

}  // namespace rn
