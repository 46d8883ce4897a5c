#include "backends/cuda/cudnn_algo_cache.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/atomic_file.h"
#include "core/log.h"

namespace rn::cuda {

CudnnAlgoCache::CudnnAlgoCache(std::string path) : path_(std::move(path)) {
  if (path_.empty()) {
    if (const char* env = std::getenv("RN_CUDNN_ALGO_CACHE"); env && *env) {
      path_ = env;
    } else if (const char* home = std::getenv("HOME"); home && *home) {
      path_ = std::string(home) + "/.cache/resnet.cpp/cudnn_algos.tsv";
    } else {
      path_ = "-";
    }
  }
  load();
}

bool CudnnAlgoCache::parse_line(const std::string& line, std::string* key, CudnnAlgoChoice* choice) {
  std::istringstream s(line);
  std::string k, algo, ws, math;
  if (!std::getline(s, k, '\t') || !std::getline(s, algo, '\t') || !std::getline(s, ws, '\t') ||
      !std::getline(s, math) || k.empty())
    return false;
  try {
    size_t used = 0;
    choice->algo = std::stoi(algo, &used);
    if (used != algo.size() || choice->algo < 0) return false;
    choice->workspace = static_cast<size_t>(std::stoull(ws, &used));
    if (used != ws.size()) return false;
    choice->math_type = std::stoi(math, &used);
    if (used != math.size() || choice->math_type < 0) return false;
  } catch (const std::exception&) {
    return false;
  }
  *key = k;
  return true;
}

std::string CudnnAlgoCache::format_line(const std::string& key, const CudnnAlgoChoice& c) {
  return key + "\t" + std::to_string(c.algo) + "\t" + std::to_string(c.workspace) + "\t" + std::to_string(c.math_type);
}

void CudnnAlgoCache::load() {
  if (path_ == "-") return;
  std::ifstream in(path_);
  if (!in) return;  // no cache yet
  std::string line;
  int lineno = 0, bad = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    std::string key;
    CudnnAlgoChoice c;
    if (parse_line(line, &key, &c))
      entries_[key] = c;
    else
      ++bad;
  }
  if (bad) RN_LOG_WARN("cuDNN algorithm cache {}: {} malformed lines ignored", path_, bad);
  RN_LOG_DEBUG("cuDNN algorithm cache {}: {} entries", path_, entries_.size());
}

void CudnnAlgoCache::save() const {
  if (path_ == "-") return;
  try {
    std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
    std::map<std::string, CudnnAlgoChoice> sorted(entries_.begin(), entries_.end());
    std::string text = "# resnet.cpp cuDNN algorithm cache: key\talgo\tworkspace bytes\tmath type\n";
    for (const auto& [k, c] : sorted) text += format_line(k, c) + "\n";
    write_file_atomic(path_, std::string_view(text));
  } catch (const std::exception& e) {
    if (!save_warned_)
      RN_LOG_WARN("cuDNN algorithm cache {} not written: {} (the searches are kept in memory for this run; said once)",
                  path_, e.what());
    save_warned_ = true;
  }
}

std::optional<CudnnAlgoChoice> CudnnAlgoCache::find(const std::string& key) const {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void CudnnAlgoCache::put(const std::string& key, const CudnnAlgoChoice& choice) {
  std::lock_guard lock(mutex_);
  entries_[key] = choice;
  save();
}

size_t CudnnAlgoCache::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

}  // namespace rn::cuda
