#include "prof/trace.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace rn {

double trace_now_us() {
  static const auto epoch = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - epoch).count();
}

int TraceRecorder::tid_locked() {
  const auto id = std::this_thread::get_id();
  auto it = tids_.find(id);
  if (it != tids_.end()) return it->second;
  const int tid = static_cast<int>(tids_.size()) + 1;
  tids_.emplace(id, tid);
  return tid;
}

void TraceRecorder::complete(std::string name, std::string category, double start_us, double dur_us,
                             std::vector<std::pair<std::string, double>> args) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(Event{std::move(name), std::move(category), start_us, dur_us, tid_locked(), std::move(args)});
}

void TraceRecorder::complete_on_track(const std::string& track, std::string name, std::string category,
                                      double start_us, double dur_us,
                                      std::vector<std::pair<std::string, double>> args) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = track_tids_.find(track);
  if (it == track_tids_.end()) {
    const int tid = 1000 + static_cast<int>(track_tids_.size());  // apart from the threads' 1, 2, ...
    it = track_tids_.emplace(track, tid).first;
    thread_names_.emplace_back(tid, track);
  }
  events_.push_back(Event{std::move(name), std::move(category), start_us, dur_us, it->second, std::move(args)});
}

void TraceRecorder::name_thread(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  thread_names_.emplace_back(tid_locked(), name);
}

size_t TraceRecorder::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

std::vector<TraceRecorder::Event> TraceRecorder::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

void TraceRecorder::write(const std::string& path) const {
  nlohmann::json events = nlohmann::json::array();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [tid, name] : thread_names_) {
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", tid}, {"args", {{"name", name}}}});
    }
    for (const Event& e : events_) {
      nlohmann::json args = nlohmann::json::object();
      for (const auto& [k, v] : e.args) args[k] = v;
      events.push_back({{"name", e.name},
                        {"cat", e.category},
                        {"ph", "X"},
                        {"ts", e.start_us},
                        {"dur", e.dur_us},
                        {"pid", 1},
                        {"tid", e.tid},
                        {"args", args}});
    }
  }
  const nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    RN_CHECK(out.good()) << "cannot write trace " << tmp;
    out << doc.dump();
    out.flush();
    RN_CHECK(out.good()) << "writing trace " << tmp << " failed";
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  RN_CHECK(!ec) << "cannot rename " << tmp << " to " << path << ": " << ec.message();
}

}  // namespace rn
