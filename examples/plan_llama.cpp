// Plans a LLaMA-style model built in code, with rules written in code: the library without the
// command. Prints the plan table, then the picture of one weight's sharding.
#include <iostream>
#include <memory>

#include "shardplan/shardplan.hpp"

int main() {
  using namespace shardplan;
  using Params = Tree<TensorSpec>;
  constexpr std::int64_t kVocab = 32000, kHidden = 4096, kInter = 11008;
  const auto w = [](std::int64_t out, std::int64_t in) {
    return TensorSpec{Shape{out, in}, DType::kBF16};
  };

  // Two decoder layers in Hugging Face naming: model/layers/N/{self_attn,mlp}/..._proj/weight.
  std::vector<Params> layers;
  for (int l = 0; l < 2; ++l) {
    layers.push_back(Params::dict({
        {"self_attn", Params::dict({{"q_proj", Params::dict({{"weight", w(kHidden, kHidden)}})},
                                    {"o_proj", Params::dict({{"weight", w(kHidden, kHidden)}})}})},
        {"mlp", Params::dict({{"up_proj", Params::dict({{"weight", w(kInter, kHidden)}})},
                              {"down_proj", Params::dict({{"weight", w(kHidden, kInter)}})}})},
        {"input_layernorm", Params::dict({{"weight", TensorSpec{Shape{kHidden}, DType::kBF16}}})},
    }));
  }
  const Params params = Params::dict({
      {"model", Params::dict({{"embed_tokens", Params::dict({{"weight", w(kVocab, kHidden)}})},
                              {"layers", Params::list(std::move(layers))}})},
      {"step", TensorSpec{Shape{}, DType::kI64}},
  });

  // Megatron-style tensor parallelism for the matrices, replicated norms, and the step counter
  // replicated by a marker: the rule tree is a prefix of the parameter tree.
  const auto megatron =
      std::make_shared<TreePathShardingRule>(std::vector<TreePathShardingRule::Entry>{
          {"embed_tokens/weight$", P("tp", "fsdp")},
          {"(q_proj|up_proj)/weight$", P("tp", "fsdp")},
          {"(o_proj|down_proj)/weight$", P("fsdp", "tp")},
          {"norm", P()},
      });
  const RuleTree rules = RuleTree::dict({{"model", RulePtr(megatron)}, {"step", Replicated{}}});

  const MeshShardingHelper helper(Mesh::parse("fsdp:-1,tp:2", 8));
  const PlanReport report = helper.plan(rules, params);
  std::cout << report.table() << "\n";

  const auto shardings = helper.match(rules, params);
  const NamedSharding& up = *shardings.at_path("model/layers/0/mlp/up_proj/weight").leaf();
  std::cout << "model/layers/0/mlp/up_proj/weight " << up << "\n"
            << up.visualize(Shape{kInter, kHidden});
  return report.max_device_bytes() * 8 >= report.total_bytes ? 0 : 1;
}
