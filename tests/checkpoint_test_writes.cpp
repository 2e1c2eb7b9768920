// Checkpoint writes under contention and failure: two conversions into one destination, runs
// killed mid-write (what they leave is removed, what a live run writes is not), descriptors and
// file counts beyond a process's limits, asynchronous saves, managers of two processes sharing a
// root, and a save killed with SIGKILL leaving the last checkpoint restorable.
#include "checkpoint_test.hpp"

namespace shardplan {
namespace {

using namespace test;

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
