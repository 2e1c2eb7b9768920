// Sharded checkpoints: saved from one mesh and restored bit for bit onto others; the same bytes
// from 1 device or 8; read back by an independent numpy reader of the public safetensors
// format; damaged files, mismatched targets and failed saves give errors naming the file and
// tensor and leave the previous checkpoint; a save killed with SIGKILL leaves no half
// checkpoint that looks complete.
#include "shardplan/checkpoint.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <latch>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

#include "checkpoint_fixtures.hpp"
#include "fixtures.hpp"
#include "shardplan/error.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/safetensors.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

/// A train state with the kinds of leaf a checkpoint holds, on `exec` and `mesh` (axes data and
/// model): weights sharded both ways, a bf16 bias, an int64 step, an optimizer list.
Tree<Array> train_state(const Executor& exec, const Mesh& mesh) {
  auto on = [&](const PartitionSpec& s) { return NamedSharding(mesh, s); };
  return Tree<Array>::dict(
      {{"params",
        Tree<Array>::dict(
            {{"w", Array::normal(Shape{16, 8}, DType::kF32, on(P("data", "model")), exec, 1)},
             {"b", Array::normal(Shape{8}, DType::kBF16, on(P("model")), exec, 2)},
             {"emb", Array::normal(Shape{6, 16}, DType::kF32, on(P(nullptr, "data")), exec, 3)}})},
       {"step", Array::generate(Shape{}, DType::kI64, on(P()), exec, Generator::full(1234))},
       {"opt",
        Tree<Array>::list({Array::uniform(Shape{16, 8}, DType::kF32, on(P("data")), exec, 4, -1, 1),
                           Tree<Array>::none()})}});
}

/// Shardings of the same tree for another mesh (`specs` by leaf path).
Tree<NamedSharding> shardings_for(const Tree<Array>& like, const Mesh& mesh,
                                  const std::map<std::string, PartitionSpec>& specs) {
  return like.map_with_path([&](const std::string& path, const Array&) {
    const auto it = specs.find(path);
    return NamedSharding(mesh, it == specs.end() ? P() : it->second);
  });
}

void expect_same_values(const Tree<Array>& got, const Tree<Array>& want) {
  ASSERT_TRUE(got.same_structure(want));
  const auto g = got.flatten();
  const auto w = want.flatten();
  for (std::size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(g[i].first, w[i].first);
    EXPECT_TRUE(g[i].second.to_host() == w[i].second.to_host()) << g[i].first;
  }
}

TEST(Checkpoint, RestoresOntoOtherMeshesBitForBitReadingOnlyEachDevicesShards) {
  TempDir tmp;
  const Executor eight(8);
  const Tree<Array> state = train_state(eight, Mesh::parse("data:4,model:2", 8));
  save_checkpoint(tmp.path() / "ckpt", state);
  struct Target {
    const char* mesh;
    int devices;
    std::map<std::string, PartitionSpec> specs;
  };
  const Target targets[] = {
      // 8 -> 4 devices, FSDP-style: every matrix split by rows.
      {"data:4",
       4,
       {{"params/w", P("data")}, {"params/emb", P(nullptr, "data")}, {"opt/0", P("data")}}},
      // 4x2 -> 2x4, the axes swapped on the weights (tensor parallel on the other dimension).
      {"data:2,model:4",
       8,
       {{"params/w", P("model", "data")},
        {"params/b", P("model")},
        {"opt/0", P(nullptr, "model")}}},
      // Onto one device.
      {"data:1", 1, {}},
  };
  for (const Target& t : targets) {
    SCOPED_TRACE(t.mesh);
    const Executor exec(t.devices);
    const Mesh mesh = Mesh::parse(t.mesh, t.devices);
    const auto target = shardings_for(state, mesh, t.specs);
    exec.reset_peak();
    const Tree<Array> restored = restore_checkpoint(tmp.path() / "ckpt", target, exec);
    expect_same_values(restored, state);
    // Each device held its own shards and nothing else (reads are staged in host memory).
    for (const int d : exec.local_devices()) {
      std::int64_t shards = 0;
      restored.for_each_leaf(
          [&](const std::string&, const Array& a) { shards += a.shard_nbytes(); });
      EXPECT_EQ(exec.memory(d).peak, shards) << "device " << d;
    }
    for (const auto& [path, a] : restored.flatten()) {
      EXPECT_EQ(a.sharding(), target.at_path(path).leaf()) << path;
    }
  }
}

TEST(Checkpoint, OneDeviceAndEightDevicesWriteTheSameTensorBytes) {
  TempDir tmp;
  const Executor one(1), eight(8);
  save_checkpoint(tmp.path() / "one", train_state(one, Mesh::parse("data:1,model:1", 1)));
  save_checkpoint(tmp.path() / "eight", train_state(eight, Mesh::parse("data:4,model:2", 8)));
  const auto a = test::checkpoint_tensor_bytes(tmp.path() / "one");
  const auto b = test::checkpoint_tensor_bytes(tmp.path() / "eight");
  EXPECT_EQ(a.size(), 5u);
  EXPECT_TRUE(a == b);
  // And they are the host tensors' bytes (row-major, little-endian).
  const Tensor w =
      train_state(one, Mesh::parse("data:1,model:1", 1)).at_path("params/w").leaf().to_host();
  EXPECT_EQ(a.at("params/w"), std::string(reinterpret_cast<const char*>(w.bytes()),
                                          static_cast<std::size_t>(w.nbytes())));
}

TEST(Checkpoint, ANumpyReaderOfThePublicFormatReadsWhatWasSaved) {
  TempDir tmp;
  const Executor eight(8);
  const Tree<Array> state = train_state(eight, Mesh::parse("data:4,model:2", 8));
  // Small files: several, with an index that maps each tensor to its file.
  save_checkpoint(tmp.path() / "ckpt", state, {.max_file_bytes = 600});
  EXPECT_GT(read_checkpoint_info(tmp.path() / "ckpt").files.size(), 2u);
  const fs::path out = tmp.path() / "values.bin";
  const std::string python = fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  const std::string cmd =
      fmt::format("{} '{}/scripts/read_safetensors_numpy.py' '{}' '{}'", python,
                  SHARDPLAN_SOURCE_DIR, (tmp.path() / "ckpt").string(), out.string());
  FILE* pipe = ::popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string listing;
  char buf[256];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) listing += buf;
  ASSERT_EQ(::pclose(pipe), 0) << cmd << "\n" << listing;
  EXPECT_EQ(listing,
            "opt/0 F32 16,8\n"
            "params/b BF16 8\n"
            "params/emb F32 6,16\n"
            "params/w F32 16,8\n"
            "step I64 \n");
  std::ifstream in(out, std::ios::binary);
  for (const char* name : {"opt/0", "params/b", "params/emb", "params/w", "step"}) {
    const Tensor t = state.at_path(name).leaf().to_host();
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      double v = 0;
      in.read(reinterpret_cast<char*>(&v), sizeof v);
      ASSERT_EQ(v, t.get(i)) << name << " element " << i;
    }
  }
  EXPECT_EQ(in.peek(), std::char_traits<char>::eof());
}

TEST(Checkpoint, TheIndexRecordsShardingsStructureAndChecksums) {
  TempDir tmp;
  const Executor eight(8);
  const Tree<Array> state = train_state(eight, Mesh::parse("data:4,model:2", 8));
  save_checkpoint(tmp.path() / "ckpt", state);
  const CheckpointInfo info = read_checkpoint_info(tmp.path() / "ckpt");
  EXPECT_TRUE(info.shardplan);
  EXPECT_EQ(info.mesh, Mesh::parse("data:4,model:2", 8).to_string());
  ASSERT_EQ(info.files.size(), 1u);
  EXPECT_EQ(info.files[0].name, "model.safetensors");
  ASSERT_TRUE(info.files[0].xxh3.has_value());
  EXPECT_THAT(info.find("params/w")->sharding, ::testing::HasSubstr("'data', 'model'"));
  EXPECT_EQ(info.total_bytes(), 16 * 8 * 4 + 8 * 2 + 6 * 16 * 4 + 8 + 16 * 8 * 4);
  EXPECT_EQ(nlohmann::json::parse(info.structure),
            nlohmann::json::parse(R"({"opt": ["opt/0", null], "params": {"b": "params/b",
                                   "emb": "params/emb", "w": "params/w"}, "step": "step"})"));
  // Nothing else in the directory: the files, the index.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(tmp.path())) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"ckpt"});
}

void flip_byte(const fs::path& file, std::int64_t at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  f.seekp(at);
  f.write(&c, 1);
}

TEST(Checkpoint, DamagedOrMissingFilesAreErrorsNamingTheFile) {
  TempDir tmp;
  const Executor four(4);
  const Mesh mesh = Mesh::parse("data:4", 4);
  const Tree<Array> state = Tree<Array>::dict(
      {{"a", Array::normal(Shape{64, 4}, DType::kF32, NamedSharding(mesh, P("data")), four, 1)},
       {"b", Array::normal(Shape{64}, DType::kF32, NamedSharding(mesh, P()), four, 2)}});
  const fs::path dir = tmp.path() / "ckpt";
  save_checkpoint(dir, state, {.max_file_bytes = 1024});
  const CheckpointInfo info = read_checkpoint_info(dir);
  ASSERT_EQ(info.files.size(), 2u);
  const fs::path second = dir / info.files[1].name;
  // A changed byte: the checksum names the file; without checking, the changed value is read.
  flip_byte(second, static_cast<std::int64_t>(fs::file_size(second)) - 3);
  EXPECT_THROW_WITH(restore_checkpoint(dir, state), IoError, second.c_str(), "checksum mismatch");
  const Tree<Array> unchecked = restore_checkpoint(dir, state, {.verify = false});
  EXPECT_TRUE(unchecked.at_path("a").leaf().to_host() == state.at_path("a").leaf().to_host());
  EXPECT_FALSE(unchecked.at_path("b").leaf().to_host() == state.at_path("b").leaf().to_host());
  // Truncated: the header no longer fits the file.
  fs::resize_file(second, fs::file_size(second) - 100);
  EXPECT_THROW_WITH(restore_checkpoint(dir, state), IoError, second.c_str());
  // Missing.
  fs::remove(second);
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, second.c_str(), "missing");
  // A malformed index.
  std::ofstream(dir / "model.safetensors.index.json") << "{\"weight_map\": {";
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, "model.safetensors.index.json",
                    "not valid JSON");
  EXPECT_THROW_WITH(read_checkpoint_info(tmp.path() / "nothing"), IoError, "no such file");
}

TEST(Checkpoint, MalformedIndexesAndArgumentsNameWhatIsWrong) {
  TempDir tmp;
  const Executor two(2);
  const Mesh mesh = Mesh::parse("x:2", 2);
  const fs::path dir = tmp.path() / "ckpt";
  const Array a = Array::ones(Shape{4}, DType::kF32, NamedSharding(mesh, P()), two);
  save_checkpoint(dir, Tree<Array>::dict({{"a", a}}));
  const fs::path index = dir / "model.safetensors.index.json";
  auto write_index = [&](const std::string& text) { std::ofstream(index) << text; };
  write_index(R"({"weight_map": {"a": "../x.safetensors"}})");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, "'a'", "'../x.safetensors'",
                    "not a file name inside");
  // Control characters in names are shown as \xNN (a NUL ended the message, an escape
  // sequence reached the terminal).
  write_index(R"({"weight_map": {"a\u001b[2J": "x\u0000.safetensors"}})");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, "tensor 'a\\x1b[2J'",
                    "'x\\x00.safetensors', which is not a file name inside");
  write_index(R"({"weight_map": {"a": 3}})");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, "tensor 'a' is mapped to 3");
  write_index("{}");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, "no \"weight_map\" object");
  write_index(R"({"weight_map": {"a": "model.safetensors", "ghost": "model.safetensors"}})");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, "model.safetensors", "'ghost'",
                    "no such tensor");
  // No index and two weight files: which one is meant is not guessed.
  fs::remove(index);
  fs::copy_file(dir / "model.safetensors", dir / "other.safetensors");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, "found 0 index files and 2 .safetensors");
  // Arguments.
  EXPECT_THROW_WITH(CheckpointManager(tmp.path() / "run", 0), SpecError, "keep must be at least 1");
  EXPECT_THROW_WITH(CheckpointManager(tmp.path() / "run").path_of(-1), SpecError,
                    "step -1 is negative");
  EXPECT_THROW_WITH(save_checkpoint(tmp.path() / "e", Tree<Array>::dict({{"x", Array()}})),
                    SpecError, "'x'", "empty array handle");
  EXPECT_FALSE(fs::exists(tmp.path() / "e"));
  const Executor other(2);
  const Tree<Array> mixed = Tree<Array>::dict(
      {{"a", a}, {"b", Array::ones(Shape{4}, DType::kF32, NamedSharding(mesh, P()), other)}});
  EXPECT_THROW_WITH(restore_checkpoint(dir, mixed), SpecError, "different executors", "'b'");
}

TEST(Checkpoint, AnIndexThatIsNotARegularFileIsAnErrorNamingItAtOnce) {
  TempDir tmp;
  const Executor one(1);
  const Mesh mesh = Mesh::parse("x:1", 1);
  const fs::path dir = tmp.path() / "ckpt";
  save_checkpoint(dir, Tree<Array>::dict({{"a", Array::ones(Shape{4}, DType::kF32,
                                                            NamedSharding(mesh, P()), one)}}));
  const fs::path index = dir / "model.safetensors.index.json";
  const std::string text = [&] {
    std::ifstream in(index);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  // A FIFO without a writer: opening it must not wait for one.
  fs::remove(index);
  ASSERT_EQ(::mkfifo(index.c_str(), 0600), 0);
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, index.c_str(), "FIFO");
  fs::remove(index);
  fs::create_directory(index);
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, index.c_str(), "directory");
  fs::remove(index);
  // A device: reading it whole would never end.
  fs::create_symlink("/dev/zero", index);
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, index.c_str(), "character device");
  fs::remove(index);
  std::ofstream(index) << text;
  const CheckpointInfo info = read_checkpoint_info(dir);
  EXPECT_EQ(info.tensors.size(), 1u);
  // A shard file that is a FIFO: its header is not waited for either.
  const fs::path shard = dir / "model.safetensors";
  fs::remove(shard);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, shard.c_str(), "FIFO");
  // Nor its bytes, when it was replaced after the info was read.
  EXPECT_THROW_WITH(verify_checkpoint(info), IoError, shard.c_str(), "FIFO");
  // Given as the checkpoint itself (no index).
  EXPECT_THROW_WITH(read_checkpoint_info(shard), IoError, shard.c_str(), "FIFO");
  // A symbolic link loop is one, not "missing" (as it was) or "no such file".
  fs::remove(shard);
  fs::create_symlink(shard.filename(), shard);
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, shard.c_str(),
                    "Too many levels of symbolic links");
  EXPECT_THROW_WITH(read_checkpoint_info(shard), IoError, shard.c_str(),
                    "Too many levels of symbolic links");
}

TEST(Checkpoint, DeeplyNestedOrRepeatedIndexEntriesAreErrorsNamingTheFileAndKey) {
  TempDir tmp;
  const Executor one(1);
  const Mesh mesh = Mesh::parse("x:1", 1);
  const fs::path dir = tmp.path() / "ckpt";
  save_checkpoint(dir, Tree<Array>::dict({{"a", Array::ones(Shape{4}, DType::kF32,
                                                            NamedSharding(mesh, P()), one)}}));
  const fs::path index = dir / "model.safetensors.index.json";
  auto write_index = [&](const std::string& t) { std::ofstream(index) << t; };
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  write_index(R"({"weight_map": {"a": )" + deep + "}}");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, index.c_str(),
                    "nesting deeper than 256 levels");
  auto with_record = [&](const std::string& record) {
    write_index(R"({"metadata": {"shardplan": )" + record +
                R"(}, "weight_map": {"a": "model.safetensors"}})");
  };
  with_record(R"({"version": 1, "structure": {"a": )" + deep + "}}");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, index.c_str(),
                    "nesting deeper than 256 levels");
  // A name twice: which file holds it would be a guess.
  write_index(R"({"weight_map": {"a": "model.safetensors", "a": "model.safetensors"}})");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, index.c_str(),
                    "tensor 'a' appears twice in weight_map");
  write_index(R"({"weight_map": {"a": "model.safetensors"}, "weight_map": {}})");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, index.c_str(), "'weight_map' twice");
  // A long value is quoted in part, not printed whole.
  write_index(R"({"weight_map": {"a": [)" + std::string(100'000, '1') + "]}}");
  try {
    read_checkpoint_info(dir);
    ADD_FAILURE() << "a number array as a file name was accepted";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("tensor 'a' is mapped to [111"));
    EXPECT_LT(std::strlen(e.what()), 500u);
  }

  // The record, field by field: a well-formed one is read...
  const std::string files = R"("files": {"model.safetensors": {"xxh3": "0123456789abcdef"}})";
  with_record(R"({"version": 1, "mesh": "x:1", "names": "dotted", "structure": {"a": "a"}, )" +
              files + R"(, "tensors": {"a": {"sharding": "P() on x:1", "dtype": "F32"}}})");
  const CheckpointInfo info = read_checkpoint_info(dir);
  EXPECT_TRUE(info.shardplan);
  EXPECT_EQ(info.mesh, "x:1");
  EXPECT_EQ(info.name_separator, '.');
  EXPECT_EQ(nlohmann::json::parse(info.structure), nlohmann::json::parse(R"({"a": "a"})"));
  ASSERT_EQ(info.files.size(), 1u);
  EXPECT_EQ(info.files[0].xxh3, 0x0123456789abcdefull);
  ASSERT_EQ(info.tensors.size(), 1u);
  EXPECT_EQ(info.tensors[0].sharding, "P() on x:1");
  // ...and each malformed field is named.
  with_record("[1, 2]");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, index.c_str(),
                    "the shardplan record (metadata.shardplan) must be an object, got array");
  with_record(R"({"version": 2, )" + files + "}");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError,
                    "version 2; this shardplan reads version 1");
  with_record(R"({"mesh": 7, )" + files + "}");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, "'mesh' must be a string, got number 7");
  with_record(R"({"names": "slashes", )" + files + "}");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, "'names' is 'slashes'");
  with_record(R"({"files": {"model.safetensors": {"xxh3": "xyz"}}})");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, "file 'model.safetensors'",
                    "16 hexadecimal digits", "\"xyz\"");
  with_record(
      R"({"files": {"model.safetensors": {"xxh3": "01"}, "model.safetensors": {"xxh3": "01"}}})");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError,
                    "file 'model.safetensors' appears twice in 'files'");
  with_record(R"({"files": {}})");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, "no checksum for file 'model.safetensors'");
  with_record("{" + files + R"(, "tensors": {"a": 3}})");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, "tensor 'a': expected an object");
  with_record("{" + files + R"(, "tensors": {"a": {"sharding": ["x"]}}})");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, "tensor 'a': 'sharding' must be a string");
  with_record("{" + files + R"(, "tensors": {"a": {}, "a": {}}})");
  EXPECT_THROW_WITH(read_checkpoint_info(dir), IoError, "tensor 'a' appears twice in 'tensors'");
}

TEST(Checkpoint, TheInfoOfACheckpointOf100kTensorsIsReadInFull) {
  // Reading is linear in the tensors (it was quadratic: the record's tensor table was copied
  // once per tensor, hours for this one); no timing here, the bench measures it
  // (checkpoint_bench BM_ReadCheckpointInfo).
  TempDir tmp;
  constexpr int kTensors = 100'000;
  std::vector<std::pair<std::string, TensorSpec>> specs;
  std::string weight_map, tensors, structure;
  for (int i = 0; i < kTensors; ++i) {
    const std::string name = fmt::format("layers/{}/w", i);
    specs.push_back({name, {Shape{2, i % 7 + 1}, DType::kF32}});
    const std::string sep = i == 0 ? "" : ", ";
    weight_map += fmt::format(R"({}"{}": "model.safetensors")", sep, name);
    tensors +=
        fmt::format(R"({}"{}": {{"sharding": "P({}) on x:1", "dtype": "F32"}})", sep, name, i);
    structure += fmt::format(R"({}{{"w": "{}"}})", sep, name);
  }
  const fs::path dir = tmp.path() / "ckpt";
  fs::create_directory(dir);
  write_safetensors_skeleton(dir / "model.safetensors", specs);
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"metadata": {"shardplan": {"version": 1, "mesh": "x:1", "structure": {"layers": [)"
      << structure << R"(]}, "files": {"model.safetensors": {"xxh3": "00000000000000ff"}}, )"
      << R"("tensors": {)" << tensors << R"(}}}, "weight_map": {)" << weight_map << "}}";
  const CheckpointInfo info = read_checkpoint_info(dir);
  ASSERT_EQ(info.tensors.size(), static_cast<std::size_t>(kTensors));
  std::int64_t offset = 0;
  for (int i = 0; i < kTensors; ++i) {
    const CheckpointTensor& t = info.tensors[static_cast<std::size_t>(i)];
    ASSERT_EQ(t.name, specs[static_cast<std::size_t>(i)].first);
    ASSERT_EQ(t.spec.shape, (Shape{2, i % 7 + 1}));
    ASSERT_EQ(t.sharding, fmt::format("P({}) on x:1", i));
    if (i == 0) offset = t.offset;
    ASSERT_EQ(t.offset, offset);
    offset += t.spec.bytes();
  }
  EXPECT_EQ(info.files.at(0).xxh3, 0xffu);
  EXPECT_EQ(nlohmann::json::parse(info.structure)["layers"][99'999]["w"], "layers/99999/w");
}

TEST(Checkpoint, TargetsThatDoNotMatchNameTheTensorTheFileAndTheAxis) {
  TempDir tmp;
  const Executor four(4);
  const Mesh mesh = Mesh::parse("x:4", 4);
  const fs::path dir = tmp.path() / "ckpt";
  save_checkpoint(dir, Tree<Array>::dict({{"emb", Array::zeros(Shape{6, 16}, DType::kF32,
                                                               NamedSharding(mesh, P()), four)}}));
  const fs::path file = dir / "model.safetensors";
  // Another shape or dtype in the template.
  EXPECT_THROW_WITH(
      restore_checkpoint(
          dir, Tree<Array>::dict({{"emb", Array::zeros(Shape{6, 8}, DType::kF32,
                                                       NamedSharding(mesh, P()), four)}})),
      SpecError, "'emb'", file.c_str(), "f32[6, 16]", "f32[6, 8]");
  EXPECT_THROW_WITH(
      restore_checkpoint(
          dir, Tree<Array>::dict({{"emb", Array::zeros(Shape{6, 16}, DType::kBF16,
                                                       NamedSharding(mesh, P()), four)}})),
      SpecError, "'emb'", "bf16[6, 16]");
  // 6 rows do not split over 4 devices.
  EXPECT_THROW_WITH(
      restore_checkpoint(dir, Tree<NamedSharding>::dict({{"emb", NamedSharding(mesh, P("x"))}}),
                         four),
      SpecError, "'emb'", file.c_str(), "'x'", "6");
  // A tensor the checkpoint does not have.
  EXPECT_THROW_WITH(
      restore_checkpoint(dir, Tree<NamedSharding>::dict({{"w", NamedSharding(mesh, P())}}), four),
      IoError, "no tensor 'w'", "'emb'");
}

TEST(Checkpoint, SavingRefusesAnExistingDirectoryAndPendingArrays) {
  TempDir tmp;
  const Executor two(2);
  const Mesh mesh = Mesh::parse("x:2", 2);
  const auto a = Array::ones(Shape{4}, DType::kF32, NamedSharding(mesh, P()), two);
  save_checkpoint(tmp.path() / "c", Tree<Array>::dict({{"a", a}}));
  EXPECT_THROW_WITH(save_checkpoint(tmp.path() / "c", Tree<Array>::dict({{"a", a}})), IoError,
                    "already exists");
  std::vector<std::shared_ptr<Buffer>> bufs;
  for (int d = 0; d < 2; ++d) bufs.push_back(std::make_shared<Buffer>(two.allocate(d, 16)));
  const Array pending = Array::from_buffers(two, Shape{4}, DType::kF32, NamedSharding(mesh, P()),
                                            bufs, Pending{ReduceOp::kSum, {"x"}});
  EXPECT_THROW_WITH(save_checkpoint(tmp.path() / "d", Tree<Array>::dict({{"p", pending}})),
                    SpecError, "'p'", "pending");
  EXPECT_FALSE(fs::exists(tmp.path() / "d"));
  EXPECT_THROW_WITH(save_checkpoint(tmp.path() / "e", Tree<Array>(a)), SpecError, "single array");
}

TEST(CheckpointManager, KeepsTheLastStepsAndAFailedSaveLosesNothing) {
  TempDir tmp;
  const Executor two(2);
  const Mesh mesh = Mesh::parse("x:2", 2);
  CheckpointManager manager(tmp.path() / "run", 2);
  auto state = [&](std::int64_t step, std::int64_t rows) {
    return Tree<Array>::dict(
        {{"w", Array::generate(Shape{rows, 256}, DType::kF32, NamedSharding(mesh, P("x")), two,
                               Generator::iota(static_cast<double>(step)))}});
  };
  for (std::int64_t step = 1; step <= 4; ++step) manager.save(step * 10, state(step * 10, 8));
  EXPECT_EQ(manager.steps(), (std::vector<std::int64_t>{30, 40}));
  EXPECT_EQ(manager.latest(), 40);
  EXPECT_THROW_WITH(manager.save(40, state(40, 8)), IoError, "already exists");
  // Disk full, as a file size limit: writes past 1 MiB fail (EFBIG, SIGXFSZ ignored).
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* previous = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 1 << 20;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  try {
    manager.save(50, state(50, 4096));  // 4 MiB
    ADD_FAILURE() << "the save did not fail";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("model.safetensors"));
  }
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  ::signal(SIGXFSZ, previous);
  // Nothing of step 50 is left, hidden or not; step 40 restores.
  EXPECT_EQ(manager.steps(), (std::vector<std::int64_t>{30, 40}));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(tmp.path() / "run"))
    names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step_00000030", "step_00000040"}));
  const Tree<Array> back = restore_checkpoint(manager.path_of(40), state(0, 8));
  EXPECT_TRUE(back.at_path("w").leaf().to_host() == state(40, 8).at_path("w").leaf().to_host());
}

// ---- Outputs: unique temporaries, no-replace renames, bad destinations ----------------------

/// The names in `dir`, sorted.
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

/// Eight 1 MiB f32 tensors on two devices.
Tree<Array> mib_state(const Executor& two) {
  const Mesh mesh = Mesh::parse("x:2", 2);
  std::vector<Tree<Array>::DictEntry> leaves;
  for (int i = 0; i < 8; ++i) {
    leaves.emplace_back(fmt::format("w{}", i),
                        Tree<Array>(Array::normal(Shape{512, 512}, DType::kF32,
                                                  NamedSharding(mesh, P("x")), two, 10 + i)));
  }
  return Tree<Array>::dict(std::move(leaves));
}

TEST(Checkpoint, TwoConversionsIntoOneDestinationAtOnceGiveOneCompleteResultAndOneError) {
  TempDir tmp;
  const Executor two(2);
  save_checkpoint(tmp.path() / "src", mib_state(two), {.max_file_bytes = 1 << 20});
  const auto want = test::checkpoint_tensor_bytes(tmp.path() / "src");
  fs::create_directories(tmp.path() / "dest");
  for (int round = 0; round < 10; ++round) {
    SCOPED_TRACE(fmt::format("round {}", round));
    const fs::path dst = tmp.path() / "dest" / fmt::format("c{}", round);
    std::latch start(2);
    std::exception_ptr errors[2];
    auto convert = [&](int i) {
      start.arrive_and_wait();
      try {
        consolidate_checkpoint(tmp.path() / "src", dst, {.max_file_bytes = 1 << 20});
      } catch (...) {
        errors[i] = std::current_exception();
      }
    };
    std::thread other(convert, 1);
    convert(0);
    other.join();
    ASSERT_TRUE((errors[0] == nullptr) != (errors[1] == nullptr)) << "exactly one must succeed";
    EXPECT_THROW_WITH(std::rethrow_exception(errors[0] ? errors[0] : errors[1]), IoError,
                      dst.string());
    const CheckpointInfo info = read_checkpoint_info(dst);
    EXPECT_EQ(info.files.size(), 8u);
    EXPECT_TRUE(test::checkpoint_tensor_bytes(dst) == want);
  }
  std::vector<std::string> expected;
  for (int round = 0; round < 10; ++round) expected.push_back(fmt::format("c{}", round));
  EXPECT_EQ(names_in(tmp.path() / "dest"), expected);  // no temporary left by either
}

TEST(Checkpoint, WritesNeverRemoveWhatTheyDidNotMake) {
  TempDir tmp;
  const Executor two(2);
  const Mesh mesh = Mesh::parse("x:2", 2);
  const auto a = Array::ones(Shape{4}, DType::kF32, NamedSharding(mesh, P()), two);
  // Directories a user happened to name like the fixed temporaries of earlier versions.
  for (const char* user :
       {".c.partial", ".d.partial", "run/.step_00000001.partial.mine", "run/.step_notes"}) {
    fs::create_directories(tmp.path() / user);
    std::ofstream(tmp.path() / user / "notes.txt") << "mine";
  }
  save_checkpoint(tmp.path() / "c", Tree<Array>::dict({{"a", a}}));
  EXPECT_THROW_WITH(save_checkpoint(tmp.path() / "c", Tree<Array>::dict({{"a", a}})), IoError,
                    "already exists");
  consolidate_checkpoint(tmp.path() / "c", tmp.path() / "d");
  EXPECT_EQ(names_in(tmp.path()),
            (std::vector<std::string>{".c.partial", ".d.partial", "c", "d", "run"}));
  // CheckpointManager removes what a save or removal of its own left when cut short (the fixed
  // names of earlier versions too), nothing else.
  fs::create_directories(tmp.path() / "run" / ".step_00000002.partial-0123456789");
  fs::create_directories(tmp.path() / "run" / ".step_00000003.partial");
  fs::create_directories(tmp.path() / "run" / ".step_00000004.removing-abcdefghij");
  CheckpointManager manager(tmp.path() / "run", 1);
  manager.save(5, Tree<Array>::dict({{"a", a}}));
  manager.save(6, Tree<Array>::dict({{"a", a}}));
  EXPECT_EQ(
      names_in(tmp.path() / "run"),
      (std::vector<std::string>{".step_00000001.partial.mine", ".step_notes", "step_00000006"}));
  for (const char* user :
       {".c.partial", ".d.partial", "run/.step_00000001.partial.mine", "run/.step_notes"}) {
    EXPECT_EQ(names_in(tmp.path() / user), (std::vector<std::string>{"notes.txt"})) << user;
  }
}

TEST(Checkpoint, ARunRemovesWhatRunsKilledBeforeItLeftButNotWhatALiveRunWrites) {
  // A run killed with SIGKILL leaves its hidden temporary; the next run for the same
  // destination removes it. A run still writing holds a lock on its own (as another process
  // would: a lock of another open file description), which keeps it.
  TempDir tmp;
  const Executor two(2);
  save_checkpoint(tmp.path() / "src", mib_state(two));
  auto hidden = [&](const fs::path& dir, const std::string& name) {
    fs::create_directories(dir / name);
    std::ofstream(dir / name / "model.safetensors") << "half";
    return dir / name;
  };
  const fs::path killed = hidden(tmp.path(), ".out.partial-0123456789");
  const fs::path live = hidden(tmp.path(), ".out.partial-abcdefghij");
  const fs::path other = hidden(tmp.path(), ".other.partial-0123456789");  // another destination
  const int lock = ::open(live.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(lock, 0);
  ASSERT_EQ(::flock(lock, LOCK_EX | LOCK_NB), 0);
  consolidate_checkpoint(tmp.path() / "src", tmp.path() / "out");
  EXPECT_EQ(names_in(tmp.path()),
            (std::vector<std::string>{".other.partial-0123456789", ".out.partial-abcdefghij", "out",
                                      "src"}));
  EXPECT_TRUE(fs::exists(live / "model.safetensors"));
  EXPECT_TRUE(fs::exists(other / "model.safetensors"));
  // The same for CheckpointManager's steps.
  const fs::path run = tmp.path() / "run";
  hidden(run, ".step_00000001.partial-0123456789");
  const fs::path saving = hidden(run, ".step_00000002.partial-0123456789");
  const int lock2 = ::open(saving.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(lock2, 0);
  ASSERT_EQ(::flock(lock2, LOCK_EX | LOCK_NB), 0);
  CheckpointManager(run, 2).save(3, mib_state(two));
  EXPECT_EQ(names_in(run),
            (std::vector<std::string>{".step_00000002.partial-0123456789", "step_00000003"}));
  ::close(lock);
  ::close(lock2);
  // Once its writer is gone, the next run for its destination removes it.
  fs::remove_all(tmp.path() / "out");
  consolidate_checkpoint(tmp.path() / "src", tmp.path() / "out");
  EXPECT_EQ(names_in(tmp.path()),
            (std::vector<std::string>{".other.partial-0123456789", "out", "run", "src"}));
  CheckpointManager(run, 2).save(4, mib_state(two));
  EXPECT_EQ(names_in(run), (std::vector<std::string>{"step_00000003", "step_00000004"}));
}

// Out of descriptors right after a run made its temporary (the lock on it cannot be opened): the
// error is the real cause, and the temporary is removed. (Before: taken for a name another run
// had, tried 100 more times, leaving a directory each, and reported "File exists".)
TEST(Checkpoint, OutOfDescriptorsWhileMakingATemporaryLeavesNothingBehind) {
  TempDir tmp;
  const Executor two(2);
  const Mesh mesh = Mesh::parse("x:2", 2);
  const Tree<Array> state = Tree<Array>::dict({{"w", Tree<Array>(Array::generate(
      Shape{4, 2}, DType::kF32, NamedSharding(mesh, P("x")), two, Generator::iota(0)))}});
  // UBSan's vptr check opens a pipe the first time it meets a dynamic type (to test that the vtable
  // is readable) and reports a bad vptr when it cannot: the error path's formatting is run once
  // with descriptors to spare (the same writer failing for another reason), so only the code under
  // test runs short of them.
  {
    std::ofstream(tmp.path() / "file") << "x";
    EXPECT_THROW(write_safetensors_skeleton(tmp.path() / "file" / "under.safetensors",
                                            {{"w", {Shape{4}, DType::kF32}}}),
                 IoError);
    EXPECT_THROW(save_checkpoint(tmp.path() / "file" / "ckpt", state), IoError);
    fs::remove(tmp.path() / "file");
  }
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  struct rlimit low = old;
  low.rlim_cur = 128;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  // Every descriptor taken (a directory needs none to be made); for the file, all but one (its
  // creation takes it, its lock would need a second).
  std::vector<int> held;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) held.push_back(fd);
  // The errors are looked at once descriptors are free again (see above).
  std::exception_ptr dir_failure, file_failure;
  try {
    save_checkpoint(tmp.path() / "ckpt", state);
  } catch (...) {
    dir_failure = std::current_exception();
  }
  ::close(held.back());
  held.pop_back();
  try {
    write_safetensors_skeleton(tmp.path() / "skeleton.safetensors",
                               {{"w", {Shape{4}, DType::kF32}}});
  } catch (...) {
    file_failure = std::current_exception();
  }
  for (const int fd : held) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  const auto message = [](const std::exception_ptr& failure) -> std::string {
    if (!failure) return "(no error)";
    try {
      std::rethrow_exception(failure);
    } catch (const IoError& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("not an IoError: ") + e.what();
    }
  };
  const std::string dir_error = message(dir_failure), file_error = message(file_failure);
  EXPECT_THAT(dir_error, ::testing::HasSubstr("Too many open files"));
  EXPECT_THAT(dir_error, ::testing::HasSubstr((tmp.path() / "ckpt").string()));
  EXPECT_THAT(file_error, ::testing::HasSubstr("Too many open files"));
  EXPECT_THAT(file_error, ::testing::HasSubstr((tmp.path() / "skeleton.safetensors").string()));
  EXPECT_TRUE(fs::is_empty(tmp.path())) << "left: " << fs::directory_iterator(tmp.path())->path();
}

TEST(Checkpoint, ACheckpointOfMoreFilesThanAProcessMayOpenIsRestoredAndConverted) {
  // 200 files (a tensor each) under a limit of 100 open files (the default is 1024; checkpoints
  // of more files exist). Before: "cannot open (Too many open files)".
  TempDir tmp;
  const Executor two(2);
  const Mesh mesh = Mesh::parse("x:2", 2);
  std::vector<Tree<Array>::DictEntry> leaves;
  for (int i = 0; i < 200; ++i) {
    leaves.emplace_back(
        fmt::format("w{:03d}", i),
        Tree<Array>(Array::generate(Shape{4, 2}, DType::kF32, NamedSharding(mesh, P("x")), two,
                                    Generator::iota(i))));
  }
  const Tree<Array> state = Tree<Array>::dict(std::move(leaves));
  save_checkpoint(tmp.path() / "src", state, {.max_file_bytes = 1});
  ASSERT_EQ(read_checkpoint_info(tmp.path() / "src").files.size(), 200u);
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  struct rlimit low = old;
  low.rlim_cur = 100;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::optional<Tree<Array>> back;
  std::string error;
  try {
    back = restore_checkpoint(tmp.path() / "src", state);
    consolidate_checkpoint(tmp.path() / "src", tmp.path() / "hf", {.max_file_bytes = 1});
    reshard_checkpoint(tmp.path() / "hf", tmp.path() / "sp", MeshShardingHelper(mesh),
                       RuleTree(parse_rule_file("rules: [{match: '.*', spec: [x]}]").make_rule()),
                       {.max_file_bytes = 1});
  } catch (const Error& e) {
    error = e.what();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  ASSERT_EQ(error, "");
  expect_same_values(*back, state);
  expect_same_values(restore_checkpoint(tmp.path() / "sp", state), state);
}

TEST(Checkpoint, KeysWithEscapedCharactersAreLoadedAndReshardedByTheirTreePaths) {
  // A shardplan checkpoint names its tensors by tree path ("a~0b" for the key "a~b"); loading
  // and resharding look each tensor up at the path tree_from_names gives its name
  // (tree_path_of_name, the one conversion). Before, such names missed: "no place in the tree".
  TempDir tmp;
  const Executor two(2);
  const Mesh mesh = Mesh::parse("x:2", 2);
  const auto leaf = [&](int i) {
    return Tree<Array>(Array::generate(Shape{4, 2}, DType::kF32, NamedSharding(mesh, P("x")), two,
                                       Generator::iota(i)));
  };
  const Tree<Array> state = Tree<Array>::dict({{"a~b", leaf(0)}, {"c/d", leaf(1)}});
  save_checkpoint(tmp.path() / "src", state);
  const RuleTree rules(parse_rule_file("rules: [{match: '.*', spec: [x]}]").make_rule());
  reshard_checkpoint(tmp.path() / "src", tmp.path() / "sp", MeshShardingHelper(mesh), rules);
  expect_same_values(restore_checkpoint(tmp.path() / "sp", state), state);
  const Tree<Array> loaded =
      load_checkpoint(tmp.path() / "src", MeshShardingHelper(mesh), rules, two);
  ASSERT_EQ(loaded.leaves().size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(loaded.leaves()[i].to_host() == state.leaves()[i].to_host()) << i;
  }
}

TEST(Checkpoint, DestinationsAreNormalisedOrAnErrorNamingThem) {
  TempDir tmp;
  const Executor two(2);
  const Mesh mesh = Mesh::parse("x:2", 2);
  const auto tree =
      Tree<Array>::dict({{"a", Array::ones(Shape{4}, DType::kF32, NamedSharding(mesh, P()), two)}});
  // A trailing slash names the directory itself (it used to leave an empty "c" behind).
  save_checkpoint(tmp.path() / "c/", tree);
  consolidate_checkpoint(tmp.path() / "c", tmp.path().string() + "/d//");
  EXPECT_EQ(names_in(tmp.path()), (std::vector<std::string>{"c", "d"}));
  EXPECT_TRUE(test::checkpoint_tensor_bytes(tmp.path() / "d") ==
              test::checkpoint_tensor_bytes(tmp.path() / "c"));
  std::ofstream(tmp.path() / "file") << "x";
  const fs::path under_file = tmp.path() / "file" / "a" / "out";
  const fs::path long_name = tmp.path() / std::string(300, 'n');
  EXPECT_THROW_WITH(save_checkpoint(under_file, tree), IoError, std::string("[checkpoint]"),
                    under_file.string(), (tmp.path() / "file").string() + " is a regular file",
                    std::string("not a directory"));
  EXPECT_THROW_WITH(consolidate_checkpoint(tmp.path() / "c", under_file), IoError,
                    under_file.string(), std::string("not a directory"));
  EXPECT_THROW_WITH(save_checkpoint("", tree), IoError, "[checkpoint]", "empty");
  EXPECT_THROW_WITH(consolidate_checkpoint(tmp.path() / "c", ""), IoError, "empty");
  EXPECT_THROW_WITH(save_checkpoint(long_name, tree), IoError, "300 bytes", "255");
  EXPECT_THROW_WITH(save_checkpoint("/", tree), IoError, "[checkpoint] /:");
  EXPECT_THROW_WITH(save_checkpoint("/proc/shardplan_test/c", tree), IoError,
                    "/proc/shardplan_test/c", "cannot create the directory /proc/shardplan_test");
  EXPECT_EQ(names_in(tmp.path()), (std::vector<std::string>{"c", "d", "file"}));
}

TEST(Checkpoint, AFailedWriteRemovesTheParentsItMadeAndOnlyThose) {
  TempDir tmp;
  const Executor two(2);
  save_checkpoint(tmp.path() / "src", mib_state(two));
  fs::create_directories(tmp.path() / "there");
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* previous = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 1 << 20;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const fs::path dst = tmp.path() / "there" / "made" / "also" / "out";
  try {
    consolidate_checkpoint(tmp.path() / "src", dst);
    ADD_FAILURE() << "the conversion did not fail";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr((dst / "model.safetensors").string()));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("File too large"));
  }
  try {
    save_checkpoint(dst, mib_state(two));
    ADD_FAILURE() << "the save did not fail";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr((dst / "model.safetensors").string()));
  }
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  ::signal(SIGXFSZ, previous);
  EXPECT_TRUE(names_in(tmp.path() / "there").empty());
}

// ---- Hugging Face checkpoints ---------------------------------------------------------------

/// A tensor as a Hugging Face file holds it: name, spec, raw bytes; and the array shardplan
/// should load from it.
struct HfTensor {
  std::string name;
  TensorSpec spec;
  std::string bytes;
  Tensor expected;
};

HfTensor hf_tensor(std::string name, const Tensor& t) {
  return {
      std::move(name), TensorSpec{t.shape(), t.dtype()},
      std::string(reinterpret_cast<const char*>(t.bytes()), static_cast<std::size_t>(t.nbytes())),
      t};
}

/// An f16 tensor of `shape` cycling through half-precision bit patterns whose values are known:
/// 1, -2, 0.333251953125, the smallest subnormal 2^-24, the largest finite 65504, -0, infinity.
HfTensor hf_half_tensor(std::string name, const Shape& shape) {
  const std::uint16_t bits[] = {0x3C00, 0xC000, 0x3555, 0x0001, 0x7BFF, 0x8000, 0x7C00};
  const double values[] = {1.0,
                           -2.0,
                           0.333251953125,
                           5.9604644775390625e-08,
                           65504.0,
                           -0.0,
                           std::numeric_limits<double>::infinity()};
  HfTensor t{std::move(name), TensorSpec{shape, DType::kF16}, "", Tensor(shape, DType::kF32)};
  for (std::int64_t i = 0; i < shape.numel(); ++i) {
    const std::uint16_t h = bits[i % 7];
    t.bytes.push_back(static_cast<char>(h & 0xff));
    t.bytes.push_back(static_cast<char>(h >> 8));
    t.expected.set(i, values[i % 7]);
  }
  return t;
}

/// Writes a safetensors file as any other tool would: the header, then each tensor's bytes.
void write_safetensors(const fs::path& file, const std::vector<HfTensor>& tensors) {
  std::vector<std::pair<std::string, TensorSpec>> specs;
  for (const auto& t : tensors) specs.emplace_back(t.name, t.spec);
  std::ofstream out(file, std::ios::binary);
  out << safetensors_header_bytes(file, specs, {{"format", "pt"}});
  for (const auto& t : tensors) out << t.bytes;
}

TEST(Checkpoint, HuggingFaceCheckpointsLoadShardedByRules) {
  TempDir tmp;
  const std::vector<HfTensor> tensors = {
      hf_tensor("model.embed_tokens.weight", Tensor::normal(Shape{32, 16}, DType::kBF16, 1)),
      hf_half_tensor("model.layers.0.self_attn.q_proj.weight", Shape{16, 16}),
      hf_half_tensor("model.layers.1.self_attn.q_proj.weight", Shape{16, 8}),
      hf_tensor("model.norm.weight", Tensor::normal(Shape{16}, DType::kF32, 4))};
  // One file, and the same tensors over two files with an index.
  const fs::path single = tmp.path() / "single";
  fs::create_directories(single);
  write_safetensors(single / "model.safetensors", tensors);
  const fs::path sharded = tmp.path() / "sharded";
  fs::create_directories(sharded);
  write_safetensors(sharded / "model-00001-of-00002.safetensors", {tensors[0], tensors[2]});
  write_safetensors(sharded / "model-00002-of-00002.safetensors", {tensors[1], tensors[3]});
  nlohmann::json index;
  index["metadata"]["total_size"] = 32 * 16 * 2 + 16 * 16 * 2 + 16 * 8 * 2 + 16 * 4;
  index["weight_map"] = {{tensors[0].name, "model-00001-of-00002.safetensors"},
                         {tensors[2].name, "model-00001-of-00002.safetensors"},
                         {tensors[1].name, "model-00002-of-00002.safetensors"},
                         {tensors[3].name, "model-00002-of-00002.safetensors"}};
  std::ofstream(sharded / "model.safetensors.index.json") << index.dump();

  const RuleFile rules = parse_rule_file(R"(
rules:
  - {match: "q_proj/weight$", spec: [tp, fsdp]}
  - {match: "embed_tokens/weight$", spec: [fsdp, tp]}
  - {match: "norm", spec: []}
)");
  const Executor exec(8);
  const MeshShardingHelper helper(Mesh::parse("fsdp:4,tp:2", 8));
  for (const fs::path& source : {single, sharded, single / "model.safetensors"}) {
    SCOPED_TRACE(source.string());
    const CheckpointInfo info = read_checkpoint_info(source);
    EXPECT_FALSE(info.shardplan);
    EXPECT_EQ(info.tensors.size(), 4u);
    EXPECT_EQ(info.find(tensors[1].name)->spec.dtype, DType::kF16);
    const Tree<Array> model = load_checkpoint(source, helper, RuleTree(rules.make_rule()), exec);
    const Array& q1 = model.at_path("model/layers/1/self_attn/q_proj/weight").leaf();
    EXPECT_EQ(q1.sharding().spec(), P("tp", "fsdp"));
    EXPECT_EQ(q1.dtype(), DType::kF32);  // widened from f16
    EXPECT_EQ(model.at_path("model/embed_tokens/weight").leaf().sharding().spec(), P("fsdp", "tp"));
    EXPECT_EQ(model.at_path("model/embed_tokens/weight").leaf().dtype(), DType::kBF16);
    for (const auto& t : tensors) {
      std::string path = t.name;
      std::replace(path.begin(), path.end(), '.', '/');
      const Tensor got = model.at_path(path).leaf().to_host();
      ASSERT_EQ(got.shape(), t.expected.shape()) << t.name;
      for (std::int64_t i = 0; i < got.numel(); ++i) {
        const double g = got.get(i), w = t.expected.get(i);
        ASSERT_TRUE(g == w && std::signbit(g) == std::signbit(w)) << t.name << " element " << i;
      }
    }
  }
}

// ---- Asynchronous saves -----------------------------------------------------------------------

TEST(AsyncCheckpointer, TheStepRunsOnWhileASnapshotIsWritten) {
  TempDir tmp;
  const Executor exec(2);
  const Mesh mesh = Mesh::parse("x:2", 2);
  Tree<Array> state = Tree<Array>::dict(
      {{"w", Array::normal(Shape{512, 256}, DType::kF32, NamedSharding(mesh, P("x")), exec, 1)},
       {"b", Array::normal(Shape{16}, DType::kF32, NamedSharding(mesh, P()), exec, 2)}});
  const Tensor w0 = state.at_path("w").leaf().to_host();
  const Tensor b0 = state.at_path("b").leaf().to_host();
  // A step that donates the state: its buffers are reused for the result while the save runs.
  auto step = sjit(
      mesh, [](const Tree<Array>& s) { return s.map([](const Array& a) { return a * 2.0; }); },
      SjitOptions{.donate_argnums = {0}});
  {
    AsyncCheckpointer saver(tmp.path() / "run", 2);
    saver.save(1, state);
    // The copy: each block once (w's two halves, b's one replica of the two), on the host.
    EXPECT_EQ(saver.pending_bytes(), 512 * 256 * 4 + 16 * 4);
    for (int i = 0; i < 3; ++i) state = step(state);
    saver.wait();
    EXPECT_EQ(saver.pending_bytes(), 0);
    EXPECT_EQ(saver.manager().steps(), std::vector<std::int64_t>{1});
    const Tree<Array> back = restore_checkpoint(saver.manager().path_of(1), state);
    EXPECT_TRUE(back.at_path("w").leaf().to_host() == w0);
    EXPECT_TRUE(back.at_path("b").leaf().to_host() == b0);
    // An error found before writing (the step exists) comes out of save() itself.
    EXPECT_THROW_WITH(saver.save(1, state), IoError, "already exists");
    saver.save(2, state);  // then left to the destructor to finish
    saver.save(3, state);  // waits for 2 first
  }
  CheckpointManager manager(tmp.path() / "run", 2);
  EXPECT_EQ(manager.steps(), (std::vector<std::int64_t>{2, 3}));  // keep 2
  const Tree<Array> back = restore_checkpoint(manager.path_of(3), state);
  EXPECT_TRUE(back.at_path("w").leaf().to_host() == state.at_path("w").leaf().to_host());
}

// ---- Killed mid-save ---------------------------------------------------------------------------

constexpr std::int64_t kRows = 2048;  // 2048 x 256 f32 per array: 2 MiB, two arrays a step

Tree<Array> numbered_state(const Executor& exec, const Mesh& mesh, std::int64_t step) {
  return Tree<Array>::dict(
      {{"a", Array::generate(Shape{kRows, 256}, DType::kF32, NamedSharding(mesh, P("x")), exec,
                             Generator::iota(static_cast<double>(step)))},
       {"b", Array::generate(Shape{kRows, 256}, DType::kF32, NamedSharding(mesh, P(nullptr, "x")),
                             exec, Generator::iota(static_cast<double>(-step)))}});
}

// Run by the test below in a child process (it re-runs this binary): saves steps forever
// until killed.
TEST(CheckpointChild, DISABLED_SavesStepsUntilKilled) {
  const char* root = std::getenv("SHARDPLAN_TEST_CHECKPOINT_ROOT");
  if (root == nullptr) GTEST_SKIP() << "run by KilledMidSave...";
  const Executor exec(2);
  const Mesh mesh = Mesh::parse("x:2", 2);
  CheckpointManager manager(root, 2);
  for (std::int64_t step = manager.latest().value_or(0) + 1;; ++step) {
    manager.save(step, numbered_state(exec, mesh, step), {.max_file_bytes = 1 << 20});
  }
}

// Run by the test below in a child process: saves steps from 1'000'000 on, keeping them all,
// until killed (another job writing into the same root).
TEST(CheckpointChild, DISABLED_SavesOtherStepsUntilKilled) {
  const char* root = std::getenv("SHARDPLAN_TEST_CHECKPOINT_ROOT");
  if (root == nullptr) GTEST_SKIP() << "run by TwoProcessesSavingIntoOneRoot...";
  const Executor exec(2);
  const Mesh mesh = Mesh::parse("x:2", 2);
  const char* keep = std::getenv("SHARDPLAN_TEST_KEEP");
  CheckpointManager manager(root, keep != nullptr ? std::atoi(keep) : 1'000'000);
  for (std::int64_t step = 1'000'000;; ++step) {
    manager.save(step, numbered_state(exec, mesh, step), {.max_file_bytes = 1 << 20});
  }
}

// Saves steps 1..`steps` with `manager` while a child process (the test above) saves steps from
// 1,000,000 on into the same root, keeping `keep` steps; then kills the child. Returns the
// number of our saves that failed and the first error. The child must have been saving all
// along: it must die of the signal, not end by itself.
std::pair<int, std::string> save_beside_a_saving_child(CheckpointManager& manager,
                                                       const fs::path& root, const char* keep,
                                                       std::int64_t steps, const Executor& exec,
                                                       const Mesh& mesh) {
  const pid_t child = ::fork();
  if (child < 0) return {-1, "fork failed"};
  if (child == 0) {
    ::setenv("SHARDPLAN_TEST_CHECKPOINT_ROOT", root.c_str(), 1);
    if (keep != nullptr) ::setenv("SHARDPLAN_TEST_KEEP", keep, 1);
    ::execl("/proc/self/exe", "checkpoint_test", "--gtest_also_run_disabled_tests",
            "--gtest_filter=CheckpointChild.DISABLED_SavesOtherStepsUntilKilled", nullptr);
    std::_Exit(127);
  }
  int failed = 0;
  std::string first_error;
  for (std::int64_t step = 1; step <= steps; ++step) {
    try {
      manager.save(step, numbered_state(exec, mesh, step), {.max_file_bytes = 1 << 20});
    } catch (const IoError& e) {
      if (failed++ == 0) first_error = e.what();
    }
  }
  ::kill(child, SIGKILL);
  int status = 0;
  EXPECT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status)) << "the child ended by itself (status " << status << ")";
  return {failed, first_error};
}

TEST(CheckpointManager, TwoProcessesSavingIntoOneRootNeverRemoveEachOthersSaveInProgress) {
  // Each save first clears what saves cut short left behind; a save still running in another
  // process is not that (before: removed under it, "cannot open ... No such file or directory").
  TempDir tmp;
  const fs::path root = tmp.path() / "run";
  const Executor exec(2);
  const Mesh mesh = Mesh::parse("x:2", 2);
  CheckpointManager manager(root, 1'000'000);
  const auto [failed, first_error] =
      save_beside_a_saving_child(manager, root, nullptr, 40, exec, mesh);
  EXPECT_EQ(failed, 0) << first_error;
  EXPECT_GT(manager.steps().back(), 1'000'000);
  for (std::int64_t step = 1; step <= 40; ++step) {
    const Tree<Array> back =
        restore_checkpoint(manager.path_of(step), numbered_state(exec, mesh, 0));
    EXPECT_TRUE(back.at_path("a").leaf().to_host() ==
                numbered_state(exec, mesh, step).at_path("a").leaf().to_host());
  }
}

TEST(CheckpointManager, EntriesThatOnlyLookLikeStepsAreNotSteps) {
  // Before: a link loop named like a step threw std::filesystem::filesystem_error out of steps().
  TempDir tmp;
  const fs::path root = tmp.path() / "run";
  fs::create_directories(root);
  fs::create_symlink("step_00000007", root / "step_00000007");
  std::ofstream(root / "step_00000008") << "a file";
  fs::create_directories(root / "step_00000009");  // no index: a save's leftovers, not a step
  fs::create_directories(root / "step_1234567890123456789");  // 19 digits
  const Executor one(1);
  const Mesh mesh = Mesh::parse("x:1", 1);
  CheckpointManager manager(root, 5);
  EXPECT_EQ(manager.steps(), std::vector<std::int64_t>{});
  manager.save(3, Tree<Array>::dict(
                      {{"a", Array::ones(Shape{4}, DType::kF32, NamedSharding(mesh, P()), one)}}));
  EXPECT_EQ(manager.steps(), std::vector<std::int64_t>{3});
  EXPECT_EQ(manager.latest(), 3);
}

TEST(CheckpointManager, TwoProcessesKeepingTwoStepsInOneRootNeverFailASaveThatSucceeded) {
  // Both remove the oldest steps after each save; a step the other process removed meanwhile is
  // gone, not an error (before: "cannot rename the old step away to remove it (No such file or
  // directory)" from a save whose checkpoint was written).
  TempDir tmp;
  const fs::path root = tmp.path() / "run";
  const Executor exec(2);
  const Mesh mesh = Mesh::parse("x:2", 2);
  CheckpointManager manager(root, 2);
  const auto [failed, first_error] = save_beside_a_saving_child(manager, root, "2", 60, exec, mesh);
  EXPECT_EQ(failed, 0) << first_error;
  for (const std::int64_t step : manager.steps()) {
    EXPECT_NO_THROW(read_checkpoint_info(manager.path_of(step))) << step;
  }
}

TEST(Checkpoint, ASaveKilledWithSigkillLeavesTheLastCheckpointRestorable) {
  TempDir tmp;
  const fs::path root = tmp.path() / "run";
  const Executor exec(2);
  const Mesh mesh = Mesh::parse("x:2", 2);
  CheckpointManager manager(root, 2);
  for (int round = 0; round < 4; ++round) {
    const std::optional<std::int64_t> before = manager.latest();
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::setenv("SHARDPLAN_TEST_CHECKPOINT_ROOT", root.c_str(), 1);
      ::execl("/proc/self/exe", "checkpoint_test", "--gtest_also_run_disabled_tests",
              "--gtest_filter=CheckpointChild.DISABLED_SavesStepsUntilKilled", nullptr);
      std::_Exit(127);
    }
    // Wait for a step past the one there was, then kill at a different moment each round.
    for (int i = 0; i < 3000 && manager.latest() == before; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(3 + 7 * round));
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child ended by itself (status " << status << ")";
    // Every checkpoint that looks complete is complete: it verifies and restores its step.
    const auto steps = manager.steps();
    ASSERT_FALSE(steps.empty()) << "round " << round;
    for (const std::int64_t step : steps) {
      SCOPED_TRACE(fmt::format("round {} step {}", round, step));
      const Tree<Array> back =
          restore_checkpoint(manager.path_of(step), numbered_state(exec, mesh, 0));
      const Tree<Array> want = numbered_state(exec, mesh, step);
      EXPECT_TRUE(back.at_path("a").leaf().to_host() == want.at_path("a").leaf().to_host());
      EXPECT_TRUE(back.at_path("b").leaf().to_host() == want.at_path("b").leaf().to_host());
    }
    // Only complete steps, and hidden directories of a save or a removal cut short.
    for (const auto& e : fs::directory_iterator(root)) {
      const std::string n = e.path().filename();
      EXPECT_TRUE(n.starts_with(".step_") || fs::exists(e.path() / "model.safetensors.index.json"))
          << n;
    }
  }
  // The next save, in the same root, clears the partial and succeeds.
  const std::int64_t next = manager.latest().value() + 1;
  manager.save(next, numbered_state(exec, mesh, next));
  EXPECT_EQ(manager.latest(), next);
}

}  // namespace
}  // namespace shardplan
