// Test helper: reads what tests/cli/nvtx_recorder (an NVTX injection library, loaded
// through NVTX_INJECTION64_PATH as Nsight Systems loads its own) recorded of a process's
// ranges, checking the rules as it reads.
#pragma once

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace rn::test {

struct NvtxRecord {
  std::multiset<std::string> pushed;                    // every range pushed, by name
  std::vector<std::string> phases;                      // started ranges, in order
  std::map<int, std::string> thread_names;              // tid -> name
  std::map<int, std::multiset<std::string>> pushed_on;  // tid -> ranges it pushed
  std::vector<std::string> errors;                      // what broke the rules
};

// Checks the rules as it reads: a pop ends a range its thread pushed, an end ends a started
// range once, no more than one phase is open at a time, and nothing is left open but the
// last phase.
inline NvtxRecord parse_nvtx_record(const std::string& text) {
  NvtxRecord r;
  std::map<int, std::vector<std::string>> stacks;
  std::map<unsigned long long, std::string> open;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    int tid = 0;
    std::string what;
    ls >> tid >> what;
    std::string rest;
    if (what == "push") {
      std::getline(ls >> std::ws, rest);
      stacks[tid].push_back(rest);
      r.pushed.insert(rest);
      r.pushed_on[tid].insert(rest);
    } else if (what == "pop") {
      if (stacks[tid].empty())
        r.errors.push_back("thread " + std::to_string(tid) + " popped with nothing pushed");
      else
        stacks[tid].pop_back();
    } else if (what == "start") {
      unsigned long long id = 0;
      ls >> id;
      std::getline(ls >> std::ws, rest);
      if (!open.empty()) r.errors.push_back("phase \"" + rest + "\" started while another was open");
      open[id] = rest;
      r.phases.push_back(rest);
    } else if (what == "end") {
      unsigned long long id = 0;
      ls >> id;
      if (open.erase(id) != 1) r.errors.push_back("end of range " + std::to_string(id) + ", which is not open");
    } else if (what == "thread") {
      unsigned named = 0;
      ls >> named;
      std::getline(ls >> std::ws, rest);
      r.thread_names[static_cast<int>(named)] = rest;
    } else {
      r.errors.push_back("unknown line: " + line);
    }
  }
  for (const auto& [tid, stack] : stacks)
    if (!stack.empty())
      r.errors.push_back("thread " + std::to_string(tid) + " left " + std::to_string(stack.size()) +
                         " ranges open, the innermost \"" + stack.back() + "\"");
  if (open.size() > 1) r.errors.push_back(std::to_string(open.size()) + " phases left open");
  return r;
}

}  // namespace rn::test
