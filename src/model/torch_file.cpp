#include "model/torch_file.h"

#include <fmt/format.h>
#include <zip.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <unordered_map>

#include "core/check.h"

namespace rn {
namespace {

// ---------------------------------------------------------------------------------------------
// Values of the pickle machine. All of them live in one arena owned by the parse, and refer to
// each other by pointer: a pickle can build cycles (a list appended to itself), which an arena
// frees without counting references.

enum class Kind : uint8_t {
  None,
  Bool,
  Int,
  BigInt,
  Float,
  Str,
  Bytes,
  Tuple,
  List,
  Dict,
  Global,
  Object,
  Storage,
  Tensor
};

struct Value {
  Kind kind = Kind::None;
  int64_t i = 0;                 // Bool, Int; Storage: element count; Tensor: storage offset
  double f = 0;                  // Float
  std::string s;                 // Str, Bytes, BigInt (little-endian two's complement), Global ("module.name")
  std::vector<Value*> items;     // Tuple, List; Dict: key, value, key, value, ...; Object: callable, args
  const Value* state = nullptr;  // Object: what BUILD gave it
  // Storage: the element type and the key of its bytes.
  std::string dtype;
  size_t element_size = 0;
  // Tensor: its storage, size and stride.
  const Value* storage = nullptr;
  std::vector<int64_t> size, stride;
};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::None:
      return "None";
    case Kind::Bool:
      return "a bool";
    case Kind::Int:
    case Kind::BigInt:
      return "an int";
    case Kind::Float:
      return "a float";
    case Kind::Str:
      return "a string";
    case Kind::Bytes:
      return "bytes";
    case Kind::Tuple:
      return "a tuple";
    case Kind::List:
      return "a list";
    case Kind::Dict:
      return "a dict";
    case Kind::Global:
      return "a class or function";
    case Kind::Object:
      return "an object";
    case Kind::Storage:
      return "a storage";
    case Kind::Tensor:
      return "a tensor";
  }
  return "a value";
}

// "a tensor", "an object (torchvision.models.resnet.ResNet)".
std::string describe(const Value* v) {
  std::string d = kind_name(v->kind);
  if (v->kind == Kind::Object && !v->items.empty() && v->items[0]->kind == Kind::Global)
    d += " (" + v->items[0]->s + ")";
  if (v->kind == Kind::Global) d += " (" + v->s + ")";
  return d;
}

struct StorageType {
  const char* name;
  const char* dtype;
  size_t size;
};

constexpr StorageType kStorageTypes[] = {
    {"torch.FloatStorage", "F32", 4},  {"torch.HalfStorage", "F16", 2}, {"torch.BFloat16Storage", "BF16", 2},
    {"torch.DoubleStorage", "F64", 8}, {"torch.LongStorage", "I64", 8}, {"torch.IntStorage", "I32", 4},
    {"torch.ShortStorage", "I16", 2},  {"torch.CharStorage", "I8", 1},  {"torch.ByteStorage", "U8", 1},
    {"torch.BoolStorage", "BOOL", 1},
};

// Names of the globals a pickled nn.Module brings; one of them is refused by name.
bool is_module_class(const std::string& g) {
  return g.starts_with("torch.nn.modules.") || g.starts_with("torchvision.models.") || g.starts_with("timm.");
}

class Unpickler {
 public:
  Unpickler(std::string what, std::vector<std::unique_ptr<Value>>& arena) : what_(std::move(what)), arena_(arena) {}

  // Runs one pickle from `begin` to its STOP; returns the value and the position after STOP.
  std::pair<const Value*, size_t> run(std::span<const std::byte> bytes, size_t begin, const std::string& part) {
    data_ = bytes;
    pos_ = begin;
    part_ = part;
    stack_.clear();
    marks_.clear();
    memo_.clear();
    for (;;) {
      const size_t at = pos_;
      const uint8_t op = u8();
      if (op == '.') {
        check(stack_.size() == 1 && marks_.empty(), at,
              "STOP with " + std::to_string(stack_.size()) + " values on the stack");
        return {stack_.back(), pos_};
      }
      step(op, at);
    }
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& msg) const {
    RN_FAIL() << "PyTorch file '" << what_ << "': " << part_ << " at byte " << at << ": " << msg;
  }
  void check(bool ok, size_t at, const std::string& msg) const {
    if (!ok) fail(at, msg);
  }

  // Reading the opcode stream.
  std::span<const std::byte> take(size_t n) {
    if (n > data_.size() - pos_)
      fail(pos_, fmt::format("the pickle ends early (wants {} more bytes, {} left)", n, data_.size() - pos_));
    auto s = data_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  uint8_t u8() { return static_cast<uint8_t>(take(1)[0]); }
  uint64_t le(size_t n) {
    auto s = take(n);
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k) v |= static_cast<uint64_t>(static_cast<uint8_t>(s[k])) << (8 * k);
    return v;
  }
  std::string text(size_t n) {
    auto s = take(n);
    return std::string(reinterpret_cast<const char*>(s.data()), n);
  }
  std::string line() {  // up to '\n', for the text opcodes (GLOBAL, PUT, GET, INT)
    const size_t at = pos_;
    for (size_t k = pos_; k < data_.size() && k - at < 4096; ++k) {
      if (data_[k] == std::byte{'\n'}) {
        std::string s = text(k - at);
        ++pos_;
        return s;
      }
    }
    fail(at, "a text argument without its newline");
  }
  int64_t decimal(const std::string& s, size_t at) {
    int64_t v = 0;
    const size_t n0 = (!s.empty() && s[0] == '-') ? 1 : 0;
    check(s.size() > n0 && s.size() <= 18 + n0, at, "a malformed decimal '" + s.substr(0, 40) + "'");
    for (size_t k = n0; k < s.size(); ++k) {
      check(s[k] >= '0' && s[k] <= '9', at, "a malformed decimal '" + s.substr(0, 40) + "'");
      v = v * 10 + (s[k] - '0');
    }
    return n0 ? -v : v;
  }

  // The machine's state.
  Value* make(Kind k) {
    arena_.push_back(std::make_unique<Value>());
    arena_.back()->kind = k;
    return arena_.back().get();
  }
  Value* pop(size_t at) {
    check(stack_.size() > (marks_.empty() ? 0 : marks_.back()), at, "an opcode needs a value and the stack has none");
    Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Value* top(size_t at) {
    check(stack_.size() > (marks_.empty() ? 0 : marks_.back()), at, "an opcode needs a value and the stack has none");
    return stack_.back();
  }
  std::vector<Value*> pop_mark(size_t at) {
    check(!marks_.empty(), at, "an opcode needs a MARK and there is none");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<Value*> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  void push(Value* v) { stack_.push_back(v); }
  void memo_put(uint64_t key, size_t at) { memo_[key] = top(at); }
  void memo_get(uint64_t key, size_t at) {
    auto it = memo_.find(key);
    check(it != memo_.end(), at, "memo entry " + std::to_string(key) + " is read before it is written");
    push(it->second);
  }
  Value* str(Kind k, std::string s) {
    Value* v = make(k);
    v->s = std::move(s);
    return v;
  }
  Value* integer(int64_t i) {
    Value* v = make(Kind::Int);
    v->i = i;
    return v;
  }
  Value* long_int(size_t n) {
    auto s = take(n);
    if (n > 8) {
      Value* v = make(Kind::BigInt);
      v->s.assign(reinterpret_cast<const char*>(s.data()), n);
      return v;
    }
    uint64_t u = 0;
    for (size_t k = 0; k < n; ++k) u |= static_cast<uint64_t>(static_cast<uint8_t>(s[k])) << (8 * k);
    if (n > 0 && n < 8 && (static_cast<uint8_t>(s[n - 1]) & 0x80)) u |= ~uint64_t{0} << (8 * n);  // sign-extend
    return integer(static_cast<int64_t>(u));
  }
  void setitems(Value* dict, const std::vector<Value*>& kv, size_t at) {
    check(kv.size() % 2 == 0, at, "SETITEMS with an odd number of values");
    if (dict->kind != Kind::Dict) fail(at, "SETITEM(S) on " + describe(dict) + ", not a dict");
    for (Value* x : kv) dict->items.push_back(x);
  }
  void appends(Value* list, const std::vector<Value*>& xs, size_t at) {
    if (list->kind != Kind::List) fail(at, "APPEND(S) or ADDITEMS on " + describe(list) + ", not a list or set");
    for (Value* x : xs) list->items.push_back(x);
  }
  Value* tuple(std::vector<Value*> xs) {
    Value* v = make(Kind::Tuple);
    v->items = std::move(xs);
    return v;
  }

  void step(uint8_t op, size_t at) {
    switch (op) {
      case 0x80: {  // PROTO
        const uint8_t p = u8();
        check(p >= 2 && p <= 5, at, "pickle protocol " + std::to_string(p) + " (torch.save writes 2 to 5)");
        return;
      }
      case 0x95:
        take(8);
        return;  // FRAME: a length hint only
      case '(':
        marks_.push_back(stack_.size());
        return;
      case '0':
        pop(at);
        return;
      case '1':
        pop_mark(at);
        return;
      case '2':
        push(top(at));
        return;
      case 'N':
        push(make(Kind::None));
        return;
      case 0x88:
      case 0x89: {
        Value* v = make(Kind::Bool);
        v->i = op == 0x88;
        push(v);
        return;
      }
      case 'J':
        push(integer(static_cast<int32_t>(le(4))));
        return;
      case 'K':
        push(integer(static_cast<int64_t>(le(1))));
        return;
      case 'M':
        push(integer(static_cast<int64_t>(le(2))));
        return;
      case 0x8a:
        push(long_int(u8()));
        return;     // LONG1
      case 0x8b: {  // LONG4
        const uint64_t n = le(4);
        check(n <= 64, at, "an integer of " + std::to_string(n) + " bytes");
        push(long_int(n));
        return;
      }
      case 'I': {  // INT, protocol 0: "01"/"00" are True/False
        const std::string s = line();
        if (s == "00" || s == "01") {
          Value* v = make(Kind::Bool);
          v->i = s == "01";
          push(v);
        } else {
          push(integer(decimal(s, at)));
        }
        return;
      }
      case 'G': {  // BINFLOAT, big-endian
        auto s = take(8);
        uint64_t u = 0;
        for (size_t k = 0; k < 8; ++k) u = (u << 8) | static_cast<uint8_t>(s[k]);
        Value* v = make(Kind::Float);
        std::memcpy(&v->f, &u, 8);
        push(v);
        return;
      }
      case 'X':
        push(str(Kind::Str, text(le(4))));
        return;  // BINUNICODE
      case 0x8c:
        push(str(Kind::Str, text(u8())));
        return;  // SHORT_BINUNICODE
      case 0x8d:
        push(str(Kind::Str, text(le(8))));
        return;  // BINUNICODE8
      case 'U':
        push(str(Kind::Str, text(u8())));
        return;  // SHORT_BINSTRING (a Python 2 str)
      case 'T':
        push(str(Kind::Str, text(le(4))));
        return;  // BINSTRING
      case 'C':
        push(str(Kind::Bytes, text(u8())));
        return;  // SHORT_BINBYTES
      case 'B':
        push(str(Kind::Bytes, text(le(4))));
        return;   // BINBYTES
      case 0x8e:  // BINBYTES8
      case 0x96:
        push(str(Kind::Bytes, text(le(8))));
        return;  // BYTEARRAY8
      case ')':
        push(tuple({}));
        return;
      case 't':
        push(tuple(pop_mark(at)));
        return;
      case 0x85: {
        Value* a = pop(at);
        push(tuple({a}));
        return;
      }
      case 0x86: {
        Value* b = pop(at);
        Value* a = pop(at);
        push(tuple({a, b}));
        return;
      }
      case 0x87: {
        Value* c = pop(at);
        Value* b = pop(at);
        Value* a = pop(at);
        push(tuple({a, b, c}));
        return;
      }
      case ']':
      case 0x8f:
        push(make(Kind::List));
        return;  // EMPTY_LIST, EMPTY_SET
      case 'l':
      case 0x91: {  // LIST, FROZENSET
        Value* v = make(Kind::List);
        v->items = pop_mark(at);
        push(v);
        return;
      }
      case 'a': {
        Value* x = pop(at);
        appends(top(at), {x}, at);
        return;
      }
      case 'e':
      case 0x90: {  // APPENDS, ADDITEMS
        std::vector<Value*> xs = pop_mark(at);
        appends(top(at), xs, at);
        return;
      }
      case '}':
        push(make(Kind::Dict));
        return;
      case 'd': {
        std::vector<Value*> kv = pop_mark(at);
        Value* v = make(Kind::Dict);
        setitems(v, kv, at);
        push(v);
        return;
      }
      case 's': {
        Value* val = pop(at);
        Value* key = pop(at);
        setitems(top(at), {key, val}, at);
        return;
      }
      case 'u': {
        std::vector<Value*> kv = pop_mark(at);
        setitems(top(at), kv, at);
        return;
      }
      case 'c': {  // GLOBAL "module\nname\n"
        std::string module = line();
        std::string name = line();
        push(str(Kind::Global, module + "." + name));
        return;
      }
      case 0x93: {  // STACK_GLOBAL
        Value* name = pop(at);
        Value* module = pop(at);
        check(name->kind == Kind::Str && module->kind == Kind::Str, at, "STACK_GLOBAL on values that are not strings");
        push(str(Kind::Global, module->s + "." + name->s));
        return;
      }
      case 'R': {  // REDUCE
        Value* args = pop(at);
        Value* callable = pop(at);
        push(reduce(callable, args, at));
        return;
      }
      case 0x81: {  // NEWOBJ
        Value* args = pop(at);
        Value* cls = pop(at);
        push(object(cls, args));
        return;
      }
      case 0x92: {  // NEWOBJ_EX
        pop(at);    // kwargs
        Value* args = pop(at);
        Value* cls = pop(at);
        push(object(cls, args));
        return;
      }
      case 'b': {  // BUILD: an object's state; OrderedDict's _metadata and the like are not needed
        Value* state = pop(at);
        Value* obj = top(at);
        if (obj->kind == Kind::Object) obj->state = state;
        return;
      }
      case 'Q': {  // BINPERSID: a storage
        Value* pid = pop(at);
        push(storage(pid, at));
        return;
      }
      case 'q':
        memo_put(le(1), at);
        return;
      case 'r':
        memo_put(le(4), at);
        return;
      case 0x94:
        memo_put(memo_.size(), at);
        return;  // MEMOIZE
      case 'p':
        memo_put(static_cast<uint64_t>(decimal(line(), at)), at);
        return;
      case 'h':
        memo_get(le(1), at);
        return;
      case 'j':
        memo_get(le(4), at);
        return;
      case 'g':
        memo_get(static_cast<uint64_t>(decimal(line(), at)), at);
        return;
      default:
        fail(at, fmt::format("pickle opcode 0x{:02x} is not one torch.save writes", op));
    }
  }

  Value* object(Value* callable, Value* args) {
    Value* v = make(Kind::Object);
    v->items = {callable, args};
    return v;
  }

  std::vector<int64_t> int_tuple(const Value* v, const std::string& what, size_t at) {
    check(v->kind == Kind::Tuple, at, what + " is " + describe(v) + ", expected a tuple of ints");
    std::vector<int64_t> out;
    for (const Value* x : v->items) {
      check(x->kind == Kind::Int && x->i >= 0, at, what + " holds " + describe(x) + ", expected ints >= 0");
      out.push_back(x->i);
    }
    return out;
  }

  Value* reduce(Value* callable, Value* args, size_t at) {
    if (callable->kind != Kind::Global || args->kind != Kind::Tuple) return object(callable, args);
    const std::string& g = callable->s;
    const std::vector<Value*>& a = args->items;
    if (g == "collections.OrderedDict" || g == "builtins.dict") {
      Value* d = make(Kind::Dict);
      if (!a.empty() && a[0]->kind == Kind::List) {  // OrderedDict([(k, v), ...])
        for (const Value* kv : a[0]->items) {
          check(kv->kind == Kind::Tuple && kv->items.size() == 2, at,
                "OrderedDict built from an item that is not a pair");
          d->items.push_back(kv->items[0]);
          d->items.push_back(kv->items[1]);
        }
      }
      return d;
    }
    if (g == "torch._utils._rebuild_tensor_v2" || g == "torch._utils._rebuild_tensor") {
      check(a.size() >= 4, at, g + " with " + std::to_string(a.size()) + " arguments, expected 4 or more");
      check(a[0]->kind == Kind::Storage, at, g + ": its storage is " + describe(a[0]));
      check(a[1]->kind == Kind::Int && a[1]->i >= 0, at,
            g + ": its storage offset is " + describe(a[1]) + " or negative");
      Value* t = make(Kind::Tensor);
      t->storage = a[0];
      t->i = a[1]->i;
      t->size = int_tuple(a[2], g + ": its size", at);
      t->stride = int_tuple(a[3], g + ": its stride", at);
      check(t->size.size() == t->stride.size() && t->size.size() <= 8, at,
            fmt::format("{}: a size of rank {} with a stride of rank {}", g, t->size.size(), t->stride.size()));
      return t;
    }
    if (g == "torch._utils._rebuild_parameter" || g == "torch._utils._rebuild_parameter_with_state") {
      check(!a.empty() && a[0]->kind == Kind::Tensor, at, g + " of something that is not a tensor");
      return a[0];
    }
    return object(callable, args);
  }

  Value* storage(const Value* pid, size_t at) {
    check(pid->kind == Kind::Tuple && pid->items.size() >= 5 && pid->items[0]->kind == Kind::Str &&
              pid->items[0]->s == "storage",
          at, "a persistent id that is not ('storage', type, key, location, size)");
    const Value* type = pid->items[1];
    const Value* key = pid->items[2];
    const Value* numel = pid->items[4];
    check(type->kind == Kind::Global, at, "a storage whose type is " + describe(type));
    const StorageType* st = nullptr;
    for (const StorageType& s : kStorageTypes)
      if (type->s == s.name) st = &s;
    check(st != nullptr, at, "storages of type " + type->s + " are not supported (only real and integer ones)");
    check(key->kind == Kind::Str, at, "a storage whose key is " + describe(key));
    check(numel->kind == Kind::Int && numel->i >= 0, at, "storage '" + key->s + "' has a size that is not an int >= 0");
    if (pid->items.size() > 5)
      check(pid->items[5]->kind == Kind::None, at,
            "storage '" + key->s +
                "' is a view into another storage (written by a PyTorch before 0.4), which is not supported");
    Value* v = make(Kind::Storage);
    v->s = key->s;
    v->i = numel->i;
    v->dtype = st->dtype;
    v->element_size = st->size;
    return v;
  }

  std::string what_;
  std::vector<std::unique_ptr<Value>>& arena_;
  std::span<const std::byte> data_;
  size_t pos_ = 0;
  std::string part_;
  std::vector<Value*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Value*> memo_;
};

// ---------------------------------------------------------------------------------------------
// Containers

struct ZipArchive {
  zip_t* z = nullptr;
  ~ZipArchive() {
    if (z) zip_discard(z);
  }
};

// The records of a torch.save zip: data.pkl and the storages, read from memory.
class ZipReader {
 public:
  ZipReader(std::span<const std::byte> bytes, const std::string& what) : what_(what) {
    zip_error_t err;
    zip_error_init(&err);
    zip_source_t* src = zip_source_buffer_create(bytes.data(), bytes.size(), 0, &err);
    if (src != nullptr) za_.z = zip_open_from_source(src, ZIP_RDONLY, &err);
    if (za_.z == nullptr) {
      const std::string msg = zip_error_strerror(&err);
      const int code = zip_error_code_zip(&err);
      if (src != nullptr) zip_source_free(src);
      zip_error_fini(&err);
      // It begins as a zip (a local file header) but has no end record: the tail is missing.
      const bool begins_as_zip = bytes.size() >= 4 && std::memcmp(bytes.data(), "PK\x03\x04", 4) == 0;
      RN_CHECK(!(begins_as_zip && (code == ZIP_ER_NOZIP || code == ZIP_ER_INCONS)))
          << "PyTorch file '" << what_ << "': truncated or damaged: it begins as a zip archive but its end (the "
          << "central directory) is missing or wrong after " << bytes.size()
          << " bytes: was the download or copy cut short? (" << msg << ")";
      RN_FAIL() << "PyTorch file '" << what_ << "': not a readable zip archive: " << msg;
    }
    zip_error_fini(&err);
    limit_ = bytes.size();
    const zip_int64_t n = zip_get_num_entries(za_.z, 0);
    for (zip_int64_t i = 0; i < n; ++i) {
      const char* name = zip_get_name(za_.z, static_cast<zip_uint64_t>(i), ZIP_FL_ENC_RAW);
      if (name == nullptr) continue;
      const std::string s = name;
      const size_t slash = s.find('/');
      if (slash != std::string::npos && s.substr(slash) == "/data.pkl") {
        RN_CHECK(prefix_.empty()) << "PyTorch file '" << what_ << "': holds two pickles, '" << prefix_
                                  << "data.pkl' and '" << s << "'";
        prefix_ = s.substr(0, slash + 1);
      }
    }
    RN_CHECK(!prefix_.empty()) << "PyTorch file '" << what_
                               << "': a zip archive without a <name>/data.pkl record, so not written by torch.save";
  }

  bool has(const std::string& record) const {
    return zip_name_locate(za_.z, (prefix_ + record).c_str(), ZIP_FL_ENC_RAW) >= 0;
  }

  std::vector<std::byte> read(const std::string& record) const {
    const std::string name = prefix_ + record;
    const zip_int64_t index = zip_name_locate(za_.z, name.c_str(), ZIP_FL_ENC_RAW);
    RN_CHECK(index >= 0) << "PyTorch file '" << what_ << "': the record '" << name << "' is missing";
    zip_stat_t st;
    zip_stat_init(&st);
    RN_CHECK(zip_stat_index(za_.z, static_cast<zip_uint64_t>(index), 0, &st) == 0 && (st.valid & ZIP_STAT_SIZE) &&
             (st.valid & ZIP_STAT_COMP_METHOD))
        << "PyTorch file '" << what_ << "': cannot read the directory entry of '" << name << "'";
    // torch.save stores its records uncompressed, so no record can be larger than the file: a
    // compressed one would let a small file ask for any amount of memory.
    RN_CHECK(st.comp_method == ZIP_CM_STORE)
        << "PyTorch file '" << what_ << "': the record '" << name
        << "' is compressed; torch.save stores its records uncompressed (was the archive repacked?)";
    RN_CHECK(st.size <= limit_) << "PyTorch file '" << what_ << "': the record '" << name << "' claims " << st.size
                                << " bytes, more than the file's " << limit_;
    std::vector<std::byte> out(st.size);
    zip_file_t* f = zip_fopen_index(za_.z, static_cast<zip_uint64_t>(index), 0);
    RN_CHECK(f != nullptr) << "PyTorch file '" << what_ << "': cannot open the record '" << name
                           << "': " << zip_strerror(za_.z);
    zip_int64_t got = 0;
    while (static_cast<zip_uint64_t>(got) < st.size) {
      const zip_int64_t r = zip_fread(f, out.data() + got, st.size - static_cast<zip_uint64_t>(got));
      if (r <= 0) break;
      got += r;
    }
    // Reading to the end lets libzip check the record's CRC.
    char extra;
    const zip_int64_t tail = static_cast<zip_uint64_t>(got) == st.size ? zip_fread(f, &extra, 1) : 0;
    const std::string err = zip_file_strerror(f);
    zip_fclose(f);
    RN_CHECK(static_cast<zip_uint64_t>(got) == st.size && tail == 0)
        << "PyTorch file '" << what_ << "': the record '" << name << "' is damaged (read " << got << " of " << st.size
        << " bytes): " << err;
    return out;
  }

  const std::string& prefix() const { return prefix_; }

 private:
  std::string what_;
  ZipArchive za_;
  std::string prefix_;  // "<name>/"
  size_t limit_ = 0;
};

// The state dict inside the unpickled object.
const Value* find_state_dict(const Value* root, const std::string& what, std::string* key) {
  auto is_tensor_dict = [](const Value* v) {
    if (v->kind != Kind::Dict) return false;
    for (size_t k = 1; k < v->items.size(); k += 2)
      if (v->items[k]->kind == Kind::Tensor) return true;
    return v->items.empty();
  };
  if (root->kind == Kind::Object && root->items[0]->kind == Kind::Global && is_module_class(root->items[0]->s)) {
    RN_FAIL() << "PyTorch file '" << what << "': holds a pickled module (" << root->items[0]->s
              << "), not a state dict; save it with torch.save(model.state_dict(), path) and import that";
  }
  RN_CHECK(root->kind == Kind::Dict) << "PyTorch file '" << what << "': holds " << describe(root)
                                     << ", not a state dict (a dict of tensors)";
  std::string keys;
  for (size_t k = 0; k < root->items.size(); k += 2) {
    const Value* name = root->items[k];
    if (name->kind != Kind::Str) continue;
    if (k < 40) keys += (keys.empty() ? "'" : ", '") + name->s.substr(0, 60) + "'";
  }
  for (const char* want : {"state_dict", "model", "model_state_dict", "model_state", "module"}) {
    for (size_t k = 0; k + 1 < root->items.size(); k += 2) {
      const Value* name = root->items[k];
      const Value* v = root->items[k + 1];
      if (name->kind != Kind::Str || name->s != want) continue;
      if (v->kind == Kind::Object && v->items[0]->kind == Kind::Global && is_module_class(v->items[0]->s)) {
        RN_FAIL() << "PyTorch file '" << what << "': '" << want << "' holds a pickled module (" << v->items[0]->s
                  << "), not a state dict; save model.state_dict() instead";
      }
      if (is_tensor_dict(v) && !v->items.empty()) {
        *key = want;
        return v;
      }
    }
  }
  // A checkpoint may hold a tensor or two beside its state dict (a best accuracy); the keys
  // above come first.
  if (is_tensor_dict(root) && !root->items.empty()) {
    key->clear();
    return root;
  }
  RN_FAIL() << "PyTorch file '" << what
            << "': holds a dict with no tensors at the top (keys: " << (keys.empty() ? "none" : keys)
            << ") and none under 'state_dict', 'model', 'model_state_dict', 'model_state' or 'module'";
}

// A tensor's bytes from its storage's: the size, stride and offset applied, row-major.
TorchTensor materialise(const std::string& name, const Value* t, const std::vector<std::byte>& storage,
                        const std::string& what) {
  const Value* s = t->storage;
  const size_t e = s->element_size;
  const std::string where = "PyTorch file '" + what + "': tensor '" + name + "'";
  RN_CHECK(storage.size() / e >= static_cast<uint64_t>(s->i) && storage.size() == static_cast<uint64_t>(s->i) * e)
      << where << ": its storage '" << s->s << "' holds " << storage.size() << " bytes, expected " << s->i
      << " elements of " << e << " bytes";
  TorchTensor out;
  out.dtype = s->dtype;
  out.element_size = e;
  out.shape = t->size;
  // Every element must be its own element of the storage (no expanded views), so the copy is
  // never larger than the storage, and the last one must lie inside it.
  __int128 count = 1, last = t->i;
  for (size_t d = 0; d < t->size.size(); ++d) {
    count *= t->size[d];
    RN_CHECK(count <= s->i || t->size[d] == 0 || count == 0)
        << where << ": its size has more elements than its storage '" << s->s << "' (" << s->i
        << "); expanded views are not supported";
  }
  if (count == 0) return out;
  for (size_t d = 0; d < t->size.size(); ++d) last += static_cast<__int128>(t->size[d] - 1) * t->stride[d];
  RN_CHECK(last < s->i) << where << ": its size, stride and offset reach past the end of its storage '" << s->s << "' ("
                        << s->i << " elements)";
  out.data.resize(static_cast<size_t>(count) * e);
  // Row-major strides: one copy.
  bool dense = true;
  int64_t expect = 1;
  for (size_t d = t->size.size(); d-- > 0;) {
    if (t->size[d] != 1 && t->stride[d] != expect) dense = false;
    expect *= t->size[d];
  }
  const std::byte* base = storage.data();
  if (dense) {
    std::memcpy(out.data.data(), base + static_cast<size_t>(t->i) * e, out.data.size());
    return out;
  }
  const size_t rank = t->size.size();
  std::vector<int64_t> idx(rank, 0);
  for (size_t k = 0; k < static_cast<size_t>(count); ++k) {
    int64_t off = t->i;
    for (size_t d = 0; d < rank; ++d) off += idx[d] * t->stride[d];
    std::memcpy(out.data.data() + k * e, base + static_cast<size_t>(off) * e, e);
    for (size_t d = rank; d-- > 0;) {
      if (++idx[d] < t->size[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

TorchStateDict collect(const Value* root, const std::string& what, const std::string& format,
                       const std::function<const std::vector<std::byte>&(const Value* storage)>& bytes_of) {
  TorchStateDict sd;
  sd.format = format;
  const Value* dict = find_state_dict(root, what, &sd.key);
  for (size_t k = 0; k + 1 < dict->items.size(); k += 2) {
    const Value* name = dict->items[k];
    const Value* v = dict->items[k + 1];
    RN_CHECK(name->kind == Kind::Str) << "PyTorch file '" << what << "': the state dict has a key that is "
                                      << describe(name) << ", not a string";
    if (v->kind != Kind::Tensor) {
      sd.other_entries.push_back(name->s);
      continue;
    }
    for (const auto& [seen, unused] : sd.tensors) {
      (void)unused;
      RN_CHECK(seen != name->s) << "PyTorch file '" << what << "': the state dict has the key '" << name->s
                                << "' twice";
    }
    sd.tensors.emplace_back(name->s, materialise(name->s, v, bytes_of(v->storage), what));
  }
  return sd;
}

TorchStateDict parse_zip(std::span<const std::byte> bytes, const std::string& what) {
  ZipReader zip(bytes, what);
  if (zip.has("byteorder")) {
    const std::vector<std::byte> b = zip.read("byteorder");
    const std::string order(reinterpret_cast<const char*>(b.data()), b.size());
    RN_CHECK(order == "little") << "PyTorch file '" << what << "': written on a '" << order.substr(0, 20)
                                << "'-endian machine; only little-endian files are read";
  }
  const std::vector<std::byte> pkl = zip.read("data.pkl");
  std::vector<std::unique_ptr<Value>> arena;
  Unpickler up(what, arena);
  const auto [root, end] = up.run(pkl, 0, zip.prefix() + "data.pkl");
  (void)end;
  std::map<std::string, std::vector<std::byte>> storages;
  return collect(root, what, "zip", [&](const Value* s) -> const std::vector<std::byte>& {
    auto it = storages.find(s->s);
    if (it == storages.end()) it = storages.emplace(s->s, zip.read("data/" + s->s)).first;
    return it->second;
  });
}

TorchStateDict parse_legacy(std::span<const std::byte> bytes, const std::string& what) {
  std::vector<std::unique_ptr<Value>> arena;
  Unpickler up(what, arena);
  auto [magic, p1] = up.run(bytes, 0, "the magic number");
  static const unsigned char kMagic[] = {0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
  RN_CHECK(magic->kind == Kind::BigInt &&
           magic->s == std::string(reinterpret_cast<const char*>(kMagic), sizeof(kMagic)))
      << "PyTorch file '" << what << "': a pickle, but not torch.save's (its magic number is missing)";
  auto [protocol, p2] = up.run(bytes, p1, "the protocol version");
  RN_CHECK(protocol->kind == Kind::Int && protocol->i == 1001)
      << "PyTorch file '" << what << "': legacy format protocol " << (protocol->kind == Kind::Int ? protocol->i : -1)
      << ", expected 1001";
  auto [sys_info, p3] = up.run(bytes, p2, "the system info");
  if (sys_info->kind == Kind::Dict) {
    for (size_t k = 0; k + 1 < sys_info->items.size(); k += 2) {
      const Value* n = sys_info->items[k];
      const Value* v = sys_info->items[k + 1];
      if (n->kind == Kind::Str && n->s == "little_endian") {
        RN_CHECK(v->kind == Kind::Bool && v->i == 1)
            << "PyTorch file '" << what << "': written on a big-endian machine; only little-endian files are read";
      }
    }
  }
  auto [root, p4] = up.run(bytes, p3, "the object");
  auto [keys, p5] = up.run(bytes, p4, "the storage keys");
  RN_CHECK(keys->kind == Kind::List) << "PyTorch file '" << what << "': its storage keys are " << describe(keys);
  // The element size of each storage, from the tensors that use it.
  std::map<std::string, size_t> element_size;
  for (const auto& v : arena)
    if (v->kind == Kind::Storage) element_size[v->s] = v->element_size;
  std::map<std::string, std::vector<std::byte>> storages;
  size_t pos = p5;
  for (const Value* k : keys->items) {
    RN_CHECK(k->kind == Kind::Str) << "PyTorch file '" << what << "': a storage key is " << describe(k);
    auto e = element_size.find(k->s);
    RN_CHECK(e != element_size.end()) << "PyTorch file '" << what << "': storage '" << k->s
                                      << "' is listed but no tensor uses it";
    RN_CHECK(bytes.size() - pos >= 8) << "PyTorch file '" << what << "': ends before storage '" << k->s << "'";
    uint64_t n = 0;
    for (size_t b = 0; b < 8; ++b) n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[pos + b])) << (8 * b);
    pos += 8;
    RN_CHECK(n <= (bytes.size() - pos) / e->second)
        << "PyTorch file '" << what << "': storage '" << k->s << "' claims " << n << " elements of " << e->second
        << " bytes, more than the " << bytes.size() - pos << " bytes left";
    const size_t len = static_cast<size_t>(n) * e->second;
    RN_CHECK(storages.count(k->s) == 0) << "PyTorch file '" << what << "': storage '" << k->s << "' is listed twice";
    storages[k->s].assign(bytes.begin() + static_cast<std::ptrdiff_t>(pos),
                          bytes.begin() + static_cast<std::ptrdiff_t>(pos + len));
    pos += len;
  }
  return collect(root, what, "legacy", [&](const Value* s) -> const std::vector<std::byte>& {
    auto it = storages.find(s->s);
    RN_CHECK(it != storages.end()) << "PyTorch file '" << what << "': storage '" << s->s
                                   << "' is used by a tensor but not in the file";
    return it->second;
  });
}

}  // namespace

bool looks_like_torch_file(std::span<const std::byte> head) {
  auto at = [&](size_t k) { return k < head.size() ? static_cast<uint8_t>(head[k]) : 0xffu; };
  if (at(0) == 'P' && at(1) == 'K' && at(2) == 3 && at(3) == 4) return true;
  // The legacy container opens with the pickled magic number: PROTO, then LONG1 (or, from
  // protocol 4, a FRAME first). As a safetensors header length these bytes would be at least
  // 9 MB of JSON, so the two formats do not meet in practice.
  return at(0) == 0x80 && at(1) >= 2 && at(1) <= 5 && (at(2) == 0x8a || (at(1) >= 4 && at(2) == 0x95));
}

TorchStateDict parse_torch_state_dict(std::span<const std::byte> bytes, const std::string& what) {
  auto at = [&](size_t k) { return k < bytes.size() ? static_cast<uint8_t>(bytes[k]) : 0xffu; };
  RN_CHECK(!bytes.empty()) << "PyTorch file '" << what
                           << "': it is empty (0 bytes): was the download or copy cut short?";
  if (at(0) == 'P' && at(1) == 'K' && at(2) == 3 && at(3) == 4) return parse_zip(bytes, what);
  if (at(0) == 0x80) return parse_legacy(bytes, what);
  // tar (PyTorch before 0.4) has "ustar" at 257.
  if (bytes.size() > 262 && std::memcmp(bytes.data() + 257, "ustar", 5) == 0)
    RN_FAIL()
        << "PyTorch file '" << what
        << "': the tar format of PyTorch before 0.4, which is not read; load and save it again with a newer PyTorch";
  RN_FAIL() << "PyTorch file '" << what << "': neither a zip archive nor a pickle, so not written by torch.save";
}

TorchStateDict read_torch_state_dict(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  RN_CHECK(in) << "PyTorch file '" << path << "': cannot open it: " << std::strerror(errno);
  const std::streamoff size = in.tellg();
  RN_CHECK(size >= 0) << "PyTorch file '" << path << "': cannot tell its size";
  std::vector<std::byte> bytes(static_cast<size_t>(size));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), size);
  RN_CHECK(in.gcount() == size) << "PyTorch file '" << path << "': read " << in.gcount() << " of " << size << " bytes";
  return parse_torch_state_dict(bytes, path);
}

}  // namespace rn
