// The convolution algorithm cache: the choice of cuDNN's measured search per convolution,
// keyed by everything that decides it (direction, shapes, dtype, layout, math mode, the
// cuDNN version and the GPU's name), in memory and in a tab-separated file that survives
// the process (`resnet tune` fills it ahead of time). A corrupt line is ignored with a
// warning (an entry that parses but cannot run is the convolution's to refuse: conv2d.cpp);
// the file is rewritten atomically when an entry is added.
#pragma once

#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace rn::cuda {

struct CudnnAlgoChoice {
  int algo = 0;
  size_t workspace = 0;
  int math_type = 0;  // cudnnMathType_t
};

class CudnnAlgoCache {
 public:
  // path empty: $RN_CUDNN_ALGO_CACHE, else $HOME/.cache/resnet.cpp/cudnn_algos.tsv; "-": memory only.
  explicit CudnnAlgoCache(std::string path = {});
  std::optional<CudnnAlgoChoice> find(const std::string& key) const;
  void put(const std::string& key, const CudnnAlgoChoice& choice);
  const std::string& path() const { return path_; }
  size_t size() const;

  // Parses one file line "key\talgo\tworkspace\tmath"; false if malformed. Exposed for tests.
  static bool parse_line(const std::string& line, std::string* key, CudnnAlgoChoice* choice);
  static std::string format_line(const std::string& key, const CudnnAlgoChoice& choice);

 private:
  void load();
  void save() const;
  std::string path_;
  mutable std::mutex mutex_;
  mutable bool save_warned_ = false;  // a cache that cannot be written is said once, not per shape
  std::unordered_map<std::string, CudnnAlgoChoice> entries_;
};

}  // namespace rn::cuda
