// Chrome trace recording: complete ("X") events from any thread, written as the JSON that
// chrome://tracing and Perfetto (ui.perfetto.dev) open. Recording is for coarse spans (a
// batch loaded, a training step, an epoch), a few per step, so one mutex is enough.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rn {

// Microseconds on the steady clock since the first call in this process: the time base of
// every trace event.
double trace_now_us();

class TraceRecorder {
 public:
  struct Event {
    std::string name;
    std::string category;
    double start_us = 0;
    double dur_us = 0;
    int tid = 0;
    std::vector<std::pair<std::string, double>> args;
  };

  // An event on the calling thread.
  void complete(std::string name, std::string category, double start_us, double dur_us,
                std::vector<std::pair<std::string, double>> args = {});
  // An event on a named track of its own (work measured elsewhere, such as a gradient
  // bucket's all-reduce on the communication thread).
  void complete_on_track(const std::string& track, std::string name, std::string category, double start_us,
                         double dur_us, std::vector<std::pair<std::string, double>> args = {});
  // Names the calling thread in the viewer ("train loader worker 0", "trainer").
  void name_thread(const std::string& name);

  size_t size() const;
  std::vector<Event> events() const;
  // Writes {"traceEvents": [...], "displayTimeUnit": "ms"} atomically (temporary + rename).
  void write(const std::string& path) const;

 private:
  int tid_locked();  // under mu_

  mutable std::mutex mu_;
  std::vector<Event> events_;
  std::unordered_map<std::thread::id, int> tids_;
  std::unordered_map<std::string, int> track_tids_;
  std::vector<std::pair<int, std::string>> thread_names_;
};

}  // namespace rn
