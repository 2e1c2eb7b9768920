// safetensors headers: parsing, validation, the skeleton writer.
#include "shardplan/safetensors.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fixtures.hpp"
#include "shardplan/error.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/model_loader.hpp"
#include "shardplan/rule_file.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using namespace shardplan::test;  // NOLINT: test fixtures

namespace fs = std::filesystem;

/// A safetensors file's bytes: the 8-byte little-endian length, then the header text, then
/// `data` zero bytes.
std::string st_bytes(const std::string& header, std::size_t data) {
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + std::string(data, '\0');
}

SafetensorsHeader parse(const std::string& header, std::size_t data) {
  const std::string bytes = st_bytes(header, data);
  return parse_safetensors_header(bytes, static_cast<std::int64_t>(bytes.size()), "m.safetensors");
}

TEST(Safetensors, ParsesEntriesInHeaderOrderWithMetadata) {
  const auto h = parse(R"({"__metadata__":{"format":"pt"},)"
                       R"("b":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},)"
                       R"("a":{"dtype":"F32","shape":[],"data_offsets":[12,16]}})",
                       16);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "b");
  EXPECT_EQ(h.tensors[0].spec.shape, Shape({2, 3}));
  EXPECT_EQ(h.tensors[0].spec.dtype, DType::kBF16);
  EXPECT_EQ(h.tensors[1].end, 16);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.data_size, 16);
}

TEST(Safetensors, CorruptHeadersAreClearErrors) {
  const std::string ok_entry = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  EXPECT_THROW_WITH(parse_safetensors_header("abc", 3, "m.st"), IoError, "m.st", "3 bytes");
  {
    std::string b = st_bytes("{}", 0);
    b[0] = static_cast<char>(0x40);  // length 64, file has 2 bytes of header
    EXPECT_THROW_WITH(parse_safetensors_header(b, static_cast<std::int64_t>(b.size()), "m.st"),
                      IoError, "header length 64", "past the end");
  }
  {
    std::string b = st_bytes("{}", 0);
    b[7] = static_cast<char>(0x01);  // an absurd length
    EXPECT_THROW_WITH(parse_safetensors_header(b, std::int64_t{1} << 60, "m.st"), IoError, "limit");
  }
  EXPECT_THROW_WITH(parse("{\"w\": [", 0), IoError, "m.safetensors", "not valid JSON", "byte");
  EXPECT_THROW_WITH(parse("[1, 2]", 0), IoError, "must be a JSON object", "array");
  EXPECT_THROW_WITH(parse(R"({"w":{"dtype":"F12","shape":[2],"data_offsets":[0,8]}})", 8), IoError,
                    "'w'", "'F12'");
  EXPECT_THROW_WITH(parse(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), IoError,
                    "'w'", "[-2]");
  EXPECT_THROW_WITH(parse(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), IoError,
                    "'w'", "[8, 0]", "begin after end");
  EXPECT_THROW_WITH(parse(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4), IoError,
                    "'w'", "past the data section", "4 bytes");
  EXPECT_THROW_WITH(parse(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), IoError,
                    "'w'", "8 bytes", "[3]", "needs 12");
  EXPECT_THROW_WITH(parse(R"({"w":{"dtype":"F32","shape":[2]}})", 8), IoError, "'w'",
                    "data_offsets");
  EXPECT_THROW_WITH(
      parse("{" + ok_entry + R"(,"v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
      IoError, "'w'", "'v'", "overlap");
  EXPECT_THROW_WITH(
      parse(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8),
      IoError, "'w'", "element count of [4611686018427387904, 4] overflows int64");
  // The count fits (2^61) but the bytes (2^63) do not.
  EXPECT_THROW_WITH(
      parse(R"({"w":{"dtype":"F32","shape":[2305843009213693952],"data_offsets":[0,8]}})", 8),
      IoError, "'w'", "byte size of f32[2305843009213693952]", "overflows int64");
  EXPECT_THROW_WITH(parse(R"({"__metadata__":{"a":1}})", 0), IoError, "__metadata__");
}

TEST(Safetensors, DeepNestingRepeatsAndHugeNumbersAreClearErrors) {
  const std::string deep = std::string(65'536, '[') + std::string(65'536, ']');
  EXPECT_THROW_WITH(
      parse(R"({"w":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,8]}})", 8), IoError,
      "m.safetensors", "not valid JSON", "nesting deeper than 256 levels");
  EXPECT_THROW_WITH(parse(std::string(65'536, '['), 0), IoError, "m.safetensors",
                    "nesting deeper than 256 levels");
  EXPECT_THROW_WITH(parse(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                          16),
                    IoError, "'w'", "twice");
  EXPECT_THROW_WITH(
      parse(R"({"w":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8), IoError,
      "'w'", "'dtype'", "twice");
  EXPECT_THROW_WITH(
      parse(R"({"w":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,8]}})", 8),
      IoError, "'w'", "[99999999999999999999]", "not a list of non-negative integers");
  EXPECT_THROW_WITH(
      parse(R"({"w":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]}})", 8),
      IoError, "'w'", "9223372036854775808", "too large");
  EXPECT_THROW_WITH(
      parse(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,99999999999999999999]}})", 8),
      IoError, "'w'", "data_offsets", "99999999999999999999");
  EXPECT_THROW_WITH(parse("{\"w\xff\":{}}", 0), IoError, "not valid JSON", "invalid UTF-8",
                    "byte 3");
}

TEST(Safetensors, SkeletonWriterRejectsNamesThatAreNotUtf8) {
  TempDir dir;
  const fs::path file = dir.path() / "bad.safetensors";
  EXPECT_THROW_WITH(write_safetensors_skeleton(file, {{"w\xff", {Shape{2}, DType::kF32}}}), IoError,
                    "bad.safetensors", "not valid UTF-8");
  EXPECT_THROW_WITH(write_safetensors_skeleton(
                        file, {{"w", {Shape{2}, DType::kF32}}, {"w", {Shape{2}, DType::kF32}}}),
                    IoError, "bad.safetensors", "'w'", "duplicate");
  EXPECT_FALSE(fs::exists(file));
}

TEST(Safetensors, SkeletonWriterRoundTripsAndIsSparse) {
  TempDir dir;
  const fs::path file = dir.path() / "model.safetensors";
  const std::vector<std::pair<std::string, TensorSpec>> tensors = {
      {"model.embed_tokens.weight", {Shape{32000, 4096}, DType::kBF16}},
      {"model.norm.weight", {Shape{4096}, DType::kF32}},
  };
  write_safetensors_skeleton(file, tensors, {{"format", "pt"}});
  const auto h = read_safetensors_header(file);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(h.tensors[0].spec, tensors[0].second);
  EXPECT_EQ(h.tensors[1].begin, 32000LL * 4096 * 2);
  EXPECT_EQ(h.header_size % 8, 0);
  EXPECT_EQ(static_cast<std::int64_t>(fs::file_size(file)), 8 + h.header_size + h.data_size);
  EXPECT_EQ(h.data_size, 32000LL * 4096 * 2 + 4096 * 4);
  // No temporary file is left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

TEST(Safetensors, SkeletonWriterReplacesAFileButNeverADirectoryOrALink) {
  TempDir dir;
  const fs::path file = dir.path() / "model.safetensors";
  write_safetensors_skeleton(file, {{"a", {Shape{4}, DType::kF32}}});
  write_safetensors_skeleton(file, {{"b", {Shape{8}, DType::kF32}}});
  EXPECT_EQ(read_safetensors_header(file).tensors.at(0).name, "b");
  fs::create_directory(dir.path() / "d.safetensors");
  EXPECT_THROW_WITH(write_safetensors_skeleton(dir.path() / "d.safetensors", {}), IoError,
                    "[safetensors]", "d.safetensors", "is a directory");
  fs::create_symlink(file, dir.path() / "l.safetensors");
  EXPECT_THROW_WITH(write_safetensors_skeleton(dir.path() / "l.safetensors", {}), IoError,
                    "l.safetensors", "symbolic link");
  EXPECT_THROW_WITH(write_safetensors_skeleton(dir.path() / "missing" / "m.safetensors", {}),
                    IoError, "m.safetensors", "No such file or directory");
  EXPECT_EQ(read_safetensors_header(file).tensors.at(0).name, "b");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 3);
}

TEST(Safetensors, ReadingATruncatedFileIsAnErrorNamingIt) {
  TempDir dir;
  const fs::path file = dir.path() / "cut.safetensors";
  write_safetensors_skeleton(file, {{"w", {Shape{1024}, DType::kF32}}});
  fs::resize_file(file, 100);
  EXPECT_THROW_WITH(read_safetensors_header(file), IoError, "cut.safetensors");
  EXPECT_THROW_WITH(read_safetensors_header(dir.path() / "missing.safetensors"), IoError,
                    "missing.safetensors");
}

TEST(Safetensors, FilesThatAreNotRegularAreErrorsNamingThemAtOnce) {
  TempDir dir;
  const fs::path fifo = dir.path() / "m.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THROW_WITH(read_safetensors_header(fifo), IoError, fifo.string(), std::string("FIFO"));
  EXPECT_THROW_WITH(read_safetensors_header(dir.path()), IoError, dir.path().string(),
                    std::string("directory"));
  EXPECT_THROW_WITH(read_safetensors_header("/dev/zero"), IoError, "/dev/zero", "character device");
}

}  // namespace
}  // namespace shardplan
