// libFuzzer target for the rank table reader (src/dist/rank_table.cpp, the topology file of
// `resnet launch`): any text must parse or be refused with rn::Error, never crash or hang.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/check.h"
#include "dist/rank_table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  rn::RankTable t;
  try {
    t = rn::parse_rank_table(text, "fuzz.json");
  } catch (const rn::Error&) {
    return 0;
  }
  // An accepted table places every rank on a listed host: host_of() throwing is a finding.
  for (int r = 0; r < t.world_size(); ++r) (void)t.host_of(r);
  return 0;
}
