// Packed shards: pack an ImageFolder of synthetic JPEGs, read it back through ShardDataset,
// and break it in the ways a disk, a kill or a hand edit would.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/augment.h"
#include "data/image_folder.h"
#include "data/image_folder_files.h"
#include "data/loader.h"
#include "data/shard_dataset.h"
#include "data/shard_format.h"
#include "data/shard_index.h"
#include "data/shard_pack.h"
#include "train/test_dir.h"

namespace rn {
namespace {

namespace fs = std::filesystem;
using test::file_bytes;
using ::testing::HasSubstr;

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void write_text(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

// Runs `fn`, expecting an rn::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an rn::Error containing '" << parts.front() << "'";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_THAT(e.what(), HasSubstr(p));
  }
}

// Every regular file under `dir` by name, with its bytes.
std::map<std::string, std::vector<uint8_t>> folder_contents(const fs::path& dir) {
  std::map<std::string, std::vector<uint8_t>> out;
  for (const auto& e : fs::directory_iterator(dir)) out[e.path().filename().string()] = file_bytes(e.path());
  return out;
}

class ShardTest : public ::testing::Test {
 protected:
  ShardTest() : src_paths_(test::write_image_folder(dir_.path() / "src", 3, 4)), src_((dir_.path() / "src").string()) {}

  PackOptions options(const std::string& out) const {
    PackOptions o;
    o.out_dir = dir_.file(out);
    o.records_per_shard = 5;
    o.workers = 2;
    return o;
  }

  TestDir dir_;
  std::vector<fs::path> src_paths_;
  ImageFolderDataset src_;
};

TEST_F(ShardTest, PackThenReadKeepsBytesLabelsClassesAndChecksums) {
  const PackResult r = pack_shards(src_, options("out"));
  EXPECT_EQ(r.records, 12);
  EXPECT_EQ(r.shards, 3);  // 5 + 5 + 2
  EXPECT_EQ(r.skipped, 0);
  EXPECT_EQ(r.shards_reused, 0);

  const ShardDataset shards(dir_.file("out"));
  ASSERT_EQ(shards.size(), src_.size());
  EXPECT_EQ(shards.classes(), src_.classes());
  EXPECT_EQ(shards.manifest().shards.size(), 3u);
  EncodedImage image;
  for (int64_t i = 0; i < shards.size(); ++i) {
    EXPECT_EQ(shards.read(i, image), src_.label(i));
    EXPECT_EQ(image.codec, ImageCodec::jpeg);
    const auto original = file_bytes(src_paths_[static_cast<size_t>(i)]);
    EXPECT_TRUE(std::equal(image.bytes.begin(), image.bytes.end(), original.begin(), original.end()))
        << "record " << i << " must hold the source file's bytes unchanged";
    EXPECT_EQ(shards.key(i), "class_" + std::to_string(i / 4) + "/img_" + std::to_string(i % 4));
  }
  EXPECT_EQ(shards.source(6), dir_.file("out/shard-00001.tar") + ":class_1/img_2");
}

// A tar truncated under a running job: reading its mapping would be a bare "Bus error"; the
// process says which shard changed and exits with an error instead.
TEST_F(ShardTest, AShardTruncatedWhileInUseIsNamed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  pack_shards(src_, options("out"));
  const ShardDataset shards(dir_.file("out"));
  fs::resize_file(dir_.file("out/shard-00001.tar"), 4096);
  EncodedImage image;
  EXPECT_NO_THROW(shards.read(0, image));  // another shard
  // The death test's child process runs the test afresh in its own folder (so the regex names the
  // shard only) and ends in _exit, which skips TestDir's destructor: the child removes its folder
  // first (the mapping keeps the truncated file readable up to its new end, so the read still faults).
  EXPECT_EXIT(
      {
        std::filesystem::remove_all(dir_.path());
        shards.read(9, image);
      },
      ::testing::ExitedWithCode(1), "out/shard-00001.tar' shrank or was rewritten while in use");
}

TEST_F(ShardTest, AFlippedByteIsAChecksumErrorNamingShardAndKey) {
  pack_shards(src_, options("out"));
  const ShardIndex index = parse_shard_index(read_text(dir_.file("out/shard-00001.idx")), "shard-00001.idx");
  const ShardIndexRecord& rec = index.records[2];
  {
    std::fstream f(dir_.file("out/shard-00001.tar"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(rec.offset + rec.size / 2));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(static_cast<std::streamoff>(rec.offset + rec.size / 2));
    f.write(&c, 1);
  }
  const ShardDataset shards(dir_.file("out"));  // opening checks sizes, not contents
  EncodedImage image;
  EXPECT_NO_THROW(shards.read(6, image));  // another record of the same shard
  expect_error([&] { shards.read(7, image); }, {"shard-00001.tar:" + rec.key, "checksum mismatch"});
  const ShardDataset unchecked(dir_.file("out"), ShardDatasetOptions{.verify_checksums = false});
  EXPECT_NO_THROW(unchecked.read(7, image));
  // Through a loader the record is named once, with its folder (train/ and val/ of one pack
  // each have a shard-00001.tar).
  DataLoaderOptions lo;
  lo.batch_size = 12;
  lo.workers = 0;
  lo.dtype = DType::u8;
  lo.layout = Layout::nhwc;
  lo.bad_files = BadFilePolicy::error;
  RandomResizedCropOptions ro;
  ro.height = ro.width = 8;
  DataLoader loader(std::make_shared<ShardDataset>(dir_.file("out")), std::make_shared<RandomResizedCrop>(ro), lo);
  loader.start_epoch(0);
  try {
    loader.next();
    ADD_FAILURE() << "the corrupt record was read";
  } catch (const Error& e) {
    const std::string what = e.what(), source = dir_.file("out/shard-00001.tar") + ":" + rec.key;
    EXPECT_NE(what.find(source + ": checksum mismatch"), std::string::npos) << what;
    EXPECT_EQ(what.find(source), what.rfind(source)) << "named twice: " << what;
  }
}

TEST_F(ShardTest, RawRecordsAreNpyAndDecodeToTheSamePixels) {
  PackOptions o = options("raw");
  o.raw = true;
  pack_shards(src_, o);
  const ShardDataset shards(dir_.file("raw"));
  EncodedImage image;
  Sample from_shard, from_source;
  for (int64_t i = 0; i < shards.size(); ++i) {
    shards.read(i, image);
    EXPECT_EQ(image.codec, ImageCodec::raw);
    shards.load(i, from_shard);
    src_.load(i, from_source);
    EXPECT_EQ(image.raw_width, from_source.width);
    EXPECT_EQ(image.raw_height, from_source.height);
    EXPECT_EQ(from_shard.pixels, from_source.pixels) << "record " << i;
    EXPECT_EQ(from_shard.label, from_source.label);
  }
}

TEST_F(ShardTest, PngFilesAreStoredAsPngAndRawPacksDecodeThemTheSame) {
  const auto png = test::synthetic_png(21, 13, 5);
  ASSERT_FALSE(png.empty());
  test::write_bytes(dir_.path() / "src/class_0/zz.png", png);
  const ImageFolderDataset src((dir_.path() / "src").string());
  ASSERT_EQ(src.relative_path(4), "class_0/zz.png");
  pack_shards(src, options("png"));
  PackOptions raw = options("raw");
  raw.raw = true;
  pack_shards(src, raw);

  const ShardDataset shards(dir_.file("png")), raw_shards(dir_.file("raw"));
  EncodedImage image;
  EXPECT_EQ(shards.read(4, image), 0);
  EXPECT_EQ(shards.key(4), "class_0/zz");
  EXPECT_EQ(image.codec, ImageCodec::png);
  EXPECT_TRUE(std::equal(image.bytes.begin(), image.bytes.end(), png.begin(), png.end()));
  Sample a, b;
  raw_shards.load(4, a);
  src.load(4, b);
  EXPECT_EQ(a.width, 21);
  EXPECT_EQ(a.pixels, b.pixels);
  EXPECT_EQ(a.pixels, test::synthetic_rgb(21, 13, 5)) << "PNG is lossless";
}

TEST_F(ShardTest, DownscaledRecordsHaveTheShorterSideAtMostS) {
  PackOptions o = options("small");
  o.max_short_side = 25;  // images are 24x18 .. 42x33: the first two of each class stay as they are
  o.quality = 80;
  pack_shards(src_, o);
  const ShardDataset shards(dir_.file("small"));
  EncodedImage image;
  int resized = 0;
  for (int64_t i = 0; i < shards.size(); ++i) {
    shards.read(i, image);
    const ImageInfo info = image_info(image);
    const ImageInfo before = read_image_info(file_bytes(src_paths_[static_cast<size_t>(i)]));
    EXPECT_EQ(info.width, shards.stored_width(i));
    EXPECT_EQ(info.height, shards.stored_height(i));
    if (std::min(before.width, before.height) <= 25) {
      EXPECT_EQ(info.width, before.width);
      EXPECT_EQ(image.bytes.size(), file_bytes(src_paths_[static_cast<size_t>(i)]).size()) << "kept as it was";
    } else {
      ++resized;
      EXPECT_EQ(std::min(info.width, info.height), 25) << "record " << i;
      EXPECT_NEAR(double(info.width) / info.height, double(before.width) / before.height, 0.05);
    }
  }
  EXPECT_EQ(resized, 6);
}

TEST_F(ShardTest, AnInterruptedPackIsCompletedByARerunWithTheSameBytes) {
  pack_shards(src_, options("clean"));

  PackOptions o = options("out");
  o.workers = 1;
  o.stop_after_shards = 2;
  EXPECT_THROW(pack_shards(src_, o), Error);
  EXPECT_TRUE(fs::exists(dir_.file("out/shard-00001.idx")));
  EXPECT_FALSE(fs::exists(dir_.file("out/shard-00002.idx")));
  EXPECT_FALSE(fs::exists(dir_.file("out/dataset.json"))) << "written last";
  // What a kill leaves: a half-written temporary, a tar cut short, a shard from a bigger pack.
  write_text(dir_.file("out/shard-00002.tar.tmp"), "partial");
  fs::resize_file(dir_.file("out/shard-00001.tar"), fs::file_size(dir_.file("out/shard-00001.tar")) - 700);
  write_text(dir_.file("out/shard-00007.idx"), "stale");

  o.stop_after_shards = -1;
  const PackResult r = pack_shards(src_, o);
  EXPECT_EQ(r.shards_reused, 1) << "shard 0 is complete; shard 1's tar no longer matches its index";
  EXPECT_EQ(r.records, 12);
  EXPECT_EQ(folder_contents(dir_.file("out")), folder_contents(dir_.file("clean")));

  // Other options: nothing is reused.
  o.max_short_side = 20;
  EXPECT_EQ(pack_shards(src_, o).shards_reused, 0);
  EXPECT_NE(folder_contents(dir_.file("out")), folder_contents(dir_.file("clean")));
}

// A source image replaced under the same name (same key, same label) is packed anew by a
// rerun; the shards whose files did not change are kept.
TEST_F(ShardTest, ARerunRepacksAShardWhoseSourceFileChanged) {
  pack_shards(src_, options("out"));
  test::write_bytes(src_paths_[6], test::synthetic_jpeg(50, 40, 999));  // record 6 is in shard 1 of 3
  const PackResult r = pack_shards(src_, options("out"));
  EXPECT_EQ(r.shards_reused, 2);
  const ShardDataset shards(dir_.file("out"));
  EncodedImage image;
  shards.read(6, image);
  const auto now = file_bytes(src_paths_[6]);
  EXPECT_TRUE(std::equal(image.bytes.begin(), image.bytes.end(), now.begin(), now.end())) << "the old image was kept";
  EXPECT_THAT(read_text(dir_.file("out/shard-00001.idx")), HasSubstr("\n#sources "));
}

// A pack of a pack knows its source's records by their index entries (CRC-32, size, label): the
// source packed again with another image under the same key makes the shard holding it be
// packed again (it used to be kept, with the old image and label, and nothing said).
TEST_F(ShardTest, ARerunOfAPackOfAPackRepacksWhatChangedInTheSourcePack) {
  pack_shards(src_, options("a"));
  pack_shards(ShardDataset(dir_.file("a")), options("b"));
  test::write_bytes(src_paths_[6], test::synthetic_jpeg(50, 40, 999));  // record 6 is in shard 1 of 3
  pack_shards(src_, options("a"));
  const PackResult r = pack_shards(ShardDataset(dir_.file("a")), options("b"));
  EXPECT_EQ(r.shards_reused, 2);
  const ShardDataset b(dir_.file("b"));
  EncodedImage image;  // its bytes lie in b's mapping
  b.read(6, image);
  const auto now = file_bytes(src_paths_[6]);
  EXPECT_TRUE(std::equal(image.bytes.begin(), image.bytes.end(), now.begin(), now.end())) << "the old image was kept";
  EXPECT_EQ(pack_shards(ShardDataset(dir_.file("a")), options("b")).shards_reused, 3) << "nothing changed since";
}

// Every image unreadable: an error, and no empty shards or marker left behind.
TEST_F(ShardTest, APackOfNothingReadableLeavesNothing) {
  test::write_bytes(dir_.path() / "bad/c/a.jpg", std::vector<uint8_t>(300, 0x5a));
  test::write_bytes(dir_.path() / "bad/c/b.jpg", {});
  const ImageFolderDataset src((dir_.path() / "bad").string());
  expect_error([&] { pack_shards(src, options("out")); }, {"was unreadable (2 skipped", "nothing was packed"});
  EXPECT_FALSE(fs::exists(dir_.file("out")));
}

TEST_F(ShardTest, UnreadableImagesAreSkippedAndCountedOrStopAStrictPack) {
  test::write_bytes(dir_.path() / "src/class_1/zz_garbage.jpg", std::vector<uint8_t>(300, 0x5a));
  auto truncated = file_bytes(src_paths_[5]);
  truncated.resize(truncated.size() / 2);
  test::write_bytes(dir_.path() / "src/class_2/zz_truncated.jpg", truncated);
  const ImageFolderDataset src((dir_.path() / "src").string());
  ASSERT_EQ(src.size(), 14);

  const PackResult r = pack_shards(src, options("out"));
  EXPECT_EQ(r.records, 12);
  EXPECT_EQ(r.skipped, 2);
  ASSERT_EQ(r.skipped_sources.size(), 2u);
  EXPECT_THAT(r.skipped_sources[0], HasSubstr("zz_garbage.jpg"));
  EXPECT_THAT(r.skipped_sources[1], HasSubstr("zz_truncated.jpg"));
  EXPECT_EQ(ShardDataset(dir_.file("out")).size(), 12);

  PackOptions strict = options("strict");
  strict.strict = true;
  expect_error([&] { pack_shards(src, strict); }, {"zz_garbage.jpg"});
}

TEST_F(ShardTest, OpeningABrokenFolderNamesTheFileAndWhatIsWrong) {
  pack_shards(src_, options("out"));
  const fs::path out = dir_.file("out");
  const std::string manifest = read_text(out / "dataset.json");
  const std::string index1 = read_text(out / "shard-00001.idx");
  auto restore = [&] {
    write_text(out / "dataset.json", manifest);
    write_text(out / "shard-00001.idx", index1);
  };
  auto open = [&] { ShardDataset d(out.string()); };

  expect_error([&] { ShardDataset d(dir_.file("nowhere")); }, {"dataset.json", "is missing"});
  write_text(out / "dataset.json", manifest.substr(0, manifest.size() / 2));
  expect_error(open, {"dataset.json", "not valid JSON"});
  write_text(out / "dataset.json", std::regex_replace(manifest, std::regex("\"version\": 1"), "\"version\": 7"));
  expect_error(open, {"dataset.json", "version 7"});
  restore();

  // Line 7 is the second record of shard 1 (five header lines first: #rn-shard-index, #tar,
  // #range, #options, #sources).
  write_text(out / "shard-00001.idx",
             std::regex_replace(index1, std::regex("class_1/img_2 (\\d+)"), "class_1/img_2 x$1"));
  expect_error(open, {"shard-00001.idx:7:", "bad offset"});
  write_text(out / "shard-00001.idx", std::regex_replace(index1, std::regex(" jpeg\n"), " jpeg 9\n"));
  expect_error(open, {"shard-00001.idx:6:", "expected 8 fields"});
  write_text(out / "shard-00001.idx", index1.substr(0, index1.size() - 10));
  expect_error(open, {"shard-00001.idx", "truncated"});
  write_text(out / "shard-00001.idx",
             std::regex_replace(index1, std::regex("(class_1/img_2 \\d+ \\d+ [0-9a-f]{8}) 1 "), "$1 3 "));
  expect_error(open, {"shard-00001.idx", "label 3", "3 classes"});
  write_text(out / "shard-00001.idx", std::regex_replace(index1, std::regex("class_1/img_2 "), "class_0/img_0 "));
  expect_error(open, {"class_0/img_0", "appears twice", "shard-00000.tar", "shard-00001.tar"});
  restore();

  fs::resize_file(out / "shard-00002.tar", fs::file_size(out / "shard-00002.tar") - 512);
  expect_error(open, {"shard-00002.tar", "truncated"});
  fs::remove(out / "shard-00002.tar");
  expect_error(open, {"shard-00002.tar", "cannot open"});
  fs::remove(out / "shard-00002.idx");
  expect_error(open, {"shard-00002.idx"});
}

// The manifest's numbers are read as integers in range, never converted: a double or a
// number too large for the field is an error naming the field (these were undefined
// behaviour, a version of 2^32 + 1 read as 1, and a record count that wrapped the sum).
TEST(ShardManifest, NumbersMustBeIntegersInRange) {
  ShardManifest m;
  m.classes = {"a", "b"};
  m.records = 3;
  m.shards = {{"s0.tar", "s0.idx", 2, 1024}, {"s1.tar", "s1.idx", 1, 512}};
  const std::string good = format_shard_manifest(m);
  EXPECT_EQ(format_shard_manifest(parse_shard_manifest(good, "dataset.json")), good);
  auto error_of = [&](const std::string& from, const std::string& to) {
    const std::string text = std::regex_replace(good, std::regex(from), to);
    EXPECT_NE(text, good) << from;
    try {
      parse_shard_manifest(text, "dataset.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto expect_has = [](const std::string& what, std::initializer_list<const char*> phrases) {
    for (const char* p : phrases) EXPECT_NE(what.find(p), std::string::npos) << what;
  };
  expect_has(error_of("\"records\": 2,", "\"records\": 3e79,"), {"dataset.json", "'records'", "3e+79", "integer"});
  expect_has(error_of("\"records\": 2,", "\"records\": 2.0,"), {"'records'", "integer"});
  expect_has(error_of("\"records\": 2,", "\"records\": -1,"), {"'records'", "integer in [0,"});
  expect_has(error_of("\"version\": 1,", "\"version\": 4294967297,"), {"'version'", "4294967297"});
  expect_has(error_of("\"tar_bytes\": 512", "\"tar_bytes\": 18446744073709551615"), {"'tar_bytes'"});
  expect_has(error_of("\"quality\": 0", "\"quality\": 1e300"), {"'quality'"});
  // A shard count past the total is named as soon as the running sum passes it; counts are
  // at most 2^40 (json_util.h's kJsonMaxCount), so the sum cannot overflow on the way.
  expect_has(error_of("\"records\": 3,", "\"records\": 1099511627776,"), {"'records' says 1099511627776"});
  expect_has(error_of("\"records\": 1,", "\"records\": 1099511627776,"),
             {"shards 0..1 hold 1099511627778 records, more than the 3 'records' says"});
  expect_has(error_of("\"records\": 1,", "\"records\": 1099511627777,"),
             {"'records'", "integer in [0, 1099511627776]"});
  // What `resnet pack --records-per-shard` was given is informational: any count reads.
  EXPECT_NO_THROW(parse_shard_manifest(
      std::regex_replace(good, std::regex("\"records_per_shard\": 0"), "\"records_per_shard\": 9223372036854775807"),
      "dataset.json"));
  expect_has(error_of("\"pack\": \\{", "\"pack\": 5, \"x\": {"), {"'pack' is 5, expected an object"});
  // A key given twice in one object is named (nlohmann would keep the later value silently).
  expect_has(error_of("\"records\": 3,", "\"records\": 3, \"records\": 2,"),
             {"dataset.json: the key 'records' is given twice in one object"});
  expect_has(error_of("\"shards\": \\[", "\"shards\": [7,"), {"shard 0 is 7, expected an object"});
  expect_has(error_of("\"records\": 3,", "\"records\": 1e999,"), {"not valid JSON"});
}

TEST(ShardIndex, FormatThenParseIsTheIdentityAndBadLinesAreNamed) {
  ShardIndex index;
  index.tar = "shard-00004.tar";
  index.tar_bytes = 8192;
  index.options = "max_size=0 quality=90 raw=0 records_per_shard=3";
  index.first = 12;
  index.count = 3;
  index.skipped = 1;
  index.records = {{"a/b_1", 512, 100, 0xdeadbeef, 2, 10, 20, ImageCodec::jpeg},
                   {"a/c-2", 2048, 328, 0x00000001, 0, 8, 6, ImageCodec::raw}};
  const std::string text = format_shard_index(index);
  EXPECT_EQ(format_shard_index(parse_shard_index(text, "x.idx")), text);
  EXPECT_THAT(text, HasSubstr("a/b_1 512 100 deadbeef 2 10 20 jpeg\n"));

  const std::string header = "#rn-shard-index 1\n#tar shard-00004.tar 8192\n#range 12 1 0\n#options o\n";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "empty index"},
      {"#rn-shard-index 2\n", "not a shard index"},
      {"#rn-shard-index 1\n#tar a/b 10\n", "without '/'"},
      {header + "k 512 100 deadbeef 0 1 1 jpeg", "no newline"},
      {header + "k.jpg 512 100 deadbeef 0 1 1 jpeg\n", "bad key"},
      {header + "k 500 100 deadbeef 0 1 1 jpeg\n", "multiple of 512"},
      {header + "k 8192 1 deadbeef 0 1 1 jpeg\n", "beyond the tar"},
      {header + "k 512 100 deadbeeg 0 1 1 jpeg\n", "bad crc32"},
      {header + "k 512 100 deadbeef -1 1 1 jpeg\n", "bad label"},
      {header + "k 512 100 deadbeef 0 0 1 jpeg\n", "empty size"},
      {header + "k 512 100 deadbeef 0 10 10 raw\n", "needs at least 300"},
      {header + "k 512 100 deadbeef 0 1 1 gif\n", "unknown codec"},
      {header + "k 512 100 deadbeef 0 1 1 jpeg\nk 1024 100 deadbeef 0 1 1 jpeg\n", "duplicate key"},
      {header, "holds 0 records"},
  };
  for (const auto& [text, message] : bad) {
    SCOPED_TRACE(text);
    expect_error([&] { parse_shard_index(text, "bad.idx"); }, {"bad.idx", message});
  }
}

TEST(ShardFormat, TarHeadersAndNpyHeadersAreWhatOtherReadersExpect) {
  const auto h = make_tar_header("class_0/img_1.jpg", 1234);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(h.data())), "class_0/img_1.jpg");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(h.data()) + 124, 11), "00000002322");  // 1234 in octal
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(h.data()) + 257, 5), "ustar");
  unsigned sum = 0;
  for (size_t i = 0; i < h.size(); ++i) sum += (i >= 148 && i < 156) ? ' ' : h[i];
  EXPECT_EQ(std::stoul(std::string(reinterpret_cast<const char*>(h.data()) + 148, 6), nullptr, 8), sum);

  const std::string npy = make_npy_header(5, 7);
  EXPECT_EQ(npy.size() % 64, 0u);
  EXPECT_EQ(npy.back(), '\n');
  std::vector<uint8_t> bytes(npy.begin(), npy.end());
  bytes.resize(bytes.size() + 5 * 7 * 3);
  EXPECT_EQ(parse_npy_header(bytes, 5, 7), npy.size());
  expect_error([&] { parse_npy_header(bytes, 7, 5); }, {"shape"});
  bytes.pop_back();
  expect_error([&] { parse_npy_header(bytes, 5, 7); }, {"needs 105"});
}

// docs/shards.md shows a Python reader; it must work on what we write.
TEST_F(ShardTest, ThePythonReaderInTheDocsReadsOurShards) {
  const char* python = "/usr/bin/python3";
  if (!fs::exists(python) || std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0)
    GTEST_SKIP() << "needs /usr/bin/python3 with numpy";
  const std::string doc = read_text(fs::path(RN_SOURCE_DIR) / "docs/shards.md");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(doc, m, std::regex("```python\n([^]*?)```"))) << "docs/shards.md has a python block";
  write_text(dir_.file("reader.py"), m[1].str());

  PackOptions o = options("jpeg");
  pack_shards(src_, o);
  o.out_dir = dir_.file("raw");
  o.raw = true;
  pack_shards(src_, o);
  for (const char* folder : {"jpeg", "raw"}) {
    const std::string cmd = std::string(python) + " " + dir_.file("reader.py") + " " + dir_.file(folder) + " 6 > " +
                            dir_.file("out.txt") + " 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << read_text(dir_.file("out.txt"));
    const ShardDataset shards(dir_.file(folder));
    EncodedImage image;
    shards.read(6, image);
    const std::string expected =
        std::string(folder) == "raw"
            ? fmt::format("class_1/img_2 label 1 ({}, {}, 3)\n", image.raw_height, image.raw_width)
            : fmt::format("class_1/img_2 label 1 {} bytes\n", image.bytes.size());
    EXPECT_EQ(read_text(dir_.file("out.txt")), expected);
  }
}

}  // namespace
}  // namespace rn
