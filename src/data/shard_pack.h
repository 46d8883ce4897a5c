// Packs an encoded-image dataset into shards (docs/shards.md), as `resnet pack` does.
// Records keep the dataset's order and are split into shards of records_per_shard; shards
// are packed in parallel, each written to <name>.tmp files that are renamed into place
// only when complete (tar first, index last: an index present means its tar is complete),
// and dataset.json is written last, atomically. A rerun over the same folder keeps every
// shard whose index matches its tar and the options, removes stale .tmp files, and packs
// the rest, so an interrupted pack finishes with the same bytes a clean pack writes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/encoded_dataset.h"

namespace rn {

struct PackProgress {
  int64_t records_done = 0;  // records written or skipped, including reused shards'
  int64_t records_total = 0;
  int64_t shards_done = 0;
  int64_t shards_total = 0;
  uint64_t bytes_out = 0;
  double seconds = 0;
};

struct PackOptions {
  std::string out_dir;
  // Shorter side at most this many pixels (larger images are downscaled, keeping the
  // aspect ratio, and re-encoded); 0 keeps every image's size.
  int max_short_side = 0;
  int quality = 90;  // JPEG quality of re-encoded images, 1..100
  bool raw = false;  // store decoded RGB pixels as .npy instead of JPEG/PNG
  // Records per shard; 0: chosen so that a shard holds about target_shard_bytes, from the
  // packed size of a sample of records.
  int64_t records_per_shard = 0;
  uint64_t target_shard_bytes = uint64_t{256} << 20;
  int workers = 0;      // shards packed at once; 0: the number of cores
  bool strict = false;  // an unreadable source image is an error instead of a counted skip
  // A folder that holds a finished pack of another source (its dataset.json names the source),
  // or shard files no unfinished pack of ours left, is refused unless this is set: the new pack
  // then replaces them. A folder holding folders is refused either way.
  bool overwrite = false;
  // Called on the calling thread about twice a second and once at the end.
  std::function<void(const PackProgress&)> progress;
  // Test hook: stop (throwing rn::Error) after this many shards have been written, leaving
  // the folder as a killed pack would. < 0: off.
  int64_t stop_after_shards = -1;
};

struct PackResult {
  int64_t records = 0;  // packed (excluding skipped)
  int64_t shards = 0;
  int64_t shards_reused = 0;  // complete shards kept from an earlier run
  int64_t records_per_shard = 0;
  int64_t skipped = 0;
  std::vector<std::string> skipped_sources;  // this run's skips (reused shards only count theirs)
  uint64_t bytes_in = 0;                     // source bytes read by this run
  uint64_t bytes_out = 0;                    // bytes of all tars
  int64_t records_packed = 0;                // by this run (records less those of kept shards)
  uint64_t bytes_written = 0;                // by this run (bytes_out less the kept shards' tars)
  double seconds = 0;
};

PackResult pack_shards(const EncodedDataset& src, const PackOptions& options);

// The key a record of `src` gets: the path under the ImageFolder root without its
// extension ("n01440764/n01440764_10026"), the key of a shard record, else the index.
// Characters outside [A-Za-z0-9_-/] become '_'.
std::vector<std::string> pack_keys(const EncodedDataset& src);

}  // namespace rn
