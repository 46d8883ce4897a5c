#include "train/device.h"

#include <algorithm>

#include "core/log.h"

namespace rn {

std::unique_ptr<Backend> make_backend_for(DeviceChoice choice, const BackendOptions& options) {
  switch (choice) {
    case DeviceChoice::cpu: return make_backend("cpu", options);
    case DeviceChoice::ref: return make_backend("ref");
    case DeviceChoice::cuda:
      return make_backend("cuda", options);
    case DeviceChoice::auto_select: {
      const auto names = available_backends();
      if (std::find(names.begin(), names.end(), "cuda") != names.end()) {
        try {
          return make_backend("cuda", options);
        } catch (const Error& e) {
          // No usable GPU in this process: the CPU, saying why (debug: a CPU-only machine
          // is the common case, not a problem).
          RN_LOG_DEBUG("device auto: the CUDA backend is built but cannot start ({}); using the CPU", e.what());
        }
      }
      return make_backend("cpu", options);
    }
  }
  RN_FAIL() << "unknown device choice";
}

BackendOptions backend_options_for(const RunConfig& run) {
  BackendOptions o;
  o.high_precision = run.implementation_mode == ImplementationMode::high_precision;
  o.deterministic = run.deterministic;
  o.cpu_bf16_conv_arithmetic = run.cpu_bf16_conv_arithmetic;
  return o;
}

DeviceChoice device_from_name(const std::string& name) {
  if (name == "auto") return DeviceChoice::auto_select;
  if (name == "cpu") return DeviceChoice::cpu;
  if (name == "ref") return DeviceChoice::ref;
  if (name == "cuda") return DeviceChoice::cuda;
  RN_FAIL() << "unknown device '" << name << "' (expected auto, cpu, ref or cuda)";
}

}  // namespace rn
