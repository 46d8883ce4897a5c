// Checkpoints (everything an exact resume needs) and weights files (what `resnet export`
// writes), both single safetensors files with torchvision tensor names; and their rotation
// in a run folder. The layout is documented in docs/checkpoints.md:
//
//   checkpoint: every parameter and running stat by name ("conv1.weight", "bn1.running_mean"),
//               the optimizer's momentum per parameter ("optimizer.momentum.conv1.weight"),
//               and in __metadata__ the TrainState, the loss scaler and the format version,
//               numbers written exactly (integers in decimal, doubles with %.17g).
//   weights:    parameters and running stats only.
//
// Loading validates everything before it writes a single float into the model or the
// optimizer, so a failed load leaves both untouched. Errors are rn::Error naming the file
// and the tensor or metadata field at fault.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/model.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"

namespace rn {

// The format version this build writes and the newest it reads.
inline constexpr int kCheckpointFormatVersion = 1;

struct TrainState {
  int64_t epoch = 0;           // epoch in progress (0-based)
  int64_t step = 0;            // global optimizer steps done
  int64_t batch_in_epoch = 0;  // batches of `epoch` already consumed
  double best_top1 = -1;       // best validation top-1 so far; -1: none yet
  // Samples per optimizer step over all ranks (data.batch_size x world size); 0 in
  // checkpoints written before it was recorded (then: data.batch_size, one rank).
  int64_t global_batch = 0;
  // The training set the schedule was laid out on: its samples and the steps of an epoch; 0 in
  // checkpoints written before they were recorded.
  int64_t train_samples = 0;
  int64_t steps_per_epoch = 0;
  std::array<uint64_t, 4> rng{};
  LossScaler::State scaler;
  std::string config_yaml;  // the resolved config, for checking a resume
  // The build that wrote the checkpoint (core/build_info.h's build_description()); filled in
  // by loading, "" for checkpoints written before it was recorded. Saving records the
  // running build.
  std::string written_by;
};

// Extra facts about one checkpoint, recorded in its metadata for the rotation.
struct CheckpointTags {
  bool epoch_end = false;      // written at the end of an epoch
  std::optional<double> top1;  // the validation top-1 measured with these weights
};

// Writes a checkpoint to `path` atomically (temporary file, fsync, rename, folder fsync).
void save_checkpoint(const std::string& path, const Model& model, const Optimizer& opt, const TrainState& st,
                     const CheckpointTags& tags = {});

// Loads a checkpoint into `model` and, unless `opt` is nullptr, the optimizer's momentum.
// Checks: the file is a resnet.cpp checkpoint of a format version this build reads; every
// model tensor is present, F32 and of the model's shape; no tensor is unknown to the model;
// the momentum of every parameter is present when `opt` is given; every metadata field is
// present and parses. Returns the TrainState; the caller restores the rng and the scaler.
TrainState load_checkpoint(const std::string& path, Model& model, Optimizer* opt);

// Writes parameters and running stats only: the file `resnet export` and `resnet import` write
// and tools/torchvision_to_safetensors.py --reverse reads. A non-empty `config_yaml` is kept in
// the metadata, where `resnet eval` and `resnet export` find the model and data settings.
void save_weights(const std::string& path, const Model& model, const std::string& config_yaml = "");

// Loads parameters and running stats from a checkpoint or a plain weights file (save_weights,
// or the torchvision converter). Every model tensor must be present (running stats too), F32,
// of the right shape; torchvision's `*.num_batches_tracked` counters and a checkpoint's
// optimizer tensors are ignored; any other unknown tensor is an error.
void load_weights(const std::string& path, Model& model);

struct LoadedCheckpoint {
  std::string path;
  TrainState state;
};

// The checkpoints of one run, in RUN_DIR/checkpoints/:
//   step-<8-digit step>.safetensors   the periodic checkpoints; the newest keep_last are kept
//   best.safetensors                  the checkpoint with the best top-1 (a hard link, or a
//                                     copy where the file system has none)
// One manager (one process, one thread) writes a run folder; leftover temporaries of a
// killed write (names containing ".tmp.") are deleted by save(), latest() and latest_loadable().
// A save at step S renames periodic checkpoints of steps above S (left by a run that resumed
// from an older checkpoint) to "<name>.abandoned", so that a later resume cannot pick them.
class CheckpointManager {
 public:
  static constexpr const char* kDamagedSuffix = ".damaged";
  static constexpr const char* kAbandonedSuffix = ".abandoned";

  // keep_last: periodic checkpoints to keep, 0 = all; keep_best: maintain best.safetensors.
  CheckpointManager(std::string run_dir, int64_t keep_last, bool keep_best);

  // Writes step-<st.step>.safetensors, then rotates. The state written has best_top1 =
  // max(st.best_top1, top1, the best this manager knows of), so the trainer may fold top1
  // into st.best_top1 before the call or not. best.safetensors is updated when top1 beats
  // the top-1 recorded in the current best.safetensors (read on first use) and keep_best.
  // Returns the path written.
  std::string save(const Model& model, const Optimizer& opt, const TrainState& st, bool is_epoch_end,
                   std::optional<double> top1);

  // The newest periodic checkpoint (by the step in its name) whose header is intact and whose
  // size matches it; truncated files are skipped with a warning.
  std::optional<std::string> latest() const;

  // Loads the newest checkpoint that loads, newest first. A file that is damaged (truncated,
  // not valid safetensors, not a checkpoint) is skipped with a warning and the next older one
  // is tried; a file that is intact but does not fit `model` (another model or number of
  // classes) is an error, thrown at once: every older file would fail the same way, and
  // quietly starting afresh would overwrite the run. nullopt when there is none.
  // With set_aside_damaged (the process that writes the run), each damaged file skipped is
  // renamed "<name>.damaged": out of the rotation, which would otherwise keep it and delete the
  // good older ones, and kept for inspection.
  std::optional<LoadedCheckpoint> latest_loadable(Model& model, Optimizer* opt, bool set_aside_damaged = false) const;
  // Periodic checkpoints set aside (".damaged", ".abandoned"), sorted by name.
  std::vector<std::string> set_aside() const;

  // The periodic checkpoints present (complete names only), oldest first.
  std::vector<std::string> checkpoints() const;
  // The top-1 recorded in best.safetensors, if it exists and is intact: its header (size,
  // header CRC) alone, or with `model`, also its data's CRC and tensors that are the model's.
  std::optional<double> best_top1(const Model* model = nullptr) const;

  const std::string& dir() const { return dir_; }
  std::string best_path() const;
  std::string step_path(int64_t step) const;

 private:
  void remove_temporaries() const;
  void update_best(const std::string& source);
  void rotate(int64_t step) const;

  std::string dir_;
  int64_t keep_last_;
  bool keep_best_;
  bool best_read_ = false;            // best.safetensors consulted yet
  std::optional<double> best_known_;  // the best top-1 known: best.safetensors's, or seen since
};

}  // namespace rn
