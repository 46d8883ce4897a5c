#include <gtest/gtest.h>

#include "core/check.h"
#include "dist/grad_buckets.h"
#include "dist/communicator.h"
#include "model/model.h"
#include "model/zoo.h"

namespace rn {
namespace {

std::vector<GradRange> aligned(const std::vector<int64_t>& sizes) {
  std::vector<GradRange> r;
  int64_t off = 0;
  for (int64_t s : sizes) {
    r.push_back({off, s});
    off += (s + 15) / 16 * 16;
  }
  return r;
}

TEST(GradBuckets, SmallGradientsShareABucketAndALargeOneStandsAlone) {
  // 4-byte floats: 100 + 100 + 100 fit 1600 bytes; 1000 floats (4000 bytes) is alone.
  const auto r = aligned({100, 100, 100, 1000, 10, 10});
  const auto b = make_grad_buckets(r, 1600);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].first, 0);
  EXPECT_EQ(b[0].last, 2);
  EXPECT_EQ(b[1].first, 3);
  EXPECT_EQ(b[1].last, 3);
  EXPECT_EQ(b[2].first, 4);
  EXPECT_EQ(b[2].last, 5);
  // Contiguous and covering the buffer from the first parameter to the last one's end,
  // padding included.
  EXPECT_EQ(b[0].begin, 0);
  for (size_t i = 1; i < b.size(); ++i) EXPECT_EQ(b[i].begin, b[i - 1].end);
  EXPECT_EQ(b.back().end, r.back().offset + r.back().numel);
}

TEST(GradBuckets, ThresholdBoundsEveryMultiParameterBucket) {
  Model m(build_model("resnet50", {}));
  std::vector<GradRange> r;
  for (const ParamView& v : m.params().params) r.push_back({v.offset, v.numel});
  for (int64_t threshold : {int64_t{64} << 10, int64_t{1} << 20, int64_t{25} << 20}) {
    const auto b = make_grad_buckets(r, threshold);
    int params = 0;
    for (const GradBucket& k : b) {
      params += k.last - k.first + 1;
      int64_t payload = 0;
      for (int p = k.first; p <= k.last; ++p) payload += r[static_cast<size_t>(p)].numel * 4;
      if (k.last > k.first) {
        EXPECT_LE(payload, threshold) << "bucket of parameters " << k.first << ".." << k.last;
      }
    }
    EXPECT_EQ(params, static_cast<int>(r.size()));
  }
  // A larger threshold never gives more buckets.
  EXPECT_GE(make_grad_buckets(r, 64 << 10).size(), make_grad_buckets(r, 1 << 20).size());
  EXPECT_GE(make_grad_buckets(r, 1 << 20).size(), make_grad_buckets(r, 25 << 20).size());
  EXPECT_EQ(make_grad_buckets(r, int64_t{1} << 40).size(), 1u);
}

TEST(GradBuckets, ExplicitBoundaries) {
  const auto r = aligned({5, 5, 5, 5, 5});
  const auto b = make_grad_buckets(r, 1, {2, 4});
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].last, 1);
  EXPECT_EQ(b[1].first, 2);
  EXPECT_EQ(b[1].last, 3);
  EXPECT_EQ(b[2].first, 4);
}

TEST(GradBuckets, BadSettingsAreErrorsThatSayWhy) {
  const auto r = aligned({5, 5, 5});
  try {
    make_grad_buckets(r, 1, {0});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a parameter index in 1..2"), std::string::npos) << e.what();
  }
  try {
    make_grad_buckets(r, 1, {2, 1});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("increasing"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_grad_buckets(r, 1, {3}), Error);
  EXPECT_THROW(make_grad_buckets(r, 0), Error);
}

// Counts what a reducer asks of its communicator, so the overlap logic is checked without MPI.
class RecordingComm : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "recording"; }
  std::vector<std::string> hosts() const override { return {"a", "b"}; }
  Ticket all_reduce_async(void* data, int64_t count, ElemType, ReduceOp op, const std::string& what) override {
    issued.push_back({static_cast<float*>(data), count, what});
    EXPECT_EQ(op, ReduceOp::average);
    return issued.size();
  }
  CollectiveTiming wait(Ticket) override { return {1.0, 1.5}; }
  void broadcast(void*, int64_t, int, const std::string&) override {}
  void barrier(const std::string&) override {}
  std::vector<double> all_gather(double v, const std::string&) override { return {v, v}; }
  struct Call {
    float* data;
    int64_t count;
    std::string what;
  };
  std::vector<Call> issued;
};

TEST(GradientReducer, StartsEachBucketWhenItsLastGradientIsReady) {
  const auto r = aligned({16, 16, 16, 16});
  std::vector<float> grads(64);
  RecordingComm comm;
  GradientReducer red(comm, make_grad_buckets(r, 128), grads.data(), 4);  // two buckets of two
  ASSERT_EQ(red.buckets().size(), 2u);
  red.begin_step();
  red.on_ready({0});
  EXPECT_EQ(comm.issued.size(), 0u);
  red.on_ready({1});
  ASSERT_EQ(comm.issued.size(), 1u);  // bucket 1 is on the wire while backward goes on
  EXPECT_EQ(comm.issued[0].data, grads.data());
  EXPECT_EQ(comm.issued[0].count, 32);
  red.on_ready({2, 3});
  ASSERT_EQ(comm.issued.size(), 2u);
  EXPECT_EQ(comm.issued[1].data, grads.data() + 32);
  EXPECT_EQ(comm.issued[1].what, "gradient bucket 2/2");
  const CommStats s = red.finish();
  EXPECT_EQ(s.buckets, 2);
  EXPECT_DOUBLE_EQ(s.total, 1.0);  // two collectives of 0.5 s
  EXPECT_EQ(s.bytes, 64 * 4);
  // A new step starts over; a bucket never completed is still sent by finish().
  red.begin_step();
  red.on_ready({0, 1});
  EXPECT_EQ(comm.issued.size(), 3u);
  red.finish();
  EXPECT_EQ(comm.issued.size(), 4u);
}

// A device communicator's view: the bucket collectives' device timings, handed out once.
class DeviceTimingComm : public RecordingComm {
 public:
  void join(Ticket) override { ++joins; }
  void mark_compute() override { ++marks; }
  std::optional<DeviceCollectiveTiming> device_timing(Ticket t) override {
    auto it = timings.find(t);
    if (it == timings.end()) return std::nullopt;
    const DeviceCollectiveTiming d = it->second;
    timings.erase(it);
    return d;
  }
  std::map<Ticket, DeviceCollectiveTiming> timings;
  int joins = 0, marks = 0;
};

TEST(GradientReducer, DeviceStepsAreTimedFromTheCommunicatorsEventsOnceTheHostHasWaited) {
  const auto r = aligned({16, 16, 16, 16});
  std::vector<float> grads(64);
  DeviceTimingComm comm;
  GradientReducer red(comm, make_grad_buckets(r, 128), grads.data(), 4);
  ASSERT_EQ(red.buckets().size(), 2u);
  EXPECT_FALSE(red.wait_joined()) << "nothing joined yet";
  red.begin_step();
  red.on_ready({0, 1});
  const CommStats queued = red.finish_on_device();
  EXPECT_FALSE(queued.timed) << "the device has not run the collectives yet";
  EXPECT_EQ(comm.marks, 1) << "the end of backward is marked on the compute stream";
  EXPECT_EQ(comm.joins, 2);
  // Bucket 1 ran 3 ms during backward; bucket 2 ran 2 ms and ended 1.5 ms after backward.
  comm.timings[1] = {0.003, -0.004};
  comm.timings[2] = {0.002, 0.0015};
  const std::optional<CommStats> s = red.wait_joined();
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->timed);
  EXPECT_NEAR(s->total, 0.005, 1e-12);
  EXPECT_NEAR(s->exposed, 0.0015, 1e-12);
  EXPECT_NEAR(s->hidden, 0.0035, 1e-12);
  EXPECT_EQ(s->bytes, 64 * 4);
  EXPECT_TRUE(s->timings.empty()) << "device times are not on the host clock";
  EXPECT_FALSE(red.wait_joined()) << "a step's figures are handed out once";
  // A bucket the device could not time leaves the step untimed, with its buckets and bytes.
  red.begin_step();
  red.on_ready({0, 1, 2, 3});
  red.finish_on_device();
  comm.timings[3] = {0.001, -0.001};
  const std::optional<CommStats> u = red.wait_joined();
  ASSERT_TRUE(u);
  EXPECT_FALSE(u->timed);
  EXPECT_EQ(u->buckets, 2);
  EXPECT_EQ(u->bytes, 64 * 4);
}

TEST(GradientReducer, ExposedCommunicationIsBetweenZeroAndTheTotal) {
  const std::vector<GradBucket> b(2, GradBucket{0, 0, 0, 8});
  // Everything ended before backward did: fully hidden.
  auto s = device_comm_stats({DeviceCollectiveTiming{0.002, -0.003}, DeviceCollectiveTiming{0.001, -0.0001}}, b);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->exposed, 0.0);
  EXPECT_NEAR(s->hidden, 0.003, 1e-12);
  // A stall between backward and the collectives (the last ends long after): at most the total.
  s = device_comm_stats({DeviceCollectiveTiming{0.002, 0.05}, DeviceCollectiveTiming{0.001, 0.06}}, b);
  ASSERT_TRUE(s);
  EXPECT_NEAR(s->exposed, 0.003, 1e-12);
  EXPECT_EQ(s->hidden, 0.0);
  EXPECT_FALSE(device_comm_stats({DeviceCollectiveTiming{}, std::nullopt}, b));
  EXPECT_FALSE(device_comm_stats({DeviceCollectiveTiming{}}, b)) << "one timing for two buckets";
}

TEST(LocalCommunicator, IsWorldOfOneAndLeavesDataAlone) {
  auto c = make_local_communicator();
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->rank(), 0);
  float x[3] = {1, 2, 3};
  c->all_reduce(x, 3, ReduceOp::average);
  EXPECT_EQ(x[2], 3.0f);
  EXPECT_EQ(c->broadcast_string("abc", 0), "abc");
  EXPECT_EQ(c->all_gather(4.0), std::vector<double>{4.0});
}

}  // namespace
}  // namespace rn
