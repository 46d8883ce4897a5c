#include "train/device.h"

#include <algorithm>

namespace rn {

std::unique_ptr<Backend> make_backend_for(DeviceChoice choice, const BackendOptions& options) {
  switch (choice) {
    case DeviceChoice::cpu: return make_backend("cpu");
    case DeviceChoice::ref: return make_backend("ref");
    case DeviceChoice::cuda:
      return make_backend("cuda", options);
    case DeviceChoice::auto_select: {
      const auto names = available_backends();
      if (std::find(names.begin(), names.end(), "cuda") != names.end()) {
        try {
          return make_backend("cuda", options);
        } catch (const Error&) {
          // no usable GPU in this process: fall through to the CPU, which the log says
        }
      }
      return make_backend("cpu");
    }
  }
  RN_FAIL() << "unknown device choice";
}

DeviceChoice device_from_name(const std::string& name) {
  if (name == "auto") return DeviceChoice::auto_select;
  if (name == "cpu") return DeviceChoice::cpu;
  if (name == "ref") return DeviceChoice::ref;
  if (name == "cuda") return DeviceChoice::cuda;
  RN_FAIL() << "unknown device '" << name << "' (expected auto, cpu, ref or cuda)";
}

}  // namespace rn
