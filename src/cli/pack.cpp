// `resnet pack SRC OUT`: an ImageFolder tree (or a list file under a root) into shards for
// fast random access (docs/shards.md). Progress goes to stderr, a summary to stdout.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "cli/format.h"
#include "core/check.h"
#include "core/plural.h"
#include "data/image_folder.h"
#include "data/shard_dataset.h"
#include "data/shard_format.h"
#include "data/shard_pack.h"

namespace rn::cli {

namespace {

namespace fs = std::filesystem;

struct PackArgs {
  std::string src;
  std::string out;
  std::string list;
  int max_size = 0;
  int quality = 90;
  bool raw = false;
  int64_t records_per_shard = 0;
  double shard_mb = 256;
  int workers = 0;
  bool strict = false;
  bool overwrite = false;
};

// A line at every further 5% of the records, and at least every 5 seconds.
class ProgressPrinter {
 public:
  void operator()(const PackProgress& p) {
    const int64_t pct = p.records_total > 0 ? 100 * p.records_done / p.records_total : 100;
    // The line with every shard done is always shown (100% of the records may come before it).
    const bool all_done = p.shards_done == p.shards_total;
    if (all_done ? done_shown_ : pct < next_pct_ && p.seconds < last_seconds_ + 5) return;
    done_shown_ = all_done;
    next_pct_ = (pct / 5 + 1) * 5;
    last_seconds_ = p.seconds;
    fmt::print(stderr, "pack: {:3d}%  {}/{} records  {}/{} shards  {:.0f} records/s  {} written  {:.1f} s\n", pct,
               p.records_done, p.records_total, p.shards_done, p.shards_total,
               p.seconds > 0 ? p.records_done / p.seconds : 0.0, human_bytes(static_cast<double>(p.bytes_out)),
               p.seconds);
  }

 private:
  int64_t next_pct_ = 0;
  double last_seconds_ = 0;
  bool done_shown_ = false;
};

// Shards written into an image folder would be read as part of it (a class folder of no
// images, or files in a class folder) by the next scan; refused before any work.
void check_out_outside_src(const std::string& src, const std::string& out) {
  std::error_code ec1, ec2;
  const fs::path s = fs::weakly_canonical(fs::absolute(src), ec1);
  const fs::path o = fs::weakly_canonical(fs::absolute(out), ec2);
  if (ec1 || ec2) return;  // the dataset and pack_shards name whatever is wrong
  const auto [s_end, o_it] = std::mismatch(s.begin(), s.end(), o.begin(), o.end());
  RN_CHECK(s_end != s.end()) << "pack: the output folder '" << out << "' is "
                             << (o_it == o.end() ? "the source folder" : "inside the source folder '" + src + "'")
                             << ", where the shards would be read as images or classes: give a folder outside it";
}

int run_pack(const PackArgs& a) {
  if (a.list.empty()) check_out_outside_src(a.src, a.out);  // a list names its files: others do no harm
  std::unique_ptr<EncodedDataset> src;
  std::error_code ec;
  if (!a.list.empty())
    src = std::make_unique<ImageListDataset>(a.src, a.list);
  else if (fs::exists(fs::path(a.src) / std::string(kShardManifestName), ec))
    src = std::make_unique<ShardDataset>(a.src);  // a pack, packed again (smaller, or raw)
  else
    src = std::make_unique<ImageFolderDataset>(a.src);
  fmt::print(stderr, "pack: {} images, {} classes from {} into {}\n", src->size(), src->num_classes(), src->name(),
             a.out);
  // One class folder is seldom a dataset: more often the class folder given for its parent.
  if (src->num_classes() == 1 && a.list.empty())
    fmt::print(stderr,
               "pack: warning: {} has one class ('{}'); a classifier needs at least 2 (was a class folder given "
               "instead of the folder above it?)\n",
               a.src, src->classes().front());

  PackOptions o;
  o.out_dir = a.out;
  o.max_short_side = a.max_size;
  o.quality = a.quality;
  o.raw = a.raw;
  o.records_per_shard = a.records_per_shard;
  RN_CHECK(a.shard_mb * (1 << 20) < kMaxByteCount)  // 0 after the cast would mean one record per shard
      << "--shard-mb " << a.shard_mb << " is more than any file holds (at most 8 EiB, 8796093022208 MiB)";
  o.target_shard_bytes = static_cast<uint64_t>(a.shard_mb * (1 << 20));
  o.workers = a.workers;
  o.strict = a.strict;
  o.overwrite = a.overwrite;
  o.progress = ProgressPrinter();
  const PackResult r = pack_shards(*src, o);

  // The rate and the bytes written are this run's: kept shards were packed by an earlier one.
  fmt::print("packed {} into {} ({} per shard, {} kept from an earlier run) in {:.1f} s, {}\n",
             counted(r.records, "record"), counted(r.shards, "shard"), counted(r.records_per_shard, "record"),
             r.shards_reused, r.seconds,
             r.records_packed > 0 ? fmt::format("{:.0f} records/s", r.records_packed / std::max(r.seconds, 1e-9))
                                  : std::string("nothing repacked"));
  // Kept shards count their skips, which the run that packed them named.
  const int64_t skipped_before = r.skipped - static_cast<int64_t>(r.skipped_sources.size());
  fmt::print(
      "read {}, wrote {} (the pack: {}); skipped {}{}\n", human_bytes(static_cast<double>(r.bytes_in)),
      human_bytes(static_cast<double>(r.bytes_written)), human_bytes(static_cast<double>(r.bytes_out)),
      counted(r.skipped, "unreadable image"),
      skipped_before > 0
          ? fmt::format(" ({} in shards kept from an earlier run, named by the run that packed them)", skipped_before)
          : std::string());
  for (const auto& s : r.skipped_sources) fmt::print("  skipped {}\n", s);
  return 0;
}

}  // namespace

Runner add_pack_command(CLI::App& app) {
  auto a = std::make_shared<PackArgs>();
  CLI::App* cmd = app.add_subcommand("pack", "Pack an image folder into shards for fast random access");
  cmd->add_option("src", a->src,
                  "ImageFolder root (class folders of images), a packed folder (packed again), or the root of "
                  "--list's paths")
      ->required();
  cmd->add_option("out", a->out, "Output folder (dataset.json, shard-NNNNN.tar/.idx)")->required();
  cmd->add_option("--list", a->list, "List file of 'relative/path label' lines (paths relative to SRC)");
  cmd->add_option("--max-size", a->max_size, "Downscale so that the shorter side is at most this (0: keep)")
      ->capture_default_str()
      ->check(non_negative_number());
  cmd->add_option("--quality", a->quality, "JPEG quality of re-encoded images")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  cmd->add_flag("--raw", a->raw, "Store decoded RGB pixels (.npy) instead of JPEG");
  cmd->add_option("--records-per-shard", a->records_per_shard, "Records per shard (0: from --shard-mb)")
      ->capture_default_str()
      ->check(non_negative_number());
  cmd->add_option("--shard-mb", a->shard_mb, "Target shard size in MiB when --records-per-shard is 0")
      ->capture_default_str()
      ->check(positive_number());
  cmd->add_option("--workers", a->workers, "Shards packed at once (0: all cores)")
      ->capture_default_str()
      ->check(non_negative_number());
  cmd->add_flag("--strict", a->strict, "Stop at the first unreadable image instead of skipping it");
  cmd->add_flag("--overwrite", a->overwrite, "Pack into a folder that holds a pack of another source, replacing it");
  return [cmd, a]() -> int { return cmd->parsed() ? run_pack(*a) : -1; };
}

}  // namespace rn::cli
