// A short deterministic training run on small synthetic images, for tests that compare the
// weights two runs end with: resnet20 at 16x16, 3 epochs of 4 steps of batch 8, one warm-up
// epoch, 2 threads, no evaluation between epochs.
#pragma once

#include <string>

#include "core/check.h"
#include "train/config.h"
#include "train/trainer.h"

namespace rn::test {

inline Config small_run_config(const std::string& out_dir) {
  Config c;
  c.model.name = "resnet20";
  c.model.image_size = {16, 16};
  c.data.dataset = DatasetKind::synthetic;
  c.data.train_subset = 32;
  c.data.val_subset = 8;
  c.data.batch_size = 8;
  c.data.workers = 1;
  c.schedule.epochs = 3;
  c.schedule.warmup_epochs = 1;
  c.run.device = DeviceChoice::cpu;
  c.run.threads = 2;
  c.run.deterministic = true;
  c.run.eval_interval_epochs = 0;
  c.run.out_dir = out_dir;
  c.validate();
  return c;
}

// The rn::Error message of train(cfg, o), or "" when it trains.
inline std::string train_error(const Config& cfg, const TrainOptions& o = {}) {
  try {
    train(cfg, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// `cfg` trained until `steps` optimizer steps in all (a checkpoint there), as a run stopped
// early that a test then resumes.
inline TrainResult train_until(const Config& cfg, int64_t steps) {
  TrainOptions o;
  o.max_steps = steps;
  return train(cfg, o);
}

}  // namespace rn::test
