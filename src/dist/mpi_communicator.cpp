#include "dist/mpi_communicator.h"

#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include "core/check.h"
#include "core/log.h"
#include "core/nvtx.h"
#include "dist/activity.h"
#include "dist/nccl_communicator.h"

namespace rn {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void copy_text(char* dst, size_t cap, const std::string& s) {
  const size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

// What one rank tells the others about itself, about once per heartbeat period.
struct Heartbeat {
  int32_t rank = 0;
  int32_t pid = 0;
  int64_t step = -1;
  int64_t issued = 0;      // collectives started by this rank's communication thread
  int64_t done = 0;        // collectives finished
  double activity_s = 0;   // how long the current activity has lasted
  double op_s = 0;         // how long the current collective has been waiting (0: none)
  char what[48] = {};      // the trainer's activity
  char op[80] = {};        // the collective being waited on
};

struct PeerStatus {
  Heartbeat hb;
  double received = 0;  // local time of the last heartbeat (the start time before any)
  bool heard = false;
};

struct Op {
  enum Kind : uint8_t { all_reduce, broadcast, barrier, all_gather } kind = all_reduce;
  uint64_t ticket = 0;
  void* data = nullptr;
  int64_t count = 0;
  ElemType type = ElemType::f32;
  ReduceOp reduce = ReduceOp::sum;
  int root = 0;
  double value = 0;
  std::vector<double>* gathered = nullptr;
  std::string what;
};

constexpr int kHeartbeatTag = 17;

MPI_Datatype mpi_type(ElemType t, const std::string& what) {
  switch (t) {
    case ElemType::f32: return MPI_FLOAT;
    case ElemType::f64: return MPI_DOUBLE;
    case ElemType::i32: return MPI_INT32_T;
    case ElemType::i64: return MPI_INT64_T;
    default: break;
  }
  RN_FAIL() << what << ": the MPI communicator reduces f32, f64, i32 and i64, not " << elem_name(t);
}

std::string mpi_error_text(int rc) {
  char buf[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  return std::string(buf, static_cast<size_t>(std::max(len, 0)));
}

// The average of a sum over `ranks`: floats multiply by the reciprocal, integers divide.
template <class T>
void divide(T* p, int64_t n, T ranks) {
  if constexpr (std::is_floating_point_v<T>) {
    const T inv = T(1) / ranks;
    for (int64_t i = 0; i < n; ++i) p[i] *= inv;
  } else {
    for (int64_t i = 0; i < n; ++i) p[i] /= ranks;
  }
}

class MpiCommunicator;
std::atomic<MpiCommunicator*> g_live{nullptr};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(const MpiOptions& o) : opt_(o) {
    RN_CHECK(o.timeout_s > 0) << "dist.timeout_s must be positive, not " << o.timeout_s;
    RN_CHECK(o.heartbeat_s > 0) << "the heartbeat period must be positive, not " << o.heartbeat_s;
    grace_s_ = std::max(5.0, 0.2 * o.timeout_s);
    // At least 4 heartbeats within the timeout, so that a short one is not a healthy rank's
    // heartbeat period.
    opt_.heartbeat_s = std::min(o.heartbeat_s, o.timeout_s / 4);
    thread_ = std::thread([this] { thread_main(); });
    std::unique_lock lk(mu_);
    // MPI_Init returns when every rank has called it: a rank that never does (stalled before it,
    // reading its config or the rank table from a hung file system) would keep this one waiting
    // for ever. The thread in MPI_Init cannot be joined, so the process ends, and mpirun with it
    // the job.
    if (!cv_.wait_for(lk, std::chrono::duration<double>(o.timeout_s + grace_s_), [&] { return init_done_; })) {
      RN_LOG_ERROR(
          "MPI did not start within {:.0f} s (dist.timeout_s {} + {:.0f} s grace): some rank has not reached "
          "MPI_Init (stalled before it, for example reading its configuration from a file system that hangs)",
          o.timeout_s + grace_s_, o.timeout_s, grace_s_);
      logger()->flush();
      std::fflush(stderr);
      std::_Exit(1);
    }
    if (!init_error_.empty()) {
      lk.unlock();
      thread_.join();
      RN_FAIL() << init_error_;
    }
    g_live = this;
  }

  ~MpiCommunicator() override {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    g_live = nullptr;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  std::vector<std::string> hosts() const override { return hosts_; }

  Ticket all_reduce_async(void* data, int64_t count, ElemType type, ReduceOp op, const std::string& what) override {
    RN_CHECK(count >= 0 && count <= INT_MAX) << "all-reduce of " << what << ": " << count
                                             << " elements is outside what one MPI call takes (0.." << INT_MAX << ")";
    mpi_type(type, what);  // unsupported types fail here, on the caller's thread
    Op o;
    o.kind = Op::all_reduce;
    o.data = data;
    o.count = count;
    o.type = type;
    o.reduce = op;
    o.what = what;
    return enqueue(std::move(o));
  }

  CollectiveTiming wait(Ticket t) override {
    std::unique_lock lk(mu_);
    RN_CHECK(t <= issued_) << "wait for collective " << t << " that was never issued";
    cv_.wait(lk, [&] { return done_ >= t; });
    CollectiveTiming timing;
    if (auto it = timings_.find(t); it != timings_.end()) {
      timing = it->second;
      timings_.erase(it);
    }
    return timing;
  }

  void broadcast(void* data, int64_t bytes, int root, const std::string& what) override {
    RN_CHECK(bytes >= 0 && bytes <= INT_MAX) << what << ": broadcast of " << bytes << " bytes";
    RN_CHECK(root >= 0 && root < size_) << what << ": broadcast from rank " << root << " of " << size_;
    Op o;
    o.kind = Op::broadcast;
    o.data = data;
    o.count = bytes;
    o.root = root;
    o.what = what;
    wait(enqueue(std::move(o)));
  }

  void barrier(const std::string& what) override {
    Op o;
    o.kind = Op::barrier;
    o.what = what;
    wait(enqueue(std::move(o)));
  }

  std::vector<double> all_gather(double value, const std::string& what) override {
    std::vector<double> out(static_cast<size_t>(size_));
    Op o;
    o.kind = Op::all_gather;
    o.value = value;
    o.gathered = &out;
    o.what = what;
    wait(enqueue(std::move(o)));
    return out;
  }

  // From any thread: have the communication thread log and MPI_Abort (abort_job()).
  void request_abort(const std::string& message, int code, bool with_status) {
    {
      std::lock_guard lk(mu_);
      if (!abort_message_.empty()) return;
      abort_message_ = message;
      abort_code_ = code;
      abort_with_status_ = with_status;
    }
    cv_.notify_all();
  }

 private:
  Ticket enqueue(Op o) {
    std::lock_guard lk(mu_);
    o.ticket = ++issued_;
    const Ticket t = o.ticket;
    queue_.push_back(std::move(o));
    cv_.notify_all();
    return t;
  }

  void thread_main() {
    nvtx::name_this_thread("MPI communication");
    int provided = 0;
    const int wanted = rn_mpi_thread_level_wanted();
    int rc = MPI_Init_thread(nullptr, nullptr, wanted, &provided);
    {
      std::lock_guard lk(mu_);
      if (rc != MPI_SUCCESS) {
        init_error_ = "MPI_Init_thread failed: " + mpi_error_text(rc);
      } else if (provided < wanted) {
        init_error_ = fmt::format("MPI_Init_thread: this MPI provides thread level {}, the program needs {}",
                                  provided, wanted);
      } else {
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
        MPI_Comm_size(MPI_COMM_WORLD, &size_);
        MPI_Comm_dup(MPI_COMM_WORLD, &coll_);
        MPI_Comm_dup(MPI_COMM_WORLD, &hb_);
        MPI_Comm_set_errhandler(coll_, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(hb_, MPI_ERRORS_RETURN);
        char name[MPI_MAX_PROCESSOR_NAME] = {};
        int len = 0;
        MPI_Get_processor_name(name, &len);
        std::vector<char> all(static_cast<size_t>(size_) * MPI_MAX_PROCESSOR_NAME);
        rc = MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, coll_);
        if (rc != MPI_SUCCESS) init_error_ = "MPI_Allgather of host names failed: " + mpi_error_text(rc);
        for (int r = 0; r < size_; ++r) hosts_.emplace_back(all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME);
        const double t = now_s();
        peers_.assign(static_cast<size_t>(size_), PeerStatus{});
        for (PeerStatus& p : peers_) p.received = t;
        sends_.assign(static_cast<size_t>(size_), SendSlot{});
        last_beat_ = 0;
      }
      init_done_ = true;
    }
    cv_.notify_all();
    if (rc != MPI_SUCCESS || !init_error_.empty()) return;

    for (;;) {
      Op op;
      bool have = false;
      {
        std::unique_lock lk(mu_);
        cv_.wait_for(lk, std::chrono::duration<double>(opt_.heartbeat_s / 4),
                     [&] { return stop_ || !queue_.empty() || !abort_message_.empty(); });
        if (!abort_message_.empty()) die_as_requested(lk);
        if (!queue_.empty()) {
          op = std::move(queue_.front());
          queue_.pop_front();
          have = true;
        } else if (stop_) {
          break;
        }
      }
      if (have)
        run(op);
      else
        service(now_s());
    }
    finalize();
  }

  std::string describe(const Op& op) const {
    switch (op.kind) {
      case Op::all_reduce:
        return fmt::format("all-reduce of {} ({} {})", op.what, op.count, elem_name(op.type));
      case Op::broadcast:
        return fmt::format("broadcast of {} ({} bytes from rank {})", op.what, op.count, op.root);
      case Op::barrier:
        return "barrier (" + op.what + ")";
      case Op::all_gather:
        return "all-gather of " + op.what;
    }
    return op.what;
  }

  void run(Op& op) {
    const double t0 = now_s();
    const std::string what = describe(op);
    nvtx::Scope range(what.c_str());  // each collective by name on a profiler's timeline (core/nvtx.h)
    {
      std::lock_guard lk(status_mu_);
      current_op_ = what;
      op_start_ = t0;
      started_ = static_cast<int64_t>(op.ticket);
    }
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_SUCCESS;
    switch (op.kind) {
      case Op::all_reduce:
        rc = MPI_Iallreduce(MPI_IN_PLACE, op.data, static_cast<int>(op.count), mpi_type(op.type, op.what), MPI_SUM,
                            coll_, &req);
        break;
      case Op::broadcast:
        rc = MPI_Ibcast(op.data, static_cast<int>(op.count), MPI_BYTE, op.root, coll_, &req);
        break;
      case Op::barrier:
        rc = MPI_Ibarrier(coll_, &req);
        break;
      case Op::all_gather:
        rc = MPI_Iallgather(&op.value, 1, MPI_DOUBLE, op.gathered->data(), 1, MPI_DOUBLE, coll_, &req);
        break;
    }
    if (rc != MPI_SUCCESS) fail_mpi(rc, op);
    double last_service = t0;
    for (int polls = 0;; ++polls) {
      int flag = 0;
      rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) fail_mpi(rc, op);
      if (flag) break;
      const double t = now_s();
      if (t - last_service > 0.005) {
        service(t);
        last_service = t;
      }
      // Poll hard for a moment (small collectives finish in microseconds), then back off so
      // that the trainer's threads keep the cores.
      const double waited = t - t0;
      if (waited < 100e-6)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(waited < 0.01 ? 20 : waited < 1 ? 100 : 1000));
    }
    if (op.kind == Op::all_reduce && op.reduce == ReduceOp::average && size_ > 1) {
      switch (op.type) {
        case ElemType::f32: divide(static_cast<float*>(op.data), op.count, static_cast<float>(size_)); break;
        case ElemType::f64: divide(static_cast<double*>(op.data), op.count, static_cast<double>(size_)); break;
        case ElemType::i32: divide(static_cast<int32_t*>(op.data), op.count, size_); break;
        case ElemType::i64: divide(static_cast<int64_t*>(op.data), op.count, int64_t{size_}); break;
        default: break;  // refused by mpi_type() when issued
      }
    }
    const double t1 = now_s();
    {
      std::lock_guard lk(status_mu_);
      current_op_.clear();
      op_start_ = 0;
      finished_ = static_cast<int64_t>(op.ticket);
    }
    {
      std::lock_guard lk(mu_);
      done_ = op.ticket;
      timings_[op.ticket] = CollectiveTiming{t0, t1};
    }
    cv_.notify_all();
  }

  // Heartbeats out and in, a pending abort, and the watchdog. Runs on the communication
  // thread only, between polls and when idle.
  void service(double t) {
    {
      std::unique_lock lk(mu_);
      if (!abort_message_.empty()) die_as_requested(lk);
    }
    if (size_ == 1) return;
    // A process that did not run (stopped, a paused machine, swapped out) finds every other rank
    // silent for as long as it was away itself: that time is not held against them (they get
    // it back, and the heartbeats that arrived meanwhile are read before the watchdog looks),
    // and the log says what happened. This thread makes no blocking MPI call, so a gap this
    // long is time the process was not running.
    const double gap = last_service_ > 0 ? t - last_service_ : 0;
    last_service_ = t;
    if (gap > 4 * opt_.heartbeat_s) {
      for (PeerStatus& p : peers_) p.received = std::min(t, p.received + gap);
      {
        std::lock_guard lk(status_mu_);
        if (op_start_ > 0) op_start_ = std::min(t, op_start_ + gap);
      }
      while (receive_heartbeats(t)) {
      }
      RN_LOG_WARN(
          "rank {}: this process did not run for {:.1f} s (stopped, a paused machine, swapping?); the other ranks' "
          "silence over that time is not held against them",
          rank_, gap);
    }
    if (t - last_beat_ >= opt_.heartbeat_s) {
      send_heartbeats(t);
      last_beat_ = t;
    }
    receive_heartbeats(t);
    watchdog(t);
  }

  Heartbeat own_heartbeat(double t) {
    Heartbeat hb;
    hb.rank = rank_;
    hb.pid = static_cast<int32_t>(getpid());
    const Activity a = current_activity();
    hb.step = a.step;
    hb.activity_s = a.seconds;
    copy_text(hb.what, sizeof hb.what, a.what);
    std::lock_guard lk(status_mu_);
    hb.issued = started_;
    hb.done = finished_;
    hb.op_s = op_start_ > 0 ? t - op_start_ : 0;
    copy_text(hb.op, sizeof hb.op, current_op_);
    return hb;
  }

  void send_heartbeats(double t) {
    const Heartbeat hb = own_heartbeat(t);
    auto send_to = [&](int dst) {
      SendSlot& s = sends_[static_cast<size_t>(dst)];
      if (s.req != MPI_REQUEST_NULL) {
        int flag = 0;
        if (MPI_Test(&s.req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag) return;  // still on its way
      }
      s.hb = hb;
      if (MPI_Isend(&s.hb, sizeof(Heartbeat), MPI_BYTE, dst, kHeartbeatTag, hb_, &s.req) != MPI_SUCCESS)
        s.req = MPI_REQUEST_NULL;
    };
    if (rank_ == 0) {
      for (int r = 1; r < size_; ++r) send_to(r);
    } else {
      send_to(0);
    }
  }

  // Reads the heartbeats that have arrived, 4 per rank at most; true when there may be more.
  bool receive_heartbeats(double t) {
    for (int i = 0; i < 4 * size_; ++i) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kHeartbeatTag, hb_, &flag, &st) != MPI_SUCCESS || !flag) return false;
      Heartbeat hb;
      if (MPI_Recv(&hb, sizeof hb, MPI_BYTE, st.MPI_SOURCE, kHeartbeatTag, hb_, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        return false;
      if (st.MPI_SOURCE < 0 || st.MPI_SOURCE >= size_) continue;
      PeerStatus& p = peers_[static_cast<size_t>(st.MPI_SOURCE)];
      p.hb = hb;
      p.received = t;
      p.heard = true;
    }
    return true;
  }

  std::string rank_line(int r, double t) {
    const std::string& host = hosts_[static_cast<size_t>(r)];
    if (r == rank_) {
      const Heartbeat hb = own_heartbeat(t);
      return fmt::format("rank {} on {} (pid {}, this process): step {}, '{}' for {:.1f} s, collectives issued {}, done {}{}",
                         r, host, hb.pid, hb.step, hb.what, hb.activity_s, hb.issued, hb.done,
                         hb.op[0] ? fmt::format(", waiting {:.1f} s in {}", hb.op_s, hb.op) : "");
    }
    const PeerStatus& p = peers_[static_cast<size_t>(r)];
    if (!p.heard) return fmt::format("rank {} on {}: no heartbeat received in {:.1f} s", r, host, t - p.received);
    const double age = t - p.received;
    return fmt::format(
        "rank {} on {} (pid {}): last heartbeat {:.1f} s ago: step {}, '{}' for {:.1f} s, collectives issued {}, "
        "done {}{}",
        r, host, p.hb.pid, age, p.hb.step, p.hb.what, p.hb.activity_s + age, p.hb.issued, p.hb.done,
        p.hb.op[0] ? fmt::format(", waiting {:.1f} s in {}", p.hb.op_s + age, p.hb.op) : "");
  }

  // The ranks holding the job up: those that have not issued the newest collective any rank
  // is waiting in, and those gone silent.
  std::string diagnosis(double t) {
    int64_t newest = 0;
    {
      std::lock_guard lk(status_mu_);
      newest = started_;
    }
    // Rank 0 hears from every rank; the others hear from rank 0 only.
    std::vector<int> known;
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && (rank_ == 0 || r == 0)) known.push_back(r);
    for (int r : known)
      if (peers_[static_cast<size_t>(r)].heard) newest = std::max(newest, peers_[static_cast<size_t>(r)].hb.issued);
    std::vector<std::string> behind, lines;
    auto consider = [&](int r, int64_t issued, bool silent) {
      if (silent || issued < newest) behind.push_back(fmt::format("{}", r));
      lines.push_back("  " + rank_line(r, t));
    };
    consider(rank_, own_issued(), false);
    for (int r : known) {
      const PeerStatus& p = peers_[static_cast<size_t>(r)];
      consider(r, p.heard ? p.hb.issued : 0, !p.heard || t - p.received > opt_.timeout_s / 2);
    }
    std::string out;
    if (!behind.empty())
      out += fmt::format("the job is held up by rank {} (behind the others or silent). ", fmt::join(behind, ", rank "));
    out += "Status:\n" + fmt::format("{}", fmt::join(lines, "\n"));
    return out;
  }

  int64_t own_issued() {
    std::lock_guard lk(status_mu_);
    return started_;
  }

  void watchdog(double t) {
    double op_wait = 0;
    std::string op;
    {
      std::lock_guard lk(status_mu_);
      if (op_start_ > 0) op_wait = t - op_start_;
      op = current_op_;
    }
    const Activity a = current_activity();
    if (rank_ == 0) {
      if (op_wait > opt_.timeout_s)
        die(fmt::format("timed out after {:.1f} s (dist.timeout_s {}) in {} at step {}; {}", op_wait, opt_.timeout_s, op,
                        a.step, diagnosis(t)),
            1);
      for (int r = 1; r < size_; ++r) {
        const PeerStatus& p = peers_[static_cast<size_t>(r)];
        const double silent = t - p.received;
        if (silent > opt_.timeout_s)
          die(fmt::format("rank {} on {} has sent no heartbeat for {:.1f} s (dist.timeout_s {}): it has stopped, hung "
                          "or died; {}",
                          r, hosts_[static_cast<size_t>(r)], silent, opt_.timeout_s, diagnosis(t)),
              1);
        if (p.heard && p.hb.op[0] && p.hb.op_s + silent > opt_.timeout_s && p.hb.issued > own_issued())
          die(fmt::format("rank {} has waited {:.1f} s in {} for a collective this rank has not reached: rank 0 holds "
                          "up the job in '{}' (step {}) for {:.1f} s; {}",
                          r, p.hb.op_s + silent, p.hb.op, a.what, a.step, a.seconds, diagnosis(t)),
              1);
      }
    } else {
      if (op_wait > opt_.timeout_s + grace_s_)
        die(fmt::format("timed out after {:.1f} s (dist.timeout_s {} + {:.0f} s grace) in {} at step {}; {}", op_wait,
                        opt_.timeout_s, grace_s_, op, a.step, diagnosis(t)),
            1);
      const double silent = t - peers_[0].received;
      if (silent > opt_.timeout_s + grace_s_)
        die(fmt::format("rank 0 on {} has sent no heartbeat for {:.1f} s: it has stopped, hung or died; {}", hosts_[0],
                        silent, diagnosis(t)),
            1);
    }
  }

  [[noreturn]] void fail_mpi(int rc, const Op& op) {
    // A truncated message is a collective of another size on another rank: the ranks disagree
    // (the trainer compares their configurations and builds at start-up; a program that does not
    // may reach this).
    int error_class = rc;
    MPI_Error_class(rc, &error_class);
    const bool truncated = error_class == MPI_ERR_TRUNCATE;
    die(fmt::format("MPI error in {} at step {}: {} ({})", describe(op), current_activity().step, mpi_error_text(rc),
                    truncated ? "the ranks issued collectives of different sizes: different configurations or builds?"
                              : "a rank has probably died; mpirun names it"),
        1);
  }

  // An abort_job() request: its message, with every rank's last known state when asked for (a
  // wait outside MPI, such as an NCCL collective's, timed out: the heartbeats tell which rank
  // is elsewhere). `lk` holds mu_. Communication thread only.
  [[noreturn]] void die_as_requested(std::unique_lock<std::mutex>& lk) {
    std::string m = abort_message_;
    const int code = abort_code_;
    const bool with_status = abort_with_status_;
    lk.unlock();
    if (with_status && size_ > 1) {
      const double t = now_s();
      receive_heartbeats(t);
      m += "; " + diagnosis(t);
    }
    die(m, code);
  }

  // Logs and ends the whole job. Communication thread only.
  [[noreturn]] void die(const std::string& message, int code) {
    RN_LOG_ERROR("rank {} of {} on {}: {}", rank_, size_, hosts_.empty() ? "?" : hosts_[static_cast<size_t>(rank_)],
                 message);
    logger()->flush();
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

  void finalize() {
    // Every rank gets here in the same order of collectives; the barrier makes sure none
    // finalises while another still needs it (under the same watchdog).
    Op b;
    b.kind = Op::barrier;
    b.what = "shutdown";
    {
      std::lock_guard lk(mu_);
      b.ticket = ++issued_;
    }
    run(b);
    for (SendSlot& s : sends_) {
      if (s.req != MPI_REQUEST_NULL) {
        int flag = 0;
        MPI_Test(&s.req, &flag, MPI_STATUS_IGNORE);
        if (!flag) {
          MPI_Cancel(&s.req);
          MPI_Request_free(&s.req);
        }
      }
    }
    receive_heartbeats(now_s());
    MPI_Comm_free(&hb_);
    MPI_Comm_free(&coll_);
    MPI_Finalize();
  }

  struct SendSlot {
    Heartbeat hb;
    MPI_Request req = MPI_REQUEST_NULL;
  };

  MpiOptions opt_;
  double grace_s_ = 5;
  std::thread thread_;
  // Queue, tickets and lifecycle.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  Ticket issued_ = 0, done_ = 0;
  std::unordered_map<Ticket, CollectiveTiming> timings_;
  bool init_done_ = false, stop_ = false;
  std::string init_error_;
  std::string abort_message_;
  int abort_code_ = 1;
  bool abort_with_status_ = false;
  // Set at init, then read-only.
  int rank_ = 0, size_ = 1;
  std::vector<std::string> hosts_;
  MPI_Comm coll_ = MPI_COMM_NULL, hb_ = MPI_COMM_NULL;
  // Communication thread only.
  std::vector<PeerStatus> peers_;
  std::vector<SendSlot> sends_;
  double last_beat_ = 0;
  double last_service_ = 0;  // when service() last ran
  // Status of the collective in progress (read by own_heartbeat()).
  std::mutex status_mu_;
  std::string current_op_;
  double op_start_ = 0;
  int64_t started_ = 0, finished_ = 0;
};

}  // namespace

int launcher_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return -1;
}

bool launched_by_mpi() { return launcher_rank() >= 0; }

extern "C" __attribute__((weak)) int rn_mpi_thread_level_wanted() { return MPI_THREAD_FUNNELED; }

std::unique_ptr<Communicator> make_mpi_communicator(const MpiOptions& options) {
  return std::make_unique<MpiCommunicator>(options);
}

void abort_job(const std::string& message, int exit_code, bool with_status) {
  if (MpiCommunicator* c = g_live.load()) {
    c->request_abort(message, exit_code, with_status);
    // The communication thread logs and calls MPI_Abort, which ends this process; should it
    // be stuck, end it anyway.
    std::this_thread::sleep_for(std::chrono::seconds(20));
  } else {
    RN_LOG_ERROR("{}", message);
    logger()->flush();
  }
  std::fflush(stderr);
  std::_Exit(exit_code);
}

std::vector<LibraryVersion> communication_library_versions() {
  // MPI_Get_library_version may be called before MPI_Init. Open MPI's text is
  // "Open MPI v4.1.4, package: ..., ident: ...": its first part is the name and version.
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  std::string mpi = MPI_Get_library_version(text, &length) == MPI_SUCCESS ? std::string(text, length) : "MPI unknown";
  mpi = mpi.substr(0, mpi.find_first_of(",\n"));
  while (!mpi.empty() && std::isspace(static_cast<unsigned char>(mpi.back()))) mpi.pop_back();
  std::vector<LibraryVersion> out;
  // "Open MPI v4.1.4" -> {"Open MPI", "4.1.4"}; another MPI keeps its text whole.
  if (const size_t v = mpi.rfind(" v");
      v != std::string::npos && v + 2 < mpi.size() && std::isdigit(static_cast<unsigned char>(mpi[v + 2])))
    out.push_back({mpi.substr(0, v), mpi.substr(v + 2)});
  else
    out.push_back({"MPI", mpi});
  if (nccl_available()) out.push_back({"NCCL", nccl_version()});
  return out;
}

}  // namespace rn
