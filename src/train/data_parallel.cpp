#include "train/data_parallel.h"

#include <algorithm>

#include "core/check.h"
#include "core/log.h"
#include "core/plural.h"

namespace rn {

GradientSync make_gradient_sync(Model& model, Backend& backend, Communicator& host, int device, const DistConfig& dist,
                                const DeviceCommunicatorFactory& make_device_comm) {
  GradientSync s;
  std::vector<GradRange> ranges;
  for (const ParamView& v : model.params().params) ranges.push_back({v.offset, v.numel});
  std::vector<int> boundaries(dist.bucket_boundaries.begin(), dist.bucket_boundaries.end());
  std::vector<GradBucket> buckets = make_grad_buckets(ranges, dist.fusion_threshold, boundaries);
  // Checked on one rank too: config.yaml records the settings, and a resume on several ranks
  // would find them wrong only then.
  if (host.size() == 1) return s;
  float* grads = model.grad_data();
  s.comm = &host;
  if (backend.device() != Device::cpu) {
    model.place_on(backend.memory());
    RN_CHECK(make_device_comm) << "data-parallel training on " << backend.name() << " needs a device communicator";
    s.device_comm = make_device_comm(host, device, backend.native_stream(), dist.timeout_s);
    s.comm = s.device_comm.get();
    grads = model.compute_grad_data();
  }
  int64_t largest = 0;
  for (const GradBucket& b : buckets) largest = std::max(largest, b.bytes());
  RN_LOG_INFO("gradient fusion: {} ({}), largest {:.2f} MiB, all-reduced during backward{}",
              counted(static_cast<int64_t>(buckets.size()), "bucket"),
              boundaries.empty() ? fmt::format("dist.fusion_threshold {} bytes", dist.fusion_threshold)
                                 : "dist.bucket_boundaries",
              largest / 1048576.0,
              s.on_device() ? fmt::format(" by the {} communicator on device {}", s.comm->name(), device) : "");
  s.reducer = std::make_unique<GradientReducer>(*s.comm, std::move(buckets), grads,
                                                static_cast<int>(model.params().params.size()));
  return s;
}

namespace {

class HostStatsReducer final : public BatchStatsReducer {
 public:
  explicit HostStatsReducer(Communicator& comm) : comm_(comm) {}
  void sum(double* values, int64_t n) override {
    comm_.all_reduce(values, n, ReduceOp::sum, "synchronised BN statistics");
  }

 private:
  Communicator& comm_;
};

// The sum is joined, not waited for: a later wait (the step's gradient buckets, issued after
// it) covers it, under the communicator's timeout.
class DeviceStatsReducer final : public BatchStatsReducer {
 public:
  explicit DeviceStatsReducer(Communicator& comm) : comm_(comm) {}
  void sum(double* values, int64_t n) override {
    comm_.join(comm_.all_reduce_async(values, n, ElemType::f64, ReduceOp::sum, "synchronised BN statistics"));
  }
  bool on_device() const override { return true; }

 private:
  Communicator& comm_;
};

}  // namespace

std::unique_ptr<BatchStatsReducer> make_bn_stats_reducer(const GradientSync& sync, Communicator& host) {
  if (sync.on_device()) return std::make_unique<DeviceStatsReducer>(*sync.comm);
  return std::make_unique<HostStatsReducer>(host);
}

}  // namespace rn
