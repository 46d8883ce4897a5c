// The reference backend object: identity, dtype support, and refusal of half types by
// every factory except cast.
#include <gtest/gtest.h>

#include "ref_test_util.h"

namespace rn::testing {
namespace {

TEST(RefBackend, Identity) {
  auto backend = make_ref_backend();
  EXPECT_EQ(backend->name(), "ref");
  EXPECT_EQ(backend->device(), Device::cpu);
  EXPECT_EQ(backend->preferred_layout(), Layout::nchw);
}

TEST(RefBackend, SupportsOnlyFp32) {
  auto backend = make_ref_backend();
  std::string why;
  EXPECT_TRUE(backend->supports_dtype(DType::f32, &why));
  for (DType t : {DType::bf16, DType::f16}) {
    why.clear();
    EXPECT_FALSE(backend->supports_dtype(t, &why));
    EXPECT_NE(why.find("fp32"), std::string::npos) << why;
  }
  EXPECT_FALSE(backend->supports_dtype(DType::bf16, nullptr));
}

TEST(RefBackend, UnsupportedMessagesNameTheOpAndFp32) {
  auto backend = make_ref_backend();
  BatchNormDesc d;
  d.dtype = DType::f16;
  try {
    backend->make_batch_norm(d);
    FAIL() << "ref accepted f16";
  } catch (const Unsupported& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("batch_norm"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ref only computes fp32"), std::string::npos) << msg;
  }
}

TEST(RefBackend, ValidatesDescriptorsFirst) {
  // An invalid descriptor is an error even when its dtype would also be refused.
  Conv2dDesc d;
  d.p.in_channels = 0;
  d.dtype = DType::bf16;
  try {
    make_ref_backend()->make_conv2d(d);
    FAIL() << "accepted";
  } catch (const Unsupported&) {
    FAIL() << "dtype refused before the descriptor was validated";
  } catch (const Error&) {
  }
}

}  // namespace
}  // namespace rn::testing
