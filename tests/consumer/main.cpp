// Plans a small model with an installed shardplan; exits 0 when the plan is as expected.
#include <iostream>
#include <memory>

#include "shardplan/shardplan.hpp"

int main() {
  using namespace shardplan;
  const auto params = Tree<TensorSpec>::dict({
      {"w_in", TensorSpec{Shape{1024, 4096}, DType::kBF16}},
      {"w_out", TensorSpec{Shape{4096, 1024}, DType::kBF16}},
  });
  const MeshShardingHelper helper(Mesh::parse("fsdp:-1,tp:2", 8));
  const RuleFile preset = load_preset("llama_fsdp_tp");  // presets are compiled into the library
  const RuleTree rules(std::make_shared<FSDPShardingRule>());
  const PlanReport report = helper.plan(rules, params);
  std::cout << report.table();
  const bool ok = report.find("w_in")->bytes_per_device * 4 == 1024 * 4096 * 2 && !preset.rules.empty();
  return ok ? 0 : 1;
}
