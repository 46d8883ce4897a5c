#include "dist/communicator.h"

#include <unistd.h>

#include "core/check.h"

namespace rn {

size_t elem_size(ElemType t) {
  switch (t) {
    case ElemType::f32:
    case ElemType::i32:
      return 4;
    case ElemType::f64:
    case ElemType::i64:
      return 8;
    case ElemType::bf16:
    case ElemType::f16:
      return 2;
  }
  return 0;
}

const char* elem_name(ElemType t) {
  switch (t) {
    case ElemType::f32: return "f32";
    case ElemType::f64: return "f64";
    case ElemType::i32: return "i32";
    case ElemType::i64: return "i64";
    case ElemType::bf16: return "bf16";
    case ElemType::f16: return "f16";
  }
  return "?";
}

std::string Communicator::broadcast_string(const std::string& s, int root, const std::string& what) {
  int64_t n = static_cast<int64_t>(s.size());
  broadcast(&n, sizeof n, root, what);
  std::string out = rank() == root ? s : std::string(static_cast<size_t>(n), '\0');
  if (n > 0) broadcast(out.data(), n, root, what);
  return out;
}

namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "local"; }
  std::vector<std::string> hosts() const override {
    char buf[256] = {};
    gethostname(buf, sizeof buf - 1);
    return {buf};
  }
  Ticket all_reduce_async(void*, int64_t count, ElemType, ReduceOp, const std::string& what) override {
    RN_CHECK(count >= 0) << "all-reduce of " << what << ": negative count " << count;
    return ++issued_;
  }
  CollectiveTiming wait(Ticket t) override {
    RN_CHECK(t <= issued_) << "wait for collective " << t << " that was never issued";
    return {};
  }
  void broadcast(void*, int64_t, int root, const std::string& what) override {
    RN_CHECK(root == 0) << what << ": broadcast from rank " << root << " in a world of 1";
  }
  void barrier(const std::string&) override {}
  std::vector<double> all_gather(double value, const std::string&) override { return {value}; }

 private:
  Ticket issued_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

}  // namespace rn
