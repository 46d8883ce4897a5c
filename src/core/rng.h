// Seeded random numbers: xoshiro256** seeded through splitmix64. Cheap to copy, so a
// component can fork an independent stream with `fork(tag)` and its results do not
// depend on what other components drew. State can be saved and restored (checkpoints).
#pragma once

#include <array>
#include <cstdint>

namespace rn {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0);

  uint64_t next_u64();
  float uniform();                          // [0, 1)
  float uniform(float lo, float hi);        // [lo, hi)
  float normal();                           // standard normal (Box-Muller)
  uint64_t below(uint64_t n);               // uniform integer in [0, n), unbiased
  Rng fork(uint64_t tag) const;             // an independent stream derived from this one

  std::array<uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<uint64_t, 4>& s) { s_ = s; }

 private:
  std::array<uint64_t, 4> s_{};
};

uint64_t splitmix64(uint64_t& x);

}  // namespace rn
