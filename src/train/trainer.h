// The training loop behind `resnet train`: builds the model, data, plans, optimizer,
// schedule and loss scaler from a Config, trains with evaluation, logging, metrics,
// checkpoints and a report, and resumes exactly from a run folder.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/zoo.h"
#include "train/config.h"
#include "train/data_setup.h"

namespace rn {

struct EvalResult {
  double loss = 0, top1 = 0, top5 = 0;  // top-k as fractions in [0, 1]
  int64_t samples = 0;                  // the images the figures are over
  int64_t unreadable = 0;               // images left out: their files could not be read (data.bad_files: skip)
  bool abandoned = false;               // a stop request ended it early (on any rank): no figures
};

struct TrainResult {
  std::string run_dir;
  int64_t steps = 0;          // the run's, a resumed run's earlier sessions included
  int64_t session_steps = 0;  // trained by this call, in `seconds`
  double seconds = 0;
  EvalResult final_eval;
  double best_top1 = 0;
  bool interrupted = false;  // stopped by SIGINT/SIGTERM after saving a checkpoint
  bool complete = false;     // every epoch of the schedule is done (also: a resume found nothing left)
};

struct TrainOptions {
  std::string resume_dir;  // continue the run in this folder (its config.yaml wins)
  int64_t max_steps = 0;   // stop (with a checkpoint) after this many optimizer steps in total; 0: no limit
  // "memory.level=O2"-style overrides applied to the resumed run's config (and saved in it).
  // Only memory.* keys: a checkpoint taken at one memory level resumes at another.
  std::vector<std::string> resume_overrides;
  // Tests: wraps the training dataset (Fashion-MNIST or synthetic), e.g. to make it slow.
  DatasetWrapper wrap_train_dataset;
  DatasetWrapper wrap_val_dataset;  // the same for the validation dataset
};

TrainResult train(const Config& config, const TrainOptions& options = {});

// The zoo's options for a configured model.
ModelOptions model_options(const ModelConfig& model);

// SIGINT and SIGTERM make a running train() save a checkpoint at the next step boundary
// and return with interrupted = true.
void install_stop_signal_handlers();
void request_stop();

}  // namespace rn
