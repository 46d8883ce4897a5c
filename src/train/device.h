// Picks the backend for a run: `auto` takes the CUDA backend when this build has it and a
// GPU is usable, else the oneDNN CPU backend.
#pragma once

#include <memory>

#include "ops/backend.h"
#include "train/config.h"

namespace rn {

std::unique_ptr<Backend> make_backend_for(DeviceChoice choice);
DeviceChoice device_from_name(const std::string& name);  // auto | cpu | ref | cuda

}  // namespace rn
