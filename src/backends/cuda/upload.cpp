// The input pipeline's side of the CUDA backend: pinned host memory for the loader's batch
// buffers, and the double-buffered uploader (core/memory_space.h) whose copies run on a
// stream of their own, so that the next batch crosses while the compute stream still runs
// the current step, and never waits behind its kernels.
//
// Ordering, for buffer k of two:
//   begin():   the copy stream waits for consumed[k] (the compute work that last read k);
//   copy():    cudaMemcpyAsync on the copy stream (pinned sources: a true asynchronous DMA);
//   end():     copied[k] is recorded on the copy stream, the compute stream waits for it, and
//              the host waits for it too, so that the loader may refill its source buffer;
//   release(): consumed[k] is recorded on the compute stream.
// The host therefore runs at most two batches ahead of the device's input conversion,
// which is the back-pressure the loader's slots need.
#include <cstring>

#include "backends/cuda/context.h"

namespace rn::cuda {
namespace {

class PinnedMemory final : public MemorySpace {
 public:
  Device device() const override { return Device::cpu; }
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
    RN_CHECK(e == cudaSuccess) << "cudaHostAlloc of " << bytes << " bytes of pinned host memory failed: "
                               << cudaGetErrorString(e);
    return p;
  }
  void free(void* p) noexcept override {
    if (p) cudaFreeHost(p);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void zero(void* p, size_t bytes) override {
    if (bytes) std::memset(p, 0, bytes);
  }
};

class CudaUploader final : public Uploader {
 public:
  CudaUploader(const ContextPtr& ctx, size_t bytes) : ctx_(ctx) {
    RN_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    for (Buffer& b : buffers_) {
      b.data = DeviceBuffer(ctx_->memory(), bytes);
      RN_CUDA_CHECK(cudaEventCreateWithFlags(&b.copied, cudaEventDisableTiming));
      RN_CUDA_CHECK(cudaEventCreateWithFlags(&b.consumed, cudaEventDisableTiming));
    }
  }
  ~CudaUploader() override {
    if (copy_stream_) cudaStreamSynchronize(copy_stream_);
    cudaStreamSynchronize(ctx_->stream());  // nothing may still read a buffer
    for (Buffer& b : buffers_) {
      cudaEventDestroy(b.copied);
      cudaEventDestroy(b.consumed);
    }
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
  }

  void* begin() override {
    RN_CHECK(!open_) << "Uploader: begin() twice without end()";
    current_ ^= 1;
    Buffer& b = buffers_[current_];
    if (b.ever_consumed) RN_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, b.consumed, 0));
    open_ = true;
    return b.data.data();
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    const Buffer& b = buffers_[current_];
    const auto* d = static_cast<const char*>(dst);
    const auto* base = static_cast<const char*>(b.data.data());
    RN_CHECK(open_ && d >= base && d + bytes <= base + b.data.bytes())
        << "Uploader: a copy of " << bytes << " bytes outside the open buffer of " << b.data.bytes() << " bytes";
    if (bytes) RN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy_stream_));
  }
  void end() override {
    RN_CHECK(open_) << "Uploader: end() without begin()";
    Buffer& b = buffers_[current_];
    RN_CUDA_CHECK(cudaEventRecord(b.copied, copy_stream_));
    RN_CUDA_CHECK(cudaStreamWaitEvent(ctx_->stream(), b.copied, 0));
    RN_CUDA_CHECK(cudaEventSynchronize(b.copied));
    open_ = false;
  }
  void release() override {
    Buffer& b = buffers_[current_];
    RN_CUDA_CHECK(cudaEventRecord(b.consumed, ctx_->stream()));
    b.ever_consumed = true;
  }

 private:
  struct Buffer {
    DeviceBuffer data;
    cudaEvent_t copied = nullptr, consumed = nullptr;
    bool ever_consumed = false;
  };
  ContextPtr ctx_;
  cudaStream_t copy_stream_ = nullptr;
  Buffer buffers_[2];
  int current_ = 1;  // the first begin() takes buffer 0
  bool open_ = false;
};

}  // namespace

MemorySpace& pinned_memory() {
  static PinnedMemory pinned;  // lives as long as the process: loaders may outlive a backend
  return pinned;
}

std::unique_ptr<Uploader> make_uploader(const ContextPtr& ctx, size_t bytes) {
  return std::make_unique<CudaUploader>(ctx, bytes);
}

}  // namespace rn::cuda
