// Settings of the decoder's blocks one by one: which layers --remat makes checkpoints
// (--remat-blocks, as torchtitan's selective layer AC and fms-fsdp's selective_checkpointing
// choose them), and whether FSDP reshards the last block after forward apart from the root
// module's wrapping (--no-reshard-last-block, --fsdp-root).
#include "train_plan_test.hpp"

namespace shardplan {
namespace {

using namespace test;

std::vector<std::int64_t> chosen(const std::string& form, std::int64_t layers) {
  const RematBlocks b = parse_remat_blocks(form);
  std::vector<std::int64_t> out;
  for (std::int64_t i = 0; i < layers; ++i) {
    if (b.selects(i)) out.push_back(i);
  }
  return out;
}

// torchtitan (3f20451, Dec 2024, parallelisms/parallelize_llama.py _apply_ac_to_transformer_block)
// counts the blocks from 1 and wraps those whose count divides by selective_ac_option; fms-fsdp
// (policies/ac_handler.py) documents p = 1/2: [ac, no-ac, ...], 1/3: [no-ac, ac, no-ac, ...],
// 2/3: [ac, no-ac, ac, ac, no-ac, ac, ...].
TEST(RematBlocks, ChoosesTheBlocksTheStacksWrap) {
  using V = std::vector<std::int64_t>;
  EXPECT_EQ(chosen("every:2", 8), (V{1, 3, 5, 7}));
  EXPECT_EQ(chosen("every:3", 8), (V{2, 5}));
  EXPECT_EQ(chosen("fraction:0.5", 7), (V{0, 2, 4, 6}));
  EXPECT_EQ(chosen("fraction:1/2", 7), (V{0, 2, 4, 6}));
  EXPECT_EQ(chosen("fraction:1/3", 9), (V{1, 4, 7}));
  EXPECT_EQ(chosen("fraction:2/3", 9), (V{0, 2, 3, 5, 6, 8}));
  EXPECT_EQ(chosen("layers:0-1,5", 8), (V{0, 1, 5}));
  for (const char* all : {"all", "every:1", "fraction:1", "fraction:3/3"}) {
    EXPECT_EQ(parse_remat_blocks(all), RematBlocks()) << all;
    EXPECT_EQ(remat_blocks_name(parse_remat_blocks(all)), "all");
  }
  for (const char* form : {"every:4", "fraction:0.25", "fraction:2/3", "layers:0-1,5,7-9"}) {
    EXPECT_EQ(remat_blocks_name(parse_remat_blocks(form)), form);
  }
}

TEST(RematBlocks, RefusesWhatIsNoFormNamingIt) {
  for (const char* bad : {"every:0", "every:", "every:-2", "every:2x", "fraction:0",
                          "fraction:1.5", "fraction:1/0", "fraction:.", "fraction:a",
                          "layers:", "layers:3-1", "layers:4,2", "layers:0-3,3", "layers:1,,2",
                          "some", "Every:2"}) {
    EXPECT_THROW_WITH(parse_remat_blocks(bad), SpecError, std::string("--remat-blocks"),
                      fmt::format("'{}'", bad), std::string("every:K"));
  }
}

// The runs of layers train-plan samples in (extrapolating from small steps): the choice's period
// over the model's layers; a choice that never repeats is its layer count (traced whole).
TEST(RematBlocks, PeriodOverTheModelsLayers) {
  TrainPlanOptions o;
  EXPECT_EQ(train::checkpoint_period(o, 22), 1);  // no recomputation
  o.recompute = true;
  EXPECT_EQ(train::checkpoint_period(o, 22), 1);
  o.remat_blocks = parse_remat_blocks("every:2");
  EXPECT_EQ(train::checkpoint_period(o, 45), 2);
  o.remat_blocks = parse_remat_blocks("fraction:1/3");
  EXPECT_EQ(train::checkpoint_period(o, 64), 3);
  o.remat_blocks = parse_remat_blocks("layers:0-3");
  EXPECT_EQ(train::checkpoint_period(o, 22), 22);
  EXPECT_EQ(train::checkpoint_period(o, 4), 1);  // every layer
  EXPECT_EQ(train::checkpoint_period(o, 1), 1);
  o.remat_blocks = parse_remat_blocks("every:4");
  EXPECT_EQ(train::checkpoint_period(o, 10), 4);  // ---C---C--
  o.remat_blocks = parse_remat_blocks("fraction:2/3");
  EXPECT_EQ(train::checkpoint_period(o, 30), 3);
  o.remat_blocks = parse_remat_blocks("layers:0,31");
  EXPECT_EQ(train::checkpoint_period(o, 32), 31);  // C ... C: repeats once, past the samples
  o.remat_blocks = parse_remat_blocks("layers:0-49999");  // linear in the layers
  EXPECT_EQ(train::checkpoint_period(o, 100000), 100000);
}

const char* kFourLayers = R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 32,
  "intermediate_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4,
  "num_key_value_heads": 2})";

// The tiny LLaMA with 4 layers on fsdp:4, batch 8 x 64 tokens (128 tokens a device), bf16,
// --remat full. A checkpointed layer runs its forward again in the backward pass as far as its
// backward reads: every product but the down projection, whose output only feeds the residual
// add: 2 x 128 x (32x32 + 16x32 + 16x32 + 32x32 + 48x32 + 48x32) = 1,572,864 matmul FLOPs, and
// its attention again. A layer before the last that is a checkpoint keeps its input only, the
// same saving at the peak (the last layer's backward pass) whichever it is; the last layer's
// activations are made again there at once, so choosing it saves little.
TEST(PlanTraining, RematBlocksRecomputeOnlyTheChosenLayers) {
  const ModelConfig c = ModelConfig::parse(kFourLayers);
  const Mesh mesh = Mesh::parse("fsdp:4", 4);
  TrainPlanOptions o;
  o.batch = 8;
  o.seq = 64;
  const TrainPlan none = plan_training(c, mesh, preset("llama_fsdp"), o);
  o.remat = checkpoint_policies::nothing_saveable();
  const auto with = [&](const char* blocks) {
    TrainPlanOptions b = o;
    b.remat_blocks = parse_remat_blocks(blocks);
    return plan_training(c, mesh, preset("llama_fsdp"), b);
  };
  const TrainPlan all = with("all");
  constexpr double kLayerMatmul = 2.0 * 128 * (1024 + 512 + 512 + 1024 + 1536 + 1536);
  const double layer_attention = (all.attention_flops - none.attention_flops) / 4;
  EXPECT_DOUBLE_EQ(all.matmul_flops - none.matmul_flops, 4 * kLayerMatmul);
  const std::int64_t saving = none.peak_bytes - with("layers:0").peak_bytes;
  EXPECT_GT(saving, 0);
  for (const auto& [blocks, layers, savings] :
       std::vector<std::tuple<const char*, int, std::int64_t>>{
           {"layers:0", 1, saving},
           {"layers:1", 1, saving},
           {"layers:2", 1, saving},
           {"layers:0-2", 3, 3 * saving},
           {"fraction:1/2", 2, 2 * saving},  // layers 0 and 2
       }) {
    SCOPED_TRACE(blocks);
    const TrainPlan p = with(blocks);
    EXPECT_EQ(p.remat_layers, layers);
    EXPECT_DOUBLE_EQ(p.matmul_flops - none.matmul_flops, layers * kLayerMatmul);
    EXPECT_DOUBLE_EQ(p.attention_flops - none.attention_flops, layers * layer_attention);
    EXPECT_EQ(none.peak_bytes - p.peak_bytes, savings);
    // The layers that are no checkpoints are resharded after forward as without --remat.
    EXPECT_TRUE(p.reshard_after_forward);
    EXPECT_EQ(p.bytes_by_collective, none.bytes_by_collective);
  }
  // every:2 (layers 1 and 3): layer 1's saving and the last layer's.
  const TrainPlan every2 = with("every:2");
  const TrainPlan last = with("layers:3");
  EXPECT_EQ(every2.remat_layers, 2);
  EXPECT_DOUBLE_EQ(every2.matmul_flops - none.matmul_flops, 2 * kLayerMatmul);
  EXPECT_EQ(none.peak_bytes - every2.peak_bytes, saving + (none.peak_bytes - last.peak_bytes));
  EXPECT_LT(none.peak_bytes - last.peak_bytes, saving);
  EXPECT_FALSE(all.reshard_after_forward);
  EXPECT_EQ(all.remat_layers, 4);
  EXPECT_NE(every2.table().find("remat full (on blocks every:2: 2 layers; the other layers' "
                                "weights gathered again for the backward pass)"),
            std::string::npos)
      << every2.table();
  std::ostringstream js;
  every2.write_json(js);
  const auto j = nlohmann::json::parse(js.str());
  EXPECT_EQ(j["remat_blocks"], "every:2");
  EXPECT_EQ(j["remat_layers"], 2);
}

TEST(PlanTraining, RefusesRematBlocksItCannotApply) {
  const ModelConfig c = ModelConfig::parse(kFourLayers);
  const Mesh mesh = Mesh::parse("fsdp:4", 4);
  TrainPlanOptions o;
  o.seq = 64;
  o.remat_blocks = parse_remat_blocks("every:2");
  EXPECT_THROW_WITH(plan_training(c, mesh, preset("llama_fsdp"), o), OptionError,
                    "--remat-blocks is refused: no recomputation", "every:2", "--remat full");
  o.recompute = true;
  o.remat_blocks = parse_remat_blocks("layers:1,3-4");
  EXPECT_THROW_WITH(plan_training(c, mesh, preset("llama_fsdp"), o), OptionError,
                    "a layer past the model's last", "layers:1,3-4: layer 4 is past the last, "
                    "layer 3", "llama");
  TrainPlanOptions t5;
  t5.seq = 8;
  t5.reshard_last_block = false;
  EXPECT_THROW_WITH(plan_training(ModelConfig::parse(kTinyT5), Mesh::parse("fsdp:2,tp:2", 4),
                                  preset("t5"), t5),
                    OptionError, "--no-reshard-last-block is refused", "t5");
}

// Which layers are checkpoints and which keep their gathered weights change what is held, not
// what is computed: the loss and every gradient are bitwise those of the step without them.
TEST(LossAndGrads, RematBlocksAndTheKeptLastBlockGiveTheSameLossAndGradients) {
  const ModelConfig c = ModelConfig::parse(kFourLayers);
  const Executor exec(4);
  const Mesh mesh = Mesh::parse("fsdp:4,tp:1", 4);
  const Tree<Array> params = uniform_parameters(c, DType::kF32, 5, mesh, exec);
  const auto [tokens, targets] = tokens_and_targets(Shape{4, 8}, mesh, P("fsdp"), exec);
  const auto run = [&, x = tokens, y = targets](const char* blocks, bool keep_last) {
    const train::ModelStep model{
        .config = c,
        .layout = train::Layout{{"fsdp"}, {"tp"}, 4, 1},
        .remat = blocks != nullptr ? std::optional(checkpoint_policies::nothing_saveable())
                                   : std::nullopt,
        .remat_blocks = parse_remat_blocks(blocks != nullptr ? blocks : "all"),
        .compute_dtype = DType::kBF16,
        .reshard_after_forward = true,
        .keep_last_gathered = keep_last};
    return to_host(sjit(mesh, [&](const Tree<Array>& p, const Array& t, const Array& u) {
      auto [loss, grads] = train::loss_and_grads(model, p, t, u);
      return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
    })(params, x, y));
  };
  const Tree<Tensor> plain = run(nullptr, false);
  for (const auto& [blocks, keep_last] : std::vector<std::pair<const char*, bool>>{
           {"every:2", false}, {"every:2", true}, {"layers:0-1", true}, {nullptr, true}}) {
    SCOPED_TRACE(fmt::format("{}, last block kept {}", blocks ? blocks : "none", keep_last));
    const Tree<Tensor> a = run(blocks, keep_last);
    EXPECT_EQ(a.at("loss").leaf().get(0), plain.at("loss").leaf().get(0));
    const auto ga = a.at("grads").flatten(), gb = plain.at("grads").flatten();
    ASSERT_EQ(ga.size(), gb.size());
    for (std::size_t i = 0; i < ga.size(); ++i) {
      EXPECT_TRUE(ga[i].second == gb[i].second) << ga[i].first;
    }
  }
}

// The root module's wrapping and the last block's resharding, each alone. The tiny LLaMA (4
// layers; a layer's matrices 7,680 elements; the embedding and the head 64 x 32 each) on fsdp:4,
// weights f32 held and used in bf16. By hand: at the peak (the loss's backward pass) the weights
// gathered for use are the head (64 x 32 x 2 bytes); with the last block kept also its matrices
// (7,680 x 2 bytes), gathered once less (7,680 x 2 x 3/4 bytes received fewer); with the root
// module also the embedding, gathered as often as without it (the embedding's backward pass
// reads no weight).
TEST(PlanTraining, LastBlockAndRootWrappingAreIndependent) {
  const ModelConfig c = ModelConfig::parse(kFourLayers);
  const Mesh mesh = Mesh::parse("fsdp:4", 4);
  TrainPlanOptions o;
  o.batch = 8;
  o.seq = 64;
  o.param_dtype = DType::kBF16;
  o.master_dtype = o.reduce_dtype = o.grad_dtype = DType::kF32;
  const auto with = [&](bool root, std::optional<bool> reshard_last) {
    TrainPlanOptions b = o;
    b.fsdp_root = root;
    b.reshard_last_block = reshard_last;
    return plan_training(c, mesh, preset("llama_fsdp"), b);
  };
  constexpr std::int64_t kTable = 64 * 32 * 2, kLayer = 7680 * 2;
  const TrainPlan units = with(false, std::nullopt);
  const TrainPlan last = with(false, false);
  const TrainPlan root = with(true, true);
  const TrainPlan both = with(true, std::nullopt);  // --fsdp-root: torchtitan before #1094
  const auto gathers = [](const TrainPlan& p) {
    return p.bytes_by_collective.at(CollectiveKind::kAllGather);
  };
  EXPECT_EQ(units.peak_gathered_bytes, kTable);
  EXPECT_EQ(last.peak_gathered_bytes, kTable + kLayer);
  EXPECT_EQ(root.peak_gathered_bytes, 2 * kTable);
  EXPECT_EQ(both.peak_gathered_bytes, 2 * kTable + kLayer);
  EXPECT_EQ(gathers(units) - gathers(last), kLayer * 3 / 4);
  EXPECT_EQ(gathers(root), gathers(units));
  EXPECT_EQ(gathers(both), gathers(last));
  EXPECT_EQ(with(true, false).peak_gathered_bytes, both.peak_gathered_bytes);
  EXPECT_EQ(with(false, true).peak_bytes, units.peak_bytes);
  EXPECT_TRUE(last.last_block_kept_gathered);
  EXPECT_FALSE(last.fsdp_root);
  EXPECT_TRUE(root.fsdp_root);
  EXPECT_FALSE(root.last_block_kept_gathered);
  EXPECT_TRUE(both.last_block_kept_gathered);
  EXPECT_NE(last.table().find(", the last block kept gathered (not resharded after forward)"),
            std::string::npos);
  EXPECT_NE(root.table().find("to the backward's end)\n"), std::string::npos) << root.table();
  std::ostringstream js;
  last.write_json(js);
  EXPECT_EQ(nlohmann::json::parse(js.str())["last_block_kept_gathered"], true);
  // One device: nothing is resharded, nothing is kept apart.
  EXPECT_FALSE(plan_training(c, Mesh::parse("fsdp:1", 1), preset("llama_fsdp"), [&] {
                 TrainPlanOptions b = o;
                 b.reshard_last_block = false;
                 return b;
               }()).last_block_kept_gathered);
}

}  // namespace
}  // namespace shardplan
