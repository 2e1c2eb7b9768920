// sjit's memory: donated arguments, kept and remade constants, the peak by kind, and lower()'s
// figures against the executor's.
#include "sjit_test.hpp"

namespace shardplan {
namespace {

using namespace test;

TEST(Sjit, DonatedArgumentsCannotBeUsedAfterwards) {
  Meshes s;
  SjitOptions o;
  o.donate_argnums = {0};
  auto f = sjit(
      s.mesh, [](const Array& x) { return x + x; }, o);
  Array x = s.put(Tensor::ones(Shape{64, 64}, DType::kF32), P("data"));
  const Array y = f(x);
  EXPECT_EQ(y.to_host().get(0), 2.0);
  EXPECT_THROW_WITH(x.to_host(), ArrayError, "donated");
  // Only the output lives on: the donated buffers went back to the executor.
  EXPECT_EQ(s.exec.memory(s.first).in_use, y.shard_nbytes());
}

// Constants (values made from no input) up to 1 MiB per device are kept for the next run; a
// larger one, as a causal mask's index arrays over [B, H, T, T], is made again each run and
// freed: kept, a model's per-layer masks would stay resident between steps. The second and third
// runs (the small constant from the cache, the large one made again) give the first run's values.
// Constants each under the per-constant bound, together over the total one
// (kDefaultKeptConstantBytes, 4 MiB per device): only the first ones that fit are kept; the others
// are made again each run. Eight iotas of ~0.9 MiB each per device (replicated) would otherwise
// keep 7.3 MiB resident.
TEST(Sjit, ManySmallConstantsAreKeptOnlyUpToATotal) {
  Meshes s;
  auto f = sjit(s.mesh, [](const Array& x) {
    Array total = sum(x);
    for (std::int64_t k = 0; k < 8; ++k) {
      const Array ids = iota_like(full(Shape{230000 + k}, DType::kF32, 0, x), 0, DType::kF32);
      total = total + sum(ids);
    }
    return total;
  });
  const Array x = s.put(Tensor::uniform(Shape{8, 4}, DType::kF32, 3, -1, 1), P("data"));
  double first = 0;
  for (int run = 0; run < 3; ++run) {
    const Array y = f(x);
    const double v = y.to_host().get(0);
    if (run == 0) {
      // sum of 0..n-1 for n = 230000..230007, plus sum(x): checked against the formula.
      double want = 0;
      for (double e : x.to_host().to_doubles()) want += e;
      for (std::int64_t k = 0; k < 8; ++k) {
        const double n = 230000.0 + static_cast<double>(k);
        want += n * (n - 1) / 2;
      }
      EXPECT_NEAR(v, want, want * 1e-6);
      first = v;
    } else {
      EXPECT_EQ(v, first) << "run " << run;
    }
    const std::int64_t kept = s.exec.memory(s.first).in_use - x.shard_nbytes() - y.shard_nbytes();
    EXPECT_LE(kept, std::int64_t{4} << 20) << "run " << run;
    EXPECT_GT(kept, std::int64_t{3} << 20) << "run " << run;  // but up to the total, they are kept
  }
}

// kept_constant_bytes = 0: the same constants are made again every run and nothing stays
// resident between runs; the values are the kept program's.
TEST(Sjit, WithKeepConstantsOffNoConstantIsKept) {
  Meshes s;
  const auto body = [](const Array& x) {
    Array total = sum(x);
    for (std::int64_t k = 0; k < 4; ++k) {
      total = total + sum(iota_like(full(Shape{1000 + k}, DType::kF32, 0, x), 0, DType::kF32));
    }
    return total;
  };
  SjitOptions off;
  off.kept_constant_bytes = 0;
  auto kept = sjit(s.mesh, body);
  auto made = sjit(s.mesh, body, off);
  const Array x = s.put(Tensor::uniform(Shape{8, 4}, DType::kF32, 5, -1, 1), P("data"));
  const double want = kept(x).to_host().get(0);
  const std::int64_t held = s.exec.memory(s.first).in_use;  // x and the kept program's constants
  EXPECT_GE(held, x.shard_nbytes() + 4 * (1000 + 1001 + 1002 + 1003));
  for (int run = 0; run < 2; ++run) {
    const Array y = made(x);
    EXPECT_EQ(y.to_host().get(0), want) << "run " << run;
    EXPECT_EQ(s.exec.memory(s.first).in_use, held + y.shard_nbytes()) << "run " << run;
  }
}

// count_constants = false (train-plan): a constant's bytes are left out of the planned peak, as a
// compiler folds an iota into the kernel that reads it; the program still runs with it. Here the
// peak is x, the iota and the sum's result live at once: 4,000 bytes of iota less.
TEST(Sjit, UncountedConstantsAreLeftOutOfThePeak) {
  Meshes s;
  const auto body = [](const Array& x) {
    return x + iota_like(full(Shape{1000}, DType::kF32, 0, x), 0, DType::kF32);
  };
  SjitOptions folded;
  folded.count_constants = false;
  folded.kept_constant_bytes = 0;
  SjitOptions counted;
  counted.kept_constant_bytes = 0;
  const Array x = device_put(Tensor::uniform(Shape{1000}, DType::kF32, 7, -1, 1),
                             NamedSharding(s.mesh, P()), s.exec);
  const std::int64_t with = sjit(s.mesh, body, counted).lower(x).cost().peak_bytes.at(0);
  const std::int64_t without = sjit(s.mesh, body, folded).lower(x).cost().peak_bytes.at(0);
  EXPECT_EQ(with - without, 4000);
  EXPECT_EQ(without, 2 * 4000);  // x and the result
  auto run = sjit(s.mesh, body, folded);
  EXPECT_FLOAT_EQ(static_cast<float>(run(x).to_host().get(999)),
                  static_cast<float>(x.to_host().get(999) + 999));
}

TEST(Sjit, LargeConstantsAreMadeAgainEachRunNotKept) {
  Meshes s;
  SjitOptions o;
  o.donate_argnums = {0};
  auto f = sjit(
      s.mesh,
      [](const Array& x) {
        // iota over [8, 512, 512] i32 is 2 MiB per device on data:4: not kept. The [512] one is.
        const Array small = astype(iota_like(full(Shape{512}, DType::kF32, 0, x), 0), DType::kF32);
        return causal_mask(x) + small;
      },
      o);
  const Tensor host = Tensor::uniform(Shape{8, 4, 512, 512}, DType::kF32, 3, -1, 1);
  std::vector<double> first;
  for (int run = 0; run < 3; ++run) {
    Array x = s.put(host, P("data"));
    const Array y = f(x);
    const Tensor out = y.to_host();
    if (run == 0) {
      first = out.to_doubles();
      // Checked against the definition at a few places: j > i masked, else x + j.
      const auto at = [](int i, int j) { return (std::int64_t{3} * 512 + i) * 512 + j; };
      EXPECT_LT(first[static_cast<std::size_t>(at(5, 6))], -1e29);
      EXPECT_FLOAT_EQ(static_cast<float>(first[static_cast<std::size_t>(at(6, 5))]),
                      static_cast<float>(host.get(static_cast<std::size_t>(at(6, 5))) + 5));
    } else {
      ASSERT_EQ(out.to_doubles(), first) << "run " << run;
    }
    // Only the output and the small cached constant stay: no mask-sized buffer is kept.
    EXPECT_LT(s.exec.memory(s.first).in_use, y.shard_nbytes() + (1 << 20)) << "run " << run;
  }
}

// What is live at the peak, by kind, worked out by hand: w [64, 64] f32 arrives split over
// data:4 (4 KiB per device), is gathered whole (16 KiB), and the product (16 KiB) is made while
// both are held, beside the f32 scalar 2 (4 bytes, computed); not donated, the argument stays.
TEST(Sjit, PeakByKindNamesHeldGatheredAndComputedBytes) {
  Meshes s;
  auto f = sjit(
      s.mesh, [](const Array& w) { return with_sharding_constraint(w, P()) * 2.0; },
      SjitOptions{.in_shardings = RuleTree::list({RuleTree(P("data"))})});
  const ProgramCost& c = f.lower(TensorSpec{Shape{64, 64}, DType::kF32}).cost();
  EXPECT_EQ(c.peak_bytes[0], 4096 + 16384 + 16384 + 4);
  EXPECT_EQ(c.peak_by_kind.inputs, 4096);
  EXPECT_EQ(c.peak_by_kind.resharded_inputs, 16384);
  EXPECT_EQ(c.peak_by_kind.computed, 16384 + 4);
  // Donated, the argument is given up after the gather: the peak holds no argument.
  auto g = sjit(
      s.mesh, [](const Array& w) { return with_sharding_constraint(w, P()) * 2.0; },
      SjitOptions{.in_shardings = RuleTree::list({RuleTree(P("data"))}), .donate_argnums = {0}});
  const ProgramCost& d = g.lower(TensorSpec{Shape{64, 64}, DType::kF32}).cost();
  EXPECT_EQ(d.peak_by_kind.inputs, 0);
  EXPECT_EQ(d.peak_bytes[0], d.peak_by_kind.resharded_inputs + d.peak_by_kind.computed);
}

// A kernel step's per-device blocks are shared between steps of equal (spec, shape): steps of the
// same shape under other specs, and of the same spec over other shapes, must get their own
// (each result is checked whole against the host computation).
TEST(Sjit, StepsOfOneShapeOrOneSpecKeepTheirOwnBlocks) {
  Meshes s;
  auto f = sjit(
      s.mesh,
      [](const Array& a, const Array& b, const Array& c) {
        return Tree<Array>::dict({{"a", a + 1.0}, {"b", b * 2.0}, {"c", c - 3.0}});
      },
      SjitOptions{.in_shardings =
                      RuleTree::list({RuleTree(P("data", "model")), RuleTree(P("model", "data")),
                                      RuleTree(P("data", "model"))}),
                  .out_shardings = RuleTree::dict({{"a", RuleTree(P("data", "model"))},
                                                   {"b", RuleTree(P("model", "data"))},
                                                   {"c", RuleTree(P("data", "model"))}})});
  const Tensor a = Tensor::uniform(Shape{8, 8}, DType::kF32, 1, -1, 1);
  const Tensor b = Tensor::uniform(Shape{8, 8}, DType::kF32, 2, -1, 1);
  const Tensor c = Tensor::uniform(Shape{16, 4}, DType::kF32, 3, -1, 1);
  const Tree<Array> out =
      f(s.put(a, P("data", "model")), s.put(b, P("model", "data")), s.put(c, P("data", "model")));
  const auto expect = [](const Tensor& t, double (*op)(double)) {
    std::vector<double> v = t.to_doubles();
    for (double& x : v) x = static_cast<double>(static_cast<float>(op(x)));
    return v;
  };
  EXPECT_EQ(out.at("a").leaf().to_host().to_doubles(), expect(a, [](double x) { return x + 1; }));
  EXPECT_EQ(out.at("b").leaf().to_host().to_doubles(), expect(b, [](double x) { return x * 2; }));
  EXPECT_EQ(out.at("c").leaf().to_host().to_doubles(), expect(c, [](double x) { return x - 3; }));
}

Array sin_cos_exp(const Array& x) { return sin(cos(exp(x))); }
// The same with a transpose between exp and sin: three steps no fusion joins (a transpose is not
// pointwise), each result a block of the input's size ([256, 32] -> [32, 256]).
Array exp_transpose_sin(const Array& x) { return sin(transpose(exp(x), {1, 0})); }

// A call that runs out of memory: an OutOfMemoryError in one process; over processes, where
// every process learns of the failure, a DistributedError carrying its message
// (docs/distributed.md, "Failure").
template <class F>
void expect_out_of_memory(F&& call) {
  if (distributed::process_count() == 1) {
    EXPECT_THROW_WITH(call(), OutOfMemoryError, "limit");
  } else {
    EXPECT_THROW_WITH(call(), DistributedError, "out of memory", "limit");
  }
}

// x [1024, 64] f32 sharded 4 x 2: a shard is [256, 32], 32 KiB per device.
constexpr std::int64_t kShard = 256 * 32 * 4;

TEST(Sjit, DonationLowersPeakMemoryAndLowerAgreesWithTheExecutor) {
  const Mesh mesh = Mesh::parse("data:4,model:2", 8);
  const Tensor t = Tensor::normal(Shape{1024, 64}, DType::kF32, 1);
  const Tensor expect =
      exp_transpose_sin(device_put(t, NamedSharding(mesh, P()), Executor(8))).to_host();
  SjitOptions donating;
  donating.donate_argnums = {0};
  for (const bool donate : {false, true}) {
    SCOPED_TRACE(donate ? "donated" : "not donated");
    const Executor exec(8);
    auto f = sjit(mesh, &exp_transpose_sin, donate ? donating : SjitOptions{});
    Array x = device_put(t, NamedSharding(mesh, P("data", "model")), exec);
    // x, exp(x), its transpose: three shards live at once unless x is freed after exp.
    const std::int64_t peak = f.lower(x).cost().peak_bytes[0];
    EXPECT_EQ(peak, (donate ? 2 : 3) * kShard);
    exec.reset_peak();
    const Array y = f(x);
    EXPECT_LT(max_diff(y.to_host(), expect), 1e-6);
    for (const int d : exec.local_devices()) {
      EXPECT_EQ(exec.memory(d).peak, peak) << "device " << d;
    }
    EXPECT_EQ(exec.memory(exec.local_devices().front()).in_use, donate ? kShard : 2 * kShard);
  }
  // With room for 2.5 shards per device the donated call fits and the other runs out.
  for (const bool donate : {false, true}) {
    const Executor exec(8, kShard * 5 / 2);
    auto f = sjit(mesh, &exp_transpose_sin, donate ? donating : SjitOptions{});
    const Array x = device_put(t, NamedSharding(mesh, P("data", "model")), exec);
    if (donate) {
      EXPECT_LT(max_diff(f(x).to_host(), expect), 1e-6);
      EXPECT_THROW_WITH(x.to_host(), ArrayError, "donated");
    } else {
      expect_out_of_memory([&] { f(x); });
      EXPECT_TRUE(x.to_host() == t);  // not donated: untouched
    }
  }
}

TEST(Sjit, DonatingOneArrayFromTwoThreadsConsumesItOnce) {
  if (distributed::process_count() > 1) {
    // Over processes every process must enter the same collectives in the same order
    // (docs/distributed.md), which two racing threads do not.
    GTEST_SKIP() << "two threads calling one program: a one-process test";
  }
  Meshes s;
  SjitOptions o;
  o.donate_argnums = {0};
  auto f = sjit(
      s.mesh, [](const Array& x) { return x * 2.0; }, o);
  const Tensor t = Tensor::normal(Shape{64, 64}, DType::kF32, 3);
  const Tensor twice = (s.put1(t) * 2.0).to_host();
  f(s.put(t, P("data")));  // compiled before the race
  for (int round = 0; round < 50; ++round) {
    const Array x = s.put(t, P("data"));
    std::atomic<int> ok{0};
    std::vector<std::string> errors(2);
    std::vector<Tensor> results(2);
    auto call = [&](int k) {
      try {
        results[static_cast<std::size_t>(k)] = f(x).to_host();
        ++ok;
      } catch (const ArrayError& e) {
        errors[static_cast<std::size_t>(k)] = e.what();
      }
    };
    std::thread a(call, 0), b(call, 1);
    a.join();
    b.join();
    ASSERT_EQ(ok.load(), 1) << "round " << round;
    const std::size_t winner = errors[0].empty() ? 0 : 1;
    EXPECT_TRUE(results[winner] == twice);
    EXPECT_THAT(errors[1 - winner], ::testing::HasSubstr("argument 0"));
    EXPECT_THAT(errors[1 - winner], ::testing::HasSubstr("donated"));
    EXPECT_THROW_WITH(x.to_host(), ArrayError, "donated");
  }
}

TEST(Sjit, InvalidDonateArgnumsAreErrorsNamingThePosition) {
  Meshes s;
  const auto f = [](const Array& x, int k) { return x * double(k); };
  EXPECT_THROW_WITH(sjit(s.mesh, f, SjitOptions{.donate_argnums = {-1}}), SpecError,
                    "donate_argnums", "-1", "negative");
  EXPECT_THROW_WITH(sjit(s.mesh, f, SjitOptions{.donate_argnums = {0, 0}}), SpecError,
                    "donate_argnums", "0", "twice");
  EXPECT_THROW_WITH(sjit(s.mesh, f, SjitOptions{.static_argnums = {1}, .donate_argnums = {1}}),
                    SpecError, "donate_argnums", "1", "static_argnums");
  const Array x = s.put(Tensor::ones(Shape{8}, DType::kF32), P());
  auto static_one = sjit(s.mesh, f, SjitOptions{.donate_argnums = {1}});
  EXPECT_THROW_WITH(static_one(x, 2), SpecError, "argument 1", "static");
  EXPECT_THROW_WITH(static_one.lower(x, 2), SpecError, "argument 1", "static");
  auto out_of_range = sjit(s.mesh, f, SjitOptions{.donate_argnums = {2}});
  EXPECT_THROW_WITH(out_of_range(x, 2), SpecError, "position 2", "out of range", "2 arguments");
  EXPECT_EQ(x.to_host().get(0), 1.0);  // nothing was donated
  // The same array donated and passed again (or captured) would be read after it is freed.
  auto both = sjit(
      s.mesh, [](const Array& a, const Array& b) { return a + b; },
      SjitOptions{.donate_argnums = {0}});
  EXPECT_THROW_WITH(both(x, x), ArrayError, "argument 0", "also passed as argument 1");
  auto captures = sjit(
      s.mesh, [&](const Array& a) { return a + x; }, SjitOptions{.donate_argnums = {0}});
  EXPECT_THROW_WITH(captures(x), ArrayError, "argument 0", "captures");
  EXPECT_EQ(x.to_host().get(0), 1.0);
}

TEST(Sjit, InvalidBatchArgnumsAreErrorsNamingThePosition) {
  Meshes s;
  const auto f = [](const Array& x, int k) { return x * double(k); };
  EXPECT_THROW_WITH(sjit(s.mesh, f, SjitOptions{.batch_argnums = {-1}}), SpecError,
                    "batch_argnums", "position -1");
  EXPECT_THROW_WITH(sjit(s.mesh, f, SjitOptions{.batch_argnums = {0, 0}}), SpecError,
                    "batch_argnums", "position 0", "twice");
  EXPECT_THROW_WITH(sjit(s.mesh, f, SjitOptions{.static_argnums = {1}, .batch_argnums = {1}}),
                    SpecError, "batch_argnums", "position 1", "static");
  const Array x = s.put(Tensor::ones(Shape{8}, DType::kF32), P());
  auto static_one = sjit(s.mesh, f, SjitOptions{.batch_argnums = {1}});
  EXPECT_THROW_WITH(static_one(x, 2), SpecError, "batch_argnums", "argument 1", "static");
  auto out_of_range = sjit(s.mesh, f, SjitOptions{.batch_argnums = {2}});
  EXPECT_THROW_WITH(out_of_range.lower(x, 2), SpecError, "batch_argnums", "position 2",
                    "out of range", "2 arguments");
}

TEST(Sjit, AFailedCallDoesNotConsumeItsDonatedArguments) {
  const Mesh mesh = Mesh::parse("data:4,model:2", 8);
  const Tensor t = Tensor::normal(Shape{1024, 64}, DType::kF32, 1);
  SjitOptions o;
  o.donate_argnums = {0};
  {
    Meshes s;
    const Array x = s.put(Tensor::ones(Shape{8, 4}, DType::kF32), P("data"));
    auto bad_shape = sjit(
        s.mesh, [](const Array& a) { return matmul(a, a); }, o);
    EXPECT_THROW_WITH(bad_shape(x), SpecError, "matmul");
    auto throws = sjit(
        s.mesh,
        [](const Array& a) -> Array {
          if (a.shape()[0] == 8) throw std::runtime_error("user error");
          return a;
        },
        o);
    EXPECT_THROW_WITH(throws(x), std::runtime_error, "user error");
    EXPECT_EQ(x.to_host().get(5), 1.0);
  }
  // Out of memory at the program's first allocation: x is given back, and a later call with
  // enough memory may donate it.
  const Executor exec(8, kShard * 3 / 2);
  auto f = sjit(mesh, &sin_cos_exp, o);
  const Array x = device_put(t, NamedSharding(mesh, P("data", "model")), exec);
  expect_out_of_memory([&] { f(x); });
  EXPECT_TRUE(x.to_host() == t);
  exec.set_memory_limit(kShard * 2);
  const Array y = f(x);
  EXPECT_THROW_WITH(x.to_host(), ArrayError, "donated");
  EXPECT_EQ(y.shape(), t.shape());
}

TEST(Sjit, ArraysOnAnotherExecutorAreErrorsAsForEagerOps) {
  Meshes s;
  const Executor other(8);
  const Tensor t = Tensor::ones(Shape{8}, DType::kF32);
  const Array bias = device_put(t, NamedSharding(s.mesh, P("data")), other);
  auto f = sjit(s.mesh, [&](const Array& x) { return x + bias; });
  EXPECT_THROW_WITH(f(s.put(t, P())), ArrayError, "different executors", "captured",
                    "Array(f32[8], NamedSharding(", "argument 0");
  // Eager ops say the same.
  EXPECT_THROW_WITH(s.put(t, P()) + bias, ArrayError, "different executors");
  auto g = sjit(s.mesh, [](const Array& a, const Array& b) { return a + b; });
  EXPECT_THROW_WITH(g(s.put(t, P()), bias), ArrayError, "different executors", "argument 0",
                    "argument 1");
  auto h = sjit(
      s.mesh, [](const Array& a) { return a + 1.0; }, SjitOptions{.executor = other});
  EXPECT_THROW_WITH(h(s.put(t, P())), ArrayError, "argument 0", "SjitOptions::executor");
  EXPECT_EQ(h(bias).to_host().get(0), 2.0);
}

}  // namespace
}  // namespace shardplan
