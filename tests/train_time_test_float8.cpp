// train-plan's float8 recipes and all-gather dtype (--float8-recipe, --float8-all-gather;
// docs/training.md "Float8"), on a tiny LLaMA over fsdp:4, each figure worked out by hand.
#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "shardplan/error.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/train_plan.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

// Hidden 64, MLP 128, 4 heads of 16 (4 key/value heads): each layer's linear weights are q, k,
// v, o (64 x 64 = 4,096 each) and gate, up, down (128 x 64 = 8,192 each): 40,960 a layer.
constexpr const char* kLlama64 = R"({"model_type": "llama", "vocab_size": 64,
  "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 4})";
constexpr double kLinearWeights = 40960;
constexpr double kLayers = 2;

TrainPlan plan(TrainPlanOptions o) {
  o.batch = 4;
  o.seq = 16;
  o.extrapolate = false;
  o.float8 = true;
  return plan_training(ModelConfig::parse(kLlama64), Mesh::parse("fsdp:4", 4),
                       load_preset("llama_fsdp").make_rule(), o);
}

std::int64_t gathered(const TrainPlan& p) {
  return p.bytes_by_collective.at(CollectiveKind::kAllGather);
}

// Each weight gathered once (no reshard after forward, so neither dtype gathers again for the
// backward pass): a device receives 3/4 of each linear weight, in 1 byte (float8) or 2 (bf16):
// 30,720 B more a layer in bf16, as many as the float8 gathers of those weights, so the bf16
// gathers of the linear weights are exactly twice the float8 ones. The other weights (norms,
// embedding, head) are gathered alike.
TEST(Float8Recipes, ABf16AllGatherMovesTwiceTheFloat8Bytes) {
  TrainPlanOptions o;
  o.reshard_after_forward = false;
  const TrainPlan f8 = plan(o);
  o.float8_all_gather = Float8Gather::kBf16;
  const TrainPlan bf16 = plan(o);
  EXPECT_EQ(gathered(bf16) - gathered(f8),
            static_cast<std::int64_t>(kLayers * kLinearWeights * 3 / 4));
  EXPECT_EQ(f8.float8_all_gather, "float8");
  EXPECT_EQ(bf16.float8_all_gather, "bf16");
  EXPECT_EQ(f8.float8_recipe, "tensorwise");
  EXPECT_EQ(bf16.float8_recipe, "tensorwise");
  // The same products either way.
  EXPECT_DOUBLE_EQ(bf16.matmul_fp8_flops, f8.matmul_fp8_flops);
  EXPECT_THAT(bf16.table(),
              ::testing::HasSubstr("linear layers float8 (tensorwise scaling, inputs kept in 8 "
                                   "bits, weights all-gathered in bf16; the head and attention "
                                   "in bf16)"));
  std::ostringstream js;
  bf16.write_json(js);
  const auto j = nlohmann::json::parse(js.str());
  EXPECT_EQ(j["float8_recipe"], "tensorwise");
  EXPECT_EQ(j["float8_all_gather"], "bf16");
}

// 16 tokens a device. Forward, dx and dw each 2 x 16 x 40,960 FLOPs a layer: all three at the
// fp8 rate for tensorwise and rowwise (6 x 16 x 40,960 x 2 layers = 7,864,320), dw at the bf16
// rate for rowwise_with_gw_hp (2,621,440 moved to matmul_flops). Rowwise gathers in bf16 by
// default (torchao casts a rowwise weight after the gather).
TEST(Float8Recipes, RowwiseWithGwHpMovesTheWeightGradientToTheBf16Rate) {
  TrainPlanOptions o;
  const TrainPlan tensorwise = plan(o);
  o.float8_recipe = Float8Scaling::kRowwise;
  const TrainPlan rowwise = plan(o);
  o.float8_recipe = Float8Scaling::kRowwiseWithGwHp;
  const TrainPlan hp = plan(o);
  const double per_product = 2 * 16 * kLinearWeights * kLayers;
  EXPECT_DOUBLE_EQ(tensorwise.matmul_fp8_flops, 3 * per_product);
  EXPECT_DOUBLE_EQ(rowwise.matmul_fp8_flops, 3 * per_product);
  EXPECT_DOUBLE_EQ(hp.matmul_fp8_flops, 2 * per_product);
  EXPECT_DOUBLE_EQ(hp.matmul_flops - rowwise.matmul_flops, per_product);
  EXPECT_EQ(rowwise.float8_recipe, "rowwise");
  EXPECT_EQ(hp.float8_recipe, "rowwise_with_gw_hp");
  EXPECT_EQ(rowwise.float8_all_gather, "bf16");
  EXPECT_EQ(hp.float8_all_gather, "bf16");
  EXPECT_THAT(hp.table(), ::testing::HasSubstr(
                              "linear layers float8 (rowwise_with_gw_hp scaling (weight gradients "
                              "in bf16), inputs kept in bf16, weights all-gathered in bf16;"));
}

// Under --tp-plan modules a weight is used in its tp split, gathered over fsdp only: with a bf16
// gather (or a rowwise recipe) its casts stay in that split too, so no float8 weight is
// gathered anywhere (the casts were resharded in 8 bits over tp before they were pinned).
TEST(Float8Recipes, ModulesGatherRowwiseWeightsInBf16Only) {
  for (const auto& [recipe, gather] :
       std::vector<std::pair<Float8Scaling, std::optional<Float8Gather>>>{
           {Float8Scaling::kTensorwise, Float8Gather::kBf16},
           {Float8Scaling::kRowwise, std::nullopt},
           {Float8Scaling::kRowwiseWithGwHp, std::nullopt}}) {
    TrainPlanOptions o;
    o.batch = 8;
    o.seq = 16;
    o.extrapolate = false;
    o.float8 = true;
    o.float8_recipe = recipe;
    o.float8_all_gather = gather;
    o.tp_plan = TpPlan::kModules;
    const TrainPlan p = plan_training(ModelConfig::parse(kLlama64), Mesh::parse("fsdp:2,tp:2", 4),
                                      load_preset("llama_fsdp_tp").make_rule(), o);
    EXPECT_TRUE(p.tp_modules) << name(recipe);
    EXPECT_EQ(p.float8_recipe, name(recipe));
    EXPECT_EQ(p.float8_all_gather, "bf16") << name(recipe);
  }
}

TEST(Float8Recipes, RecipeOptionsAreRefusedWithoutFloat8OrWithAFloat8GatherOfRows) {
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 16;
  o.extrapolate = false;
  o.float8_recipe = Float8Scaling::kRowwise;
  const ModelConfig c = ModelConfig::parse(kLlama64);
  const Mesh mesh = Mesh::parse("fsdp:4", 4);
  const RulePtr rules = load_preset("llama_fsdp").make_rule();
  EXPECT_THROW_WITH(plan_training(c, mesh, rules, o), OptionError,
                    "--float8-recipe, --float8-all-gather is refused: without --float8",
                    "--float8-recipe rowwise choose how float8 linear layers run");
  o.float8_recipe.reset();
  o.float8_all_gather = Float8Gather::kBf16;
  EXPECT_THROW_WITH(plan_training(c, mesh, rules, o), OptionError, "without --float8",
                    "--float8-all-gather bf16 choose");
  o.float8 = true;
  o.float8_recipe = Float8Scaling::kRowwiseWithGwHp;
  o.float8_all_gather = Float8Gather::kFloat8;
  EXPECT_THROW_WITH(plan_training(c, mesh, rules, o), OptionError,
                    "--float8-all-gather float8 is refused: --float8-recipe rowwise or "
                    "rowwise_with_gw_hp",
                    "--float8-recipe rowwise_with_gw_hp scales each weight per row",
                    "enable_fsdp_float8_all_gather only supports tensorwise scaling granularity",
                    "give --float8-all-gather bf16");
  EXPECT_THROW_WITH(parse_float8_recipe("row"), SpecError,
                    "unknown float8 recipe 'row' (known: tensorwise, rowwise, rowwise_with_gw_hp");
  EXPECT_THROW_WITH(parse_float8_gather("fp8"), SpecError,
                    "unknown float8 all-gather dtype 'fp8' (known: float8, bf16)");
}

}  // namespace
}  // namespace shardplan
