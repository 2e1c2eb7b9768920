// The declared training stacks (training_stack.hpp): each choice sourced and either applied or
// listed as not modelled; apply_stack applies what no given option overrides and records it.
#include "shardplan/training_stack.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "test_util.hpp"

namespace shardplan {
namespace {

TEST(TrainingStack, EveryChoiceHasASourceAndSaysWhetherItIsPlanned) {
  std::set<std::string_view> names;
  for (const TrainingStack& s : training_stacks()) {
    SCOPED_TRACE(std::string(s.name));
    EXPECT_TRUE(names.insert(s.name).second) << "two stacks of one name";
    EXPECT_FALSE(s.summary.empty());
    std::set<std::string_view> topics;
    for (const StackChoice& c : s.choices) {
      SCOPED_TRACE(std::string(c.topic));
      EXPECT_TRUE(topics.insert(c.topic).second) << "a topic twice";
      EXPECT_FALSE(c.what.empty());
      EXPECT_FALSE(c.source.empty());
      // A choice not planned says so and what is planned instead; one planned never says it
      // is not, and the option its setting names is one that overrides it.
      EXPECT_EQ(c.setting.starts_with("not modelled: "), !c.modelled()) << c.setting;
      if (c.modelled() && c.setting.starts_with("--")) {
        const std::string_view first = c.setting.substr(0, c.setting.find(' '));
        EXPECT_NE(std::find(c.options.begin(), c.options.end(), first), c.options.end())
            << first;
      }
      if (!c.modelled()) {
        EXPECT_TRUE(c.options.empty());
      }
    }
  }
}

TEST(TrainingStack, ApplyingSetsTheChoicesNoGivenOptionOverrides) {
  const TrainingStack& s = find_training_stack("torchtitan-2024-12");
  TrainPlanOptions o;
  apply_stack(s, o);
  EXPECT_TRUE(o.eager);
  EXPECT_TRUE(o.fsdp_root);
  EXPECT_EQ(o.fused_loss, std::optional<bool>(false));
  EXPECT_EQ(o.master_dtype, std::optional<DType>(DType::kF32));
  EXPECT_EQ(o.reduce_dtype, std::optional<DType>(DType::kF32));
  EXPECT_EQ(remat_name(o.remat), "torchtitan:op");
  ASSERT_TRUE(o.stack.has_value());
  EXPECT_EQ(o.stack->name, "torchtitan-2024-12");
  EXPECT_TRUE(o.stack->validated);
  EXPECT_TRUE(o.stack->overridden.empty());
  EXPECT_EQ(o.optimizer_kernel, OptimizerKernel::kForeach);
  EXPECT_TRUE(o.stack->not_modelled.empty());

  TrainPlanOptions given;
  apply_stack(s, given, [](std::string_view option) {
    return option == "--loss" || option == "--fsdp-root" ? std::string(option) : std::string();
  });
  EXPECT_EQ(given.fused_loss, std::nullopt);  // left as it was
  EXPECT_FALSE(given.fsdp_root);
  EXPECT_TRUE(given.eager);
  EXPECT_EQ(given.stack->overridden,
            (std::vector<std::string>{"loss (by --loss)", "FSDP wrapping (by --fsdp-root)"}));

  // A stack with fewer than 2 published runs is unvalidated.
  TrainPlanOptions m;
  apply_stack(find_training_stack("maxtext"), m);
  EXPECT_FALSE(m.stack->validated);
  EXPECT_FALSE(m.eager);
  EXPECT_EQ(remat_name(m.remat), "full");
}

TEST(TrainingStack, AnUnknownNameListsTheKnownOnes) {
  EXPECT_THROW_WITH(find_training_stack("megatron"), SpecError, "unknown stack 'megatron'",
                    "known: torchtitan-2024-07", "megatron-core", "maxtext");
}

// torch.optim.AdamW's default kernel on CUDA (foreach) is planned as torch's passes in the stacks
// that run it; Composer's loop over the parameters (llm-foundry) is not modelled.
TEST(TrainingStack, TheForeachStacksPlanTorchsForeachPasses) {
  const auto kernel_choice = [](const TrainingStack& s) {
    const auto c = std::find_if(s.choices.begin(), s.choices.end(),
                                [](const StackChoice& x) { return x.topic == "optimizer kernel"; });
    EXPECT_NE(c, s.choices.end()) << s.name;
    return *c;
  };
  for (const char* name : {"torchtitan-2024-07", "torchtitan-2024-12", "fms-fsdp"}) {
    SCOPED_TRACE(name);
    const TrainingStack& s = find_training_stack(name);
    const StackChoice c = kernel_choice(s);
    EXPECT_EQ(c.setting, "--optimizer-kernel foreach");
    EXPECT_NE(c.source.find("torch/optim/adamw.py: _multi_tensor_adamw"), std::string_view::npos);
    TrainPlanOptions o;
    apply_stack(s, o);
    EXPECT_EQ(o.optimizer_kernel, OptimizerKernel::kForeach);
  }
  const StackChoice loop = kernel_choice(find_training_stack("llm-foundry"));
  EXPECT_FALSE(loop.modelled());
  EXPECT_NE(loop.what.find("one parameter at a time"), std::string_view::npos);
}

}  // namespace
}  // namespace shardplan
