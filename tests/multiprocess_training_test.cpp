// Training over processes gives the bits of training in one process. ctest runs this file one
// process per test and under `mpirun -np 2` and `-np 4` (tests/CMakeLists.txt). In every run,
// each process also trains the same model on 8 devices of its own (Executor::process_local):
// that single-process run is the expectation, and every step's loss, and the final parameters,
// must equal it bit for bit.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <new>
#include <optional>
#include <stdexcept>

#include "../examples/mlp.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/collectives.hpp"
#include "shardplan/detail/agreement.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/optim.hpp"
#include "shardplan/rules/tree_path_sharding_rule.hpp"
#include "shardplan/shard_map.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

struct TrainingRun {
  std::vector<float> losses;
  std::vector<Tensor> params;  // final, on the host
};

/// The MLP of examples/mlp_training.cpp (small), trained with SGD for `steps` steps.
TrainingRun train(const Executor& exec, const Mesh& mesh, const std::vector<PartitionSpec>& w_specs,
                  const std::vector<PartitionSpec>& b_specs, const PartitionSpec& batch,
                  int steps) {
  const std::vector<std::int64_t> sizes = {32, 64, 64, 10};
  std::vector<Tree<Array>> layers;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    layers.push_back(Tree<Array>::dict(
        {{"w", Array::normal(Shape{sizes[i], sizes[i + 1]}, DType::kF32,
                             NamedSharding(mesh, w_specs[i]), exec, 10 + i, 0, 0.2)},
         {"b",
          Array::zeros(Shape{sizes[i + 1]}, DType::kF32, NamedSharding(mesh, b_specs[i]), exec)}}));
  }
  Tree<Array> params = Tree<Array>::list(layers);
  const Array x = Array::normal(Shape{64, 32}, DType::kF32, NamedSharding(mesh, batch), exec, 1);
  std::vector<std::int32_t> lab;
  for (int i = 0; i < 64; ++i) lab.push_back(i % 10);
  const Array y =
      device_put(Tensor::from<std::int32_t>(Shape{64}, lab), NamedSharding(mesh, batch), exec);
  const Optimizer opt = Optimizer::adam(0.01);
  Tree<Array> state = opt.init(params);
  auto step =
      sjit(mesh, [&](const Tree<Array>& p, const Tree<Array>& s, const Array& xb, const Array& yb) {
        const auto [loss, g] = value_and_grad(mlp::loss)(p, xb, yb);
        auto [np, ns] = opt.update(g, s, p);
        return Tree<Array>::dict({{"loss", loss}, {"params", np}, {"state", ns}});
      });
  TrainingRun run;
  for (int i = 0; i < steps; ++i) {
    const Tree<Array> out = step(params, state, x, y);
    params = out.at("params");
    state = out.at("state");
    run.losses.push_back(static_cast<float>(out.at("loss").leaf().to_host().get(0)));
  }
  for (const Array& a : params.leaves()) run.params.push_back(a.to_host());
  return run;
}

void expect_same_bits(const TrainingRun& got, const TrainingRun& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (std::size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_EQ(std::memcmp(&got.losses[i], &want.losses[i], sizeof(float)), 0)
        << what << ", step " << i << ": " << got.losses[i] << " vs " << want.losses[i];
  }
  ASSERT_EQ(got.params.size(), want.params.size());
  for (std::size_t i = 0; i < got.params.size(); ++i) {
    EXPECT_EQ(got.params[i], want.params[i]) << what << ", parameter " << i;  // bitwise
  }
}

TEST(MultiProcessTraining, DataParallelStepsAreTheOneProcessBits) {
  const std::vector<PartitionSpec> none(3, P());
  const Mesh mesh = Mesh::parse("batch:8", 8);
  const TrainingRun here = train(Executor::process_local(8), mesh, none, none, P("batch"), 6);
  const TrainingRun over = train(Executor(8), mesh, none, none, P("batch"), 6);
  EXPECT_LT(here.losses.back(), here.losses.front());  // it learns
  expect_same_bits(over, here, "8-way data parallel");
}

TEST(MultiProcessTraining, DataTimesTensorParallelStepsAreTheOneProcessBits) {
  const Mesh mesh = Mesh::parse("batch:4,model:2", 8);
  const std::vector<PartitionSpec> w = {P(), P(nullptr, "model"), P("model", nullptr)};
  const std::vector<PartitionSpec> b = {P(), P("model"), P()};
  const TrainingRun here = train(Executor::process_local(8), mesh, w, b, P("batch"), 6);
  const TrainingRun over = train(Executor(8), mesh, w, b, P("batch"), 6);
  expect_same_bits(over, here, "4-way data x 2-way tensor parallel");
}

TEST(MultiProcessTraining, FullyShardedParametersTrainToTheOneProcessBits) {
  const Mesh mesh = Mesh::parse("fsdp:8", 8);
  const std::vector<PartitionSpec> w = {P("fsdp"), P("fsdp"), P(nullptr, nullptr)};
  const std::vector<PartitionSpec> b = {P(), P(), P()};
  const TrainingRun here = train(Executor::process_local(8), mesh, w, b, P("fsdp"), 4);
  const TrainingRun over = train(Executor(8), mesh, w, b, P("fsdp"), 4);
  expect_same_bits(over, here, "FSDP");
}

TEST(MultiProcessTraining, ProcessesRunningDifferentProgramsGetAnErrorNotAHang) {
  if (distributed::process_count() == 1) GTEST_SKIP() << "needs two processes";
  const int me = distributed::process_index();
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:8", 8);
  auto f = sjit(mesh, [](const Array& x) { return sin(x) * 2.0; });
  // Process 1 passes other shapes than the rest: every process is told, naming the shapes.
  const std::int64_t rows = me == 1 ? 16 : 8;
  const Array x =
      device_put(Tensor::normal(Shape{rows, 4}, DType::kF32, 1), NamedSharding(mesh, P("a")), exec);
  EXPECT_THROW_WITH(f(x), DistributedError, "sjit program", "process 1", "f32[16, 4]", "f32[8, 4]");
  // A static argument with another value on process 1.
  auto g = sjit(
      mesh, [](const Array& a, int k) { return a * static_cast<double>(k); },
      SjitOptions{.static_argnums = {1}});
  const Array y =
      device_put(Tensor::normal(Shape{8, 4}, DType::kF32, 1), NamedSharding(mesh, P("a")), exec);
  EXPECT_THROW(g(y, me == 1 ? 3 : 2), DistributedError);
  // The same program everywhere still runs, and the group is still in step.
  EXPECT_EQ(g(y, 2).to_host(),
            (device_put(Tensor::normal(Shape{8, 4}, DType::kF32, 1), NamedSharding(mesh, P("a")),
                        Executor::process_local(8)) *
             2.0)
                .to_host());
}

// With the last process's devices able to hold almost nothing more, `call` runs out of memory
// there: every process gets a DistributedError naming that process and the memory; afterwards
// the limit is lifted.
void expect_out_of_memory_on_last_process(Executor& exec, const std::function<void()>& call) {
  const int me = distributed::process_index(), last = distributed::process_count() - 1;
  const std::int64_t in_use = exec.memory(exec.local_devices().front()).in_use;
  if (me == last) exec.set_memory_limit(in_use + 64);
  try {
    call();
    ADD_FAILURE() << "no error on process " << me;
  } catch (const DistributedError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(fmt::format("process {} of", last)));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("memory"));
  }
  exec.set_memory_limit(0);
}

TEST(MultiProcessTraining, AStepThatFailsOnOneProcessIsAnErrorOnEveryProcess) {
  if (distributed::process_count() == 1) GTEST_SKIP() << "needs two processes";
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:8", 8);
  // A kernel, then a reduction over the sharded axis (a step that communicates).
  auto f = sjit(mesh, [](const Array& x) { return sum(exp(x), {0}); });
  const Tensor host = Tensor::normal(Shape{64, 16}, DType::kF32, 4);
  const Array x = device_put(host, NamedSharding(mesh, P("a")), exec);
  const Array warm = f(x);  // compiled and run once everywhere
  // The last process's devices may hold almost nothing more: its exp step runs out of memory.
  expect_out_of_memory_on_last_process(exec, [&] { f(x); });
  // Every process is still in step: the next call runs and gives the host's sums.
  const Tensor got = f(x).to_host();
  const Tensor want =
      f(device_put(host, NamedSharding(mesh, P("a")), Executor::process_local(8))).to_host();
  EXPECT_EQ(got, want);
}

// The same inside a shard_map: a kernel of the body fails on the last process only, before the
// body's collective (a ppermute, then a psum). Every process learns of it at that collective
// (it runs as a communicating step does), none waits there; the next call runs again.
TEST(MultiProcessTraining, AShardMapBodyThatFailsOnOneProcessIsAnErrorOnEveryProcess) {
  if (distributed::process_count() == 1) GTEST_SKIP() << "needs two processes";
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:8", 8);
  std::vector<std::pair<int, int>> ring;
  for (int d = 0; d < 8; ++d) ring.emplace_back(d, (d + 1) % 8);
  auto f = sjit(mesh, [&](const Array& x) {
    return shard_map(
        [&](const Array& b) { return lax::psum(lax::ppermute(exp(b), "a", ring), "a"); }, mesh,
        {P("a")}, {P()})(x);
  });
  const Tensor host = Tensor::normal(Shape{64, 16}, DType::kF32, 4);
  const Array x = device_put(host, NamedSharding(mesh, P("a")), exec);
  const Tensor warm = f(x).to_host();  // compiled and run once everywhere
  expect_out_of_memory_on_last_process(exec, [&] { f(x); });
  EXPECT_EQ(f(x).to_host(), warm);
}

/// Runs `call`, which fails on process `who` only: every process must throw a DistributedError
/// naming `who` and holding `part`, within seconds (a regression hangs until the collective
/// timeout instead: ctest's mpi.np*.failure_agreement runs these with a short one); on `who`
/// the process's own exception, a `Own`, is nested in it.
template <class Own, class Call>
void expect_failure_of(int who, const std::string& part, const Call& call) {
  const auto start = std::chrono::steady_clock::now();
  try {
    call();
    ADD_FAILURE() << "no error on process " << distributed::process_index();
  } catch (const DistributedError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(fmt::format("process {} of {} failed", who,
                                                           distributed::process_count())));
    EXPECT_THAT(e.what(), ::testing::HasSubstr(part));
    bool nested = false;
    try {
      std::rethrow_if_nested(e);
    } catch (const Own&) {
      nested = true;
    } catch (...) {
    }
    EXPECT_EQ(nested, distributed::process_index() == who) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

// A training step whose labels (sharded with the batch) hold a bad one on the last process's
// devices only: that process's check fails, and every process throws the same DistributedError
// naming it, the op, the label, its index and the classes, within seconds; then a step with
// good labels runs everywhere (PyTorch: "Target out of bounds"; docs/sjit.md "Losses' labels").
TEST(MultiProcessTraining, ABadLabelOnOneProcessIsAnErrorOnEveryProcess) {
  if (distributed::process_count() == 1) GTEST_SKIP() << "needs two processes";
  const int last = distributed::process_count() - 1;
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:8", 8);
  const Array w = device_put(Tensor::normal(Shape{16, 10}, DType::kF32, 5),
                             NamedSharding(mesh, P()), exec);
  const Array x = device_put(Tensor::normal(Shape{32, 16}, DType::kF32, 6),
                             NamedSharding(mesh, P("a")), exec);
  auto step = sjit(mesh, [](const Array& wb, const Array& xb, const Array& yb) {
    return value_and_grad([&](const Array& v) {
             return mean_over_labels(cross_entropy(matmul(xb, v), yb), yb);
           })(wb)
        .second;
  });
  const auto labels = [&](std::int32_t at_31) {
    std::vector<std::int32_t> l;
    for (int i = 0; i < 32; ++i) l.push_back(i % 10);
    l[31] = at_31;  // on device 7: the last process's
    return device_put(Tensor::from<std::int32_t>(Shape{32}, l), NamedSharding(mesh, P("a")), exec);
  };
  const Tensor good = step(w, x, labels(1)).to_host();
  expect_failure_of<DeviceError>(last, "[cross_entropy] label 10 at index [31] is out of bounds: "
                                       "labels must be in [0, 10)",
                                 [&] { step(w, x, labels(10)); });
  EXPECT_EQ(step(w, x, labels(1)).to_host(), good);
}

TEST(MultiProcessTraining, OutOfMemoryInAReshardOnOneProcessIsAnErrorOnEveryProcess) {
  if (distributed::process_count() == 1) GTEST_SKIP() << "needs two processes";
  const int me = distributed::process_index(), last = distributed::process_count() - 1;
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:8", 8);
  // As under FSDP: the step starts by gathering the weights (the constraint), then multiplies.
  auto f = sjit(mesh, [](const Array& w, const Array& x) {
    return matmul(x, with_sharding_constraint(w, P()));
  });
  const Tensor wh = Tensor::normal(Shape{32, 16}, DType::kF32, 5);
  const Tensor xh = Tensor::normal(Shape{64, 32}, DType::kF32, 6);
  const Array w = device_put(wh, NamedSharding(mesh, P("a")), exec);
  const Array x = device_put(xh, NamedSharding(mesh, P("a")), exec);
  const Executor here = Executor::process_local(8);
  const Tensor want = f(device_put(wh, NamedSharding(mesh, P("a")), here),
                        device_put(xh, NamedSharding(mesh, P("a")), here))
                          .to_host();
  EXPECT_EQ(f(w, x).to_host(), want);  // compiled and run once everywhere
  // The all-gather inside the step cannot allocate its output on the last process.
  if (me == last) distributed::detail::fail_collective_allocation(1);
  expect_failure_of<std::bad_alloc>(last, "out of host memory", [&] { f(w, x); });
  distributed::detail::fail_collective_allocation(0);
  // The inputs' reshard before the step: the program takes w replicated, it is passed sharded.
  auto g = sjit(
      mesh, [](const Array& w2, const Array& x2) { return matmul(x2, w2); },
      SjitOptions{.in_shardings = RuleTree::list({RuleTree(P()), RuleTree(P("a"))})});
  EXPECT_EQ(g(w, x).to_host(), want);
  if (me == last) distributed::detail::fail_collective_allocation(1);
  expect_failure_of<std::bad_alloc>(last, "[all_gather] of Array(f32[32, 16]", [&] { g(w, x); });
  distributed::detail::fail_collective_allocation(0);
  // A device's memory limit (an OutOfMemoryError) in an eager reshard, on process 0.
  if (me == 0) exec.set_memory_limit(exec.memory(exec.local_devices().front()).in_use + 64);
  expect_failure_of<OutOfMemoryError>(0, "out of memory",
                                      [&] { reshard(x, NamedSharding(mesh, P())); });
  exec.set_memory_limit(0);
  // Every process is still in step, and nothing is left held: the step runs again.
  EXPECT_EQ(f(w, x).to_host(), want);
  EXPECT_EQ(g(w, x).to_host(), want);
}

TEST(MultiProcessTraining, OutOfMemoryInAnyCollectiveOnOneProcessIsAnErrorOnEveryProcess) {
  if (distributed::process_count() == 1) GTEST_SKIP() << "needs two processes";
  const int me = distributed::process_index(), last = distributed::process_count() - 1;
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:8", 8);
  const Tensor host = Tensor::normal(Shape{64, 32}, DType::kF32, 7);
  const Array x = device_put(host, NamedSharding(mesh, P("a")), exec);
  // A sum pending over 'a': every device holds ones.
  std::vector<std::shared_ptr<Buffer>> buffers(8);
  for (const int d : exec.local_devices()) {
    auto& b = buffers[static_cast<std::size_t>(d)];
    b = std::make_shared<Buffer>(exec.allocate(d, host.numel() * 4));
    std::fill_n(reinterpret_cast<float*>(b->data()), host.numel(), 1.0f);
  }
  const Array pending =
      Array::from_buffers(exec, host.shape(), DType::kF32, NamedSharding(mesh, P()),
                          std::move(buffers), Pending{ReduceOp::kSum, {"a"}});
  std::vector<std::pair<int, int>> ring;
  for (int i = 0; i < 8; ++i) ring.emplace_back(i, (i + 1) % 8);
  const int local = static_cast<int>(exec.local_devices().size());
  struct Case {
    std::string kind;
    int nth;  // the failing allocation: 1 an output shard; local + 1 a buffer received into
    std::function<Array()> run;
  };
  const std::vector<Case> cases = {
      {"all_gather", 1, [&] { return all_gather(x, {"a"}); }},
      {"all_to_all", 1, [&] { return all_to_all(x, {"a"}, 0, 1); }},
      {"permute", 1, [&] { return permute(x, "a", ring); }},
      {"all_reduce", 1, [&] { return all_reduce(pending); }},
      {"all_reduce", local + 1, [&] { return all_reduce(pending); }},
      {"reduce_scatter", 1, [&] { return reduce_scatter(pending, 0); }},
      {"reduce_scatter", local + 1, [&] { return reduce_scatter(pending, 0); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{}, allocation {}", c.kind, c.nth));
    if (me == last) distributed::detail::fail_collective_allocation(c.nth);
    expect_failure_of<std::bad_alloc>(last, fmt::format("[{}] of Array(f32[64, 32]", c.kind),
                                      [&] { c.run(); });
    distributed::detail::fail_collective_allocation(0);
  }
  // The processes are in step, and every collective works again.
  for (const Case& c : cases) EXPECT_NO_THROW(c.run()) << c.kind;
  EXPECT_EQ(all_gather(x, {"a"}).to_host(), host);
  EXPECT_EQ(all_reduce(pending).to_host(),
            Tensor::generate(host.shape(), DType::kF32, Generator::full(8)));
}

TEST(MultiProcessTraining, OutOfMemoryGatheringToTheHostOnOneProcessIsAnErrorOnEveryProcess) {
  if (distributed::process_count() == 1) GTEST_SKIP() << "needs two processes";
  const int me = distributed::process_index(), last = distributed::process_count() - 1;
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:8", 8);
  // 1 MiB: a gather this large is agreed on before the bytes cross.
  const Tensor host = Tensor::normal(Shape{512, 512}, DType::kF32, 8);
  const Array x = device_put(host, NamedSharding(mesh, P("a")), exec);
  // to_host's own result, then the all-gather's buffer, on the last process.
  if (me == last) distributed::detail::fail_collective_allocation(1);
  expect_failure_of<std::bad_alloc>(last, "[array] to_host of Array(f32[512, 512]",
                                    [&] { x.to_host(); });
  if (me == last) distributed::detail::fail_collective_allocation(2);
  expect_failure_of<std::bad_alloc>(last, "[distributed] allgather_bytes of 1048576 bytes",
                                    [&] { x.to_host(); });
  // The receiving process of to_host_on_process.
  if (me == 0) distributed::detail::fail_collective_allocation(1);
  expect_failure_of<std::bad_alloc>(0, "[to_host_on_process] of Array(f32[512, 512]",
                                    [&] { to_host_on_process(x, 0); });
  distributed::detail::fail_collective_allocation(0);
  EXPECT_EQ(x.to_host(), host);
  const std::optional<Tensor> on_last = to_host_on_process(x, last);
  EXPECT_EQ(on_last.has_value(), me == last);
  if (on_last) {
    EXPECT_EQ(*on_last, host);
  }
}

TEST(MultiProcessTraining, TracingThatFailsOnOneProcessIsAnErrorOnEveryProcess) {
  if (distributed::process_count() == 1) GTEST_SKIP() << "needs two processes";
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:8", 8);
  // Process 1 computes a shape its array cannot take: only its trace fails.
  auto f = sjit(mesh, [](const Array& x) {
    return reshape(x, Shape{distributed::process_index() == 1 ? 7 : 32}) * 2.0;
  });
  const Tensor host = Tensor::normal(Shape{8, 4}, DType::kF32, 3);
  const Array x = device_put(host, NamedSharding(mesh, P("a")), exec);
  expect_failure_of<SpecError>(1, "[sjit] tracing and compiling the call: [reshape] cannot reshape",
                               [&] { f(x); });
  // Tracing that fails alike on every process keeps its type, as in one process.
  auto h = sjit(mesh, [](const Array& a) { return reshape(a, Shape{7}); });
  EXPECT_THROW_WITH(h(x), SpecError, "[reshape] cannot reshape");
  // The group is in step: a program every process traces alike runs.
  auto g = sjit(mesh, [](const Array& a) { return reshape(a, Shape{32}) * 2.0; });
  EXPECT_EQ(g(x).to_host(),
            g(device_put(host, NamedSharding(mesh, P("a")), Executor::process_local(8))).to_host());
}

// An eager shard_map (outside sjit) traces its body into a program of its own: a body that
// throws on one process only is named on every process, as inside sjit, before any collective
// (before the fix the others waited in the program's first agreement until the collective
// timeout). A body that traces differently on one process is named too, not run.
TEST(MultiProcessTraining, AnEagerShardMapBodyThatThrowsOnOneProcessIsAnErrorOnEveryProcess) {
  if (distributed::process_count() == 1) GTEST_SKIP() << "needs two processes";
  const int me = distributed::process_index(), last = distributed::process_count() - 1;
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:8", 8);
  const Tensor host = Tensor::normal(Shape{64, 16}, DType::kF32, 4);
  const Array x = device_put(host, NamedSharding(mesh, P("a")), exec);
  // A psum over 'a': the program communicates (every process would wait in it).
  const auto body = [&](const Array& b) {
    if (me == last) throw std::runtime_error("no weights for this process");
    return lax::psum(exp(b), "a");
  };
  expect_failure_of<std::runtime_error>(
      last, "[shard_map] tracing and compiling the call: no weights for this process",
      [&] { shard_map(body, mesh, {P("a")}, {P()})(x); });
  // A body that traces another program on the last process: named, not run.
  const auto other = [&](const Array& b) { return me == last ? b * b : b + b; };
  EXPECT_THROW_WITH(shard_map(other, mesh, {P("a")}, {P("a")})(x), DistributedError,
                    std::string("the shard_map program"), fmt::format("process {}", last));
  // The group is in step: a body every process traces alike runs, and sums as one process does.
  const auto ok = [](const Array& b) { return lax::psum(exp(b), "a"); };
  const Executor here = Executor::process_local(8);
  EXPECT_EQ(shard_map(ok, mesh, {P("a")}, {P()})(x).to_host(),
            shard_map(ok, mesh, {P("a")}, {P()})(device_put(host, NamedSharding(mesh, P("a")), here))
                .to_host());
}

// An eager op (outside sjit) whose shape rule refuses its operands on one process only (a reshape
// to a shape the last process alone asks for): every process throws
// a DistributedError naming that process and the op within seconds, instead of the others
// running the op's program and waiting in its first collective (the reshape gathers x: it is
// split over 'a'). Then an eager op every process calls alike runs and agrees with one process.
TEST(MultiProcessTraining, AnEagerOpThatFailsItsChecksOnOneProcessIsAnErrorOnEveryProcess) {
  if (distributed::process_count() == 1) GTEST_SKIP() << "needs two processes";
  const int me = distributed::process_index(), last = distributed::process_count() - 1;
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:8", 8);
  const Tensor host = Tensor::normal(Shape{64, 16}, DType::kF32, 4);
  const Array x = device_put(host, NamedSharding(mesh, P("a")), exec);
  expect_failure_of<SpecError>(last, "[eager reshape] tracing and compiling the call: [reshape]",
                               [&] { reshape(x, me == last ? Shape{7, 3} : Shape{16, 64}); });
  // In step again: the same eager op on every process runs as in one process.
  const Executor here = Executor::process_local(8);
  EXPECT_EQ(reshape(x, Shape{16, 64}).to_host(),
            reshape(device_put(host, NamedSharding(mesh, P("a")), here), Shape{16, 64}).to_host());
}

TEST(MultiProcessTraining, OneProcessFailuresKeepTheirType) {
  // Arrays that never leave this process (any group size): no agreement, the errors as they are.
  const Executor exec = Executor::process_local(8);
  const Mesh mesh = Mesh::parse("a:8", 8);
  const Array w =
      device_put(Tensor::normal(Shape{32, 16}, DType::kF32, 5), NamedSharding(mesh, P("a")), exec);
  auto f = sjit(mesh, [](const Array& a) { return with_sharding_constraint(a, P()) * 2.0; });
  f(w);
  distributed::detail::fail_collective_allocation(1);
  EXPECT_THROW(f(w), std::bad_alloc);
  distributed::detail::fail_collective_allocation(1);
  EXPECT_THROW(reshard(w, NamedSharding(mesh, P())), std::bad_alloc);
  distributed::detail::fail_collective_allocation(0);
  auto g = sjit(mesh, [](const Array& a) { return reshape(a, Shape{7}); });
  EXPECT_THROW_WITH(g(w), SpecError, "[reshape] cannot reshape");
  EXPECT_EQ(f(w).to_host(), f(w).to_host());
}

TEST(MultiProcessTraining, AProcessInAnotherCollectiveIsNamedNotAHang) {
  if (distributed::process_count() == 1) GTEST_SKIP() << "needs two processes";
  const int me = distributed::process_index();
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:8", 8);
  auto f = sjit(mesh, [](const Array& x) { return x * 2.0; });
  const Tensor host = Tensor::normal(Shape{16, 4}, DType::kF32, 2);
  const Array x = device_put(host, NamedSharding(mesh, P("a")), exec);
  const Tensor twice = f(x).to_host();
  // Process 0 calls the program; the others call to_host (collective too) instead.
  if (me == 0) {
    EXPECT_THROW_WITH(f(x), DistributedError, "process 1 is not calling this sjit program");
  } else {
    EXPECT_THROW_WITH(x.to_host(), DistributedError, "process 0 sent", "disagree");
  }
  // The mismatched calls met each other: the processes are in step again.
  EXPECT_EQ(f(x).to_host(), twice);
}

// The planned peak is what the allocator reaches, on every device, over processes as in one: an
// FSDP training step (weights gathered over 'fsdp' before use, gradients reduce-scattered over
// it) on 8 devices, as 2 or 4 processes. Over processes a collective also holds, while it runs,
// the copies of other processes' shards or chunks it receives (CollectiveRecord::staging_bytes);
// before the plan counted them, the first device of each process peaked above the plan (by 2.4x
// on process 0's device 0 over 2 processes).
TEST(MultiProcessTraining, TheAllocatorsPeakIsThePlannedPeakOnEveryDeviceOfAnFsdpStep) {
  Executor exec(8);
  const Mesh mesh = Mesh::parse("fsdp:8", 8);
  const auto on = [&](const PartitionSpec& s) { return NamedSharding(mesh, s); };
  const std::vector<std::int64_t> sizes = {32, 64, 64, 16};
  std::vector<Tree<Array>> layers;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    layers.push_back(Tree<Array>::dict(
        {{"w", Array::normal(Shape{sizes[i], sizes[i + 1]}, DType::kF32, on(P("fsdp")), exec,
                             10 + i, 0, 0.2)},
         {"b", Array::zeros(Shape{sizes[i + 1]}, DType::kF32, on(P("fsdp")), exec)}}));
  }
  const Tree<Array> params = Tree<Array>::list(layers);
  layers.clear();
  const Array x = Array::normal(Shape{64, 32}, DType::kF32, on(P("fsdp")), exec, 1);
  std::vector<std::int32_t> lab;
  for (int i = 0; i < 64; ++i) lab.push_back(i % 10);
  const Array y = device_put(Tensor::from<std::int32_t>(Shape{64}, lab), on(P("fsdp")), exec);
  const Optimizer opt = Optimizer::sgd(0.01);
  const Tree<Array> state = opt.init(params);
  auto step = sjit(mesh, [&](const Tree<Array>& p, const Tree<Array>& s, const Array& xb,
                             const Array& yb) {
    const auto [loss, g] = value_and_grad(mlp::loss)(p, xb, yb);
    auto [np, ns] = opt.update(g, s, p);
    return Tree<Array>::dict({{"loss", loss}, {"params", np}, {"state", ns}});
  });
  const ProgramCost cost = step.lower(params, state, x, y).cost();
  exec.reset_peak();
  const Tree<Array> out = step(params, state, x, y);
  for (const int d : exec.local_devices()) {
    EXPECT_EQ(exec.memory(d).peak, cost.peak_bytes[static_cast<std::size_t>(d)]) << "device " << d;
  }
}

TEST(MultiProcessTraining, AStepOnAThousandDevicesIsCostedFromAbstractArguments) {
  // A cluster run sized from this machine: 128 processes x 8 devices, nothing allocated. (No
  // process talks to another here: it runs once, not in the mpirun suites.)
  if (distributed::process_count() > 1) GTEST_SKIP() << "planning needs one process";
  const Mesh mesh = Mesh::parse("data:128,model:8", 1024);
  const std::vector<std::int64_t> sizes = {1024, 8192, 8192, 1024};
  std::vector<Tree<TensorSpec>> layers;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    layers.push_back(
        Tree<TensorSpec>::dict({{"w", TensorSpec{Shape{sizes[i], sizes[i + 1]}, DType::kF32}},
                                {"b", TensorSpec{Shape{sizes[i + 1]}, DType::kF32}}}));
  }
  const Tree<TensorSpec> params = Tree<TensorSpec>::list(layers);
  const TensorSpec x{Shape{8192, 1024}, DType::kF32}, y{Shape{8192}, DType::kI32};
  // Megatron-style: the first and last weights split over 'model' by columns and rows.
  const RulePtr param_rules =
      std::make_shared<TreePathShardingRule>(std::vector<TreePathShardingRule::Entry>{
          {"^0/w$", P(nullptr, "model")}, {"^1/w$", P("model", nullptr)}, {".*", P()}});
  SjitOptions o;
  o.in_shardings =
      RuleTree::list({RuleTree(param_rules), RuleTree(P("data")), RuleTree(P("data"))});
  const Optimizer sgd = Optimizer::sgd(0.01);
  auto step = sjit(
      mesh,
      [&](const Tree<Array>& p, const Array& xb, const Array& yb) {
        const auto [loss, g] = value_and_grad(mlp::loss)(p, xb, yb);
        return Tree<Array>::dict({{"loss", loss}, {"grads", g}});
      },
      o);
  const Lowered low = step.lower(params, x, y);
  const ProgramCost& cost = low.cost();
  ASSERT_EQ(cost.flops.size(), 1024u);
  ASSERT_EQ(cost.peak_bytes.size(), 1024u);
  // Every device does the same share of the work: the forward and backward matmuls, 6 flops per
  // weight per example (forward, weight gradient, input gradient) except the first layer's 4
  // (the gradient of x is not asked for: no program computes it), the batch split over 'data'
  // (128) and the first two weights over 'model' (8); the elementwise work adds little.
  double matmul_flops = 0;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    const double split = i < 2 ? 8 : 1;
    const double per_weight = i == 0 ? 4.0 : 6.0;
    matmul_flops +=
        per_weight * (8192 / 128) * static_cast<double>(sizes[i] * sizes[i + 1]) / split;
  }
  EXPECT_GE(cost.flops[0], matmul_flops);
  EXPECT_LE(cost.flops[0], matmul_flops * 1.05);
  EXPECT_EQ(cost.flops[0], cost.flops[1023]);
  // The gradients are summed over 'data': each device receives at least its gradient shards'
  // bytes once, and a device never holds more than the unsharded parameters and batch.
  std::int64_t grad_shard_bytes =
      4 * (1024 * 8192 / 8 + 8192 * 8192 / 8 + 8192 * 1024 + 8192 + 8192 + 1024);
  ASSERT_TRUE(cost.bytes_by_kind.count(CollectiveKind::kAllReduce) ||
              cost.bytes_by_kind.count(CollectiveKind::kReduceScatter));
  std::int64_t reduced = 0;
  for (const auto& [kind, bytes] : cost.bytes_by_kind) {
    if (kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter) {
      reduced += bytes;
    }
  }
  EXPECT_GE(reduced, grad_shard_bytes / 2);
  EXPECT_LT(cost.peak_bytes[0], 4 * (1024 * 8192 + 8192 * 8192 + 8192 * 1024) + 8192 * 1024 * 4);
}

}  // namespace
}  // namespace shardplan
