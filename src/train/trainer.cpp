#include "train/trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <ctime>
#include <exception>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <thread>

#include "core/log.h"
#include "core/memory_space.h"
#include "core/plural.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "core/utf8.h"
#include "data/loader.h"
#include "dist/activity.h"
#include "dist/grad_buckets.h"
#include "dist/mpi_communicator.h"
#include "dist/nccl_communicator.h"
#include "dist/world.h"
#include "model/memory_usage.h"
#include "model/model.h"
#include "model/plan.h"
#include "model/zoo.h"
#include "prof/pipeline.h"
#include "prof/trace.h"
#include "train/batch_feeder.h"
#include "train/checkpoint.h"
#include "train/checkpoint_file.h"
#include "train/data_parallel.h"
#include "train/data_setup.h"
#include "train/device.h"
#include "train/diagnostics.h"
#include "train/evaluate.h"
#include "train/metrics.h"
#include "train/precision.h"
#include "train/pretrained.h"
#include "train/report.h"
#include "train/run_folder_lock.h"
#include "train/schedule.h"
#include "train/train_step.h"
#include "train/versions.h"

namespace rn {

namespace {

std::atomic<bool> g_stop{false};

std::atomic<int64_t> g_stop_at_ns{0};  // CLOCK_MONOTONIC of the request not yet answered

// The first signal asks for a stop at the next step boundary (with a checkpoint); another one
// at least 2 s later, before that stop is answered, ends the process at once as the signal
// would have (a set-up that blocks, a long evaluation: the last complete checkpoint is kept).
// Sooner is the same request again: a terminal's Ctrl-C reaches a rank directly and through
// mpirun. Only async-signal-safe calls here.
int64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Two signals at once (Ctrl-C directly and through mpirun) may run this on two threads: the
// second can find the flag set and the time not yet, which is the same request, not a late
// second one.
extern "C" void on_stop_signal(int sig) {
  const int64_t now = monotonic_ns();
  if (!g_stop.exchange(true)) {
    g_stop_at_ns = now;
    return;
  }
  const int64_t first = g_stop_at_ns.load();
  if (first != 0 && now - first >= int64_t{2} * 1000000000) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

// A stop request was answered (or there is none yet): the next signal is a new first one.
// The time goes first, so that a signal in between never pairs the new flag with the old time.
void clear_stop_request() {
  g_stop_at_ns = 0;
  g_stop = false;
}

// Keys that do not change the recipe a run follows, so a resumed run's config.yaml may differ
// from its checkpoint's in them: where the data lives and how it is read, threads, logging,
// evaluation and checkpoint frequency, diagnostics, memory reuse, the device and its kernels
// (which round differently, as another build may: see the build warning), gradient buckets, the
// job's placement, and the per-rank batch (which follows the number of ranks; the global batch is
// checked on its own).
bool may_differ_on_resume(const std::string& key) {
  static const char* const kKeys[] = {"memory.",
                                      "diagnostics.",
                                      "run.checkpoint.",
                                      "run.out_dir",
                                      "run.threads",
                                      "run.log_interval_steps",
                                      "run.trace",
                                      "run.eval_interval_epochs",
                                      "run.device",
                                      "run.implementation_mode",
                                      "run.cpu_bf16_conv_arithmetic",
                                      "run.deterministic",
                                      "run.sink_size",
                                      "precision.loss_scale.max_skips_in_a_row",
                                      "data.root",
                                      "data.val_root",
                                      "data.workers",
                                      "data.prefetch",
                                      "data.cache_mb",
                                      "data.batch_size",
                                      "dist.timeout_s",
                                      "dist.rank_table",
                                      "dist.fusion_threshold",
                                      "dist.bucket_boundaries"};
  for (std::string_view k : kKeys)
    if (k.back() == '.' ? key.rfind(k, 0) == 0 : key == k) return true;
  return false;
}

// A resume continues the run its checkpoint belongs to: config.yaml, which a user may have
// edited since, must agree with the configuration the checkpoint was trained with.
void check_resume_config(const std::string& checkpoint_path, const std::string& trained_yaml, const Config& now,
                         const std::string& run_dir) {
  Config trained;
  try {
    trained = load_config_from_string(trained_yaml, {}, checkpoint_path + " (its config_yaml)");
  } catch (const Error& e) {
    RN_LOG_WARN("cannot compare {}/config.yaml with the configuration of {} ({}): resuming without that check", run_dir,
                checkpoint_path, e.what());
    return;
  }
  std::string changed, rounding;
  // Keys that keep the recipe but not the rounding (sink mode replays the same kernels).
  static const std::set<std::string> kRounding = {"run.threads", "run.device", "run.implementation_mode",
                                                  "run.cpu_bf16_conv_arithmetic", "run.deterministic"};
  for (const std::string& d : config_differences(trained, now)) {
    const std::string key = d.substr(0, d.find(':'));
    if (!may_differ_on_resume(key)) changed += (changed.empty() ? "" : "; ") + d;
    if (kRounding.count(key)) rounding += (rounding.empty() ? "" : "; ") + d;
  }
  if (!rounding.empty())
    RN_LOG_WARN(
        "resuming with other kernels or threads than {} was trained with ({}): the run goes on with the same "
        "recipe, but it may not match an uninterrupted run bit for bit",
        checkpoint_path, rounding);
  // The decoded-image cache keeps images at data.cache_short_side, and with it on every image
  // is decoded so (docs/images.md): turned on or off, the crops of every later step change.
  if ((trained.data.cache_mb > 0) != (now.data.cache_mb > 0) && now.data.dataset == DatasetKind::imagefolder)
    RN_LOG_WARN(
        "data.cache_mb is {} now and was {} when {} was written: with the cache images are decoded at its "
        "resolution (data.cache_short_side {}), without it at the crop's, so the steps from here see other pixels "
        "than an uninterrupted run would; the run goes on",
        now.data.cache_mb, trained.data.cache_mb, checkpoint_path, now.data.cache_short_side);
  RN_CHECK(changed.empty()) << "cannot resume " << run_dir << ": its config.yaml differs from the configuration "
                            << checkpoint_path << " was trained with, in keys that change results (" << changed
                            << "). Put them back, or start a new run from these weights with --set model.pretrained="
                            << checkpoint_path;
}

namespace fs = std::filesystem;

// The name of the first parameter or state tensor (BN statistics) holding an inf or NaN on
// the host, or empty.
std::string first_non_finite_tensor(const Model& model) {
  for (const ParamView& p : model.params().params)
    if (any_inf_or_nan(model.param_data() + p.offset, p.numel)) return p.name;
  for (const StateView& v : model.state_views())
    if (any_inf_or_nan(model.state_data() + v.offset, v.numel)) return v.name;
  return "";
}

// The planned and the measured memory of a training plan, as a log line and a "memory"
// record in metrics.jsonl (bytes; level 0, 1, 2 for O0, O1, O2).
// On a device the arena is device memory, which the host's page residency says nothing
// about: the device's peak of all its allocations is reported instead.
void log_measured_memory(const Plan& plan, MetricsLog& metrics, int64_t epoch, int64_t step) {
  const PlannedPeak p = plan.planned_peak(1);
  const bool on_device = plan.backend() != nullptr && plan.backend()->device() != Device::cpu;
  const RangeResidency arena = on_device ? RangeResidency{} : plan.arena_residency();
  const double device_peak = on_device ? static_cast<double>(plan.backend()->memory().peak_bytes()) : 0.0;
  const ProcessMemory process = process_memory();
  const double MiB = 1048576.0;
  RN_LOG_INFO(
      "memory at level {} after epoch {}: planned arena {:.1f} MiB, total {:.1f} MiB; {}, resident {:.1f} MiB, "
      "peak resident {:.1f} MiB",
      memory_level_name(plan.options().memory), epoch, p.arena / MiB, p.total() / MiB,
      on_device ? fmt::format("measured device peak {:.1f} MiB (every device allocation)", device_peak / MiB)
                : fmt::format("measured arena high-water {:.1f} MiB", arena.high_water / MiB),
      process.resident / MiB, process.peak_resident / MiB);
  MetricsRecord record("memory", epoch, step);
  record.add("level", static_cast<int64_t>(plan.options().memory))
      .add("batch", plan.options().batch)
      .add("planned_arena", p.arena)
      .add("planned_activations", p.activations)
      .add("planned_gradients", p.gradients)
      .add("planned_parameters", p.parameters + p.parameter_grads + p.half_weights)
      .add("planned_optimizer", p.optimizer_state)
      .add("planned_workspace", p.workspace)
      .add("planned_total", p.total());
  if (on_device)
    record.add("arena_high_water", std::numeric_limits<double>::quiet_NaN());  // null: not measured
  else
    record.add("arena_high_water", arena.high_water);
  record.add("resident", process.resident).add("peak_resident", process.peak_resident);
  if (on_device) record.add("device_peak", device_peak);
  metrics.append(record);
}

// The folder of a fresh run, locked (run_folder_lock.h); `made`: this run created it (else it
// was an empty folder, or a link to one, given as run.out_dir).
struct NewRunFolder {
  std::string dir;
  RunFolderLock lock;
  bool made = false;
};

// A fresh run never writes into a folder that already holds a run, or that another run is
// setting up (locked, no train.log yet): it takes the first free "<out_dir>-N" instead.
NewRunFolder fresh_run_dir(const std::string& out_dir) {
  RN_CHECK(!out_dir.empty()) << "config: key 'run.out_dir' is empty: name the run folder (e.g. runs/my_run)";
  auto used = [](const fs::path& p) {
    return fs::exists(p / "train.log") || fs::exists(p / "checkpoints") || RunFolderLock::held_by_another(p.string());
  };
  for (int n = 1;; ++n) {
    const fs::path dir = n == 1 ? fs::path(out_dir) : fs::path(out_dir + "-" + std::to_string(n));
    if (used(dir)) continue;
    // Nor into a folder of other files (".", a project folder): the run's report.html,
    // config.yaml, ... would replace files of the same names there.
    std::error_code ec;
    const bool existed = fs::exists(dir, ec);
    if (fs::is_directory(dir, ec)) {
      std::string found;
      int others = 0;
      for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        if (it->path().filename() == RunFolderLock::kFileName) continue;  // a set-up that failed
        if (++others <= 3) found += (found.empty() ? "" : ", ") + it->path().filename().string();
      }
      RN_CHECK(others == 0) << "run.out_dir: '" << dir.string() << "' is a folder that holds other files (" << found
                            << (others > 3 ? fmt::format(" and {} more", others - 3) : std::string())
                            << "); a run writes config.yaml, train.log, report.html, checkpoints/ and more into its "
                               "folder: name a new or empty one (e.g. runs/my_run)";
    }
    fs::create_directories(dir, ec);
    RN_CHECK(!ec && fs::is_directory(dir)) << "run.out_dir: cannot make the run folder '" << dir.string()
                                           << "': " << (ec ? ec.message() : "a file of that name is in the way");
    try {
      return {dir.string(), RunFolderLock(dir.string()), !existed};
    } catch (const Error&) {
      if (!RunFolderLock::held_by_another(dir.string())) throw;
      // Another run took this folder in the meantime: the next name.
    }
  }
}

// A fresh run that fails before training starts (a model that does not fit its pretrained
// weights, a missing device, ...) leaves no folder behind: otherwise the corrected attempt would
// go to <out_dir>-2, and a resume of the failed folder could not take the corrected settings.
// Only what the run wrote itself is removed, and the folder only if the run made it (not an
// empty folder or a link the user gave as run.out_dir) and once it is empty.
class FreshRunFolder {
 public:
  FreshRunFolder(std::string dir, bool made) : dir_(std::move(dir)), made_(made) {}
  FreshRunFolder(const FreshRunFolder&) = delete;
  FreshRunFolder& operator=(const FreshRunFolder&) = delete;
  void keep() { dir_.clear(); }  // training has started: the folder is a run now
  ~FreshRunFolder() {
    if (dir_.empty() || std::uncaught_exceptions() == 0) return;
    const fs::path d = dir_;
    std::error_code ec;
    for (const char* f :
         {"config.yaml", "train.log", "metrics.jsonl", "grad_summary.jsonl", "report.html", RunFolderLock::kFileName})
      fs::remove(d / f, ec);
    fs::remove(d / "checkpoints", ec);  // fails, and keeps it, unless it is empty
    if (made_) fs::remove(d, ec);       // likewise
  }

 private:
  std::string dir_;
  bool made_;
};

// One all-reduce per step: the loss (averaged for logging) and whether any rank was asked to
// stop, so that every rank stops after the same step.
struct StepAgreement {
  float loss = 0;
  bool stop = false;
};
StepAgreement agree_on_step(Communicator& comm, float loss, bool stop) {
  if (comm.size() == 1) return {loss, stop};
  double v[2] = {static_cast<double>(loss), stop ? 1.0 : 0.0};
  comm.all_reduce(v, 2, ReduceOp::sum, "step loss and stop flag");
  return {static_cast<float>(v[0] / comm.size()), v[1] > 0};
}

// Communication figures summed over steps.
struct CommTotals {
  double total = 0, exposed = 0;
  int64_t steps = 0;
  bool timed = true;  // false once a step's figures were not measured (device runs)
  void add(const CommStats& c) {
    timed = timed && c.timed;
    total += c.total;
    exposed += c.exposed;
    ++steps;
  }
  double ms_per_step(double x) const { return steps > 0 ? 1000 * x / static_cast<double>(steps) : 0; }
  double hidden_share() const { return total > 0 ? (total - exposed) / total : 0; }
};

TrainResult train_impl(const Config& config_in, const TrainOptions& options, LogFile& log_file);

}  // namespace

ModelOptions model_options(const ModelConfig& m) {
  ModelOptions o;
  o.num_classes = m.num_classes;
  o.in_channels = m.in_channels;
  o.height = m.image_size[0];
  o.width = m.image_size[1];
  o.zero_init_residual = m.zero_init_residual;
  return o;
}

// Keys each rank may hold its own value of: where its data lives and how its host reads it, and
// the pretrained weights (rank 0 alone reads them and broadcasts what it loaded). Everything else
// must be rank 0's: a learning rate or a seed of its own trains a replica that drifts away (or
// shards that overlap), and a batch, a bucket size or a model of its own issues collectives of
// other sizes than the other ranks'.
constexpr const char* kPerRankKeys[] = {
    "data.root",   "data.val_root", "data.workers",    "data.prefetch",    "data.cache_mb",
    "run.threads", "run.out_dir",   "dist.rank_table", "model.pretrained", "model.pretrained_exclude"};

bool may_differ_between_ranks(const std::string& key) {
  return std::find(std::begin(kPerRankKeys), std::end(kPerRankKeys), key) != std::end(kPerRankKeys);
}

// Each rank reads its own configuration (its own copy of the file, its own --set): every rank
// compares its own with rank 0's, and its build too, and all stop, before any folder is made,
// when one differs. The error names the keys and the ranks.
void check_ranks_agree(const Config& cfg, Communicator& comm) {
  const std::string mine = cfg.to_yaml();
  const std::string theirs = comm.broadcast_string(mine, 0, "rank 0's configuration");
  std::string differences;
  if (theirs != mine) {
    const Config rank0 = load_config_from_string(theirs, {}, "rank 0's configuration");
    for (const std::string& d : config_differences(rank0, cfg))
      if (!may_differ_between_ranks(d.substr(0, d.find(':')))) differences += (differences.empty() ? "" : "; ") + d;
  }
  const std::string build = comm.broadcast_string(build_description(), 0, "rank 0's build");
  if (build != build_description())
    differences += fmt::format("{}build: {} -> {}", differences.empty() ? "" : "; ", build, build_description());
  const std::vector<double> differs = comm.all_gather(differences.empty() ? 0.0 : 1.0, "the configuration check");
  std::string all;
  for (int r = 1; r < comm.size(); ++r) {
    if (differs[static_cast<size_t>(r)] == 0) continue;
    const std::string d = comm.broadcast_string(differences, r, fmt::format("rank {}'s configuration", r));
    all += fmt::format("{}rank {}: {}", all.empty() ? "" : "; ", r, d);
  }
  RN_CHECK(all.empty()) << "the ranks do not all run the same configuration (rank 0's value -> the rank's): " << all
                        << ". Give every rank the same config file and --set options (only "
                        << fmt::format("{}", fmt::join(kPerRankKeys, ", ")) << " may differ) and the same resnet build";
}

void install_stop_signal_handlers() {
  // Cleared here, not when train() starts: a signal during the set-up (an MPI start-up can
  // take seconds) is a stop request the first step answers.
  clear_stop_request();
  // SIGHUP (the terminal or ssh session went away) stops like SIGTERM, with a checkpoint.
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, on_stop_signal);
  // A console that is gone (`| head`, a closed tee) must not end the run: writes to it fail
  // instead, and train.log keeps the record. A file-size limit (ulimit -f) becomes the
  // write's "File too large" error naming the file, not a silent death.
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGXFSZ, SIG_IGN);
}

void request_stop() {
  if (!g_stop.exchange(true)) g_stop_at_ns = monotonic_ns();  // a signal right after is the same request
}

TrainResult train(const Config& config, const TrainOptions& options) {
  LogFile log_file;  // the run's train.log, from when its folder is known
  try {
    return train_impl(config, options, log_file);
  } catch (const std::exception& e) {
    log_file.write_error(e.what());
    // One rank's error must end every rank, not leave them waiting in a collective.
    if (World* w = current_world(); w && w->size > 1) abort_job(std::string("training stopped: ") + e.what());
    throw;
  }
}

namespace {

TrainResult train_impl(const Config& config_in, const TrainOptions& options, LogFile& log_file) {
  Config cfg = config_in;
  const bool resuming = !options.resume_dir.empty();
  std::string run_dir;
  std::optional<RunFolderLock> run_lock;       // this process writes the run folder (rank 0)
  std::optional<FreshRunFolder> fresh_folder;  // removed again if the run fails before it starts
  bool moved_folder = false;                   // a resumed folder whose recorded out_dir is elsewhere
  if (resuming) {
    run_dir = options.resume_dir;
    const std::string path = run_dir + "/config.yaml";
    RN_CHECK(fs::is_directory(run_dir)) << "cannot resume from '" << run_dir
                                        << "': " << (fs::exists(run_dir) ? "it is not a folder" : "no such folder");
    RN_CHECK(fs::exists(path)) << "cannot resume from '" << run_dir
                               << "': it has no config.yaml (not a run folder that resnet train wrote)";
    cfg = load_config(path, {});
    // A run folder that was moved or copied resumes where it is now: its recorded out_dir
    // follows (config.yaml is rewritten once the run is under way).
    const std::string here = fs::absolute(run_dir).lexically_normal().string();
    // config.yaml and every checkpoint record the folder, as UTF-8: a folder moved to a path
    // that is not would train and then fail at the first checkpoint, and not resume again.
    if (const size_t at = invalid_utf8_at(here); at != std::string_view::npos)
      RN_FAIL() << "cannot resume from '" << run_dir << "': the folder's path is not UTF-8 text (byte " << at
                << "), which config.yaml and the checkpoints must record; rename the folder or the folders above it";
    std::error_code ec_recorded, ec_here;
    const fs::path recorded_dir = fs::weakly_canonical(cfg.run.out_dir, ec_recorded);
    moved_folder = ec_recorded || recorded_dir != fs::weakly_canonical(here, ec_here);
    if (moved_folder) {
      RN_LOG_INFO(
          "{}: its config.yaml says run.out_dir {} (the folder was moved, copied or renamed); run.out_dir "
          "is now {}",
          run_dir, cfg.run.out_dir, here);
      cfg.run.out_dir = here;
    }
    // Only settings that cannot change results may differ from the run's (the same keys an edit
    // of its config.yaml may change). The folder and the per-rank batch follow from the resume.
    for (const std::string& o : options.resume_overrides) {
      const std::string before = cfg.to_yaml();
      apply_config_override(cfg, o);  // first: a key that does not exist is named as such
      if (cfg.to_yaml() == before) continue;  // the run's own value: nothing changes
      std::string key = o.substr(0, o.find('='));
      key.erase(key.find_last_not_of(" \t") + 1);
      key.erase(0, key.find_first_not_of(" \t"));
      RN_CHECK(may_differ_on_resume(key) && key != "run.out_dir" && key != "data.batch_size")
          << "cannot change '" << key << "' when resuming " << run_dir
          << ": only settings that do not change results may (docs/training.md, \"Checkpoints and exact resume\"); "
             "start a new run "
             "from the checkpoint's weights with --set model.pretrained=CHECKPOINT to change it";
    }
    if (!options.resume_overrides.empty()) cfg.validate();
  }
  // Data-parallel: this process's rank (world size 1 without a launcher). Only rank 0
  // writes the run folder; the others read it (it must be on a file system they all see).
  World& world = init_world({cfg.dist.timeout_s, cfg.dist.rank_table});
  Communicator& comm = *world.comm;
  const bool writer = world.writer();
  if (resuming && writer) run_lock.emplace(run_dir);  // before anything in the folder changes
  set_activity("setting up", -1);
  // The data folders as absolute paths, so that the recorded config (config.yaml and every
  // checkpoint's) reads the same data from any working directory: resnet eval, a resume (whose
  // --set data.root may be relative as well).
  for (std::string* path : {&cfg.data.root, &cfg.data.val_root})
    if (!path->empty()) *path = fs::absolute(*path).lexically_normal().string();
  if (world.size > 1) check_ranks_agree(cfg, comm);
  // A resume's changes to config.yaml (--set overrides, a moved folder, the per-rank batch on
  // other ranks) are written once the run is under way: a resume that fails (a mistyped
  // data.root, a step limit already reached) leaves the file as it was.
  bool rewrite_config = false;
  if (resuming) {
    rewrite_config = writer && (!options.resume_overrides.empty() || moved_folder);
  } else {
    if (writer) {
      NewRunFolder folder = fresh_run_dir(cfg.run.out_dir);
      run_dir = folder.dir;
      run_lock.emplace(std::move(folder.lock));
      fresh_folder.emplace(run_dir, folder.made);
    }
    run_dir = comm.broadcast_string(run_dir, 0, "the run folder's name");
    // config.yaml records the folder the run is in (a taken out_dir gives <out_dir>-2), as an
    // absolute path like the data folders, so that a resume knows whether it was moved.
    cfg.run.out_dir = fs::absolute(run_dir).lexically_normal().string();
    if (writer) write_file_atomic(run_dir + "/config.yaml", cfg.to_yaml());
  }
  if (writer) {
    log_file.open(run_dir + "/train.log");
  } else {
    // Other ranks print warnings and errors only, marked with their rank, and their errors go
    // into train.log too: the run's record says why it ended whichever rank ended it.
    logger()->set_pattern(fmt::format("[%Y-%m-%d %H:%M:%S.%e] [%l] [rank {}] %v", world.rank));
    set_log_level("warn");
    try {
      log_file.open_for_errors(run_dir + "/train.log", fmt::format("[rank {}]", world.rank));
    } catch (const Error& e) {
      RN_LOG_WARN("{}: this rank's errors go to its console only", e.what());
    }
  }
  int threads = static_cast<int>(cfg.run.threads);
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const bool shared = threads == 0 && world.local_size > 1;
  if (shared) threads = std::max(1, cores / world.local_size);  // share the cores among the ranks on this host
  if (writer && threads > 0 && threads <= cores && world.local_size > 1 && threads * world.local_size > cores) {
    if (shared)
      RN_LOG_WARN(
          "{} ranks on this host's {} cores: one thread each, and still they take turns and slow every step "
          "down; start at most {} ranks per host",
          world.local_size, cores, cores);
    else
      RN_LOG_WARN(
          "run.threads {} on each of this host's {} ranks asks for {} threads on {} cores: they take turns and "
          "slow every step down (run.threads 0 shares the cores among the ranks)",
          threads, world.local_size, threads * world.local_size, cores);
  }
  set_host_threads(threads);

  RN_LOG_INFO("{} run in {}", resuming ? "resuming" : "starting", run_dir);
  RN_LOG_INFO("{}", software_description());
  if (world.size > 1) {
    std::string placement;
    const std::vector<std::string> hosts = comm.hosts();
    for (int r = 0; r < world.size; ++r)
      placement += fmt::format("{}{}:{}", r ? ", " : "", r,
                               world.table ? world.table->host_of(r).name : hosts[static_cast<size_t>(r)]);
    RN_LOG_INFO("data-parallel over {} ranks ({} communicator{}); rank:host {}", world.size, comm.name(),
                world.table ? ", rank table " + world.table->source : "", placement);
  }
  BackendOptions backend_options = backend_options_for(cfg.run);
  // The rank table's device, else the local rank, modulo the devices this process sees (a
  // launcher that gives each process one GPU through CUDA_VISIBLE_DEVICES shows it as 0).
  // NCCL uses the same.
  int device = world.device;
  if (!world.table && accelerator_count() > 0) device %= accelerator_count();
  backend_options.device = device;
  std::unique_ptr<Backend> backend;
  try {
    backend = make_backend_for(cfg.run.device, backend_options);
  } catch (const Error& e) {
    if (!world.table) throw;
    RN_FAIL() << e.what() << " (rank " << world.rank << "'s device " << device << " comes from the rank table "
              << world.table->source << ")";
  }
  if (world.size > 1) {  // every rank on the same kind of backend, or none trains (no mixed collectives)
    const std::vector<double> on_device = comm.all_gather(backend->device() == Device::cpu ? 0.0 : 1.0, "backends");
    if (std::any_of(on_device.begin(), on_device.end(), [&](double v) { return v != on_device[0]; })) {
      std::string which;
      for (size_t r = 0; r < on_device.size(); ++r) which += fmt::format(" {}:{}", r, on_device[r] > 0 ? "gpu" : "cpu");
      RN_FAIL() << "the ranks did not all get the same backend (rank:backend" << which << "); with run.device=auto "
                << "a rank without a usable GPU falls back to the CPU. Give every rank a GPU, or set run.device";
    }
  }
  const PrecisionPolicy policy = make_precision_policy(cfg.precision, *backend);
  // The backend's description names its implementation mode (run.implementation_mode).
  RN_LOG_INFO("device {}; {}; {}", backend->describe(), counted(host_threads(), "host thread"), policy.describe());
  const std::string host_pages = host_memory_description();  // logged now, recorded in the start record below
  RN_LOG_INFO("host memory: {}", host_pages);
  const int sink_size = static_cast<int>(cfg.run.sink_size);
  if (sink_size > 0) {
    RN_CHECK(backend->device() != Device::cpu)
        << "run.sink_size=" << sink_size << " needs the CUDA backend (device " << backend->name() << ")";
    // With several ranks the NCCL all-reduces are captured in the graph too (the step checks
    // that the communicator allows it; docs/distributed.md).
    RN_LOG_INFO("sink mode: the step runs as a CUDA graph{}; the host synchronises every {} steps",
                world.size > 1 ? " with its gradient all-reduces" : "", sink_size);
  }
  if (cfg.run.deterministic)
    RN_LOG_INFO(
        "deterministic mode: fixed data order and augmentation, kernels with a fixed summation order "
        "(the same machine and thread count give bit-identical results)");

  Model model(build_model(cfg.model.name, model_options(cfg.model)), cfg.optimizer.decay_bn_and_bias);
  model.init(static_cast<uint64_t>(cfg.run.seed));
  ParamTable table = model.params();
  apply_optimizer_param_policy(table, cfg.optimizer);
  Optimizer optimizer(cfg.optimizer, table);
  LossScaler scaler(policy.loss_scale);
  RN_LOG_INFO("model {}: {} parameters", cfg.model.name, model.param_count());

  CheckpointManager checkpoints(run_dir, cfg.run.checkpoint.keep_last, cfg.run.checkpoint.keep_best);
  TrainState st;
  Rng rng(static_cast<uint64_t>(cfg.run.seed));
  bool from_checkpoint = false;
  if (resuming) {
    set_activity("loading the checkpoint", -1);
    // Rank 0 chooses, and every rank takes its step, position and random state from that file:
    // a rank that looked for itself could see another newest file (a copy of the folder, a
    // file system's stale cache) and train on the wrong samples with rank 0's weights.
    std::optional<LoadedCheckpoint> loaded;
    if (writer) loaded = checkpoints.latest_loadable(model, &optimizer, /*set_aside_damaged=*/true);
    if (world.size > 1) {
      const std::string chosen = comm.broadcast_string(loaded ? loaded->path : "", 0, "the checkpoint to resume from");
      if (!writer && !chosen.empty()) {
        try {
          loaded = LoadedCheckpoint{chosen, load_checkpoint(chosen, model, &optimizer)};
        } catch (const Error& e) {
          RN_FAIL() << "rank " << world.rank << " cannot read " << chosen
                    << ", the checkpoint rank 0 resumes from (every rank reads it: the run folder must be on a file "
                       "system they all see): "
                    << e.what();
        }
      }
    }
    if (world.size > 1 && loaded) {
      // The same name may not be the same file on every rank (a stale cache of the shared file
      // system; a step's checkpoint is rewritten under its name when a stop at an epoch's last
      // step is followed by the epoch's own): ranks at different positions would issue
      // different collectives and corrupt each other. Compared once, on every rank alike.
      const TrainState& mine = loaded->state;
      const std::vector<double> steps = comm.all_gather(static_cast<double>(mine.step), "the resumed step");
      const std::vector<double> epochs = comm.all_gather(static_cast<double>(mine.epoch), "the resumed epoch");
      const std::vector<double> batches =
          comm.all_gather(static_cast<double>(mine.batch_in_epoch), "the resumed batch of the epoch");
      for (size_t r = 1; r < steps.size(); ++r)
        RN_CHECK(steps[r] == steps[0] && epochs[r] == epochs[0] && batches[r] == batches[0])
            << "rank " << r << " read " << loaded->path << " as step " << steps[r] << " (epoch " << epochs[r] + 1
            << ", batch " << batches[r] << "), and rank 0 as step " << steps[0] << " (epoch " << epochs[0] + 1
            << ", batch " << batches[0]
            << "): the file differs between the ranks' views of the run folder (a stale cache of a shared file "
               "system?); resume when every rank sees the same file";
    }
    if (loaded) {
      from_checkpoint = true;
      st = loaded->state;
      if (!st.config_yaml.empty()) check_resume_config(loaded->path, st.config_yaml, cfg, run_dir);
      scaler.set_state(st.scaler);
      rng.set_state(st.rng);
      RN_LOG_INFO("resumed from {}: epoch {}, step {}, batch {} of the epoch", loaded->path, st.epoch + 1, st.step,
                  st.batch_in_epoch);
      RN_CHECK(options.max_steps <= 0 || st.step < options.max_steps)
          << "the step limit (--max-steps) is " << options.max_steps << " but " << run_dir << " is at step " << st.step
          << " already: nothing to train; give a larger limit, or none to train to the end";
      // Exact resume holds for the same build: other code may round differently.
      if (!st.written_by.empty() && st.written_by != build_description())
        RN_LOG_WARN(
            "the checkpoint was written by {}, and this is {}: the run goes on, but it may not match an "
            "uninterrupted run bit for bit",
            st.written_by, build_description());
      // The global batch is what a run is made of (learning rate, steps per epoch, the samples
      // of each step): on another number of ranks, the per-rank batch changes to keep it.
      const int64_t saved_global = st.global_batch > 0 ? st.global_batch : cfg.data.batch_size;
      if (saved_global != cfg.data.batch_size * world.size) {
        RN_CHECK(saved_global % world.size == 0)
            << "cannot resume " << run_dir << " on " << world.size << " ranks: its global batch of " << saved_global
            << " is not a multiple of " << world.size << "; use a number of ranks that divides it";
        RN_LOG_INFO("resuming on {} rank(s): batch per rank {} -> {} keeps the global batch of {} (and with it the "
                    "learning rate, the steps per epoch and the samples of every step)",
                    world.size, cfg.data.batch_size, saved_global / world.size, saved_global);
        cfg.data.batch_size = saved_global / world.size;
        rewrite_config = writer;
      }
    } else {
      // A run whose checkpoints all failed is not one to start again in place: the new run
      // would rotate out what is left of the old one.
      std::string set_aside;
      for (const std::string& p : checkpoints.set_aside()) set_aside += (set_aside.empty() ? "" : ", ") + p;
      RN_CHECK(set_aside.empty()) << "cannot resume " << run_dir
                                  << ": none of its checkpoints loads (set aside: " << set_aside
                                  << "). Starting from the beginning would write over the run: start a new run "
                                     "without --resume, or rename a set-aside file back if you know it is usable";
      RN_LOG_WARN("no checkpoint in {}: starting from the beginning", run_dir);
    }
  }
  if (!from_checkpoint && !cfg.model.pretrained.empty() && world.rank == 0) {
    // Rank 0 reads the file; the broadcast below gives its weights to the other ranks, so the
    // file need only be on rank 0's host.
    set_activity("loading the pretrained weights", -1);
    const PretrainedLoad p = load_pretrained(cfg.model.pretrained, model, cfg.model.pretrained_exclude);
    RN_LOG_INFO("model.pretrained {}: {}", cfg.model.pretrained, p.summary());
    warn_non_finite(model, "model.pretrained " + cfg.model.pretrained);
  }
  if (world.size > 1) {
    // Every rank starts from rank 0's weights, running statistics and momentum.
    set_activity("receiving the initial weights", st.step);
    const ParamTable& pt = model.params();
    comm.broadcast(model.param_data(), pt.total * 4, 0, "initial weights");
    int64_t state_n = 0;
    for (const StateView& v : model.state_views()) state_n = std::max(state_n, v.offset + v.numel);
    if (state_n > 0) comm.broadcast(model.state_data(), state_n * 4, 0, "BN running statistics");
    std::vector<float> momentum = optimizer.state();
    if (!momentum.empty()) {
      comm.broadcast(momentum.data(), static_cast<int64_t>(momentum.size()) * 4, 0, "optimizer state");
      optimizer.set_state(momentum);
    }
  }

  // Data.
  const Layout layout = backend->preferred_layout();
  std::shared_ptr<TraceRecorder> trace = cfg.run.trace && writer ? std::make_shared<TraceRecorder>() : nullptr;
  if (trace) trace->name_thread("trainer");
  // On a GPU, batches come as u8 in pinned memory and are cropped, flipped and normalised
  // there (train/batch_feeder.h).
  const DType loader_dtype = loader_dtype_for(policy.activation_dtype, *backend);
  Loaders loaders = make_loaders(cfg, loader_dtype, layout, trace, ShardSpec{world.rank, world.size, true},
                                 options.wrap_train_dataset, &backend->pinned_memory(), options.wrap_val_dataset);
  if (cfg.data.classes != loaders.classes) {
    // The training folder's class names, label = position, into config.yaml and every
    // checkpoint: validation folders, `resnet eval` and a resume then label by name.
    cfg.data.classes = loaders.classes;
    if (writer && resuming)
      rewrite_config = true;
    else if (writer)
      write_file_atomic(run_dir + "/config.yaml", cfg.to_yaml());
  }
  BatchFeeder feeder(loaders.train->options().mean, loaders.train->options().std);
  DataLoader& train_loader = *loaders.train;
  DataLoader& val_loader = *loaders.val;
  const int64_t steps_per_epoch = train_loader.batches_per_epoch();
  RN_CHECK(steps_per_epoch > 0) << "the training set (" << train_loader.dataset().size()
                                << " samples) has no full batch of " << cfg.data.batch_size;
  // A resume lays the schedule (warmup, decay, milestones) and its place in the epoch out on
  // the steps of an epoch: data.root may move, but not to a training set of another size.
  const int64_t train_samples = train_loader.dataset().size();
  if (from_checkpoint && st.steps_per_epoch > 0) {
    RN_CHECK(st.steps_per_epoch == steps_per_epoch)
        << "cannot resume " << run_dir << ": it was trained on " << st.train_samples << " samples, "
        << counted(st.steps_per_epoch, "step") << " an epoch, and data.root '" << cfg.data.root << "' now gives "
        << train_samples << ", " << counted(steps_per_epoch, "step")
        << " an epoch; the learning-rate schedule and the place in the epoch are laid out on them. Point data.root "
           "at the same data, or start a new run from these weights with --set model.pretrained=CHECKPOINT";
    if (st.train_samples != train_samples)
      RN_LOG_WARN(
          "the run was trained on {} samples and data.root '{}' now gives {}: the steps of an epoch are the "
          "same, but the samples of each step are not those an uninterrupted run would see",
          st.train_samples, cfg.data.root, train_samples);
  }
  st.train_samples = train_samples;
  st.steps_per_epoch = steps_per_epoch;
  // Every training step runs a whole batch: the plans (and the sink-mode graph) are built for
  // one batch size. A last partial batch is refused here, not when the first epoch ends.
  RN_CHECK(cfg.data.drop_last || train_loader.samples_per_epoch() % cfg.data.batch_size == 0)
      << "data.drop_last=false: this rank's " << train_loader.samples_per_epoch()
      << " training samples an epoch leave a last batch of " << train_loader.samples_per_epoch() % cfg.data.batch_size
      << " of " << cfg.data.batch_size
      << ", and partial training batches are not supported (every step runs a whole batch); set data.drop_last=true "
         "(the shuffle puts other samples in the dropped batch each epoch) or a batch size that divides the samples";

  // Plans: made once the starting epoch is known (its memory level may come from
  // memory.schedule), and made again at an epoch boundary where the level changes.
  PlanOptions po;
  po.batch = cfg.data.batch_size;
  po.dtype = policy.conv_dtype;
  po.activation_dtype = policy.activation_dtype;
  po.layout = layout;
  po.memory = cfg.memory.level;
  po.label_smoothing = static_cast<float>(cfg.loss.label_smoothing);

  // Gradient fusion: buckets of the flat gradient buffer, all-reduced during backward; on a
  // GPU by NCCL over the device gradients. This places a device model (after the broadcasts
  // above, which went to the host buffers that the placement copies).
  GradientSync grad_sync = make_gradient_sync(model, *backend, comm, device, cfg.dist, make_nccl_communicator);
  GradientReducer* const reducer = grad_sync.reducer.get();
  const std::unique_ptr<BatchStatsReducer> bn_sync = make_bn_stats_reducer(grad_sync, comm);
  if (world.size > 1) {
    if (cfg.dist.sync_bn) po.bn_sync = bn_sync.get();
    RN_LOG_INFO("batch norm: statistics {}", cfg.dist.sync_bn ? fmt::format("over the global batch ({} ranks x {}, "
                                                                            "synchronised)", world.size, po.batch)
                                                              : fmt::format("per rank (batch {}); running statistics "
                                                                            "averaged over the ranks before each "
                                                                            "evaluation and checkpoint",
                                                                            po.batch));
  }
  std::unique_ptr<Plan> plan;
  std::unique_ptr<TrainStep> step;
  std::unique_ptr<Evaluator> evaluator;
  bool memory_logged = false;  // the measured peak is reported after the first epoch at each level
  auto plan_at = [&](MemoryLevel level, int64_t epoch) {
    const size_t old_arena = plan ? plan->memory().arena_bytes : 0;
    const MemoryLevel old_level = po.memory;
    if (step) step->sync_host_state();  // device optimizer and scaler state back to the host objects
    step.reset();
    evaluator.reset();
    if (plan) feeder.forget(*plan);
    plan.reset();  // the old arena goes first: the new plan may need that memory
    po.memory = level;
    try {
      plan = std::make_unique<Plan>(model, backend.get(), po);
    } catch (const Unsupported& e) {
      if (!po.bn_sync) throw;
      RN_FAIL() << "dist.sync_bn=true on device " << backend->name() << ": " << e.what()
                << " (use dist.sync_bn=false: statistics per rank)";
    }
    evaluator = std::make_unique<Evaluator>(model, *backend, po);
    step = std::make_unique<TrainStep>(*plan, optimizer, scaler, policy, sink_size);
    step->set_gradient_reducer(reducer);
    const PlannedPeak p = plan->planned_peak(1);
    // The peaks measured for this level's memory line start here: the last level's (its
    // evaluation's, at O0 the largest) would otherwise stand for this one's.
    if (old_arena > 0) {
      reset_peak_resident();
      backend->memory().reset_peak();
      RN_LOG_INFO("epoch {}: memory level {} -> {}, re-planned: arena {:.1f} MiB -> {:.1f} MiB", epoch + 1,
                  memory_level_name(old_level), memory_level_name(level), old_arena / 1048576.0, p.arena / 1048576.0);
    }
    RN_LOG_INFO(
        "training plan: batch {}, memory level {}, arena {:.1f} MiB; planned peak {:.1f} MiB "
        "(of which parameters, gradients, optimizer state {:.1f} MiB, workspace {:.1f} MiB)",
        po.batch, memory_level_name(level), p.arena / 1048576.0, p.total() / 1048576.0,
        (p.parameters + p.parameter_grads + p.optimizer_state + p.half_weights) / 1048576.0, p.workspace / 1048576.0);
    // The arena is allocated lazily by the system: a plan that cannot fit would only fail
    // later, killed mid-epoch. Say so now, with what to do about it.
    if (const size_t avail = available_memory(); avail > 0 && p.total() > avail)
      RN_LOG_WARN(
          "the planned peak {:.1f} MiB at memory level {} exceeds the {:.1f} MiB of memory available: "
          "lower data.batch_size or use memory.level=O2 (resnet bench --find-max-batch --memory-cap shows "
          "what fits)",
          p.total() / 1048576.0, memory_level_name(level), avail / 1048576.0);
    memory_logged = false;
  };

  const int64_t global_batch = cfg.data.batch_size * world.size;
  const LrSchedule schedule(cfg.schedule, scaled_peak_lr(cfg.optimizer, global_batch), steps_per_epoch);
  // lr_scale_batch 0 means "not scaled", not a division by zero.
  RN_LOG_INFO(
      "schedule {}: peak lr {:.6g} ({}), {} x {}, warmup {}", enum_name(cfg.schedule.name), schedule.peak_lr(),
      cfg.optimizer.lr_scale_batch > 0
          ? fmt::format("base {:.6g} x {} / {}", cfg.optimizer.base_lr, global_batch, cfg.optimizer.lr_scale_batch)
          : fmt::format("base {:.6g}, not scaled with the batch", cfg.optimizer.base_lr),
      counted(cfg.schedule.epochs, "epoch"), counted(steps_per_epoch, "step"),
      counted(schedule.warmup_steps(), "step"));
  // warmup_epochs past the run is a config error; warmup_steps is only known to be now. The
  // warmup's last rate comes one step before its end, so a warmup as long as the run never
  // reaches the peak either.
  if (const int64_t run_steps = cfg.schedule.epochs * steps_per_epoch; schedule.warmup_steps() >= run_steps)
    RN_LOG_WARN("{} is {} the run ({} steps): the learning rate never reaches its peak {:.6g} (and never decays)",
                cfg.schedule.warmup_steps > 0
                    ? fmt::format("schedule.warmup_steps={}", cfg.schedule.warmup_steps)
                    : fmt::format("schedule.warmup_epochs={} ({})", cfg.schedule.warmup_epochs,
                                  counted(schedule.warmup_steps(), "step")),
                schedule.warmup_steps() > run_steps ? "longer than" : "as long as", run_steps, schedule.peak_lr());

  if (cfg.schedule.warmup_steps == 0 && cfg.schedule.warmup_epochs > 0 && schedule.warmup_steps() == 0)
    RN_LOG_WARN("schedule.warmup_epochs={} is less than half of a step ({} per epoch): no warmup",
                cfg.schedule.warmup_epochs, counted(steps_per_epoch, "step"));

  st.config_yaml = cfg.to_yaml();
  st.global_batch = global_batch;
  plan_at(memory_level_at_epoch(cfg.memory, st.epoch), st.epoch);
  auto set_sink_rates = [&] {
    if (sink_size > 0) step->set_lr_source([&schedule](int64_t s) { return schedule.lr(s); }, st.step);
  };
  set_sink_rates();

  MetricsLog metrics(run_dir, writer);
  // What made this stretch of the run (a resumed run adds one per resume): report.html lists them.
  // Every record's "epoch" counts from 1: the epoch it belongs to (the one being trained, or
  // the one just completed); "epochs_from" tells a reader of older files, which counted train
  // records from 0, which convention a file uses.
  // The epoch about to be trained; a resume of a finished run trains none, and is at its last.
  metrics.append(MetricsRecord("start", std::min(st.epoch + 1, std::max<int64_t>(cfg.schedule.epochs, 1)), st.step)
                     .add("epochs_from", int64_t{1})
                     .add("software", build_description())
                     .add("libraries", describe_libraries(library_versions()))
                     .add("host_memory", host_pages)
                     .add("resumed", from_checkpoint));
  ProgressPrinter progress(writer ? ProgressPrinter::Mode::automatic : ProgressPrinter::Mode::lines);
  // Gradient monitor, device monitor, throughput variance (docs/troubleshooting.md); only
  // the writer rank writes their files and records.
  TrainDiagnostics diag(cfg, model, backend->device(), run_dir, writer ? &metrics : nullptr, backend->pci_bus_id(),
                        st.epoch + 1, st.step);
  TrainResult result;
  result.run_dir = run_dir;
  const auto t_start = std::chrono::steady_clock::now();
  const int64_t first_step = st.step;  // a resume's earlier sessions trained the steps before it

  // Per-rank batch norm (dist.sync_bn off) leaves each rank with its own running statistics.
  // Before an evaluation and a checkpoint they are averaged over the ranks (a collective: all
  // ranks come here at the same step), so every rank evaluates the same model and a resumed
  // run starts from what every rank had, as an uninterrupted one goes on.
  int64_t bn_state_averaged_at = -1;
  auto average_bn_state = [&] {
    if (world.size == 1 || cfg.dist.sync_bn || bn_state_averaged_at == st.step) return;
    int64_t n = 0;
    for (const StateView& v : model.state_views()) n = std::max(n, v.offset + v.numel);
    if (n == 0) return;
    set_activity("averaging BN running statistics", st.step);
    step->sync_host_state();  // on a device: the model's buffers (statistics included) to the host
    comm.all_reduce(model.state_data(), n, ReduceOp::average, "BN running statistics");
    model.to_device();  // and back (no-op on a host backend)
    bn_state_averaged_at = st.step;
  };

  auto save = [&](bool epoch_end, std::optional<double> top1) {
    average_bn_state();
    step->sync_host_state();  // a device run's weights, momentum and scaler into the host objects
    st.rng = rng.state();
    st.scaler = scaler.state();
    if (!writer) return;
    // A diverged model's checkpoint would rotate out the good ones it is no use against.
    if (const std::string bad = first_non_finite_tensor(model); !bad.empty()) {
      RN_LOG_WARN(
          "no checkpoint at step {}: '{}' holds inf or NaN values (training is diverging); the earlier "
          "checkpoints are kept",
          st.step, bad);
      return;
    }
    set_activity("writing a checkpoint");
    const std::string path = checkpoints.save(model, optimizer, st, epoch_end, top1);
    RN_LOG_INFO("checkpoint {}", path);
  };

  const int64_t epochs = cfg.schedule.epochs;
  bool cache_full_said = false;
  const auto periodic_save_due = [&](int64_t step) {
    return cfg.run.checkpoint.every_steps > 0 && step % cfg.run.checkpoint.every_steps == 0;
  };
  bool stop = false;
  if (fresh_folder) fresh_folder->keep();
  if (rewrite_config) write_file_atomic(run_dir + "/config.yaml", cfg.to_yaml());
  while (st.epoch < epochs && !stop) {
    if (const MemoryLevel level = memory_level_at_epoch(cfg.memory, st.epoch); level != po.memory) {
      plan_at(level, st.epoch);
      set_sink_rates();
    }
    train_loader.start_epoch(st.epoch, st.batch_in_epoch);
    diag.begin_epoch(train_loader.epoch_wait_seconds(), st.epoch + 1);
    // Interval statistics for the log lines.
    double interval_loss = 0;  // the sum of the interval's known step losses
    int64_t interval_steps = 0, interval_images = 0, interval_losses = 0;
    double interval_wait0 = train_loader.epoch_wait_seconds();
    auto interval_t0 = std::chrono::steady_clock::now();
    // The input-pipeline analyser's view of the epoch: copy and step time on this thread.
    PipelineSpan pipeline;
    CommTotals comm_epoch, comm_interval;
    const auto epoch_t0 = std::chrono::steady_clock::now();
    float last_loss = 0.0f;
    int64_t steps_here = 0;  // of this epoch, in this process (0: a resume at its last step)
    for (;;) {
      set_activity("waiting for a batch", st.step);
      const Batch* b = train_loader.next();
      if (!b) break;
      RN_CHECK(b->size == po.batch) << "partial training batch of " << b->size << " (data.drop_last=false)";
      // The gradient monitor reads the host copies of weights, gradients and the loss scale:
      // on a device they are brought back around a monitored step (outside its timing).
      const bool monitor_sync = step->on_device() && diag.grad_monitor_due(st.step + 1);
      if (monitor_sync) step->sync_host_state();
      const double copy_us = trace_now_us();
      feeder.feed(*plan, *b);
      const double step_us = trace_now_us();
      const double lr = schedule.lr(st.step);
      diag.before_step(st.step + 1);
      const float scale_used = scaler.scale();
      const int64_t skipped_before = scaler.skipped_steps();
      bool applied = step->run(lr);
      const double end_us = trace_now_us();
      if (monitor_sync) {
        step->sync_host_state();
        applied = scaler.skipped_steps() == skipped_before;  // the device's verdict
      }
      pipeline.copy += 1e-6 * (step_us - copy_us);
      pipeline.compute += 1e-6 * (end_us - step_us);
      if (trace) {
        trace->complete("copy", "step", copy_us, step_us - copy_us);
        trace->complete("step " + std::to_string(st.step + 1), "step", step_us, end_us - step_us);
      }
      ++st.step;
      ++st.batch_in_epoch;
      ++steps_here;
      const bool at_limit = options.max_steps > 0 && st.step >= options.max_steps;
      set_activity("agreeing on the step's loss", st.step);
      // Sink mode reads the loss (a synchronisation) only every sink_size steps. Eager device
      // steps read it every step, data-parallel or not; the all-reduce of the loss below is a
      // host collective and adds no device synchronisation. Before the read, a data-parallel
      // device step waits for its gradient all-reduces under dist.timeout_s (that wait ends
      // before the read's would: the update queued behind them is still running).
      const auto sync_t0 = std::chrono::steady_clock::now();
      // The step losses known now: this step's (eager), or in sink mode, at a sync point or a
      // log line, those of every step since the last read (the device records them).
      // A log line every log_interval_steps, and at an epoch's last step and a step limit, so
      // that every step's loss is in one train record (the interval restarts with each epoch).
      // A stop request is one too (below, once the ranks have agreed on it).
      bool log_point = st.step % cfg.run.log_interval_steps == 0 || st.batch_in_epoch == steps_per_epoch || at_limit;
      std::vector<float> step_losses;
      bool losses_read = true;  // sink mode: whether this step read the device's losses
      auto take_device_losses = [&] {
        step_losses = step->take_losses();
        double sum = 0;
        for (float l : step_losses) sum += l;
        if (!step_losses.empty()) last_loss = static_cast<float>(sum / static_cast<double>(step_losses.size()));
      };
      if (sink_size == 0) {
        step->wait_for_gradients();
        last_loss = plan->loss();
        step_losses.push_back(last_loss);
      } else if (st.step % sink_size == 0 || log_point) {
        take_device_losses();
      } else {
        losses_read = false;
      }
      // On a device run() only queued the step: its time is the wait for it too (eager: every
      // step's loss read; sink mode: the read at a sync point covers the steps queued before it).
      if (step->on_device()) pipeline.compute += 1e-6 * (trace_now_us() - end_us);
      // The step's communication: known after the wait above on a device (CUDA events),
      // after run() on the host.
      if (reducer) {
        const CommStats& c = step->last_comm();
        comm_epoch.add(c);
        comm_interval.add(c);
        if (trace && c.timed) {
          // The buckets' all-reduces on a track of their own, beside the step they overlap
          // (host runs: a device's timings are on its own clock and are not drawn).
          const double to_trace_us =
              trace_now_us() -
              1e6 * std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
          for (size_t k = 0; k < c.timings.size(); ++k)
            trace->complete_on_track("gradient all-reduce", fmt::format("bucket {}/{}", k + 1, c.timings.size()),
                                     "comm", 1e6 * c.timings[k].start + to_trace_us,
                                     1e6 * (c.timings[k].end - c.timings[k].start),
                                     {{"bytes", static_cast<double>(reducer->buckets()[k].bytes())}});
        }
      }
      StepAgreement agreed = agree_on_step(comm, last_loss, g_stop);
      if (agreed.stop && !log_point) {
        // The steps since the last log line get their train record before the run stops: in
        // sink mode their losses are read now (every rank knows of the stop, so every rank
        // reads, and agrees on the mean again).
        log_point = true;
        if (!losses_read) {
          take_device_losses();
          losses_read = true;
          agreed.loss = agree_on_step(comm, last_loss, true).loss;
        }
      }
      const float loss = agreed.loss;
      if (!std::isfinite(loss)) step->sync_scaler_state();  // the device's skip counters decide below
      // On a device the wait above includes the exposed all-reduce time, which comm_seconds
      // already reports: counted once, as communication.
      double host_sync_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - sync_t0).count();
      if (reducer && step->on_device() && step->last_comm().timed)
        host_sync_s = std::max(0.0, host_sync_s - step->last_comm().exposed);
      diag.after_step({.epoch = st.epoch + 1,
                       .step = st.step,
                       .images = b->size,
                       .wait_total = train_loader.epoch_wait_seconds(),
                       .loss_scale = scale_used,
                       .applied = applied,
                       .comm_seconds = reducer ? step->last_comm().exposed : 0.0,  // 0 where untimed
                       .host_sync_seconds = host_sync_s,
                       .sync_point = sink_size == 0 || st.step % sink_size == 0});
      // The agreed (rank-averaged) mean of the losses read now, once per step it covers.
      interval_loss += static_cast<double>(loss) * static_cast<double>(step_losses.size());
      interval_losses += static_cast<int64_t>(step_losses.size());
      ++interval_steps;
      interval_images += b->size * world.size;  // every rank takes a batch of this size
      RN_CHECK(std::isfinite(loss) || scaler.consecutive_skips() > 0)
          << "loss is " << loss << " at step " << st.step << "; training diverged (lower optimizer.base_lr?)";
      const auto now = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double>(now - interval_t0).count();
      ProgressFields pf;
      pf.epoch = st.epoch + 1;  // 1-based for display
      pf.epochs = epochs;
      pf.step_in_epoch = st.batch_in_epoch;
      pf.steps_per_epoch = steps_per_epoch;
      pf.step = st.step;
      pf.total_steps = epochs * steps_per_epoch;
      pf.loss = interval_losses > 0 ? interval_loss / static_cast<double>(interval_losses) : static_cast<double>(loss);
      pf.lr = lr;
      // An eager device step has just been waited for (its loss read): its counters cost one
      // small copy more. Sink mode reads them at log lines (and non-finite losses) only.
      if (step->on_device() && (log_point || sink_size == 0)) step->sync_scaler_state();
      // Skips in a row past the limit: the weights no longer change and the scale cannot help,
      // so more steps would only spend time (and write checkpoints of a diverged model). A
      // device's counters are current in eager mode and read at log lines and non-finite
      // losses in sink mode; the host's are current.
      if (scaler.skipping_without_end()) {
        diag.finish(st.epoch, st.step);
        if (writer) write_report(run_dir);
        RN_FAIL() << scaler.consecutive_skips() << " steps in a row, up to step " << st.step
                  << ", were skipped for inf/NaN gradients (" << scaler.skip_reason()
                  << "): training diverged; lower optimizer.base_lr or lengthen schedule.warmup_epochs "
                     "(precision.loss_scale.max_skips_in_a_row="
                  << cfg.precision.loss_scale.max_skips_in_a_row << " sets when this stops a run)"
                  << (writer ? "; report: " + run_dir + "/report.html" : std::string());
      }
      pf.loss_scale = scaler.scale();
      pf.images_per_sec = dt > 0 ? static_cast<double>(interval_images) / dt : 0;
      pf.data_wait_share = dt > 0 ? (train_loader.epoch_wait_seconds() - interval_wait0) / dt : 0;
      progress.update(pf);
      if (log_point) {
        progress.log_line(pf);
        TrainMetrics m;
        m.epoch = st.epoch + 1;  // the epoch being trained, from 1 (as every record)
        m.step = st.step;
        m.loss = pf.loss;
        m.lr = lr;
        m.loss_scale = pf.loss_scale;
        m.images_per_sec = pf.images_per_sec;
        m.data_wait_share = pf.data_wait_share;
        m.skipped_steps = scaler.skipped_steps();
        if (reducer && comm_interval.timed) {
          m.extra["comm_ms"] = comm_interval.ms_per_step(comm_interval.total);
          m.extra["comm_exposed_ms"] = comm_interval.ms_per_step(comm_interval.exposed);
          m.extra["comm_hidden_share"] = comm_interval.hidden_share();
        }
        comm_interval = {};
        metrics.log_train(m);
        interval_loss = 0;
        interval_steps = interval_images = interval_losses = 0;
        interval_wait0 = train_loader.epoch_wait_seconds();
        interval_t0 = std::chrono::steady_clock::now();
      }
      if (agreed.stop || at_limit) {
        if (agreed.stop) clear_stop_request();  // answered: a later train() in this process runs afresh
        RN_LOG_INFO("{} at step {}: saving a checkpoint", agreed.stop ? "stop requested" : "step limit reached",
                    st.step);
        save(false, std::nullopt);
        stop = true;
        result.interrupted = agreed.stop;
        break;
      }
      // A periodic checkpoint due at the epoch's last step is the epoch-end one (below), written
      // after the evaluation with its top-1, so that it may become best.safetensors; the same
      // step is not written twice.
      if (periodic_save_due(st.step) && st.batch_in_epoch != steps_per_epoch) {
        const auto t0 = std::chrono::steady_clock::now();
        save(false, std::nullopt);
        diag.between_steps(t0);
      }
    }
    // The input-pipeline and communication figures of the epoch's steps in this process, a step
    // limit or a stop at its last step included: not where a resume came at that step (the
    // session before logged them), nor for an epoch a stop cut short.
    if (steps_here > 0 && (!stop || st.batch_in_epoch == steps_per_epoch)) {
      pipeline.loader = train_loader.epoch_times();
      pipeline.workers = train_loader.workers();
      // On a device the step's host threads are few and mostly waiting: only the workers count.
      pipeline.cores = static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, world.local_size);
      pipeline.step_threads = step->on_device() ? 1 : host_threads();
      if (const DecodedCache* cache = train_loader.cache()) {
        pipeline.cache = cache->refused() > 0 ? PipelineSpan::Cache::full : PipelineSpan::Cache::room;
        // Said once: a full cache keeps the images it has, and the others are decoded every epoch.
        if (cache->refused() > 0 && !cache_full_said) {
          cache_full_said = true;
          const double per_image =
              cache->entries() > 0 ? static_cast<double>(cache->bytes_used()) / static_cast<double>(cache->entries())
                                   : 0.0;
          RN_LOG_INFO(
              "the image cache is full: {} of {} images in {:.0f} MiB (data.cache_mb={}); the others are read and "
              "decoded every epoch; about {:.0f} MiB would hold them all",
              cache->entries(), cache->size(), static_cast<double>(cache->bytes_used()) / 1048576.0, cfg.data.cache_mb,
              per_image * static_cast<double>(cache->size()) / 1048576.0);
        }
      }
      pipeline.wait = train_loader.epoch_wait_seconds();
      pipeline.wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_t0).count();
      const PipelineVerdict verdict = analyse_pipeline(pipeline);
      RN_LOG_INFO("epoch {} {}", st.epoch + 1, format_pipeline(pipeline, verdict));
      if (reducer && !comm_epoch.timed) {
        RN_LOG_INFO(
            "epoch {} communication: {}, {:.2f} MiB per step, all-reduced by {} during backward; times not "
            "measured ({})",
            st.epoch + 1, counted(static_cast<int64_t>(reducer->buckets().size()), "bucket"),
            static_cast<double>(model.params().total) * 4 / 1048576.0, grad_sync.comm->name(),
            sink_size > 0 ? "sink mode: the all-reduces run inside the replayed step graph"
                          : "the communicator did not time every bucket of every step on the device");
        metrics.append(MetricsRecord("comm", st.epoch + 1, st.step)
                           .add("ranks", static_cast<int64_t>(world.size))
                           .add("buckets", static_cast<int64_t>(reducer->buckets().size()))
                           .add("bytes_per_step", static_cast<int64_t>(model.params().total * 4))
                           .add("timed", false));
      } else if (reducer) {
        RN_LOG_INFO(
            "epoch {} communication: {}, {:.2f} MiB per step, {:.2f} ms/step in all-reduces (waiting for other ranks "
            "included), {:.0f}% of it "
            "hidden behind backward ({:.2f} ms/step exposed)",
            st.epoch + 1, counted(static_cast<int64_t>(reducer->buckets().size()), "bucket"),
            static_cast<double>(model.params().total) * 4 / 1048576.0, comm_epoch.ms_per_step(comm_epoch.total),
            100 * comm_epoch.hidden_share(), comm_epoch.ms_per_step(comm_epoch.exposed));
        metrics.append(MetricsRecord("comm", st.epoch + 1, st.step)
                           .add("ranks", static_cast<int64_t>(world.size))
                           .add("buckets", static_cast<int64_t>(reducer->buckets().size()))
                           .add("bytes_per_step", static_cast<int64_t>(model.params().total * 4))
                           .add("clock", std::string_view(step->on_device() ? "device" : "host"))
                           .add("comm_ms", comm_epoch.ms_per_step(comm_epoch.total))
                           .add("exposed_ms", comm_epoch.ms_per_step(comm_epoch.exposed))
                           .add("hidden_share", comm_epoch.hidden_share())
                           .add("step_ms", comm_epoch.steps > 0 ? 1000 * pipeline.compute / comm_epoch.steps : 0.0));
      }
      // 1-based completed epochs, as eval records.
      metrics.append(MetricsRecord("pipeline", st.epoch + 1, st.step).add_fields(pipeline_json(pipeline, verdict)));
    }
    if (train_loader.bad_file_count() > 0)
      RN_LOG_WARN("{} skipped so far (each logged once above)",
                  counted(train_loader.bad_file_count(), "bad image file"));
    if (stop) break;
    // Measured only where this process ran steps of the epoch: a resume at an epoch's last step
    // finishes that epoch without one, and would report this session's plan with nothing measured.
    // After the epoch's evaluation, whose plan comes on top of the training arena's.
    const bool log_memory = !memory_logged && steps_here > 0;
    if (trace) trace->write(run_dir + "/trace.json");
    const int64_t done_epoch = st.epoch;
    ++st.epoch;
    st.batch_in_epoch = 0;
    const bool last = st.epoch == epochs;
    std::optional<double> top1;
    if (last || (cfg.run.eval_interval_epochs > 0 && st.epoch % cfg.run.eval_interval_epochs == 0)) {
      average_bn_state();
      set_activity("evaluating", st.step);
      const EvalResult ev = evaluator->run(val_loader, done_epoch, nullptr, &comm, &g_stop);
      if (ev.abandoned) {
        // A stop request during the evaluation (a large validation set takes minutes, longer
        // than a batch scheduler's grace period): the checkpoint is the one a stop at the
        // epoch's last step writes, so that the resume evaluates this epoch and saves it as
        // the epoch's checkpoint (best.safetensors included) then.
        clear_stop_request();  // answered
        st.epoch = done_epoch;
        st.batch_in_epoch = steps_per_epoch;
        RN_LOG_INFO(
            "stop requested during the evaluation after epoch {}: it is left for the resume; saving a checkpoint "
            "at step {}",
            done_epoch + 1, st.step);
        save(false, std::nullopt);
        stop = true;
        result.interrupted = true;
        break;
      }
      // Weights that give no finite loss are not a result to save as the best, nor to finish on.
      // The run that most needs its report gets one first (the loss-scale history, the skipped
      // steps and the gradient monitor's NaN counts are in metrics.jsonl), and its log says so.
      if (!std::isfinite(ev.loss) && ev.samples > 0) {
        step->sync_scaler_state();  // for the count of skipped steps
        diag.finish(st.epoch, st.step);
        if (writer) write_report(run_dir);
        RN_FAIL() << "the validation loss after epoch " << done_epoch + 1 << " is not finite ("
                  << (std::isnan(ev.loss) ? "NaN" : "inf") << "; " << scaler.skipped_steps() << " of " << st.step
                  << " steps were skipped for inf/NaN gradients): training diverged; lower optimizer.base_lr or "
                     "lengthen schedule.warmup_epochs"
                  << (writer ? "; report: " + run_dir + "/report.html" : std::string());
      }
      result.final_eval = ev;
      top1 = ev.top1;
      EvalMetrics em;
      em.epoch = st.epoch;  // epochs completed (1-based), as in the log line
      em.step = st.step;
      em.loss = ev.loss;
      em.top1 = ev.top1;
      em.top5 = ev.top5;
      em.extra["images"] = static_cast<double>(ev.samples);
      if (ev.unreadable > 0) em.extra["unreadable"] = static_cast<double>(ev.unreadable);
      metrics.log_eval(em);
      RN_LOG_INFO(
          "epoch {} evaluation: loss {:.4f}, top-1 {:.2f}%, top-5 {:.2f}% ({} images{})", done_epoch + 1, ev.loss,
          100 * ev.top1, 100 * ev.top5, ev.samples,
          ev.unreadable > 0 ? fmt::format("; {} left out", counted(ev.unreadable, "unreadable file")) : std::string());
      st.best_top1 = std::max(st.best_top1, ev.top1);
    }
    if (log_memory) {
      log_measured_memory(*plan, metrics, done_epoch + 1, st.step);
      memory_logged = true;
    }
    const bool epoch_saved = cfg.run.checkpoint.every_epoch || last || periodic_save_due(st.step);
    if (epoch_saved) save(true, top1);
    if (writer) write_report(run_dir);
    // A stop request that came after the evaluation read its last batch (or during an epoch
    // end without one): the run stops here, not after the next epoch's first step. Every rank
    // comes here and agrees on it as on a step.
    if (!last && agree_on_step(comm, 0.0f, g_stop).stop) {
      clear_stop_request();  // answered
      RN_LOG_INFO("stop requested at the end of epoch {}: saving a checkpoint", done_epoch + 1);
      if (!epoch_saved) save(true, top1);
      stop = true;
      result.interrupted = true;
    }
  }
  // A run stopped mid-epoch (--max-steps, a signal) still leaves the trace of its steps; at an
  // epoch's end it was written above.
  if (trace && st.batch_in_epoch > 0) trace->write(run_dir + "/trace.json");
  step->sync_host_state();
  result.steps = st.step;
  result.best_top1 = st.best_top1;
  result.complete = st.epoch >= epochs;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  result.session_steps = st.step - first_step;
  diag.finish(st.batch_in_epoch > 0 ? st.epoch + 1 : st.epoch, st.step);  // the last step's epoch
  if (scaler.skipped_steps() > 0)
    RN_LOG_INFO("{} skipped for inf/NaN gradients", counted(scaler.skipped_steps(), "step was", "steps were"));
  if (writer) write_report(run_dir);
  set_activity("finished", st.step);
  RN_LOG_INFO("{} after {} {}; report: {}/report.html", stop ? "stopped" : "finished", counted(st.step, "step"),
              result.session_steps == st.step
                  ? fmt::format("in {:.1f} s", result.seconds)
                  : fmt::format("({} in this session, {:.1f} s)", result.session_steps, result.seconds),
              run_dir);
  return result;
}

}  // namespace
}  // namespace rn
