// checkpoint / remat (remat.hpp): gradients bitwise equal to no rematerialisation under every
// policy, eagerly and under sjit on 1 and 4 devices; the peak is what the policy keeps and the
// FLOPs are the forward pass plus exactly what is recomputed (both worked out by hand on a
// two-layer model); names checked; nesting; weights gathered again where they are recomputed.
#include "shardplan/remat.hpp"

#include <string>
#include <vector>

#include "shardplan/autodiff.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

namespace cp = checkpoint_policies;

constexpr std::int64_t kN = 1024, kD = 8, kF = 32;  // rows, width, inner width

// One layer: u = h @ up [n, f], v = tanh(u) (named "v"), out = v @ down [n, d]; the residual
// h + out. Its VJPs read h and up (the first dot), v (tanh's derivative and the second dot) and
// down.
Array layer(const Tree<Array>& p, const Array& h) {
  const Array u = matmul(h, p.at("up").leaf());
  const Array v = checkpoint_name(tanh(u), "v");
  return h + matmul(v, p.at("down").leaf());
}

// loss = sum of the two layers' output, each layer checkpointed with `policy` (none: plain).
Array loss(const Tree<Array>& params, const Array& x, const std::optional<RematPolicy>& policy) {
  Array h = x;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tree<Array>& p = params.at(i);
    h = policy ? checkpoint([&](const Array& in) { return layer(p, in); }, *policy)(h)
               : layer(p, h);
  }
  return sum(h);
}

Tree<Array> params_on(const Mesh& mesh, const Executor& exec, const PartitionSpec& up,
                      const PartitionSpec& down, int num_layers = 2) {
  const auto put = [&](Shape s, std::uint64_t seed, const PartitionSpec& spec) {
    return device_put(Tensor::uniform(std::move(s), DType::kF32, seed, -0.5, 0.5),
                      NamedSharding(mesh, spec), exec);
  };
  std::vector<Tree<Array>> layers;
  std::uint64_t seed = 1;
  for (int i = 0; i < num_layers; ++i) {
    layers.push_back(Tree<Array>::dict({{"up", Tree<Array>(put(Shape{kD, kF}, seed, up))},
                                        {"down", Tree<Array>(put(Shape{kF, kD}, seed + 1, down))}}));
    seed += 2;
  }
  return Tree<Array>::list(std::move(layers));
}

Array input_on(const Mesh& mesh, const Executor& exec, const PartitionSpec& spec) {
  return device_put(Tensor::uniform(Shape{kN, kD}, DType::kF32, 9, -1, 1), NamedSharding(mesh, spec),
                    exec);
}

std::vector<RematPolicy> all_policies() {
  return {cp::everything_saveable(), cp::nothing_saveable(), cp::dots_saveable(),
          cp::dots_with_no_batch_dims_saveable(), cp::save_only_these_names({"v"}),
          cp::save_anything_except_these_names({"v"}), cp::save_anything_except_these_names({})};
}

std::vector<Tensor> host(const std::pair<Array, Tree<Array>>& r) {
  std::vector<Tensor> out{r.first.to_host()};
  for (const Array& g : r.second.leaves()) out.push_back(g.to_host());
  return out;
}

void expect_bitwise(const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                    const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(a[i].bit_equal(b[i])) << what << ": output " << i;
  }
}

// Under sjit on 4 devices, rows of x over `d` and the weights FSDP-sharded (their first
// dimension over `d`, gathered where they are used).
struct Sharded {
  Executor exec{4};
  Mesh mesh = Mesh::parse("d:4", 4);
  Tree<Array> params = params_on(mesh, exec, P("d"), P("d"));
  Array x = input_on(mesh, exec, P("d"));

  auto step(std::optional<RematPolicy> policy) {
    return sjit(mesh, [policy](const Tree<Array>& p, const Array& in) {
      auto [value, grads] =
          value_and_grad([&](const Tree<Array>& q) { return loss(q, in, policy); })(p);
      return Tree<Array>::list({Tree<Array>(value), grads});
    });
  }
};

// Eagerly (each op run at once, shard by shard; the barrier is the identity there).
TEST(Remat, EagerGradientsAreBitwiseThoseWithoutIt) {
  Sharded s;
  const auto run = [&](std::optional<RematPolicy> policy) {
    return host(
        value_and_grad([&](const Tree<Array>& p) { return loss(p, s.x, policy); })(s.params));
  };
  const std::vector<Tensor> plain = run(std::nullopt);
  for (const RematPolicy& policy : all_policies()) {
    expect_bitwise(run(policy), plain, policy.to_string());
  }
}

TEST(Remat, ShardedGradientsAreBitwiseThoseWithoutIt) {
  Sharded s;
  const auto run = [&](std::optional<RematPolicy> policy) {
    std::vector<Tensor> out;
    for (const Array& a : s.step(policy)(s.params, s.x).leaves()) out.push_back(a.to_host());
    return out;
  };
  const std::vector<Tensor> plain = run(std::nullopt);
  for (const RematPolicy& policy : all_policies()) expect_bitwise(run(policy), plain, policy.to_string());
}

// The figures of one policy's program with `layers` layers, per device.
struct Figures {
  double flops;
  std::int64_t peak, inputs, resharded, computed;
};
Figures figures(Sharded& s, const std::optional<RematPolicy>& policy, int layers) {
  const Lowered l = s.step(policy).lower(params_on(s.mesh, s.exec, P("d"), P("d"), layers), s.x);
  const ProgramCost& c = l.cost();
  return {c.flops[0], c.peak_bytes[0], c.peak_by_kind.inputs, c.peak_by_kind.resharded_inputs,
          c.peak_by_kind.computed};
}

// What a layer adds to the peak, worked out by hand. Per device: 256 of the 1,024 rows, f32.
// Every policy: the layer's weight shards (up and down, 8 x 32 each over 4 devices: 512 B).
// Without recomputation the backward pass reads the forward pass's values: the tanh result v
// (32 per row) and the layer's input h (8 per row), and the weights as gathered for the forward
// pass (2 x 1,024 B). nothing_saveable keeps h only; dots_saveable keeps u (the first dot; the
// second dot's result is read by no VJP) and h; save_only_these_names(v) keeps v and h; the
// recomputing policies gather the weights again in the backward pass (none kept gathered).
// And the FLOPs: the forward pass plus what is recomputed per layer: nothing_saveable the first
// dot (2 x 256 x 8 x 32) and tanh (256 x 32), dots_saveable tanh (v from the saved u), the
// others nothing (the second dot and the residual add are read by no VJP: not recomputed).
TEST(Remat, PeakIsWhatThePolicyKeepsAndFlopsWhatItRecomputes) {
  Sharded s;
  constexpr std::int64_t rows = kN / 4, f32 = 4, shards = 2 * kD * kF * f32 / 4;
  constexpr std::int64_t gathered = 2 * kD * kF * f32;
  constexpr double dot_up = 2.0 * rows * kD * kF, tanh_flops = 1.0 * rows * kF;
  struct Expect {
    std::optional<RematPolicy> policy;
    std::int64_t kept_per_row;  // floats a layer keeps per row of its activations
    std::int64_t gathered;      // weights kept gathered per layer
    double recomputed;          // FLOPs per layer
  };
  const std::vector<Expect> expects{
      {std::nullopt, kF + kD, gathered, 0},
      {cp::everything_saveable(), kF + kD, gathered, 0},
      {cp::nothing_saveable(), kD, 0, dot_up + tanh_flops},
      {cp::dots_saveable(), kF + kD, 0, tanh_flops},
      {cp::dots_with_no_batch_dims_saveable(), kF + kD, 0, tanh_flops},
      {cp::save_only_these_names({"v"}), kF + kD, 0, 0},
      // v made again from the saved u; with no names everything is saved, but the weights are
      // still gathered again (what train-plan's reshard after forward relies on).
      {cp::save_anything_except_these_names({"v"}), kF + kD, 0, tanh_flops},
      {cp::save_anything_except_these_names({}), kF + kD, 0, 0},
  };
  const Figures plain4 = figures(s, std::nullopt, 4);
  for (const Expect& e : expects) {
    const std::string what = e.policy ? e.policy->to_string() : "no checkpoint";
    const Figures four = figures(s, e.policy, 4), five = figures(s, e.policy, 5);
    EXPECT_EQ(five.peak - four.peak, shards + e.gathered + rows * e.kept_per_row * f32) << what;
    EXPECT_EQ(five.inputs - four.inputs, shards) << what;
    EXPECT_EQ(five.resharded - four.resharded, e.gathered) << what;
    EXPECT_EQ(five.computed - four.computed, rows * e.kept_per_row * f32) << what;
    EXPECT_EQ(four.flops - plain4.flops, 4 * e.recomputed) << what;
  }
}

// A name the policy lists that no checkpoint_name gives is an error naming it and the names
// there are; a name given outside the checkpointed function does not count.
TEST(Remat, AnUnknownNameInSaveOnlyTheseNamesIsAnError) {
  Sharded s;
  EXPECT_THROW_WITH(s.step(cp::save_only_these_names({"v", "attn_out"})).lower(s.params, s.x),
                    SpecError, "save_only_these_names(v, attn_out)", "'attn_out'",
                    "names given there: 'v'");
  auto outside = sjit(s.mesh, [](const Tree<Array>& p, const Array& in) {
    return value_and_grad([&](const Tree<Array>& q) {
             const Array named = checkpoint_name(in * 2.0, "w");
             return sum(checkpoint([&](const Array& h) { return layer(q.at(0), h); },
                                   cp::save_only_these_names({"w"}))(named));
           })(p)
        .first;
  });
  EXPECT_THROW_WITH(outside.lower(s.params, s.x), SpecError, "'w'", "names given there: 'v'");
  // The same for the names save_anything_except_these_names leaves out: a typo would silently
  // save everything.
  EXPECT_THROW_WITH(s.step(cp::save_anything_except_these_names({"vv"})).lower(s.params, s.x),
                    SpecError, "save_anything_except_these_names(vv)", "'vv'",
                    "names given there: 'v'");
}

// A policy made with ignoring_absent_names (a stack's list, written for many models, as JAX's
// policies are) saves the listed names that are given and ignores the others: the program is the
// one the given names alone make.
TEST(Remat, IgnoringAbsentNamesSavesTheNamesGiven) {
  Sharded s;
  const auto text = [&](const RematPolicy& p) { return s.step(p).lower(s.params, s.x).text(); };
  const RematPolicy listed = cp::save_only_these_names({"v", "attn_out"}).ignoring_absent_names();
  EXPECT_TRUE(listed.absent_names_ignored());
  EXPECT_FALSE(cp::save_only_these_names({"v"}).absent_names_ignored());
  EXPECT_EQ(text(listed), text(cp::save_only_these_names({"v"})));
  EXPECT_NE(text(listed), text(cp::nothing_saveable()));
}

// Without differentiation a checkpoint only calls the function: the same program as without.
TEST(Remat, WithoutGradItIsTheFunction) {
  Sharded s;
  const auto fwd = [](std::optional<RematPolicy> policy) {
    return [policy](const Tree<Array>& p, const Array& in) { return loss(p, in, policy); };
  };
  const Lowered plain = sjit(s.mesh, fwd(std::nullopt)).lower(s.params, s.x);
  const Lowered remat = sjit(s.mesh, fwd(cp::nothing_saveable())).lower(s.params, s.x);
  EXPECT_EQ(remat.text(), plain.text());
  EXPECT_TRUE(loss(s.params, s.x, cp::nothing_saveable()).to_host().bit_equal(
      loss(s.params, s.x, std::nullopt).to_host()));
}

// A checkpoint inside another: the inner region recomputes its own ops and reads what it needs
// of the outer one as saved; gradients are still bitwise those without; the two layers of one
// outer checkpoint recompute both first dots and tanhs (nothing_saveable outside, names inside).
TEST(Remat, NestedCheckpoints) {
  Sharded s;
  const auto step = [&](bool nested) {
    return sjit(s.mesh, [nested](const Tree<Array>& p, const Array& in) {
      auto [value, grads] = value_and_grad([&](const Tree<Array>& q) {
        const auto body = [&](const Array& x) {
          Array h = x;
          for (std::size_t i = 0; i < q.size(); ++i) {
            const Tree<Array>& lp = q.at(i);
            h = nested ? checkpoint([&](const Array& y) { return layer(lp, y); },
                                    cp::save_only_these_names({"v"}))(h)
                       : layer(lp, h);
          }
          return sum(h);
        };
        return nested ? checkpoint(body)(in) : body(in);
      })(p);
      return Tree<Array>::list({Tree<Array>(value), grads});
    });
  };
  const auto outs = [&](bool nested) {
    std::vector<Tensor> out;
    for (const Array& a : step(nested)(s.params, s.x).leaves()) out.push_back(a.to_host());
    return out;
  };
  expect_bitwise(outs(true), outs(false), "nested");
  // The inner regions save v; their inputs (the layers' inputs h, ops of the outer region) are
  // read as saved: nothing is recomputed.
  EXPECT_EQ(step(true).lower(s.params, s.x).cost().flops,
            step(false).lower(s.params, s.x).cost().flops);
}

}  // namespace
}  // namespace shardplan
