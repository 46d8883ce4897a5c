// Evaluation over a data loader: mean loss (plain cross-entropy, without the training label
// smoothing), top-1 and top-5, optionally the per-image top-5 predictions.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "data/loader.h"
#include "dist/communicator.h"
#include "model/plan.h"
#include "train/trainer.h"

namespace rn {

struct Prediction {
  int64_t index = 0;  // dataset index
  int32_t label = 0;
  int32_t classes[5] = {};
  float probs[5] = {};
  int k = 0;  // how many of classes/probs are valid (min(5, num_classes))
};

class Evaluator {
 public:
  // Eval plans are made for the loader's batch size, and lazily for a partial last batch.
  Evaluator(Model& model, Backend& backend, const PlanOptions& base);
  // With `comm`, each rank evaluates its slice of the set and the sums are all-reduced, so
  // every rank returns the figures of the whole set (predictions stay this rank's).
  // `stop` (a training run's stop request) is read before each batch: once it is set, the
  // evaluation ends without figures, `abandoned` on every rank (they learn of it in the one
  // all-reduce of the sums, so a rank without the request evaluates its slice to the end).
  EvalResult run(DataLoader& loader, int64_t epoch, std::vector<Prediction>* predictions = nullptr,
                 Communicator* comm = nullptr, const std::atomic<bool>* stop = nullptr);

 private:
  Plan& plan_for(int64_t batch);
  Model& model_;
  Backend& backend_;
  PlanOptions base_;
  std::vector<std::unique_ptr<Plan>> plans_;
};

// Copies a loader batch into a plan's input and labels (same dtype and layout).
void copy_batch(Plan& plan, const Batch& batch);

}  // namespace rn
