#include "data/dataset.h"

#include <algorithm>
#include <utility>

#include "core/check.h"
#include "core/rng.h"

namespace rn {

std::string SampleGeometry::str() const {
  auto dim = [](int v) { return v == kVariable ? std::string("VAR") : std::to_string(v); };
  return std::to_string(channels) + "x" + dim(height) + "x" + dim(width);
}

std::vector<int64_t> subset_indices(int64_t size, const SubsetSpec& spec, const std::string& source) {
  RN_CHECK(size >= 0) << "negative dataset size " << size;
  const int64_t count = spec.all() ? size : spec.count;
  RN_CHECK(count <= size) << (spec.setting.empty() ? std::string("a subset")
                                                   : spec.setting + "=" + std::to_string(count))
                          << " asks for " << count << " samples but " << (source.empty() ? "the dataset" : source)
                          << " holds " << size << (spec.setting.empty() ? "" : ": use at most that many, or 0 for all");
  std::vector<int64_t> indices;
  if (!spec.random || count == size) {
    indices.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) indices[static_cast<size_t>(i)] = i;
    return indices;
  }
  // Partial Fisher-Yates over all indices: the first `count` positions are a uniform
  // sample without replacement. O(size) memory, which is fine for any dataset we index.
  std::vector<int64_t> all(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) all[static_cast<size_t>(i)] = i;
  Rng rng = Rng(spec.seed).fork(0x5375627365747ull);  // "Subset"
  for (int64_t i = 0; i < count; ++i) {
    const int64_t j = i + static_cast<int64_t>(rng.below(static_cast<uint64_t>(size - i)));
    std::swap(all[static_cast<size_t>(i)], all[static_cast<size_t>(j)]);
  }
  indices.assign(all.begin(), all.begin() + count);
  std::sort(indices.begin(), indices.end());
  return indices;
}

SubsetDataset::SubsetDataset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices)
    : base_(std::move(base)), indices_(std::move(indices)) {
  RN_CHECK(base_ != nullptr) << "SubsetDataset needs a base dataset";
  const int64_t n = base_->size();
  for (int64_t i : indices_)
    RN_CHECK(i >= 0 && i < n) << "subset index " << i << " outside " << base_->name() << " (size " << n << ")";
}

SubsetDataset::SubsetDataset(std::shared_ptr<const Dataset> base, const SubsetSpec& spec)
    : SubsetDataset(base, subset_indices(base ? base->size() : 0, spec, base ? base->name() : "")) {}

void SubsetDataset::load(int64_t index, Sample& out) const {
  RN_CHECK(index >= 0 && index < size()) << "index " << index << " outside " << name() << " (size " << size() << ")";
  base_->load(indices_[static_cast<size_t>(index)], out);
}

std::string SubsetDataset::name() const { return "subset(" + std::to_string(size()) + " of " + base_->name() + ")"; }

}  // namespace rn
