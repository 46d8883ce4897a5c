// The roofline model for the per-layer profile (`resnet profile`): a layer that does
// `flops` floating-point operations while moving `bytes` to or from memory can run no faster
// than max(flops / peak_flops, bytes / peak_bandwidth). Its arithmetic intensity
// (flops / byte) against the ridge point (peak_flops / peak_bandwidth) says which roof
// bounds it; achieved over attainable says how close it gets.
#pragma once

#include <string>

namespace rn {

struct DevicePeaks {
  double flops_per_s = 0;  // measured: a large GEMM in the profiled dtype
  double bytes_per_s = 0;  // measured: a large streaming elementwise op (read + write)
  double ridge() const { return bytes_per_s > 0 ? flops_per_s / bytes_per_s : 0; }  // flops per byte
};

struct RooflinePoint {
  double intensity = 0;         // flops per byte
  double achieved_flops = 0;    // flops / s
  double achieved_bytes = 0;    // bytes / s
  double attainable_flops = 0;  // min(peak, intensity * bandwidth)
  double roof_fraction = 0;     // achieved / attainable: 1 means on the roof
  std::string bound;            // "compute" or "memory"
};

RooflinePoint roofline(double flops, double bytes, double seconds, const DevicePeaks& peaks);

}  // namespace rn
