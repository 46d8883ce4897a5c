// Test helpers for stop requests: a training dataset that requests a stop (request_stop(), as
// SIGINT would) while a given sample loads, and the train records' losses of a run.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "data/dataset.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace rn::test {

// Requests a stop while the sample numbered `at` (in load order) is loaded. With no loader
// workers (data.workers=0) a batch is loaded on the training thread just before its step, so
// the stop lands after that batch's step.
class StopAtLoadDataset : public Dataset {
 public:
  StopAtLoadDataset(std::shared_ptr<const Dataset> inner, int64_t at) : inner_(std::move(inner)), at_(at) {}
  int64_t size() const override { return inner_->size(); }
  int num_classes() const override { return inner_->num_classes(); }
  SampleGeometry geometry() const override { return inner_->geometry(); }
  std::string name() const override { return "stop-at-load(" + inner_->name() + ")"; }
  void load(int64_t index, Sample& out) const override {
    if (loads_++ == at_) request_stop();
    inner_->load(index, out);
  }

 private:
  std::shared_ptr<const Dataset> inner_;
  int64_t at_;
  mutable std::atomic<int64_t> loads_{0};
};

inline TrainOptions stop_at_load(int64_t at) {
  TrainOptions o;
  o.wrap_train_dataset = [at](std::shared_ptr<const Dataset> d) -> std::shared_ptr<const Dataset> {
    return std::make_shared<StopAtLoadDataset>(std::move(d), at);
  };
  return o;
}

// step -> loss of the train records in a run's metrics.jsonl.
inline std::map<int64_t, double> train_losses(const std::string& run_dir) {
  std::map<int64_t, double> out;
  for (const auto& r : read_metrics(run_dir + "/metrics.jsonl"))
    if (r["kind"] == "train") out[r["step"].get<int64_t>()] = r["loss"].get<double>();
  return out;
}

}  // namespace rn::test
