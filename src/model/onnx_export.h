// ONNX export of a model's inference graph (`resnet export --out model.onnx`), for serving
// runtimes (ONNX Runtime, TensorRT, OpenVINO): every node of the graph as the standard ONNX
// operator with the same semantics in evaluation mode (Conv with its groups, BatchNormalization
// on the running statistics, the fused ReLU and residual add+ReLU as Relu and Add nodes,
// MaxPool, GlobalAveragePool + Flatten, Gemm), the parameters and running statistics as fp32
// initializers under their torchvision names. The input is "input" [N, C, H, W], already
// normalised (the training's mean/std are not in the graph), N symbolic; the output is
// "logits" [N, classes]. Built with Debian's libonnx (ONNX 1.12): the model is checked by
// ONNX's own checker and shape inference before it is written, atomically.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "model/model.h"
#include "ops/backend.h"

namespace rn {

inline constexpr int kOnnxOpset = 13;

// Whether this build can write ONNX (libonnx-dev was found at configure time).
bool onnx_export_available();

struct OnnxExportInfo {
  int nodes = 0;         // ONNX nodes written
  int initializers = 0;  // parameter and running-statistic tensors
  size_t bytes = 0;      // the file's size
};

// Writes `model` (its parameters and running statistics on the host) to `path`. Throws
// rn::Error naming the path on a failed write, and rn::Unsupported in a build without libonnx.
OnnxExportInfo save_onnx(const std::string& path, const Model& model);

// What an exported graph must reproduce: `batch` standard-normal inputs drawn with `seed`
// (already normalised, NCHW fp32) and the logits `backend` computes for them in evaluation mode.
struct ExportSample {
  HostTensor input;   // [batch, C, H, W] fp32
  HostTensor logits;  // [batch, classes] fp32
};
ExportSample export_sample(Model& model, Backend& backend, int64_t batch, uint64_t seed);

}  // namespace rn
