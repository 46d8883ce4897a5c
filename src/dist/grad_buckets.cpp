#include "dist/grad_buckets.h"

#include <algorithm>
#include <chrono>

#include "core/check.h"

namespace rn {

std::vector<GradBucket> make_grad_buckets(const std::vector<GradRange>& params, int64_t threshold_bytes,
                                          const std::vector<int>& boundaries, size_t elem_bytes) {
  const int n = static_cast<int>(params.size());
  std::vector<GradBucket> out;
  if (n == 0) return out;
  for (int i = 1; i < n; ++i)
    RN_CHECK(params[static_cast<size_t>(i)].offset >= params[static_cast<size_t>(i - 1)].offset +
                                                          params[static_cast<size_t>(i - 1)].numel)
        << "gradient buckets: parameter " << i << " does not follow parameter " << i - 1 << " in the flat buffer";
  std::vector<bool> starts(static_cast<size_t>(n), false);
  starts[0] = true;
  if (!boundaries.empty()) {
    int prev = 0;
    for (int b : boundaries) {
      RN_CHECK(b > 0 && b < n) << "dist.bucket_boundaries: " << b << " is not a parameter index in 1.." << n - 1
                               << " (the model has " << n << " parameter tensors)";
      RN_CHECK(b > prev) << "dist.bucket_boundaries must be increasing: " << b << " after " << prev;
      starts[static_cast<size_t>(b)] = true;
      prev = b;
    }
  } else {
    RN_CHECK(threshold_bytes > 0) << "dist.fusion_threshold must be positive, not " << threshold_bytes;
    int64_t bytes = 0;
    for (int i = 0; i < n; ++i) {
      const int64_t b = params[static_cast<size_t>(i)].numel * static_cast<int64_t>(elem_bytes);
      if (i > 0 && bytes > 0 && bytes + b > threshold_bytes) {
        starts[static_cast<size_t>(i)] = true;
        bytes = 0;
      }
      bytes += b;
    }
  }
  for (int i = 0; i < n; ++i) {
    const GradRange& p = params[static_cast<size_t>(i)];
    if (starts[static_cast<size_t>(i)]) {
      if (!out.empty()) out.back().end = p.offset;  // padding before p belongs to the previous bucket
      out.push_back({i, i, p.offset, p.offset + p.numel});
    } else {
      out.back().last = i;
      out.back().end = p.offset + p.numel;
    }
  }
  return out;
}

GradientReducer::GradientReducer(Communicator& comm, std::vector<GradBucket> buckets, float* grads, int num_params)
    : comm_(comm), buckets_(std::move(buckets)), grads_(grads), bucket_of_(static_cast<size_t>(num_params), -1) {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (int p = buckets_[b].first; p <= buckets_[b].last; ++p) {
      RN_CHECK(p >= 0 && p < num_params) << "gradient bucket " << b << " names parameter " << p << " of " << num_params;
      bucket_of_[static_cast<size_t>(p)] = static_cast<int>(b);
    }
    names_.push_back("gradient bucket " + std::to_string(b + 1) + "/" + std::to_string(buckets_.size()));
  }
  for (int p = 0; p < num_params; ++p)
    RN_CHECK(bucket_of_[static_cast<size_t>(p)] >= 0) << "parameter " << p << " is in no gradient bucket";
  remaining_.assign(buckets_.size(), 0);
  tickets_.assign(buckets_.size(), 0);
}

void GradientReducer::begin_step() {
  wait_joined();  // the previous device step's buckets (long done; releases their events)
  for (size_t b = 0; b < buckets_.size(); ++b) {
    remaining_[b] = buckets_[b].last - buckets_[b].first + 1;
    tickets_[b] = 0;
  }
}

void GradientReducer::issue(int b) {
  const GradBucket& k = buckets_[static_cast<size_t>(b)];
  tickets_[static_cast<size_t>(b)] = comm_.all_reduce_async(grads_ + k.begin, k.end - k.begin, ElemType::f32,
                                                            ReduceOp::average, names_[static_cast<size_t>(b)]);
}

void GradientReducer::on_ready(const std::vector<int>& params) {
  for (int p : params) {
    if (p < 0 || p >= static_cast<int>(bucket_of_.size())) continue;
    const int b = bucket_of_[static_cast<size_t>(p)];
    if (--remaining_[static_cast<size_t>(b)] == 0) issue(b);
  }
}

void GradientReducer::issue_rest() {
  // Buckets whose parameters got no gradient this step (frozen layers) go last, in order,
  // so that every rank issues the same sequence.
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (tickets_[b] == 0) issue(static_cast<int>(b));
}

CommStats GradientReducer::finish() {
  const double backward_end =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  issue_rest();
  CommStats s;
  double last_end = backward_end;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const CollectiveTiming t = comm_.wait(tickets_[b]);
    s.timings.push_back(t);
    s.total += std::max(0.0, t.end - t.start);
    last_end = std::max(last_end, t.end);
    s.bytes += buckets_[b].bytes();
  }
  s.buckets = static_cast<int>(buckets_.size());
  s.backward_end = backward_end;
  s.exposed = std::min(s.total, std::max(0.0, last_end - backward_end));
  s.hidden = s.total - s.exposed;
  return s;
}

CommStats GradientReducer::finish_on_device() {
  issue_rest();
  comm_.mark_compute();  // before the joins, which make the compute stream wait
  CommStats s;
  s.timed = false;
  joined_tickets_.clear();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    comm_.join(tickets_[b]);
    joined_ = std::max(joined_, tickets_[b]);
    joined_tickets_.push_back(tickets_[b]);
    s.bytes += buckets_[b].bytes();
  }
  s.buckets = static_cast<int>(buckets_.size());
  return s;
}

std::optional<CommStats> GradientReducer::wait_joined() {
  if (joined_ == 0) return std::nullopt;
  const Communicator::Ticket t = joined_;
  joined_ = 0;
  comm_.wait(t);  // collectives finish in issue order: the last covers all
  std::vector<std::optional<DeviceCollectiveTiming>> timings;
  for (Communicator::Ticket k : joined_tickets_) timings.push_back(comm_.device_timing(k));
  if (auto s = device_comm_stats(timings, buckets_)) return s;
  CommStats s;  // untimed: buckets and bytes only
  s.timed = false;
  s.buckets = static_cast<int>(buckets_.size());
  for (const GradBucket& b : buckets_) s.bytes += b.bytes();
  return s;
}

void GradientReducer::wait_device() {
  joined_ = 0;  // a captured step's tickets: covered by the wait below
  comm_.wait_for_compute("the gradient all-reduces of the replayed steps");
}

bool GradientReducer::any_rank(bool mine) {
  for (double v : comm_.all_gather(mine ? 1.0 : 0.0, "whether a rank must capture the step graph again"))
    if (v != 0.0) return true;
  return false;
}

std::optional<CommStats> device_comm_stats(const std::vector<std::optional<DeviceCollectiveTiming>>& timings,
                                           const std::vector<GradBucket>& buckets) {
  if (timings.empty() || timings.size() != buckets.size()) return std::nullopt;
  CommStats s;
  double last_end = -1e300;
  for (size_t b = 0; b < timings.size(); ++b) {
    if (!timings[b]) return std::nullopt;
    s.total += std::max(0.0, timings[b]->run_s);
    last_end = std::max(last_end, timings[b]->end_after_mark_s);
    s.bytes += buckets[b].bytes();
  }
  s.buckets = static_cast<int>(buckets.size());
  s.exposed = std::min(s.total, std::max(0.0, last_end));
  s.hidden = s.total - s.exposed;
  return s;
}

}  // namespace rn
