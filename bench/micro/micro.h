// The micro-benchmark families of rn_micro, each registered by its own file (no static
// initialisers: main registers them all before running the filter).
#pragma once

namespace rn {
void register_batch_norm();  // micro_batch_norm.cpp
void register_conv();        // micro_conv.cpp
void register_nvtx();        // micro_nvtx.cpp
}  // namespace rn
