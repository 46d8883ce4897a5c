// The CUDA step graph (ops/fused_step.h): stream capture of a whole training step, replayed
// with cudaGraphLaunch.
#include <functional>
#include <string>

#include "backends/cuda/context.h"
#include "backends/cuda/fused_step.h"

namespace rn::cuda {
namespace {

// A captured graph holds the addresses its kernels used, the shared workspace's among them.
// When a later kernel (an evaluation plan's, say) makes the workspace grow, the old block is
// freed, so the graph counts as not captured any more and the step is captured again.
class CudaStepGraph final : public StepGraph {
 public:
  explicit CudaStepGraph(const ContextPtr& ctx) : ctx_(ctx) {}
  ~CudaStepGraph() override { destroy(); }
  void capture(const std::function<void()>& work) override {
    RN_CHECK(!captured()) << "step graph: already captured";
    cudaStream_t s = ctx_->stream();
    RN_CUDA_CHECK(cudaStreamSynchronize(s));
    destroy();  // a stale graph (see above), if any
    const uint64_t generation = ctx_->workspace_generation();
    RN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    try {
      work();
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(s, &broken);
      if (broken) cudaGraphDestroy(broken);
      cudaGetLastError();
      throw;
    }
    RN_CUDA_CHECK(cudaStreamEndCapture(s, &graph_));
    RN_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
    RN_CHECK(ctx_->workspace_generation() == generation)
        << "step graph: the shared device workspace was reallocated during the capture (a kernel was made inside it)";
    generation_ = generation;
  }
  bool captured() const override { return exec_ != nullptr && generation_ == ctx_->workspace_generation(); }
  void check_capture(const std::string& after) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    RN_CUDA_CHECK(cudaStreamIsCapturing(ctx_->stream(), &status));
    RN_CHECK(status != cudaStreamCaptureStatusInvalidated)
        << "sink mode: the CUDA graph capture of the training step was invalidated in '" << after
        << "' (a call there, or just before it, cannot be captured); run.sink_size=0 trains without graphs";
  }
  void replay() override {
    RN_CHECK(captured()) << "step graph: replay before capture, or after the workspace it captured was reallocated";
    RN_CUDA_CHECK(cudaGraphLaunch(exec_, ctx_->stream()));
  }
  void invalidate() override {
    RN_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream()));  // no replay of it may still run
    destroy();
  }

 private:
  void destroy() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
  }
  ContextPtr ctx_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  uint64_t generation_ = 0;
};

}  // namespace

std::unique_ptr<StepGraph> make_step_graph(const ContextPtr& ctx) { return std::make_unique<CudaStepGraph>(ctx); }

}  // namespace rn::cuda
