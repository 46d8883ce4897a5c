// Picks the backend for a run: `auto` takes the CUDA backend when this build has it and a
// GPU is usable, else the oneDNN CPU backend.
#pragma once

#include <memory>

#include "ops/backend.h"
#include "train/config.h"

namespace rn {

// `auto` falls back to the CPU when the CUDA backend cannot start (no GPU, no driver).
std::unique_ptr<Backend> make_backend_for(DeviceChoice choice, const BackendOptions& options = {});
// The backend options a config's run section asks for (run.implementation_mode).
BackendOptions backend_options_for(const RunConfig& run);
DeviceChoice device_from_name(const std::string& name);  // auto | cpu | ref | cuda

}  // namespace rn
