// Evaluator: an unreadable file in the evaluation set is left out of every figure and of the
// predictions, so that the result equals the one without the file, rather than scoring the
// image that stands in for it (the loader's skip policy) a second time.
#include "train/evaluate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "data/encoded_dataset.h"
#include "data/image_folder_files.h"
#include "log_capture.h"
#include "model/zoo.h"
#include "ops/backend.h"
#include "test_dir.h"
#include "train/config.h"
#include "train/data_setup.h"

namespace rn {
namespace {

namespace fs = std::filesystem;

Config eval_config(const std::string& root) {
  Config c;
  c.model.name = "resnet20";
  c.model.num_classes = 3;
  c.model.in_channels = 3;
  c.model.image_size = {16, 16};
  c.data.dataset = DatasetKind::imagefolder;
  c.data.root = root;
  c.data.classes = {"class_0", "class_1", "class_2"};
  c.data.mean = {0.5, 0.5, 0.5};
  c.data.std = {0.25, 0.25, 0.25};
  c.data.augment.eval_resize = 16;
  c.data.batch_size = 4;
  c.data.workers = 1;
  c.run.device = DeviceChoice::cpu;
  c.run.threads = 1;
  c.validate();
  return c;
}

struct Evaluated {
  EvalResult result;
  std::vector<std::string> sources;  // the image of each prediction, in order
};

// An evaluator of `model` on the reference backend and the validation loader of `cfg`.
struct EvalSetup {
  EvalSetup(const Config& cfg, Model& model)
      : backend(make_backend("ref")),
        loader(make_val_loader(cfg, DType::f32, Layout::nhwc)),
        evaluator(model, *backend, [] {
          PlanOptions po;
          po.layout = Layout::nhwc;
          return po;
        }()) {}
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DataLoader> loader;
  Evaluator evaluator;
};

Evaluated evaluate(const Config& cfg, Model& model) {
  EvalSetup setup(cfg, model);
  std::vector<Prediction> preds;
  Evaluated out;
  out.result = setup.evaluator.run(*setup.loader, 0, &preds);
  const auto& ds = dynamic_cast<const EncodedDataset&>(setup.loader->dataset());
  for (const Prediction& p : preds) out.sources.push_back(fs::path(ds.source(p.index)).filename().string());
  std::sort(out.sources.begin(), out.sources.end());
  return out;
}

// A validation folder of 3 classes of `per_class` images, its config and a resnet20 for it.
struct ValFolder {
  explicit ValFolder(int per_class)
      : root((test::write_image_folder(dir.path() / "data/val", 3, per_class), dir.file("data"))),
        cfg(eval_config(root)),
        model(build_model(cfg.model.name, model_options(cfg.model))) {}
  TestDir dir;
  std::string root;  // the data folder: val/ below it
  Config cfg;
  Model model;
};

TEST(Evaluator, LeavesUnreadableFilesOut) {
  ValFolder v(3);
  TestDir& dir = v.dir;
  const Config& cfg = v.cfg;
  Model& model = v.model;
  const Evaluated clean = evaluate(cfg, model);
  EXPECT_EQ(clean.result.samples, 9);
  EXPECT_EQ(clean.result.unreadable, 0);

  // One truncated and one empty file: each would otherwise be scored as the next readable image.
  test::write_bytes(dir.path() / "data/val/class_1/broken.jpg", {0xff, 0xd8, 0xff});
  test::write_bytes(dir.path() / "data/val/class_2/zz_empty.jpg", {});
  const Evaluated bad = evaluate(cfg, model);
  EXPECT_EQ(bad.result.samples, 9);
  EXPECT_EQ(bad.result.unreadable, 2);
  EXPECT_NEAR(bad.result.loss, clean.result.loss, 1e-5 * std::max(1.0, clean.result.loss));
  EXPECT_EQ(bad.result.top1, clean.result.top1);
  EXPECT_EQ(bad.result.top5, clean.result.top5);
  EXPECT_EQ(bad.sources, clean.sources) << "a prediction row for a file that was never read";
}

// Also where a stand-in's label lies far below the top logit (a loss near 200 here): -log of its
// float probability stopped at the underflow (69), so the bad file still moved the loss.
TEST(Evaluator, LeavesUnreadableFilesOutOfALargeLoss) {
  ValFolder v(3);
  TestDir& dir = v.dir;
  const Config& cfg = v.cfg;
  Model& model = v.model;
  model.init(1);
  static_cast<float*>(model.named("fc.bias").data)[1] = 200;
  const Evaluated clean = evaluate(cfg, model);
  ASSERT_GT(clean.result.loss, 100);
  // The last file of the last class: its stand-in is the first image of class_0.
  test::write_bytes(dir.path() / "data/val/class_2/zz_empty.jpg", {});
  const Evaluated bad = evaluate(cfg, model);
  EXPECT_EQ(bad.result.unreadable, 1);
  EXPECT_NEAR(bad.result.loss, clean.result.loss, 1e-5 * clean.result.loss);
}

// Outputs that are not finite are misses, not a top-5 of 100%: with a NaN the ordering the sort
// relies on breaks, and with three classes every finite row has its label in the top 5.
TEST(Evaluator, NonFiniteOutputsAreMisses) {
  ValFolder v(2);
  const Config& cfg = v.cfg;
  Model& model = v.model;
  model.init(1);
  EXPECT_EQ(evaluate(cfg, model).result.top5, 1.0);
  Tensor fc = model.named("fc.weight");
  static_cast<float*>(fc.data)[0] = std::numeric_limits<float>::quiet_NaN();
  LogCapture log;
  const Evaluated nan = evaluate(cfg, model);
  EXPECT_EQ(nan.result.samples, 6);
  EXPECT_EQ(nan.result.top1, 0.0);
  EXPECT_EQ(nan.result.top5, 0.0);
  EXPECT_EQ(nan.sources.size(), 6u) << "every sample still has its prediction row";
  EXPECT_NE(log.text().find("evaluation: 6 of 6 samples have outputs that are not finite"), std::string::npos)
      << log.text();
}

// The other rank of a two-rank job in the evaluation's one all-reduce: it adds `other` to the
// sums (f64), as that rank's figures.
class OtherRankComm final : public Communicator {
 public:
  explicit OtherRankComm(std::vector<double> other) : other_(std::move(other)) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "other-rank"; }
  std::vector<std::string> hosts() const override { return {"a", "b"}; }
  Ticket all_reduce_async(void* data, int64_t count, ElemType type, ReduceOp op, const std::string&) override {
    EXPECT_EQ(type, ElemType::f64);
    EXPECT_EQ(op, ReduceOp::sum);
    EXPECT_EQ(static_cast<size_t>(count), other_.size());
    for (int64_t i = 0; i < count && i < static_cast<int64_t>(other_.size()); ++i)
      static_cast<double*>(data)[i] += other_[static_cast<size_t>(i)];
    return ++reduces;
  }
  CollectiveTiming wait(Ticket) override { return {}; }
  void broadcast(void*, int64_t, int, const std::string&) override {}
  void barrier(const std::string&) override {}
  std::vector<double> all_gather(double v, const std::string&) override { return {v, v}; }
  Ticket reduces = 0;

 private:
  std::vector<double> other_;
};

// A training run's stop request ends an evaluation before its next batch, without figures, and
// on every rank of a job: a rank without the request learns of it in the sums' all-reduce.
TEST(Evaluator, AStopRequestAbandonsItOnEveryRank) {
  ValFolder v(3);
  const Config& cfg = v.cfg;
  Model& model = v.model;
  model.init(1);
  EvalSetup setup(cfg, model);
  Evaluator& ev = setup.evaluator;
  DataLoader* loader = setup.loader.get();

  std::atomic<bool> stop{false};
  const EvalResult full = ev.run(*loader, 0, nullptr, nullptr, &stop);
  EXPECT_FALSE(full.abandoned);
  EXPECT_EQ(full.samples, 9);

  stop = true;
  const EvalResult here = ev.run(*loader, 0, nullptr, nullptr, &stop);
  EXPECT_TRUE(here.abandoned);
  EXPECT_EQ(here.samples, 0);

  // This rank has no request and evaluates its slice; the other rank stopped (its sums are 0
  // but for the last, the stop flag).
  stop = false;
  OtherRankComm other({0, 0, 0, 0, 0, 1});
  const EvalResult there = ev.run(*loader, 0, nullptr, &other, &stop);
  EXPECT_EQ(other.reduces, 1u);
  EXPECT_TRUE(there.abandoned) << "this rank went on while the other one stopped";

  // Neither stopped: the other rank's samples count in the whole set's figures.
  OtherRankComm none({0, 0, 0, 5, 0, 0});
  const EvalResult both = ev.run(*loader, 0, nullptr, &none, &stop);
  EXPECT_FALSE(both.abandoned);
  EXPECT_EQ(both.samples, 14);
}

}  // namespace
}  // namespace rn
