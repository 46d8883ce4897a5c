// An NVTX injection library for tests, loaded the way Nsight Systems' is
// (NVTX_INJECTION64_PATH=.../libnvtx_recorder.so): it writes each range the process pushes,
// pops, starts and ends, and each thread it names, one line per event, to the file that
// RN_NVTX_RECORD names ("%p" in it becomes the process id: one file per rank of a job). Lines: "<tid> push <name>",
// "<tid> pop", "<tid> start <id> <name>",
// "<tid> end <id>", "<tid> thread <named tid> <name>".
#include <nvtx3/nvToolsExt.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace {

std::mutex g_mu;
FILE* g_out = nullptr;
nvtxRangeId_t g_next_id = 1;

int push(const char* name) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(g_out, "%d push %s\n", static_cast<int>(gettid()), name ? name : "");
  std::fflush(g_out);
  return 0;
}

int pop() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(g_out, "%d pop\n", static_cast<int>(gettid()));
  std::fflush(g_out);
  return 0;
}

nvtxRangeId_t start(const char* name) {
  std::lock_guard<std::mutex> lock(g_mu);
  const nvtxRangeId_t id = g_next_id++;
  std::fprintf(g_out, "%d start %llu %s\n", static_cast<int>(gettid()), static_cast<unsigned long long>(id),
               name ? name : "");
  std::fflush(g_out);
  return id;
}

void end(nvtxRangeId_t id) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(g_out, "%d end %llu\n", static_cast<int>(gettid()), static_cast<unsigned long long>(id));
  std::fflush(g_out);
}

void name_thread(uint32_t tid, const char* name) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(g_out, "%d thread %u %s\n", static_cast<int>(gettid()), tid, name ? name : "");
  std::fflush(g_out);
}

}  // namespace

// Called by the application's NVTX on its first call; non-zero: attached.
extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table) {
  const char* path = std::getenv("RN_NVTX_RECORD");
  if (!path || !get_table) return 0;
  const auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(get_table(NVTX_ETID_CALLBACKS));
  if (!callbacks || !callbacks->GetModuleFunctionTable) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;  // the largest callback id the table holds
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) || !table) return 0;
  std::string file = path;
  if (const size_t at = file.find("%p"); at != std::string::npos) file.replace(at, 2, std::to_string(getpid()));
  g_out = std::fopen(file.c_str(), "w");
  if (!g_out) return 0;
  auto set = [&](unsigned int id, NvtxFunctionPointer fn) {
    if (id <= size && table[id]) *table[id] = fn;
  };
  set(NVTX_CBID_CORE_RangePushA, reinterpret_cast<NvtxFunctionPointer>(&push));
  set(NVTX_CBID_CORE_RangePop, reinterpret_cast<NvtxFunctionPointer>(&pop));
  set(NVTX_CBID_CORE_RangeStartA, reinterpret_cast<NvtxFunctionPointer>(&start));
  set(NVTX_CBID_CORE_RangeEnd, reinterpret_cast<NvtxFunctionPointer>(&end));
  set(NVTX_CBID_CORE_NameOsThreadA, reinterpret_cast<NvtxFunctionPointer>(&name_thread));
  return 1;
}
