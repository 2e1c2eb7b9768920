// Mesh axis roles (docs/rule-files.md, "Axis roles"): the defaults by name, a rule file's
// axis_roles: declaring others, and train-plan's layout following them.
#include <gtest/gtest.h>

#include "shardplan/error.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/train_plan.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

TEST(AxisRoles, NamesAreTheDefaults) {
  for (const char* a : {"tp", "model", "mp", "tensor"}) EXPECT_EQ(default_axis_role(a), AxisRole::kModel) << a;
  for (const char* a : {"cp", "context"}) EXPECT_EQ(default_axis_role(a), AxisRole::kContext) << a;
  for (const char* a : {"fsdp", "dp", "data", "ep", "pp"}) EXPECT_EQ(default_axis_role(a), AxisRole::kBatch) << a;
  EXPECT_EQ(name(AxisRole::kPipeline), "pipeline");
}

TEST(AxisRoles, ARuleFileDeclaresThem) {
  const RuleFile f = parse_rule_file(R"(rules:
  - {match: ".*", spec: []}
axis_roles: {shard: batch, mp2: model, seq: context, ep: expert, stage: pipeline, tp: batch}
)");
  EXPECT_EQ(f.axis_role("shard"), AxisRole::kBatch);
  EXPECT_EQ(f.axis_role("mp2"), AxisRole::kModel);
  EXPECT_EQ(f.axis_role("seq"), AxisRole::kContext);
  EXPECT_EQ(f.axis_role("ep"), AxisRole::kExpert);
  EXPECT_EQ(f.axis_role("stage"), AxisRole::kPipeline);
  EXPECT_EQ(f.axis_role("tp"), AxisRole::kBatch);  // a declaration overrides the name
  EXPECT_EQ(f.axis_role("cp"), AxisRole::kContext);  // undeclared: by name
}

TEST(AxisRoles, BadDeclarationsNameTheFileLineAndAxis) {
  EXPECT_THROW_WITH(parse_rule_file("rules: []\naxis_roles: {tp: tensor}\n", "r.yaml"), IoError,
                    "r.yaml:2", "axis 'tp'", "expected batch, model, context, pipeline or expert",
                    "got 'tensor'");
  EXPECT_THROW_WITH(parse_rule_file("rules: []\naxis_roles: [tp]\n", "r.yaml"), IoError,
                    "r.yaml:2", "'axis_roles' as a mapping of mesh axis -> role", "a list");
  EXPECT_THROW_WITH(parse_rule_file("rules: []\naxis_roles: {tp: model, tp: batch}\n", "r.yaml"),
                    IoError, "r.yaml:2", "duplicate key 'tp'");
}

constexpr const char* kTinyLlama = R"({"model_type": "llama", "vocab_size": 64,
  "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2})";

TrainPlan plan_on(const char* mesh, const char* roles) {
  const RuleFile f = parse_rule_file(
      std::string("rules:\n  - {match: \".*\", spec: []}\n") + roles, "roles.yaml");
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 8;
  o.activations = f;
  return plan_training(ModelConfig::parse(kTinyLlama), Mesh::parse(mesh, 4), f.make_rule(), o);
}

// Unnamed, `mp2` would be a batch axis; declared a model axis, the batch splits over `shard`
// only, and the step's tensor-parallel collectives run over mp2.
TEST(AxisRoles, TrainPlanSplitsTheBatchOverTheDeclaredBatchAxes) {
  EXPECT_EQ(plan_on("shard:2,mp2:2", "").batch_axes, (std::vector<std::string>{"shard", "mp2"}));
  EXPECT_EQ(plan_on("shard:2,mp2:2", "axis_roles: {mp2: model}\n").batch_axes,
            (std::vector<std::string>{"shard"}));
  EXPECT_EQ(plan_on("tp:2,ep:2", "axis_roles: {tp: batch, ep: expert}\n").batch_axes,
            (std::vector<std::string>{"tp", "ep"}));
  EXPECT_THROW_WITH(plan_on("shard:2,stage:2", "axis_roles: {stage: pipeline}\n"), SpecError,
                    "mesh axis 'stage' is a pipeline axis", "roles.yaml", "not planned");
}

// A role for an axis the mesh lacks would apply to nothing: refused, naming the file and axis.
TEST(AxisRoles, ARoleForAnAxisTheMeshLacksIsRefused) {
  EXPECT_THROW_WITH(plan_on("shard:2,mp2:2", "axis_roles: {mp3: model}\n"), SpecError,
                    "axis_roles in roles.yaml", "'mp3'", "does not have");
}

}  // namespace
}  // namespace shardplan
