// What a run was made with: the build (core/build_info.h) and every library it runs with, as
// `resnet --version` prints it and train.log, checkpoints and `resnet bench --json` record it.
#pragma once

#include <string>
#include <vector>

#include "core/build_info.h"

namespace rn {

// The backends' libraries (oneDNN; CUDA runtime, driver, cuDNN, cuBLAS), the communication
// libraries (MPI; NCCL) and the image decoders (libjpeg-turbo, libpng), in that order. Needs no
// GPU and no MPI job.
std::vector<LibraryVersion> library_versions();

// build_description() and library_versions() on one line:
// "resnet.cpp 0.1.0 (commit 012ad84abcde, Release, GNU 12.2.0); oneDNN 2.7.3, Open MPI 4.1.4, ..."
std::string software_description();

}  // namespace rn
