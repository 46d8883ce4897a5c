// The run report: RUN_DIR/report.html, one self-contained page (inline CSS and SVG; no
// scripts, fonts or network) drawn from RUN_DIR/metrics.jsonl (metrics.h):
//
//   summary    final and best validation top-1/top-5, final losses, total steps, skipped
//              overflow steps, median img/s and data-wait share, training time, resumes, the
//              build that ran it (each build, when a resume changed it) and its libraries, in a
//              table of their own (shown even before the first training record)
//   plots      training (and validation) loss vs step; validation top-1/top-5 vs epoch;
//              learning rate vs step; loss scale vs step (log2 axis); images/s vs step;
//              data-wait share vs step
//   memory     planned and measured peak memory after the first epoch at each memory level
//   config     RUN_DIR/config.yaml verbatim, when present
//
// A resumed run appends to metrics.jsonl after rewinding to its checkpoint: its "start"
// record names the checkpoint's step, and every earlier record past that step, of any kind (the
// per-epoch tables too), is dropped; dropping any counts as a rewind. In files without start
// records, a record whose step is below the last one seen starts over from there, and one
// repeating a step of its own kind replaces that kind's records (device samples excepted: they
// repeat a step by nature). Missing or empty metrics give a page that says "no data".
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace rn {

// Writes RUN_DIR/report.html atomically. The folder must exist.
void write_report(const std::string& run_dir);

// The page for these records (read_metrics order) and config text (empty: none); `title`
// names the run.
std::string render_report_html(const std::vector<nlohmann::json>& records, const std::string& config_yaml,
                               const std::string& title);

}  // namespace rn
