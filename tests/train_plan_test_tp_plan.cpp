// --tp-plan: where a tensor-parallel step's layer weights are laid out as used. `modules` plans
// each block as Megatron's column/row-parallel modules (and torchtitan's ColwiseParallel /
// RowwiseParallel with SequenceParallel) run it.
#include "train_plan_test.hpp"

#include "shardplan/training_stack.hpp"

namespace shardplan::test {
namespace {

constexpr const char* kSmallLlama = R"({{"model_type": "llama", "vocab_size": 4096,
  "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": {},
  "num_attention_heads": 8, "num_key_value_heads": 8}})";

// Bytes a device receives per step by kind over the axes `axes` (any argument flag).
std::int64_t over(const TrainPlan& p, CollectiveKind kind, std::vector<std::string> axes) {
  std::int64_t b = 0;
  for (const auto& [on, bytes] : p.bytes_by_axes) {
    if (on.kind == kind && on.axes == axes) b += bytes;
  }
  return b;
}

TrainPlan plan_layers(int layers, TpPlan tp_plan, bool fused_loss = true,
                      bool reshard_after_forward = true,
                      std::optional<DType> master = std::nullopt) {
  const ModelConfig config = ModelConfig::parse(fmt::format(kSmallLlama, layers));
  TrainPlanOptions o;
  o.master_dtype = master;
  o.fused_loss = fused_loss;
  o.batch = 4;
  o.seq = 256;
  o.extrapolate = false;
  o.tp_plan = tp_plan;
  o.reshard_after_forward = reshard_after_forward;
  o.activations = load_preset("llama_fsdp_tp");  // its activations: sequence parallelism
  return plan_training(config, Mesh::parse("fsdp:2,tp:4", 8), preset("llama_fsdp_tp"), o);
}

// Per layer, by hand: the forward pass all-gathers the attention's and the MLP's input (the
// norm's output, its sequence split over tp) and reduce-scatters the output projections'
// partial sums back to the sequence split; the backward pass runs the transposes (a
// reduce-scatter for each all-gather and the reverse). Each moves [4 / 2 sequences, 256, 512]
// bf16 = 512 KiB, of which a device receives 3/4: 393,216 B, 4 times per kind. No all-to-all.
// The weights are used in their tp split: never gathered over tp. Two layers more add exactly
// that; the partitioner's own plan moves the attention's activations by all-to-all instead.
TEST(TensorParallelPlan, ModulesMoveEachBlocksActivationsAsMegatronDoes) {
  const TrainPlan two = plan_layers(2, TpPlan::kModules), four = plan_layers(4, TpPlan::kModules);
  EXPECT_TRUE(two.tp_modules);
  const std::int64_t per_layer = 4 * 393'216;
  EXPECT_EQ(over(four, CollectiveKind::kAllGather, {"tp"}) -
                over(two, CollectiveKind::kAllGather, {"tp"}),
            2 * per_layer);
  EXPECT_EQ(over(four, CollectiveKind::kReduceScatter, {"tp"}) -
                over(two, CollectiveKind::kReduceScatter, {"tp"}),
            2 * per_layer);
  EXPECT_EQ(over(four, CollectiveKind::kAllToAll, {"tp"}),
            over(two, CollectiveKind::kAllToAll, {"tp"}));

  const TrainPlan p2 = plan_layers(2, TpPlan::kPartitioner),
                  p4 = plan_layers(4, TpPlan::kPartitioner);
  EXPECT_FALSE(p2.tp_modules);
  EXPECT_GT(over(p4, CollectiveKind::kAllToAll, {"tp"}), over(p2, CollectiveKind::kAllToAll, {"tp"}));
}

// FSDP's reshard after forward holds for weights laid out as the modules use them: the backward
// pass gathers each layer's weights over fsdp again. By hand, a layer's matrices (q, k, v, o
// 512 x 512, the MLP's three 512 x 1024) are 2,621,440 bf16 values, split 4 ways over tp and
// gathered over fsdp:2, of which a device receives half: 655,360 B a layer. (Without mixed
// precision the weights as used were a value of the program that the reshard policy saved:
// both settings planned one program.)
TEST(TensorParallelPlan, ModulesGatherTheLayersWeightsAgainWhenReshardedAfterForward) {
  const TrainPlan kept = plan_layers(2, TpPlan::kModules, true, false),
                  resharded = plan_layers(2, TpPlan::kModules, true, true);
  EXPECT_TRUE(resharded.reshard_after_forward);
  EXPECT_EQ(over(resharded, CollectiveKind::kAllGather, {"fsdp"}) -
                over(kept, CollectiveKind::kAllGather, {"fsdp"}),
            2 * 655'360);
  EXPECT_LT(resharded.peak_bytes, kept.peak_bytes);
  // With mixed precision (f32 weights held, each layer cast to bf16 on its shard as FSDP2's
  // MixedPrecisionPolicy casts before the gather): the same bf16 bytes gathered again. (The
  // cast was a value the reshard policy saved, gathered: both settings planned one program.)
  const TrainPlan kept_mp = plan_layers(2, TpPlan::kModules, true, false, DType::kF32),
                  resharded_mp = plan_layers(2, TpPlan::kModules, true, true, DType::kF32);
  EXPECT_TRUE(resharded_mp.reshard_after_forward);
  EXPECT_EQ(over(resharded_mp, CollectiveKind::kAllGather, {"fsdp"}) -
                over(kept_mp, CollectiveKind::kAllGather, {"fsdp"}),
            2 * 655'360);
  EXPECT_LT(resharded_mp.peak_bytes, kept_mp.peak_bytes);
}

// The embedding, the final norm, the head and the loss as torchtitan's plan runs them with
// loss_parallel (and Megatron's VocabParallelEmbedding and vocab_parallel_cross_entropy), by
// hand on the same step with the naive loss: the embedding's rows split over tp, each device
// looks up its own and the partial sums are reduce-scattered along the sequence (RowwiseParallel,
// output Shard(1)): [2, 256, 512] bf16 = 512 KiB, 3/4 received, 393,216 B, and all-gathered in
// the backward pass. The head's input is all-gathered from the final norm's sequence split
// (ColwiseParallel, input Shard(1)), its cotangent reduce-scattered back: 393,216 B each. The
// logits stay split along the vocabulary (Shard(-1)); the loss all-reduces the rows' max and
// their sum of exponentials, [512 tokens] f32 = 2,048 B each, of which a ring all-reduce
// receives 2 x 3/4: 3,072 B (the target's logit, a masked pick, is summed with the mean).
// So over tp the head and the loss move 4 x 393,216 + 2 x 3,072 B beyond the layers' 8 x
// 393,216 each; nothing by all-to-all, the table never gathered over tp, the [tokens, vocab]
// logits never gathered. The table's gradient, [1024, 512] bf16 per tp shard, is all-reduced
// over fsdp inside the lookup: 2 x 1/2 x 1 MiB.
TEST(TensorParallelPlan, ModulesRunTheEmbeddingHeadAndLossVocabularyParallel) {
  const TrainPlan p = plan_layers(2, TpPlan::kModules, /*fused_loss=*/false);
  std::int64_t tp = 0;
  for (const CollectiveKind k : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                                 CollectiveKind::kAllReduce, CollectiveKind::kAllToAll}) {
    tp += over(p, k, {"tp"});
  }
  const std::int64_t layers = 2 * 8 * 393'216;
  EXPECT_EQ(tp - layers, 4 * 393'216 + 2 * 3'072);
  EXPECT_EQ(over(p, CollectiveKind::kAllToAll, {"tp"}), 0);
  EXPECT_EQ(over(p, CollectiveKind::kAllGather, {"tp", "fsdp"}), 0);
  EXPECT_EQ(over(p, CollectiveKind::kAllGather, {"fsdp", "tp"}), 0);
  EXPECT_EQ(over(p, CollectiveKind::kAllReduce, {"fsdp"}), 1'048'576);
  // The partitioner's own layout gathers the table over tp and fsdp for the lookup (take reads
  // its gathered axis whole) and moves the one-hot rows of its gradient by all-to-all.
  const TrainPlan q = plan_layers(2, TpPlan::kPartitioner, /*fused_loss=*/false);
  EXPECT_GT(over(q, CollectiveKind::kAllGather, {"tp", "fsdp"}), 0);
  EXPECT_GT(over(q, CollectiveKind::kAllToAll, {"tp"}), 0);
}

// The vocabulary-parallel lookup and the head in its vocabulary split compute what one device
// does: the loss and every gradient of a small step on fsdp:2 x tp:4, against the same step on
// one device, with sequence parallelism (the partial sums reduce-scattered along the sequence)
// and without (all-reduced). The token ids (below 40) fall in three of the four devices'
// rows (16 each): the last one reads none.
TEST(TensorParallelPlan, TheVocabularyParallelStepComputesWhatOneDeviceDoes) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 64,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4})");
  for (const std::int64_t t : {8, 6}) {
    SCOPED_TRACE(t);
    const auto run = [&](const char* axes, int n, train::Layout layout, bool modules) {
      const Executor exec(n);
      const Mesh mesh = Mesh::parse(axes, n);
      layout.mesh = mesh;
      layout.sequence_parallel = t % 4 == 0;
      const Tree<Array> params = uniform_parameters(c, DType::kF32, 5, mesh, exec);
      const auto [x, y] = tokens_and_targets(Shape{2, t}, mesh, P("fsdp"), exec);
      train::ModelStep model{.config = c, .layout = layout, .fused_loss = false};
      if (modules) {
        const PartitionSpec rows(std::vector<AxisNames>{{"tp"}, {}});
        model.outside_in_use = {{"model/embed_tokens/weight", rows}, {"lm_head/weight", rows}};
      }
      return to_host(sjit(mesh, [&](const Tree<Array>& p, const Array& a, const Array& b) {
        auto [loss, grads] = train::loss_and_grads(model, p, a, b);
        return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
      })(params, x, y));
    };
    const Tree<Tensor> one = run("fsdp:1,tp:1", 1, train::Layout{}, false);
    const Tree<Tensor> split = run("fsdp:2,tp:4", 8, train::Layout{{"fsdp"}, {"tp"}, 2, 4}, true);
    EXPECT_NEAR(split.at("loss").leaf().get(0), one.at("loss").leaf().get(0), 1e-5);
    const auto a = split.at("grads").flatten(), b = one.at("grads").flatten();
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      const auto u = a[i].second.to_doubles(), v = b[i].second.to_doubles();
      ASSERT_EQ(u.size(), v.size()) << a[i].first;
      for (std::size_t k = 0; k < u.size(); ++k) {
        ASSERT_NEAR(u[k], v[k], 1e-5 + 1e-4 * std::abs(v[k])) << a[i].first << " [" << k << "]";
      }
    }
  }
}

// Eager tensor parallelism: the host dispatches each op the forward and backward passes launch
// through DTensor (90 us each, PyTorch's own dispatch-overhead test) while the device runs the
// ops before it. This small step's device time is tens of microseconds, so the step is the
// host's: launched ops x 90 us exactly. Compiled, or without a model axis, nothing is charged.
// The update is not counted: AdamW's and SGD's steps launch the same ops.
TEST(TensorParallelPlan, EagerTensorParallelismWaitsForTheHostsDispatch) {
  const ModelConfig config = ModelConfig::parse(fmt::format(kSmallLlama, 2));
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 64;
  o.extrapolate = false;
  o.tp_plan = TpPlan::kModules;
  o.eager = true;
  o.hardware = find_hardware("h100-sxm");
  o.activations = load_preset("llama_fsdp_tp");
  const Mesh mesh = Mesh::parse("fsdp:2,tp:4", 8);
  const TrainPlan eager = plan_training(config, mesh, preset("llama_fsdp_tp"), o);
  ASSERT_TRUE(eager.time.has_value());
  const StepTime& t = *eager.time;
  EXPECT_GT(eager.launched_ops, 100);
  EXPECT_EQ(t.launched_ops, eager.launched_ops);
  EXPECT_DOUBLE_EQ(t.dispatch_seconds_per_op, 90e-6);
  EXPECT_DOUBLE_EQ(t.dispatch_seconds, static_cast<double>(eager.launched_ops) * 90e-6);
  EXPECT_LT(t.compute_seconds() + t.exposed_seconds, t.dispatch_seconds);
  EXPECT_DOUBLE_EQ(t.step_seconds, t.dispatch_seconds);
  EXPECT_DOUBLE_EQ(t.dispatch_exposed_seconds,
                   t.dispatch_seconds - t.compute_seconds() - t.exposed_seconds);
  EXPECT_THAT(eager.table(), ::testing::HasSubstr(fmt::format(
                                 "({} ops x 90.0 us dispatched eagerly through DTensor; the device "
                                 "waits",
                                 eager.launched_ops)));

  o.optimizer = OptimizerKind::kSgd;
  EXPECT_EQ(plan_training(config, mesh, preset("llama_fsdp_tp"), o).launched_ops,
            eager.launched_ops);
  o.optimizer = OptimizerKind::kAdamw;
  o.eager = false;
  const TrainPlan compiled = plan_training(config, mesh, preset("llama_fsdp_tp"), o);
  EXPECT_EQ(compiled.time->dispatch_seconds, 0);
  EXPECT_EQ(compiled.time->step_seconds,
            compiled.time->compute_seconds() + compiled.time->exposed_seconds);
  o.eager = true;
  o.activations.reset();
  o.tp_plan = TpPlan::kPartitioner;  // without a model axis --tp-plan modules is refused
  const TrainPlan fsdp = plan_training(config, Mesh::parse("fsdp:4", 4), preset("llama_fsdp"), o);
  EXPECT_EQ(fsdp.time->dispatch_seconds, 0);
}

// Without a model axis there is nothing to lay out. Asked for by the caller, the option would
// change nothing: refused by name, as is a model axis the rules split no layer weight over. Set
// by a stack (torchtitan's and Megatron's plan is the modules'), it is that stack's default
// there: the same program as without it, and the plan says the partitioner's (what ran).
TEST(TensorParallelPlan, WithoutAModelSplitModulesAreRefusedUnlessAStackSetsThem) {
  const ModelConfig config = ModelConfig::parse(fmt::format(kSmallLlama, 2));
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 256;
  o.extrapolate = false;
  const Mesh fsdp = Mesh::parse("fsdp:4", 4);
  o.tp_plan = TpPlan::kModules;
  EXPECT_THROW_WITH(plan_training(config, fsdp, preset("llama_fsdp"), o), OptionError,
                    "--tp-plan modules is refused", "split no layer weight",
                    "Mesh('fsdp': 4) (it has no tensor-parallel axis)");
  EXPECT_THROW_WITH(
      plan_training(config, Mesh::parse("fsdp:2,tp:2", 4), preset("llama_fsdp"), o), OptionError,
      "--tp-plan modules is refused", "(its tensor-parallel axes are [tp])", "llama_fsdp");
  TrainPlanOptions by_stack;
  by_stack.batch = 4;
  by_stack.seq = 256;
  by_stack.extrapolate = false;
  apply_stack(find_training_stack("megatron-core"), by_stack, {});
  ASSERT_EQ(by_stack.tp_plan, TpPlan::kModules);
  const TrainPlan b = plan_training(config, fsdp, preset("llama_fsdp"), by_stack);
  by_stack.tp_plan = TpPlan::kPartitioner;
  const TrainPlan c = plan_training(config, fsdp, preset("llama_fsdp"), by_stack);
  EXPECT_FALSE(b.tp_modules);
  EXPECT_EQ(b.bytes_by_axes, c.bytes_by_axes);
  EXPECT_EQ(b.peak_bytes, c.peak_bytes);
}

// Float8 under the modules' plan, as torchtitan's apply_tp (3f20451, parallelize_llama.py) runs
// it with enable_float8: Float8ColwiseParallel / Float8RowwiseParallel (torchao's
// float8_tensor_parallel.py) keep ColwiseParallel's and RowwiseParallel's weight split and cast
// each device's shard. By hand, per layer on the step above with float8 (a device's share of a
// gather over tp:4 is 3/4; [2, 256, 512] is 512 KiB in bf16, 256 KiB in 8 bits):
// - all-gathers over tp: the attention's and the MLP's input in bf16, 2 x 393,216 B (the rules'
//   attention_in / mlp_in regions gather it before float8_linear casts it; torchtitan's
//   PrepareFloat8ModuleInput casts first and gathers in float8, 196,608 B: not modelled), and
//   in the backward pass the cotangents of o_proj's and down_proj's outputs cast to f8_e5m2 on
//   their sequence split and gathered in 8 bits, 2 x 196,608 B (torchao's
//   _NoopFwToFloat8BwDynamic after the output's redistribute: its backward casts, then gathers);
// - reduce-scatters over tp, in bf16: o_proj's and down_proj's partial sums forward, the
//   column-parallel layers' input gradients backward: 4 x 393,216 B;
// - no all-to-all, and no weight gathered over tp;
// - the weights cast on their shards and gathered over fsdp in 8 bits, forward and again
//   backward (reshard after forward): 2,621,440 values / 4 (tp) / 2 (half received) = 327,680 B
//   twice; once when not resharded after forward (in bf16 it would be 655,360 B).
TEST(TensorParallelPlan, ModulesWithFloat8UseEachWeightInItsSplitIn8Bits) {
  const auto plan = [](int layers, bool reshard_after_forward = true) {
    const ModelConfig config = ModelConfig::parse(fmt::format(kSmallLlama, layers));
    TrainPlanOptions o;
    o.batch = 4;
    o.seq = 256;
    o.extrapolate = false;
    o.float8 = true;
    o.tp_plan = TpPlan::kModules;
    o.reshard_after_forward = reshard_after_forward;
    o.activations = load_preset("llama_fsdp_tp");
    return plan_training(config, Mesh::parse("fsdp:2,tp:4", 8), preset("llama_fsdp_tp"), o);
  };
  const TrainPlan two = plan(2), four = plan(4);
  EXPECT_TRUE(four.tp_modules);
  EXPECT_TRUE(four.float8);
  const auto grown = [&](CollectiveKind kind, std::vector<std::string> axes) {
    return over(four, kind, axes) - over(two, kind, axes);
  };
  EXPECT_EQ(grown(CollectiveKind::kAllGather, {"tp"}), 2 * (2 * 393'216 + 2 * 196'608));
  EXPECT_EQ(grown(CollectiveKind::kReduceScatter, {"tp"}), 2 * 4 * 393'216);
  EXPECT_EQ(over(four, CollectiveKind::kAllToAll, {"tp"}), 0);
  EXPECT_EQ(four.bytes_by_axes.count({CollectiveKind::kAllGather, {"tp"}, true}), 0U);
  EXPECT_EQ(grown(CollectiveKind::kAllGather, {"fsdp"}), 2 * 2 * 327'680);
  EXPECT_EQ(over(plan(4, false), CollectiveKind::kAllGather, {"fsdp"}) -
                over(plan(2, false), CollectiveKind::kAllGather, {"fsdp"}),
            2 * 327'680);
}

TEST(TensorParallelPlan, UnknownPlanIsRefused) {
  EXPECT_THROW_WITH(parse_tp_plan("megatron"), SpecError,
                    "unknown tensor-parallel plan 'megatron' (known: partitioner, modules)");
}

}  // namespace
}  // namespace shardplan::test
