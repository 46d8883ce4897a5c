// The pipeline verdict names the cause it can see: a loader slower than the step, the training
// thread loading by itself (data.workers=0), or workers fast enough yet waited for.
#include "prof/pipeline.h"

#include <gtest/gtest.h>

#include <string>

namespace rn {
namespace {

// 100 images; the workers busy `busy` seconds in all; the step 1 s of compute; `wait` s waited.
PipelineSpan span(int workers, double busy, double wait) {
  PipelineSpan s;
  s.workers = workers;
  s.loader.samples = 100;
  s.loader.batches = 10;
  s.loader.decode = busy;
  s.compute = 1.0;
  s.wait = wait;
  s.wall = s.compute + s.wait;
  return s;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(PipelineVerdict, ASlowLoaderMustGetFaster) {
  const PipelineVerdict v = analyse_pipeline(span(2, 8.0, 3.0));  // 25 img/s against 100
  EXPECT_TRUE(v.input_bound);
  EXPECT_DOUBLE_EQ(v.factor, 4.0);
  EXPECT_TRUE(has(v.text, "input must get 4.00x faster")) << v.text;
}

// The ways out named fit the machine and the cache: no more workers where the cores are taken,
// no "the cache" where it is on with room, a larger one where it is full.
TEST(PipelineVerdict, TheAdviceFitsTheCoresAndTheCache) {
  PipelineSpan s = span(2, 8.0, 3.0);
  s.cores = 8;
  s.step_threads = 2;
  std::string text = analyse_pipeline(s).text;
  EXPECT_TRUE(has(text, "(more workers, packed shards, the cache)")) << text;
  s.cores = 2;  // 2 workers and 2 step threads busy 25% of the time: 2.5 cores of 2
  s.cache = PipelineSpan::Cache::full;
  text = analyse_pipeline(s).text;
  EXPECT_TRUE(has(text,
                  "(packed shards, a larger data.cache_mb (the cache is full)); more workers would not help: 2 "
                  "workers and the step's 2 threads (busy 25% of the time) already take the 2 cores"))
      << text;
  s.cores = 4;  // the step mostly waits: a core is left for a worker
  EXPECT_TRUE(has(analyse_pipeline(s).text, "(more workers, packed shards, a larger data.cache_mb"));
  s.cores = 2;
  s.cache = PipelineSpan::Cache::room;
  text = analyse_pipeline(s).text;
  EXPECT_TRUE(has(text, "faster (packed shards);")) << text;
}

TEST(PipelineVerdict, NoWorkersIsNamedAsTheCause) {
  const PipelineVerdict v = analyse_pipeline(span(0, 0.1, 0.1));  // 1000 img/s, loaded in line
  EXPECT_TRUE(v.input_bound);
  EXPECT_TRUE(has(v.text, "with data.workers=0 the training thread loads every batch itself")) << v.text;
  EXPECT_FALSE(has(v.text, "faster")) << v.text;
}

TEST(PipelineVerdict, FastWorkersThatAreWaitedForAreNotToldToGetFaster) {
  const PipelineVerdict v = analyse_pipeline(span(4, 0.4, 0.2));  // 1000 img/s against 100
  EXPECT_TRUE(v.input_bound);
  EXPECT_TRUE(has(v.text, "10.00x what the step takes")) << v.text;
  EXPECT_TRUE(has(v.text, "short of cores")) << v.text;
  EXPECT_FALSE(has(v.text, "must get")) << v.text;
}

TEST(PipelineVerdict, LittleWaitingIsComputeBound) {
  const PipelineVerdict v = analyse_pipeline(span(2, 0.5, 0.01));
  EXPECT_FALSE(v.input_bound);
  EXPECT_TRUE(has(v.text, "compute-bound")) << v.text;
  EXPECT_DOUBLE_EQ(v.factor, 4.0);  // 400 img/s against 100
}

// The table's wall-time rows add up to the wall time: what the loop does besides copy, wait
// and step (gradient monitor, checkpoints, logging) is the "other" row, in the JSON too.
TEST(PipelineTable, TheWallTimeRowsAddUpWithTheLoopsOtherWork) {
  PipelineSpan s = span(2, 0.5, 0.25);
  s.copy = 0.25;
  s.wall = 2.0;  // 1 s step + 0.25 wait + 0.25 copy: 0.5 s elsewhere
  const std::string table = format_pipeline(s, analyse_pipeline(s));
  EXPECT_TRUE(has(table, "  step          100.00 ms/batch   50.0% of wall time\n")) << table;
  EXPECT_TRUE(has(table,
                  "  other          50.00 ms/batch   25.0% of wall time (gradient monitor, checkpoints, "
                  "logging)\n  verdict: "))
      << table;
  EXPECT_DOUBLE_EQ(pipeline_json(s, analyse_pipeline(s))["other_s"].get<double>(), 0.5);
  s.wall = 1.0;  // timer noise past the wall time: none, not negative
  EXPECT_DOUBLE_EQ(s.other(), 0.0);
}

}  // namespace
}  // namespace rn
