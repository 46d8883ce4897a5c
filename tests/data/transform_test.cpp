// CropFlipNormalize against a plain reference, across dtypes and layouts; the synthetic
// dataset; subsets.
#include "data/transform.h"

#include <gtest/gtest.h>

#include <set>

#include "core/dtype.h"
#include "data/dataset.h"
#include "data/synthetic_dataset.h"

namespace rn {
namespace {

Sample make_sample(int c, int h, int w, uint64_t seed) {
  Sample s;
  Rng rng(seed);
  uint8_t* p = s.resize(c, h, w);
  for (size_t i = 0; i < s.pixels.size(); ++i) p[i] = static_cast<uint8_t>(rng.below(256));
  s.label = 1;
  return s;
}

float read(const Tensor& t, int64_t n, int64_t c, int64_t h, int64_t w) {
  const int64_t off = t.offset(n, c, h, w);
  return t.dtype == DType::f32 ? t.ptr<float>()[off] : bf16_to_f32(bf16_t{t.ptr<uint16_t>()[off]});
}

// The reference: pad, crop at (oy, ox), flip, normalise, round to the dtype.
float reference(const Sample& s, int pad, int oy, int ox, bool flip, int c, int y, int x, float mean, float std,
                DType t) {
  const int cx = flip ? s.width - 1 - x : x;
  const int sy = y + oy - pad, sx = cx + ox - pad;
  const int v = (sy < 0 || sy >= s.height || sx < 0 || sx >= s.width) ? 0 : s.at(sy, sx)[c];
  return round_to_dtype((static_cast<float>(v) / 255.0f - mean) / std, t);
}

TEST(CropFlipNormalize, MatchesReferenceAllDtypesAndLayouts) {
  const float means[3] = {0.1f, 0.5f, 0.9f}, stds[3] = {0.2f, 0.3f, 0.4f};
  for (int C : {1, 3}) {
    CropFlipNormalizeOptions o;
    o.pad = 3;
    o.flip_prob = 0.5f;
    o.mean.assign(means, means + C);
    o.std.assign(stds, stds + C);
    CropFlipNormalize tf(o);
    for (DType dt : {DType::f32, DType::bf16}) {
      for (Layout layout : {Layout::nchw, Layout::nhwc}) {
        HostTensor batch(Shape{8, C, 7, 9}, dt, layout);
        TransformScratch scratch;
        bool saw_flip = false, saw_plain = false;
        for (int slot = 0; slot < 8; ++slot) {
          Sample s = make_sample(C, 7, 9, 100 + static_cast<uint64_t>(slot));
          Rng rng = sample_rng(5, 0, slot);
          Rng replay = rng;
          tf.apply(s, rng, batch, slot, scratch);
          const int oy = static_cast<int>(replay.below(7)), ox = static_cast<int>(replay.below(7));
          const bool flip = replay.uniform() < 0.5f;
          (flip ? saw_flip : saw_plain) = true;
          for (int c = 0; c < C; ++c)
            for (int y = 0; y < 7; ++y)
              for (int x = 0; x < 9; ++x)
                ASSERT_EQ(read(batch, slot, c, y, x), reference(s, 3, oy, ox, flip, c, y, x, means[c], stds[c], dt))
                    << "C=" << C << " " << dtype_name(dt) << " " << layout_name(layout) << " slot " << slot;
        }
        EXPECT_TRUE(saw_flip && saw_plain);
      }
    }
  }
}

TEST(CropFlipNormalize, EvalIsNormalisationOnly) {
  auto tf = small_image_eval_transform({0.2860f}, {0.3530f});
  Sample s = make_sample(1, 28, 28, 1);
  HostTensor batch(Shape{1, 1, 28, 28}, DType::f32);
  TransformScratch scratch;
  Rng rng(0);
  tf->apply(s, rng, batch, 0, scratch);
  for (int y = 0; y < 28; ++y)
    for (int x = 0; x < 28; ++x)
      ASSERT_FLOAT_EQ(batch.ptr<float>()[y * 28 + x], (*s.at(y, x) / 255.0f - 0.2860f) / 0.3530f);
}

TEST(CropFlipNormalize, RejectsMismatches) {
  auto tf = small_image_train_transform(4, {0.5f, 0.5f, 0.5f}, {0.25f, 0.25f, 0.25f});
  EXPECT_THROW(tf->output_geometry({1, 28, 28}), Error);  // 3 means, 1 channel
  EXPECT_THROW(tf->output_geometry({3, 0, 0}), Error);    // variable size
  EXPECT_EQ(tf->output_geometry({3, 32, 32}), (SampleGeometry{3, 32, 32}));
  HostTensor batch(Shape{2, 3, 32, 32}, DType::f32);
  TransformScratch scratch;
  Rng rng(0);
  EXPECT_THROW(tf->apply(make_sample(3, 30, 32, 0), rng, batch, 0, scratch), Error);
  EXPECT_THROW(tf->apply(make_sample(3, 32, 32, 0), rng, batch, 2, scratch), Error);
  HostTensor wrong(Shape{2, 3, 32, 32}, DType::f16);
  EXPECT_THROW(tf->apply(make_sample(3, 32, 32, 0), rng, wrong, 0, scratch), Error);
  EXPECT_THROW(CropFlipNormalize({0, 0.0f, {0.5f}, {0.0f}}), Error);
}

TEST(SampleRng, DependsOnSeedEpochAndIndex) {
  std::set<uint64_t> firsts;
  for (uint64_t seed : {0, 1})
    for (int64_t epoch : {0, 1})
      for (int64_t index : {0, 1}) firsts.insert(sample_rng(seed, epoch, index).next_u64());
  EXPECT_EQ(firsts.size(), 8u);
  EXPECT_EQ(sample_rng(3, 4, 5).next_u64(), sample_rng(3, 4, 5).next_u64());
}

TEST(SyntheticDataset, DeterministicPerIndex) {
  SyntheticDataset a({3, 17, 13, 7, 100, 42}), b({3, 17, 13, 7, 100, 42}), c({3, 17, 13, 7, 100, 43});
  EXPECT_EQ(a.size(), 100);
  EXPECT_EQ(a.geometry(), (SampleGeometry{3, 17, 13}));
  Sample s1, s2, s3;
  std::set<int> labels;
  int differing = 0;
  for (int64_t i = 99; i >= 0; --i) {  // order does not matter
    a.load(i, s1);
    b.load(i, s2);
    c.load(i, s3);
    ASSERT_EQ(s1.pixels, s2.pixels);
    ASSERT_EQ(s1.label, s2.label);
    ASSERT_GE(s1.label, 0);
    ASSERT_LT(s1.label, 7);
    labels.insert(s1.label);
    differing += s1.pixels != s3.pixels;
  }
  EXPECT_EQ(labels.size(), 7u);
  EXPECT_EQ(differing, 100);
  EXPECT_THROW(a.load(100, s1), Error);
}

TEST(Subset, IndicesAndDataset) {
  EXPECT_EQ(subset_indices(5, {}), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(subset_indices(5, {2, false, 0, ""}), (std::vector<int64_t>{0, 1}));
  auto r = subset_indices(1000, {10, true, 9, ""});
  EXPECT_EQ(r, subset_indices(1000, {10, true, 9, ""}));
  EXPECT_NE(r, subset_indices(1000, {10, true, 10, ""}));
  EXPECT_EQ(std::set<int64_t>(r.begin(), r.end()).size(), 10u);
  EXPECT_TRUE(std::is_sorted(r.begin(), r.end()));
  EXPECT_THROW(subset_indices(5, {6, false, 0, ""}), Error);
  // Too many asked for by a config key: the error names the key, the dataset and its size.
  SubsetSpec too_many{6, true, 0, "data.val_subset"};
  try {
    subset_indices(5, too_many, "idx:/data/t10k-images");
    ADD_FAILURE() << "a subset larger than the dataset was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("data.val_subset=6"), std::string::npos) << what;
    EXPECT_NE(what.find("idx:/data/t10k-images holds 5"), std::string::npos) << what;
  }

  auto base = std::make_shared<SyntheticDataset>(SyntheticOptions{1, 4, 4, 3, 50, 1});
  SubsetDataset sub(base, std::vector<int64_t>{7, 3});
  Sample s1, s2;
  sub.load(1, s1);
  base->load(3, s2);
  EXPECT_EQ(s1.pixels, s2.pixels);
  EXPECT_EQ(sub.size(), 2);
  EXPECT_THROW(SubsetDataset(base, std::vector<int64_t>{50}), Error);
}

}  // namespace
}  // namespace rn
