// Checkpoints over processes (ctest runs this binary alone and under mpirun -np 2 and -np 4):
// every process writes only the blocks whose replica group starts on one of its devices and
// reads only its devices' blocks; what is restored, on another mesh, equals what was saved.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "shardplan/checkpoint.hpp"
#include "shardplan/distributed.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

namespace dist = shardplan::distributed;
namespace fs = std::filesystem;

/// A directory every process agrees on (process 0's name), removed at the end.
class SharedDir {
 public:
  SharedDir() {
    std::string mine =
        (fs::temp_directory_path() / fmt::format("shardplan_mp_ckpt_{}_{}", ::getpid(), counter_++))
            .string();
    const auto all = dist::allgather_bytes(std::as_bytes(std::span(mine.data(), mine.size())));
    path_ = std::string(reinterpret_cast<const char*>(all[0].data()), all[0].size());
    if (dist::process_index() == 0) fs::create_directories(path_);
    dist::barrier();
  }
  ~SharedDir() {
    dist::barrier();
    if (dist::process_index() == 0) fs::remove_all(path_);
  }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

Tree<Array> state_on(const Executor& exec, const Mesh& mesh) {
  auto on = [&](const PartitionSpec& s) { return NamedSharding(mesh, s); };
  return Tree<Array>::dict(
      {{"w", Array::normal(Shape{16, 8}, DType::kF32, on(P("data", "model")), exec, 1)},
       {"emb", Array::normal(Shape{6, 16}, DType::kBF16, on(P(nullptr, "data")), exec, 2)},
       {"b", Array::normal(Shape{8}, DType::kF32, on(P()), exec, 3)},
       {"step", Array::generate(Shape{}, DType::kI64, on(P()), exec, Generator::full(77))}});
}

TEST(MultiProcessCheckpoint, SavedOnOneMeshRestoredOnAnotherEqualsTheSavedValues) {
  SharedDir dir;
  const Executor exec(8);
  const Tree<Array> state = state_on(exec, Mesh::parse("data:4,model:2", 8));
  save_checkpoint(dir.path() / "ckpt", state, {.max_file_bytes = 256});
  const CheckpointInfo info = read_checkpoint_info(dir.path() / "ckpt");
  EXPECT_GT(info.files.size(), 1u);
  verify_checkpoint(info);
  // Onto 2 x 4 with the axes swapped, and onto 8 devices of this process alone.
  const Mesh other = Mesh::parse("data:2,model:4", 8);
  const Tree<NamedSharding> target =
      Tree<NamedSharding>::dict({{"w", NamedSharding(other, P("model", "data"))},
                                 {"emb", NamedSharding(other, P(nullptr, "model"))},
                                 {"b", NamedSharding(other, P("model"))},
                                 {"step", NamedSharding(other, P())}});
  const Tree<Array> back = restore_checkpoint(dir.path() / "ckpt", target, exec);
  for (const auto& [path, a] : state.flatten()) {
    EXPECT_TRUE(back.at_path(path).leaf().to_host() == a.to_host()) << path;
  }
  // Every device's memory holds its shards of the restored tree and of the state, no more.
  std::int64_t shards = 0;
  for (const Array& a : back.leaves()) shards += a.shard_nbytes();
  for (const Array& a : state.leaves()) shards += a.shard_nbytes();
  for (const int d : exec.local_devices()) EXPECT_EQ(exec.memory(d).in_use, shards) << d;
  // A damaged file is an error on every process, naming the file.
  if (dist::process_index() == 0) {
    std::fstream f(dir.path() / "ckpt" / info.files.back().name,
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    f.put('\x7f');
  }
  dist::barrier();
  EXPECT_THROW_WITH(restore_checkpoint(dir.path() / "ckpt", state), Error, "checksum mismatch",
                    info.files.back().name.c_str());
}

// Padded shards (Uneven::kPad) over processes: 10 x 3 over 8 devices (blocks of 2 rows, the last
// three devices none) saved unpadded, each block by the process of its group's first device, and
// restored padded the other way round (3 columns over 'model' 2, 10 rows over 'data' 4).
TEST(MultiProcessCheckpoint, PaddedShardsRoundTripOverProcesses) {
  SharedDir dir;
  const Executor exec(8);
  const auto pad = [](const Mesh& m, const PartitionSpec& s) {
    return NamedSharding(m, s, Uneven::kPad);
  };
  const Mesh flat = Mesh::parse("x:8", 8);
  const Array w = Array::normal(Shape{10, 3}, DType::kF32, pad(flat, P("x")), exec, 4);
  save_checkpoint(dir.path() / "ckpt", Tree<Array>::dict({{"w", w}}));
  const Mesh two = Mesh::parse("data:4,model:2", 8);
  const Tree<Array> back = restore_checkpoint(
      dir.path() / "ckpt", Tree<NamedSharding>::dict({{"w", pad(two, P("data", "model"))}}), exec);
  EXPECT_TRUE(back.at_path("w").leaf().to_host() == w.to_host());
  EXPECT_TRUE(back.at_path("w").leaf().to_host() ==
              Tensor::normal(Shape{10, 3}, DType::kF32, 4));  // as generated whole
}

TEST(MultiProcessCheckpoint, AsynchronousSavesFinishInTheNextCall) {
  SharedDir dir;
  const Executor exec(8);
  const Tree<Array> state = state_on(exec, Mesh::parse("data:4,model:2", 8));
  {
    AsyncCheckpointer saver(dir.path() / "run", 2);
    saver.save(1, state);
    saver.save(2, state);
    saver.wait();
    EXPECT_EQ(saver.manager().steps(), (std::vector<std::int64_t>{1, 2}));
    saver.save(3, state);
  }  // the destructor finishes step 3 (collectively: every process destroys its saver)
  dist::barrier();
  const CheckpointManager manager(dir.path() / "run", 2);
  EXPECT_EQ(manager.steps(), (std::vector<std::int64_t>{2, 3}));
  const Tree<Array> back = restore_checkpoint(manager.path_of(3), state);
  for (const auto& [path, a] : state.flatten()) {
    EXPECT_TRUE(back.at_path(path).leaf().to_host() == a.to_host()) << path;
  }
}

// Every process writes its blocks where its own tree puts them: a tree that differs between
// processes (a leaf more on one, a leaf sharded otherwise) would give a checkpoint whose
// checksums verify and whose tensors are wrong. It is an error on every process, naming the
// first tensor that differs and the processes, and nothing is written (before the fix each save
// succeeded). A check that fails on one process only (a pending array there) is named on every
// process too.
TEST(MultiProcessCheckpoint, ATreeThatDiffersBetweenProcessesIsAnErrorOnEveryProcess) {
  if (dist::process_count() == 1) GTEST_SKIP() << "needs two processes";
  const int me = dist::process_index(), last = dist::process_count() - 1;
  SharedDir dir;
  const Executor exec(8);
  const Mesh mesh = Mesh::parse("data:4,model:2", 8);
  const Tree<Array> state = state_on(exec, mesh);
  const auto saved_nothing = [&] {
    dist::barrier();
    EXPECT_TRUE(fs::is_empty(dir.path())) << "something was written in " << dir.path();
  };
  const auto start = std::chrono::steady_clock::now();
  // One leaf more on the last process ('extra' comes after 'emb' in the flattened order).
  Tree<Array> more = state;
  if (me == last) {
    more = Tree<Array>::dict(
        {{"w", state.at_path("w").leaf()},
         {"emb", state.at_path("emb").leaf()},
         {"b", state.at_path("b").leaf()},
         {"step", state.at_path("step").leaf()},
         {"extra", Array::normal(Shape{8}, DType::kF32, NamedSharding(mesh, P()), exec, 4)}});
  }
  EXPECT_THROW_WITH(save_checkpoint(dir.path() / "ckpt", more), DistributedError,
                    std::string("the processes disagree on the tree saved to"),
                    std::string("first at line 3"),
                    fmt::format("process {}: ''extra': f32[8]", last),
                    std::string("'step': i64[] sharded PartitionSpec() on Mesh('data': 4, 'model': 2)"));
  saved_nothing();
  // The same names and shapes, one leaf sharded otherwise on the last process.
  Tree<Array> other = state;
  if (me == last) {
    other = Tree<Array>::dict({{"w", state.at_path("w").leaf()},
                               {"emb", state.at_path("emb").leaf()},
                               {"b", Array::normal(Shape{8}, DType::kF32,
                                                   NamedSharding(mesh, P("data")), exec, 3)},
                               {"step", state.at_path("step").leaf()}});
  }
  EXPECT_THROW_WITH(save_checkpoint(dir.path() / "ckpt", other), DistributedError,
                    std::string("first at line 1"),
                    fmt::format("process {}: ''b': f32[8] sharded PartitionSpec('data')", last));
  saved_nothing();
  // A check that fails on the last process only: a leaf pending a reduction there.
  Tree<Array> pending = state;
  if (me == last) {
    std::vector<std::shared_ptr<Buffer>> ones(8);
    for (const int d : exec.local_devices()) {
      ones[static_cast<std::size_t>(d)] = std::make_shared<Buffer>(exec.allocate(d, 8 * 4));
    }
    pending = Tree<Array>::dict(
        {{"w", state.at_path("w").leaf()},
         {"emb", state.at_path("emb").leaf()},
         {"b", Array::from_buffers(exec, Shape{8}, DType::kF32, NamedSharding(mesh, P()),
                                   std::move(ones), Pending{ReduceOp::kSum, {"data"}})},
         {"step", state.at_path("step").leaf()}});
  }
  EXPECT_THROW_WITH(save_checkpoint(dir.path() / "ckpt", pending), DistributedError,
                    fmt::format("process {} of {} failed", last, dist::process_count()),
                    std::string("'b'"), std::string("is pending a reduction"));
  saved_nothing();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  // The processes are in step: the same tree everywhere saves and restores.
  save_checkpoint(dir.path() / "ckpt", state);
  const Tree<Array> back = restore_checkpoint(dir.path() / "ckpt", state);
  for (const auto& [path, a] : state.flatten()) {
    EXPECT_TRUE(back.at_path(path).leaf().to_host() == a.to_host()) << path;
  }
}

}  // namespace
}  // namespace shardplan
