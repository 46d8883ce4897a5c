// libFuzzer target for the configuration reader (src/train/config.cpp): any YAML text and
// any --set overrides must load or be refused with rn::Error, never crash or hang. A config
// that loads must survive to_yaml() and a second load unchanged (the run folder's
// config.yaml is what a resumed run reads).
//
// The input is the YAML text, then optional overrides, each after a NUL byte.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  size_t nul = input.find('\0');
  const std::string yaml(input.substr(0, nul));
  std::vector<std::string> overrides;
  while (nul != std::string_view::npos) {
    const size_t next = input.find('\0', nul + 1);
    overrides.emplace_back(input.substr(nul + 1, next == std::string_view::npos ? next : next - nul - 1));
    nul = next;
  }
  rn::Config cfg;
  try {
    cfg = rn::load_config_from_string(yaml, overrides, "fuzz.yaml");
  } catch (const rn::Error&) {
    return 0;
  }
  const std::string again = cfg.to_yaml();
  const rn::Config reloaded = rn::load_config_from_string(again, {}, "fuzz-roundtrip.yaml");
  if (!(reloaded == cfg) || reloaded.to_yaml() != again) std::abort();
  return 0;
}
