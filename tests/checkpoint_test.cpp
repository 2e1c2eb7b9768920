// Sharded checkpoints: saved from one mesh and restored bit for bit onto others; the same bytes
// from 1 device or 8; read back by an independent numpy reader of the public safetensors
// format; damaged files, mismatched targets and failed saves give errors naming the file and
// tensor and leave the previous checkpoint; Hugging Face checkpoints loaded by rules.
// Concurrent, killed and failed writes: checkpoint_test_writes.cpp.
#include "checkpoint_test.hpp"

namespace shardplan {
namespace {

using namespace test;

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

// Padded shards (NamedSharding's Uneven::kPad): the files hold each tensor unpadded (its host
// bytes, not a shard's zeros), so a checkpoint saved on 6 devices restores onto 4 (padded
// otherwise), onto 1 and onto 6 laid out another way, bitwise, with zeros after a padded
// block's rows.
TEST(Checkpoint, PaddedShardsAreSavedUnpaddedAndRestoreOntoAnyMesh) {
  TempDir tmp;
  const auto pad = [](const Mesh& m, const PartitionSpec& s) {
    return NamedSharding(m, s, Uneven::kPad);
  };
  const auto host_bytes = [](const Tensor& t) {
    return std::string(reinterpret_cast<const char*>(t.bytes()),
                       static_cast<std::size_t>(t.nbytes()));
  };
  const Tensor w = Tensor::normal(Shape{10, 7}, DType::kF32, 1);
  const Tensor b = Tensor::normal(Shape{5}, DType::kBF16, 2);
  {
    const Executor six(6);
    const Mesh mesh = Mesh::parse("x:2,y:3", 6);  // w: 10 rows over 3, 7 columns over 2
    save_checkpoint(
        tmp.path() / "c",
        Tree<Array>::dict({{"w", device_put(w, pad(mesh, P("y", "x")), six)},
                           {"b", device_put(b, pad(mesh, P(AxisNames{"x", "y"})), six)}}));
  }
  const auto files = test::checkpoint_tensor_bytes(tmp.path() / "c");
  EXPECT_EQ(files.at("w"), host_bytes(w));
  EXPECT_EQ(files.at("b"), host_bytes(b));
  const struct {
    const char* mesh;
    int devices;
    PartitionSpec w, b;
  } targets[] = {
      {"x:4", 4, P("x"), P("x")}, {"x:1", 1, P(), P()}, {"a:3,b:2", 6, P("b", "a"), P("a")}};
  for (const auto& t : targets) {
    SCOPED_TRACE(t.mesh);
    const Executor exec(t.devices);
    const Mesh mesh = Mesh::parse(t.mesh, t.devices);
    const Tree<Array> r = restore_checkpoint(
        tmp.path() / "c", Tree<NamedSharding>::dict({{"w", pad(mesh, t.w)}, {"b", pad(mesh, t.b)}}),
        exec);
    EXPECT_TRUE(r.at_path("w").leaf().to_host() == w);
    EXPECT_TRUE(r.at_path("b").leaf().to_host() == b);
  }
  // 10 rows over 4: device 3 holds row 9 in a buffer of 3 rows, then two rows of zeros.
  const Executor four(4);
  const Array w4 =
      restore_checkpoint(
          tmp.path() / "c",
          Tree<NamedSharding>::dict({{"w", pad(Mesh::parse("x:4", 4), P("x"))},
                                     {"b", NamedSharding(Mesh::parse("x:4", 4), P())}}),
          four)
          .at_path("w")
          .leaf();
  const Tensor last = w4.shard_tensor(3);
  ASSERT_EQ(last.shape(), (Shape{3, 7}));
  for (std::int64_t i = 0; i < 21; ++i) EXPECT_EQ(last.get(i), i < 7 ? w.get(63 + i) : 0.0) << i;
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

}  // namespace
}  // namespace shardplan
