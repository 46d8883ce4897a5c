// Gradient fusion: the flat gradient buffer (parameters in the order backward produces
// their gradients, see model/params.h) cut into buckets, each all-reduced as soon as
// backward has written its last gradient, on the communicator's thread (or stream), while
// backward goes on with the layers below. The optimizer then waits only for what is left.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace rn {

// One parameter tensor's range in the flat buffer, in elements.
struct GradRange {
  int64_t offset = 0, numel = 0;
};

struct GradBucket {
  int first = 0, last = 0;  // parameter indices, inclusive
  int64_t begin = 0, end = 0;  // element range [begin, end) of the flat buffer (alignment padding included)
  int64_t bytes(size_t elem_bytes = 4) const { return (end - begin) * static_cast<int64_t>(elem_bytes); }
};

// Buckets of consecutive parameters. With `boundaries` empty: a new bucket starts when
// adding the next parameter would pass `threshold_bytes`, so small gradients always share a
// bucket and one larger than the threshold gets a bucket of its own. With `boundaries`
// (parameter indices, increasing, each in (0, n)): a bucket starts at each of them and
// the threshold is not used. Throws rn::Error for a bad threshold or boundary.
std::vector<GradBucket> make_grad_buckets(const std::vector<GradRange>& params, int64_t threshold_bytes,
                                          const std::vector<int>& boundaries = {}, size_t elem_bytes = 4);

// Communication of one step, in seconds: `total` on the wire, of which `exposed` came after
// backward ended (what the step waited for) and `hidden` overlapped backward. On a device
// (finish_on_device) the seconds come from the communicator's CUDA events, read once the
// host has waited for the step (wait_joined); `timings` (host clock) stays empty there.
// `timed` is false when nothing could be measured: only buckets and bytes are known and
// the seconds stay 0.
struct CommStats {
  bool timed = true;
  double total = 0, exposed = 0, hidden = 0;
  int buckets = 0;
  int64_t bytes = 0;
  std::vector<CollectiveTiming> timings;  // per bucket, in bucket order
  double backward_end = 0;                // when finish() was called (steady-clock seconds)
  double hidden_share() const { return total > 0 ? hidden / total : 0; }
};

// Drives the all-reduce (average) of fp32 gradients bucket by bucket during backward.
//   host:   reducer.begin_step();  ... backward calls reducer.on_ready(params) ...;  reducer.finish();
//   device: reducer.begin_step();  ... on_ready ...;  reducer.finish_on_device();  queue the update;
//           later, before the host reads the step's results: reducer.wait_joined().
// On a device, backward only queues kernels: on_ready() fires when a gradient's kernels are
// queued, and the communicator orders the bucket's collective after everything queued on
// the compute stream at that moment, which includes them.
class GradientReducer {
 public:
  GradientReducer(Communicator& comm, std::vector<GradBucket> buckets, float* grads, int num_params);

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  void begin_step();
  // Backward has finished the gradients of these parameters: start every bucket now complete.
  void on_ready(const std::vector<int>& params);
  // Starts the buckets not yet started (parameters without a gradient this step), waits for
  // all, and returns the step's communication figures.
  CommStats finish();
  // The device form of finish(): starts the buckets not yet started, marks the end of
  // backward on the compute stream and joins every bucket (Communicator::join: later work on
  // the compute stream, the overflow check and the optimizer, waits for them on the device;
  // the host does not wait). Untimed figures: the times come with wait_joined().
  CommStats finish_on_device();
  // Blocks until the buckets joined by the last finish_on_device() are done (a wait() on the
  // last one, under the communicator's timeout: a hung collective ends the job instead of
  // hanging the host in its next synchronisation), and returns that step's figures, timed
  // when the communicator measured every bucket on the device. nullopt when nothing was
  // joined since the last call (and after finish()).
  std::optional<CommStats> wait_joined();
  // Sink mode: the buckets' all-reduces were captured in the step graph and run in every
  // replay, with no tickets to wait for. Blocks until the compute stream has done every
  // replay queued so far, under the communicator's timeout (Communicator::wait_for_compute).
  void wait_device();
  // Whether the communicator's collectives can be captured in a step graph (sink mode).
  bool capturable() const { return comm_.capturable(); }
  // Whether `mine` holds on any rank (a host all-gather; every rank must call it).
  bool any_rank(bool mine);

 private:
  void issue(int bucket);
  void issue_rest();

  Communicator& comm_;
  std::vector<GradBucket> buckets_;
  float* grads_;
  std::vector<int> bucket_of_;    // parameter -> bucket
  std::vector<int> remaining_;    // bucket -> parameters not yet ready this step
  std::vector<Communicator::Ticket> tickets_;  // bucket -> ticket (0: not issued)
  std::vector<std::string> names_;
  Communicator::Ticket joined_ = 0;  // the last bucket of finish_on_device(), until wait_joined()
  std::vector<Communicator::Ticket> joined_tickets_;  // every bucket of that step, in bucket order
};

// A device step's figures from its buckets' device timings (in bucket order): `total` their
// sum, `exposed` how long after the end of backward the last one ended (within [0, total]).
// nullopt if any bucket is missing a timing.
std::optional<CommStats> device_comm_stats(const std::vector<std::optional<DeviceCollectiveTiming>>& timings,
                                           const std::vector<GradBucket>& buckets);

}  // namespace rn
