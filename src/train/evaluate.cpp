#include "train/evaluate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/log.h"
#include "train/batch_feeder.h"

namespace rn {

void copy_batch(Plan& plan, const Batch& batch) {
  const Tensor in = plan.input();
  RN_CHECK(batch.images.dtype == in.dtype && batch.images.layout == in.layout && batch.images.shape == in.shape)
      << "batch " << batch.images.str() << " does not match the plan's input " << in.str();
  plan.copy_from_host_async(in, batch.images.data);
  plan.copy_from_host_async(plan.labels(), batch.labels.data);
}

Evaluator::Evaluator(Model& model, Backend& backend, const PlanOptions& base)
    : model_(model), backend_(backend), base_(base) {
  base_.mode = PlanMode::eval;
  base_.label_smoothing = 0.0f;  // the evaluation loss is plain cross-entropy
}

Plan& Evaluator::plan_for(int64_t batch) {
  for (auto& p : plans_)
    if (p->options().batch == batch) return *p;
  PlanOptions o = base_;
  o.batch = batch;
  plans_.push_back(std::make_unique<Plan>(model_, &backend_, o));
  return *plans_.back();
}

EvalResult Evaluator::run(DataLoader& loader, int64_t epoch, std::vector<Prediction>* predictions, Communicator* comm,
                          const std::atomic<bool>* stop) {
  EvalResult r;
  double loss_sum = 0;
  int64_t top1 = 0, top5 = 0;
  int64_t nonfinite = 0;  // samples whose outputs hold a NaN or an infinity: misses
  loader.start_epoch(epoch);
  BatchFeeder feeder(loader.options().mean, loader.options().std);
  for (;;) {
    if (stop && stop->load()) {
      r.abandoned = true;
      break;
    }
    const Batch* b = loader.next();
    if (!b) break;
    Plan& plan = plan_for(b->size);
    feeder.feed(plan, *b);
    plan.forward();
    const Tensor probs_view = plan.probs();
    const int64_t K = probs_view.shape[1];
    std::vector<float> probs_host(static_cast<size_t>(probs_view.numel()));
    plan.copy_to_host(probs_host.data(), probs_view);
    // An unreadable file's slot holds the next readable image (the loader's skip policy);
    // counting it would score that image twice and the bad file not at all. Its share of the
    // batch's mean loss is taken back out: plain cross-entropy, log-sum-exp of the logits less
    // the label's logit, in double as the loss kernel computes it (-log of a float probability
    // would stop at its underflow).
    double batch_loss = static_cast<double>(plan.loss()) * static_cast<double>(b->size);
    std::vector<float> logits_host;
    if (!b->replaced.empty() && std::find(b->replaced.begin(), b->replaced.end(), 1) != b->replaced.end()) {
      const Tensor logits = plan.logits();
      logits_host.resize(static_cast<size_t>(logits.numel()));
      plan.copy_to_host(logits_host.data(), logits);
    }
    std::vector<int32_t> order(static_cast<size_t>(K));
    for (int64_t n = 0; n < b->size; ++n) {
      const float* p = probs_host.data() + n * K;
      const int32_t label = b->label_data()[n];
      if (!b->replaced.empty() && b->replaced[static_cast<size_t>(n)]) {
        const float* z = logits_host.data() + n * K;
        const double top = *std::max_element(z, z + K);
        double sum = 0;
        for (int64_t c = 0; c < K; ++c) sum += std::exp(static_cast<double>(z[c]) - top);
        batch_loss -= top + std::log(sum) - static_cast<double>(z[label]);
        ++r.unreadable;
        continue;
      }
      // A NaN would break the ordering the sort needs (and rank any class first): such a
      // sample is a miss, and its NaNs sort last so that the predictions file stays readable.
      const bool finite = std::all_of(p, p + K, [](float v) { return std::isfinite(v); });
      const auto key = [&](int32_t c) { return std::isnan(p[c]) ? -INFINITY : p[c]; };
      std::iota(order.begin(), order.end(), 0);
      const int k = static_cast<int>(std::min<int64_t>(5, K));
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t x, int32_t y) { return key(x) > key(y) || (key(x) == key(y) && x < y); });
      if (!finite) {
        ++nonfinite;
      } else {
        if (order[0] == label) ++top1;
        if (std::find(order.begin(), order.begin() + k, label) != order.begin() + k) ++top5;
      }
      if (predictions) {
        Prediction pr;
        pr.index = b->sample_indices[static_cast<size_t>(n)];
        pr.label = label;
        pr.k = k;
        for (int j = 0; j < k; ++j) {
          pr.classes[j] = order[static_cast<size_t>(j)];
          pr.probs[j] = p[order[static_cast<size_t>(j)]];
        }
        predictions->push_back(pr);
      }
      ++r.samples;
    }
    loss_sum += batch_loss;
  }
  if (nonfinite > 0 && !r.abandoned)
    RN_LOG_WARN(
        "evaluation: {} of {} samples{} have outputs that are not finite (NaN or infinity) and count as misses: "
        "the model's weights or its input hold non-finite values, or a batch norm's running variance is negative",
        nonfinite, r.samples, comm && comm->size() > 1 ? fmt::format(" on rank {}", comm->rank()) : "");
  if (comm && comm->size() > 1) {
    double sums[6] = {loss_sum,
                      static_cast<double>(top1),
                      static_cast<double>(top5),
                      static_cast<double>(r.samples),
                      static_cast<double>(r.unreadable),
                      r.abandoned ? 1.0 : 0.0};
    comm->all_reduce(sums, 6, ReduceOp::sum, "evaluation sums");
    loss_sum = sums[0];
    top1 = static_cast<int64_t>(sums[1]);
    top5 = static_cast<int64_t>(sums[2]);
    r.samples = static_cast<int64_t>(sums[3]);
    r.unreadable = static_cast<int64_t>(sums[4]);
    r.abandoned = sums[5] > 0;
  }
  if (r.abandoned) return EvalResult{.abandoned = true};
  RN_CHECK(r.samples > 0) << "evaluation saw no samples"
                          << (r.unreadable > 0 ? fmt::format(": all {} images were unreadable", r.unreadable) : "");
  r.loss = loss_sum / static_cast<double>(r.samples);
  r.top1 = static_cast<double>(top1) / static_cast<double>(r.samples);
  r.top5 = static_cast<double>(top5) / static_cast<double>(r.samples);
  return r;
}

}  // namespace rn
