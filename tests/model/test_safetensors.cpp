// safetensors reader and writer: round trips, the writer's atomicity, one test per malformed
// input the reader must refuse, and interop with tools/torchvision_to_safetensors.py.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/utf8.h"
#include "model/safetensors.h"

namespace rn {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file: length, header text exactly as given (no padding), data.
std::string file_bytes(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `fn`, expecting an rn::Error whose message names `path` and contains every phrase.
void expect_error(const std::function<void()>& fn, const std::string& path, const std::vector<std::string>& phrases) {
  try {
    fn();
    ADD_FAILURE() << "no rn::Error thrown for " << path;
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_THAT(message, HasSubstr(path));
    for (const std::string& p : phrases) EXPECT_THAT(message, HasSubstr(p));
  }
}

void expect_load_error(const std::string& path, const std::vector<std::string>& phrases) {
  expect_error([&] { (void)SafetensorsFile::load(path); }, path, phrases);
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& c : name)
      if (c == '/') c = '_';
    dir_ = fs::path(::testing::TempDir()) / ("rn_safetensors_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

HostTensor filled(Shape shape, DType dtype, int seed) {
  HostTensor t(shape, dtype);
  auto* bytes = static_cast<unsigned char*>(t.view().data);
  for (size_t i = 0; i < t.view().bytes(); ++i) bytes[i] = static_cast<unsigned char>(i * 31 + seed * 7 + 1);
  return t;
}

TEST_F(SafetensorsTest, RoundTripDtypesAndShapes) {
  std::vector<std::pair<std::string, HostTensor>> owned;
  owned.emplace_back("odd.u8", filled({5}, DType::u8, 1));
  owned.emplace_back("half.bf16", filled({7}, DType::bf16, 2));
  owned.emplace_back("conv.weight", filled({2, 3, 4, 5}, DType::f32, 3));
  owned.emplace_back("half.f16", filled({3, 2}, DType::f16, 4));
  owned.emplace_back("rank5.i32", filled({4, 1, 1, 1, 2}, DType::i32, 5));
  owned.emplace_back("scalar", filled(Shape{}, DType::f32, 6));
  owned.emplace_back("empty", filled({0, 3}, DType::f32, 7));
  owned.emplace_back("more.u8", filled({3}, DType::u8, 8));
  std::vector<std::pair<std::string, Tensor>> tensors;
  uint64_t data_bytes = 0;
  for (const auto& [name, t] : owned) {
    tensors.emplace_back(name, t.view());
    data_bytes += t.view().bytes();
  }
  const std::string file = path("round.safetensors");
  write_safetensors(file, tensors);

  SafetensorsFile f = SafetensorsFile::load(file);
  EXPECT_EQ(f.path(), file);
  // Only the data's and the header's CRC-32, which the writer adds.
  ASSERT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.metadata().count(std::string(kDataCrc32Key)), 1u);
  EXPECT_EQ(f.metadata().count(std::string(kHeaderCrc32Key)), 1u);
  ASSERT_EQ(f.entries().size(), owned.size());
  EXPECT_EQ(f.find("absent"), nullptr);
  for (const auto& [name, t] : owned) {
    SCOPED_TRACE(name);
    const SafetensorsEntry* e = f.find(name);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->dtype_tag, safetensors_dtype_tag(t.view().dtype));
    EXPECT_EQ(e->begin % e->element_size, 0u);  // the writer keeps offsets aligned
    Tensor v = f.view(name);
    EXPECT_EQ(v.dtype, t.view().dtype);
    EXPECT_EQ(v.shape, t.view().shape);
    EXPECT_EQ(v.shape.rank(), t.view().shape.rank());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % dtype_size(v.dtype), 0u);
    EXPECT_EQ(std::memcmp(v.data, t.view().data, t.view().bytes()), 0);
    EXPECT_EQ(f.raw(name).size(), t.view().bytes());
  }
  EXPECT_EQ(f.view("scalar").shape.rank(), 0);
  EXPECT_EQ(f.view("scalar").numel(), 1);
  EXPECT_EQ(f.view("empty").numel(), 0);
  // Entries come in file order; larger elements were written first.
  for (size_t i = 1; i < f.entries().size(); ++i) {
    EXPECT_LE(f.entries()[i - 1].begin, f.entries()[i].begin);
    EXPECT_GE(f.entries()[i - 1].element_size, f.entries()[i].element_size);
  }
  const std::string bytes = read_bytes(file);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = (header << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ(bytes.size(), 8 + header + data_bytes);

  // A moved file keeps its views valid (the data does not move).
  Tensor before = f.view("conv.weight");
  SafetensorsFile g = std::move(f);
  EXPECT_EQ(g.view("conv.weight").data, before.data);
}

// A flipped bit in a metadata value leaves valid JSON and a plausible value: the header's CRC-32
// finds it. An edit made on purpose is resealed.
TEST_F(SafetensorsTest, AFlippedBitInTheHeaderIsDamage) {
  const std::string file = path("meta.safetensors");
  write_safetensors(file, {}, {{"train.step", "6"}});
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = bytes.find("\"train.step\":\"6\"");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 14] = '7';  // '6' ^ 0x01
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  try {
    SafetensorsFile::load(file);
    ADD_FAILURE() << "loaded a header with a flipped bit";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(file));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("the header is damaged: its CRC-32 is"));
  }
  ASSERT_TRUE(reseal_header_crc(bytes));
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_EQ(SafetensorsFile::load(file).metadata().at("train.step"), "7");
}

TEST_F(SafetensorsTest, MetadataRoundTrip) {
  HostTensor t = filled({4}, DType::f32, 1);
  const std::string unicode = "gr\xc3\xbc\xc3\x9f"  // UTF-8
                               "e";
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"model", "resnet50"}, {"empty", ""}, {"unicode", unicode}, {"quote", "a\"b\\c\n"}};
  const std::string file = path("meta.safetensors");
  write_safetensors(file, {{"w", t.view()}}, metadata);
  SafetensorsFile f = SafetensorsFile::load(file);
  const auto without_crc = [](std::map<std::string, std::string> m) {
    EXPECT_EQ(m.erase(std::string(kDataCrc32Key)), 1u);
    EXPECT_EQ(m.erase(std::string(kHeaderCrc32Key)), 1u);
    return m;
  };
  EXPECT_EQ(without_crc(f.metadata()), metadata);
  EXPECT_EQ(f.entries().size(), 1u);

  // Metadata alone, no tensors, is a valid file too.
  write_safetensors(file, {}, metadata);
  SafetensorsFile empty = SafetensorsFile::load(file);
  EXPECT_TRUE(empty.entries().empty());
  EXPECT_EQ(without_crc(empty.metadata()), metadata);
}

// A flipped bit in the tensor data passes every check of the format; the CRC-32 the writer
// records finds it, and the error names the file.
TEST_F(SafetensorsTest, AFlippedDataBitIsFoundByTheChecksum) {
  HostTensor t = filled({64}, DType::f32, 3);
  const std::string file = path("crc.safetensors");
  write_safetensors(file, {{"w", t.view()}});
  std::string bytes = read_bytes(file);
  bytes[bytes.size() - 100] ^= 0x40;
  std::ofstream(file, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  try {
    SafetensorsFile::load(file);
    ADD_FAILURE() << "a damaged file loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("safetensors file '" + file + "': the tensor data is damaged"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(SafetensorsTest, HeaderIsPaddedWithSpacesToEightBytes) {
  HostTensor t = filled({3}, DType::f32, 1);
  for (size_t length = 1; length <= 9; ++length) {
    const std::string name(length, 'n');
    SCOPED_TRACE(name);
    const std::string file = path("pad.safetensors");
    write_safetensors(file, {{name, t.view()}});
    const std::string bytes = read_bytes(file);
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = (header << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
    EXPECT_EQ(header % 8, 0u);
    const std::string text = bytes.substr(8, header);
    EXPECT_EQ(text.front(), '{');
    const size_t last = text.find_last_not_of(' ');
    EXPECT_EQ(text[last], '}');
    EXPECT_LT(text.size() - 1 - last, 8u);
    EXPECT_EQ(SafetensorsFile::load(file).view(name).numel(), 3);
  }
}

TEST_F(SafetensorsTest, ReadsUnpaddedHeaderAndMisalignedOffsets) {
  // Another writer may leave the header unpadded and put an F32 at an odd offset.
  const std::string header =
      R"({"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"f":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  float values[2] = {1.5f, -2.25f};
  std::string data(1, '\x07');
  data.append(reinterpret_cast<const char*>(values), sizeof(values));
  const std::string file = path("odd.safetensors");
  write_bytes(file, file_bytes(header, data));
  SafetensorsFile f = SafetensorsFile::load(file);
  Tensor v = f.view("f");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % 4, 0u);
  EXPECT_EQ(v.ptr<float>()[0], 1.5f);
  EXPECT_EQ(v.ptr<float>()[1], -2.25f);
  EXPECT_EQ(f.view("b").ptr<uint8_t>()[0], 7);
}

TEST_F(SafetensorsTest, KnownUnmappableDtypeLoadsButViewRefuses) {
  const std::string header = R"({"bn1.num_batches_tracked":{"dtype":"I64","shape":[],"data_offsets":[0,8]}})";
  const std::string file = path("i64.safetensors");
  write_bytes(file, file_bytes(header, le64(5)));
  SafetensorsFile f = SafetensorsFile::load(file);
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_FALSE(f.entries()[0].dtype.has_value());
  EXPECT_EQ(f.entries()[0].element_size, 8u);
  expect_error([&] { (void)f.view("bn1.num_batches_tracked"); }, file, {"bn1.num_batches_tracked", "I64"});
  std::span<const std::byte> raw = f.raw("bn1.num_batches_tracked");
  ASSERT_EQ(raw.size(), 8u);
  EXPECT_EQ(std::memcmp(raw.data(), le64(5).data(), 8), 0);
}

TEST_F(SafetensorsTest, ViewOfMissingTensorNamesIt) {
  HostTensor t = filled({1}, DType::f32, 1);
  const std::string file = path("one.safetensors");
  write_safetensors(file, {{"w", t.view()}});
  SafetensorsFile f = SafetensorsFile::load(file);
  expect_error([&] { (void)f.view("fc.weight"); }, file, {"no tensor named 'fc.weight'"});
  expect_error([&] { (void)f.raw("fc.weight"); }, file, {"no tensor named 'fc.weight'"});
}

// ----- The reader refuses malformed files ---------------------------------------------------

TEST_F(SafetensorsTest, MissingFileAndDirectory) {
  expect_load_error(path("absent.safetensors"), {"cannot open", "No such file"});
  fs::create_directory(path("dir.safetensors"));
  expect_load_error(path("dir.safetensors"), {"not a regular file"});
}

TEST_F(SafetensorsTest, TruncatedAtEveryStage) {
  HostTensor a = filled({16}, DType::f32, 1), b = filled({3, 3}, DType::f16, 2);
  const std::string good = path("good.safetensors");
  write_safetensors(good, {{"a", a.view()}, {"b", b.view()}}, {{"k", "v"}});
  const std::string bytes = read_bytes(good);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = (header << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  struct Cut {
    size_t size;
    std::string phrase;
  };
  const std::vector<Cut> cuts = {
      {0, "too short"},
      {1, "too short"},
      {7, "too short"},
      {8, "exceeds the file"},                             // length only
      {8 + header / 2, "exceeds the file"},                // half the header
      {8 + header - 1, "exceeds the file"},                // all but one header byte
      {8 + header, "end past the data section"},           // no data at all
      {8 + header + 64 + 3, "end past the data section"},  // inside the first tensor
      {bytes.size() - 1, "end past the data section"},     // last byte missing
  };
  for (const Cut& cut : cuts) {
    SCOPED_TRACE(cut.size);
    const std::string file = path("cut" + std::to_string(cut.size) + ".safetensors");
    write_bytes(file, bytes.substr(0, cut.size));
    expect_load_error(file, {cut.phrase});
  }
}

TEST_F(SafetensorsTest, HeaderLengthAbsurd) {
  const std::string file = path("absurd.safetensors");
  write_bytes(file, le64(1ull << 40) + "{}");
  expect_load_error(file, {"header length 1099511627776 is absurd"});
  write_bytes(file, le64(~0ull) + "{}");
  expect_load_error(file, {"is absurd", "this is not a safetensors file;"});
  // Another kind of file where weights were expected: its text start is shown.
  write_bytes(file, "index,label,top1\n0,3,3\n");
  expect_load_error(file, {"this is not a safetensors file (it starts with the text 'index,la')"});
}

// A parser's message quotes the bytes it stopped at: text stays as it is, the rest is shown.
TEST(Printable, ShowsBytesThatAreNotTextAsEscapes) {
  EXPECT_EQ(printable("layer1.0 \xc3\xa9t\xc3\xa9"), "layer1.0 \xc3\xa9t\xc3\xa9");  // UTF-8 kept
  EXPECT_EQ(printable("a\xff\xfe"
                      "b"),
            "a\\xff\\xfeb");
  EXPECT_EQ(printable("\x1b[31mred"), "\\x1b[31mred");  // a terminal escape, shown
  EXPECT_EQ(printable(std::string("\0z", 2)), "\\x00z");
  EXPECT_EQ(printable("\xc3"), "\\xc3");  // a sequence cut short
}

TEST_F(SafetensorsTest, HeaderLengthLargerThanFile) {
  const std::string file = path("long.safetensors");
  write_bytes(file, le64(1000) + "{}      ");
  expect_load_error(file, {"header length 1000 exceeds the file"});
}

// One malformed header per case: the header text, the data section, and what the error must say.
struct MalformedCase {
  std::string name;
  std::string header;
  size_t data_bytes;
  std::vector<std::string> phrases;
};

std::ostream& operator<<(std::ostream& os, const MalformedCase& c) { return os << c.name; }

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":" + dtype + ",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
}

// An empty array nested `depth` deep: [[[...]]].
std::string nested(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

const std::vector<MalformedCase>& malformed_cases() {
  static const std::vector<MalformedCase> cases = {
      {"BadJson", R"({"w":{"dtype":"F32",)", 8, {"not valid JSON"}},
      {"TrailingGarbage", "{" + entry("w", "\"F32\"", "[2]", "[0,8]") + "} x", 8, {"not valid JSON"}},
      {"EmptyHeader", "", 8, {"not valid JSON"}},
      {"InvalidUtf8", "{\"w\xff\":{}}", 0, {"not valid JSON", "'\"w\\xff'"}},  // the byte shown, not sent raw
      {"HeaderNotObject", "[1,2]", 0, {"header is a JSON array, expected an object"}},
      {"EntryNotObject", R"({"w":5})", 0, {"tensor 'w'", "entry is a JSON number, expected an object"}},
      {"EntryIsArray", R"({"w":["F32"]})", 0, {"tensor 'w'", "expected an object"}},
      {"MissingField", R"({"w":{"dtype":"F32","shape":[2]}})", 8, {"tensor 'w'", "missing field 'data_offsets'"}},
      {"ExtraField",
       R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"stride":[1]}})",
       8,
       {"tensor 'w'", "unexpected field 'stride'"}},
      {"UnknownDtype", "{" + entry("w", "\"F33\"", "[2]", "[0,8]") + "}", 8, {"tensor 'w'", "unknown dtype 'F33'"}},
      {"LowercaseDtype", "{" + entry("w", "\"f32\"", "[2]", "[0,8]") + "}", 8, {"unknown dtype 'f32'"}},
      {"DtypeNotString", "{" + entry("w", "32", "[2]", "[0,8]") + "}", 8, {"tensor 'w'", "dtype is a JSON number"}},
      {"ShapeNotArray", "{" + entry("w", "\"F32\"", "2", "[0,8]") + "}", 8, {"tensor 'w'", "shape is a JSON number"}},
      {"ShapeNegative",
       "{" + entry("w", "\"F32\"", "[-2]", "[0,8]") + "}",
       8,
       {"tensor 'w'", "not a non-negative integer"}},
      {"ShapeFloat", "{" + entry("w", "\"F32\"", "[2.0]", "[0,8]") + "}", 8, {"not a non-negative integer"}},
      {"ShapeString", "{" + entry("w", "\"F32\"", "[\"2\"]", "[0,8]") + "}", 8, {"not a non-negative integer"}},
      {"ShapeRankSix",
       "{" + entry("w", "\"F32\"", "[1,1,1,1,1,2]", "[0,8]") + "}",
       8,
       {"tensor 'w'", "rank 6, more than 5"}},
      {"ShapeOverflow",
       "{" + entry("w", "\"F32\"", "[4611686018427387904,4]", "[0,8]") + "}",
       8,
       {"tensor 'w'", "overflows"}},
      {"ShapeBytesOverflow", "{" + entry("w", "\"F64\"", "[4611686018427387904]", "[0,8]") + "}", 8, {"overflows"}},
      {"ShapeHuge",
       "{" + entry("w", "\"F32\"", "[18446744073709551615]", "[0,8]") + "}",
       8,
       {"not a non-negative integer"}},
      {"OffsetsThree",
       "{" + entry("w", "\"F32\"", "[2]", "[0,4,8]") + "}",
       8,
       {"tensor 'w'", "not an array of two non-negative integers"}},
      {"OffsetsNegative", "{" + entry("w", "\"F32\"", "[2]", "[-8,0]") + "}", 8, {"not an array of two"}},
      {"OffsetsNotArray", "{" + entry("w", "\"F32\"", "[2]", "8") + "}", 8, {"not an array of two"}},
      {"OffsetsReversed", "{" + entry("w", "\"F32\"", "[2]", "[8,0]") + "}", 8, {"tensor 'w'", "begin > end"}},
      {"OffsetsPastEnd",
       "{" + entry("w", "\"F32\"", "[4]", "[0,16]") + "}",
       8,
       {"tensor 'w'", "end past the data section (8 bytes"}},
      {"OffsetsHugePastEnd",
       "{" + entry("w", "\"F32\"", "[2]", "[18446744073709551608,18446744073709551615]") + "}",
       8,
       {"end past the data section"}},
      {"SizeMismatch",
       "{" + entry("w", "\"F32\"", "[3]", "[0,8]") + "}",
       8,
       {"tensor 'w'", "size mismatch", "needs 12"}},
      {"SizeMismatchDtype", "{" + entry("w", "\"F16\"", "[2]", "[0,8]") + "}", 8, {"size mismatch"}},
      {"Overlapping",
       "{" + entry("a", "\"F32\"", "[2]", "[0,8]") + "," + entry("b", "\"F32\"", "[2]", "[4,12]") + "}",
       12,
       {"tensor 'b'", "overlapping", "tensor 'a'"}},
      {"Identical",
       "{" + entry("a", "\"F32\"", "[2]", "[0,8]") + "," + entry("b", "\"F32\"", "[2]", "[0,8]") + "}",
       8,
       {"overlapping"}},
      {"Hole",
       "{" + entry("a", "\"F32\"", "[1]", "[0,4]") + "," + entry("b", "\"F32\"", "[1]", "[8,12]") + "}",
       12,
       {"bytes [4, 8)", "not covered", "tensor 'b'"}},
      {"HoleAtStart", "{" + entry("a", "\"F32\"", "[1]", "[4,8]") + "}", 8, {"bytes [0, 4)", "not covered"}},
      {"TrailingBytes", "{" + entry("w", "\"F32\"", "[2]", "[0,8]") + "}", 12, {"bytes [8, 12)", "not covered"}},
      {"DataWithoutTensors", "{}", 4, {"bytes [0, 4)", "not covered"}},
      {"DuplicateTensor",
       "{" + entry("w", "\"F32\"", "[1]", "[0,4]") + "," + entry("w", "\"F32\"", "[1]", "[4,8]") + "}",
       8,
       {"key 'w' twice"}},
      {"DuplicateField",
       R"({"w":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}})",
       8,
       {"key 'dtype' twice"}},
      {"EmptyName", "{" + entry("", "\"F32\"", "[2]", "[0,8]") + "}", 8, {"empty name"}},
      // Nested 300000 deep: the message shows an excerpt (dump() recursed once per level and
      // overflowed the stack).
      {"ShapeNestedDeep",
       "{" + entry("w", "\"F32\"", nested(300000), "[0,0]") + "}",
       0,
       {"tensor 'w'", "shape [[[[[...]]]]] has an element that is not"}},
      {"OffsetsNestedDeep",
       "{" + entry("w", "\"F32\"", "[0]", nested(300000)) + "}",
       0,
       {"tensor 'w'", "data_offsets [[[[[...]]]]] is not an array of two"}},
      {"ShapeLongString",
       "{" + entry("w", "\"F32\"", "[\"" + std::string(100000, 'a') + "\"]", "[0,0]") + "}",
       0,
       {"tensor 'w'", "shape [\"aaaaaaaaaa", "a... has an element"}},
      {"MetadataNotObject", R"({"__metadata__":["a"]})", 0, {"__metadata__ is a JSON array"}},
      {"MetadataValueNotString",
       R"({"__metadata__":{"epoch":3}})",
       0,
       {"__metadata__ value for 'epoch' is a JSON number"}},
  };
  return cases;
}

class SafetensorsMalformedTest : public SafetensorsTest, public ::testing::WithParamInterface<MalformedCase> {};

TEST_P(SafetensorsMalformedTest, IsRefused) {
  const MalformedCase& c = GetParam();
  const std::string file = path(c.name + ".safetensors");
  write_bytes(file, file_bytes(c.header, std::string(c.data_bytes, '\x11')));
  expect_load_error(file, c.phrases);
}

INSTANTIATE_TEST_SUITE_P(Header, SafetensorsMalformedTest, ::testing::ValuesIn(malformed_cases()),
                         [](const ::testing::TestParamInfo<MalformedCase>& info) { return info.param.name; });

TEST_F(SafetensorsTest, AcceptsEmptyTensorsAnywhereInRange) {
  // Zero-byte tensors may sit at any offset up to the end; they cover nothing and overlap nothing.
  const std::string header = "{" + entry("a", "\"F32\"", "[2]", "[0,8]") + "," + entry("e", "\"F32\"", "[0]", "[4,4]") +
                             "," + entry("z", "\"U8\"", "[0,7]", "[8,8]") + "}";
  const std::string file = path("empty.safetensors");
  write_bytes(file, file_bytes(header, std::string(8, '\0')));
  SafetensorsFile f = SafetensorsFile::load(file);
  EXPECT_EQ(f.entries().size(), 3u);
  EXPECT_EQ(f.view("z").shape, (Shape{0, 7}));
}

// ----- The writer -------------------------------------------------------------------------

TEST_F(SafetensorsTest, WriterRefusesBadNamesAndTensors) {
  HostTensor t = filled({2}, DType::f32, 1);
  const std::string file = path("bad.safetensors");
  expect_error([&] { write_safetensors(file, {{"w", t.view()}, {"w", t.view()}}); }, file, {"'w' appears twice"});
  expect_error([&] { write_safetensors(file, {{"", t.view()}}); }, file, {"empty name"});
  expect_error([&] { write_safetensors(file, {{"__metadata__", t.view()}}); }, file, {"reserved"});
  HostTensor nhwc({1, 2, 2, 3}, DType::f32, Layout::nhwc);
  expect_error([&] { write_safetensors(file, {{"x", nhwc.view()}}); }, file, {"'x'", "nhwc"});
  Tensor dangling = t.view();
  dangling.data = nullptr;
  expect_error([&] { write_safetensors(file, {{"d", dangling}}); }, file, {"'d' has no data"});
  Tensor device = t.view();
  device.device = Device::cuda;
  expect_error([&] { write_safetensors(file, {{"g", device}}); }, file, {"'g' is on cuda"});
  expect_error([&] { write_safetensors(file, {{"w", t.view()}}, {{"bad", "\xff"}}); }, file, {"cannot encode"});
  EXPECT_TRUE(listing().empty());
}

TEST_F(SafetensorsTest, RejectedWriteLeavesExistingTargetIntact) {
  HostTensor t = filled({4}, DType::f32, 1);
  const std::string file = path("target.safetensors");
  write_safetensors(file, {{"w", t.view()}});
  const std::string before = read_bytes(file);
  EXPECT_THROW(write_safetensors(file, {{"w", t.view()}, {"w", t.view()}}), Error);
  EXPECT_EQ(read_bytes(file), before);
  EXPECT_EQ(listing(), std::vector<std::string>{"target.safetensors"});
}

TEST_F(SafetensorsTest, FailedRenameRemovesTemporary) {
  // The target is a directory: everything is written, then the rename fails.
  HostTensor t = filled({4}, DType::f32, 1);
  const std::string target = path("target.safetensors");
  fs::create_directory(target);
  write_bytes((fs::path(target) / "keep").string(), "x");
  expect_error([&] { write_safetensors(target, {{"w", t.view()}}); }, target, {"rename", "Is a directory"});
  EXPECT_EQ(listing(), std::vector<std::string>{"target.safetensors"});
  EXPECT_EQ(read_bytes((fs::path(target) / "keep").string()), "x");
}

TEST_F(SafetensorsTest, MissingDirectoryFails) {
  HostTensor t = filled({4}, DType::f32, 1);
  const std::string file = path("no/such/dir/w.safetensors");
  expect_error([&] { write_safetensors(file, {{"w", t.view()}}); }, file,
               {"cannot create temporary", "No such file or directory"});
}

TEST_F(SafetensorsTest, UnwritableDirectoryLeavesTargetIntact) {
  HostTensor t = filled({4}, DType::f32, 1), u = filled({8}, DType::f32, 2);
  const std::string file = path("target.safetensors");
  write_safetensors(file, {{"w", t.view()}});
  const std::string before = read_bytes(file);
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec, fs::perm_options::replace);
  if (::access(dir_.c_str(), W_OK) == 0) {
    GTEST_SKIP() << "running with privileges that ignore directory permissions (root?); "
                    "FailedRenameRemovesTemporary and WriteErrorMidFileLeavesTargetIntact cover the failure paths";
  }
  expect_error([&] { write_safetensors(file, {{"w", u.view()}}); }, file,
               {"cannot create temporary", "Permission denied"});
  fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::replace);
  EXPECT_EQ(read_bytes(file), before);
  EXPECT_EQ(listing(), std::vector<std::string>{"target.safetensors"});
}

TEST_F(SafetensorsTest, WriteErrorMidFileLeavesTargetIntact) {
  // A file-size limit makes write() fail with EFBIG part-way through the data, even as root.
  HostTensor small = filled({4}, DType::f32, 1), big = filled({256, 1024}, DType::f32, 2);
  const std::string file = path("target.safetensors");
  write_safetensors(file, {{"w", small.view()}});
  const std::string before = read_bytes(file);

  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit limited = old;
  limited.rlim_cur = 64 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  std::string message;
  try {
    write_safetensors(file, {{"w", big.view()}});
  } catch (const Error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);

  EXPECT_THAT(message, HasSubstr(file));
  EXPECT_THAT(message, HasSubstr("write tensor data failed"));
  EXPECT_THAT(message, HasSubstr("File too large"));
  EXPECT_EQ(read_bytes(file), before);
  EXPECT_EQ(listing(), std::vector<std::string>{"target.safetensors"});
}

TEST_F(SafetensorsTest, OverwriteReplacesTarget) {
  HostTensor t = filled({4}, DType::f32, 1), u = filled({2, 2}, DType::bf16, 2);
  const std::string file = path("target.safetensors");
  write_safetensors(file, {{"w", t.view()}});
  write_safetensors(file, {{"v", u.view()}});
  SafetensorsFile f = SafetensorsFile::load(file);
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.entries()[0].name, "v");
  EXPECT_EQ(listing(), std::vector<std::string>{"target.safetensors"});
  EXPECT_EQ(fs::status(file).permissions() & fs::perms::owner_read, fs::perms::owner_read);
}

// ----- Interop with tools/torchvision_to_safetensors.py -------------------------------------

class SafetensorsConverterTest : public SafetensorsTest {
 protected:
  void run_tool(const std::string& arguments) {
    const std::string log = path("tool.log");
    const std::string tool = RN_SOURCE_DIR "/tools/torchvision_to_safetensors.py";
    const std::string command = "/usr/bin/python3 '" + tool + "' " + arguments + " > '" + log + "' 2>&1";
    int status = std::system(command.c_str());
    ASSERT_EQ(status, 0) << command << "\n" << read_bytes(log);
  }
};

TEST_F(SafetensorsConverterTest, Resnet18RoundTrip) {
  if (std::system("/usr/bin/python3 -c 'import torch, torchvision' > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch and torchvision (Debian: python3-torch, python3-torchvision)";
  }
  // 1. torchvision's random resnet18 with a 5-class classifier (a fine-tuned model: every step
  // below must keep the file's classifier rather than torchvision's 1000 classes) ->
  // safetensors, read here.
  const std::string a = path("a.safetensors");
  ASSERT_NO_FATAL_FAILURE(run_tool("--model resnet18 --random --num-classes 5 --seed 3 --out '" + a + "'"));
  SafetensorsFile fa = SafetensorsFile::load(a);
  EXPECT_EQ(fa.entries().size(), 102u);  // 122 state-dict entries less 20 num_batches_tracked
  EXPECT_EQ(fa.metadata().at("model"), "resnet18");
  for (const SafetensorsEntry& e : fa.entries()) {
    EXPECT_THAT(e.name, ::testing::Not(HasSubstr("num_batches_tracked")));
    EXPECT_EQ(e.dtype_tag, "F32") << e.name;
  }
  EXPECT_EQ(fa.view("conv1.weight").shape, (Shape{64, 3, 7, 7}));
  EXPECT_EQ(fa.view("layer2.0.downsample.0.weight").shape, (Shape{128, 64, 1, 1}));
  EXPECT_EQ(fa.view("layer4.1.bn2.running_var").shape, (Shape{512}));
  EXPECT_EQ(fa.view("fc.weight").shape, (Shape{5, 512}));
  EXPECT_EQ(fa.view("fc.bias").shape, (Shape{5}));
  EXPECT_EQ(fa.view("bn1.weight").ptr<float>()[0], 1.0f);  // torchvision's BN initialisation
  EXPECT_NE(fa.view("conv1.weight").ptr<float>()[0], 0.0f);

  // 2. Written here (one value changed) -> torchvision state dict -> safetensors with the counters.
  std::vector<HostTensor> copies;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const SafetensorsEntry& e : fa.entries()) {
    Tensor v = fa.view(e.name);
    HostTensor& c = copies.emplace_back(v.shape, v.dtype);
    std::memcpy(c.view().data, v.data, v.bytes());
    tensors.emplace_back(e.name, c.view());
  }
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].first == "conv1.weight") copies[i].ptr<float>()[0] = 42.0f;
  const std::string b = path("b.safetensors"), pth = path("b.pth"), c = path("c.safetensors");
  write_safetensors(b, tensors, {{"format", "pt"}});
  ASSERT_NO_FATAL_FAILURE(run_tool("--model resnet18 --reverse '" + b + "' --out '" + pth + "'"));
  ASSERT_NO_FATAL_FAILURE(
      run_tool("--model resnet18 --weights '" + pth + "' --keep-num-batches-tracked --out '" + c + "'"));

  SafetensorsFile fb = SafetensorsFile::load(b), fc = SafetensorsFile::load(c);
  EXPECT_EQ(fc.entries().size(), 122u);
  for (const SafetensorsEntry& e : fb.entries()) {
    const SafetensorsEntry* back = fc.find(e.name);
    ASSERT_NE(back, nullptr) << e.name;
    EXPECT_EQ(back->shape, e.shape) << e.name;
    ASSERT_EQ(back->bytes(), e.bytes()) << e.name;
    EXPECT_EQ(std::memcmp(fc.raw(e.name).data(), fb.raw(e.name).data(), e.bytes()), 0) << e.name;
  }
  EXPECT_EQ(fc.view("conv1.weight").ptr<float>()[0], 42.0f);
  const SafetensorsEntry* counter = fc.find("layer1.0.bn1.num_batches_tracked");
  ASSERT_NE(counter, nullptr);
  EXPECT_EQ(counter->dtype_tag, "I64");
  EXPECT_EQ(counter->shape.rank(), 0);
  EXPECT_EQ(std::memcmp(fc.raw(counter->name).data(), le64(0).data(), 8), 0);
  expect_error([&] { (void)fc.view(counter->name); }, c, {"layer1.0.bn1.num_batches_tracked", "I64"});
}

}  // namespace
}  // namespace rn
