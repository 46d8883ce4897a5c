#include "prof/roofline.h"

#include <algorithm>

namespace rn {

RooflinePoint roofline(double flops, double bytes, double seconds, const DevicePeaks& peaks) {
  RooflinePoint p;
  p.intensity = bytes > 0 ? flops / bytes : 0;
  if (seconds > 0) {
    p.achieved_flops = flops / seconds;
    p.achieved_bytes = bytes / seconds;
  }
  p.bound = p.intensity >= peaks.ridge() && flops > 0 ? "compute" : "memory";
  p.attainable_flops = std::min(peaks.flops_per_s, p.intensity * peaks.bytes_per_s);
  if (flops > 0 && p.attainable_flops > 0) {
    p.roof_fraction = p.achieved_flops / p.attainable_flops;
  } else if (peaks.bytes_per_s > 0) {
    p.roof_fraction = p.achieved_bytes / peaks.bytes_per_s;  // no arithmetic: the memory roof alone
  }
  return p;
}

}  // namespace rn
