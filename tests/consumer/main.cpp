// Uses an installed shardplan the way a user would, through the one header: plans a model, then
// trains a linear layer one SGD step under sjit (planner rule, device_put, value_and_grad, an
// optimizer, to_host) and checks the loss and the new weight against a gradient worked out by
// hand. Exits 0 when everything is as expected.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <vector>

#include "shardplan/shardplan.hpp"

namespace {

using namespace shardplan;

bool plan_is_as_expected() {
  const auto params = Tree<TensorSpec>::dict({
      {"w_in", TensorSpec{Shape{1024, 4096}, DType::kBF16}},
      {"w_out", TensorSpec{Shape{4096, 1024}, DType::kBF16}},
  });
  const MeshShardingHelper helper(Mesh::parse("fsdp:-1,tp:2", 8));
  const RuleFile preset = load_preset("llama_fsdp_tp");  // presets are compiled into the library
  const RuleTree rules(std::make_shared<FSDPShardingRule>());
  const PlanReport report = helper.plan(rules, params);
  std::cout << report.table();
  return report.find("w_in")->bytes_per_device * 4 == 1024 * 4096 * 2 && !preset.rules.empty();
}

// loss(w) = sum((x w)^2), so dloss/dw[i][j] = 2 sum_r x[r][i] (x w)[r][j]; one SGD step at rate
// 0.1 is compared with that, computed here on the host.
bool training_step_is_as_expected() {
  constexpr int kRows = 8, kIn = 4, kOut = 2;
  constexpr double kRate = 0.1;
  const Executor exec(8);
  const MeshShardingHelper helper(Mesh::parse("data:4,model:2", 8));
  const Tensor x = Tensor::normal(Shape{kRows, kIn}, DType::kF32, 1);
  const Tensor w = Tensor::normal(Shape{kIn, kOut}, DType::kF32, 2);
  // The planner shards the weight by a path rule; the batch goes over 'data'.
  const RuleTree rule(std::make_shared<TreePathShardingRule>(
      std::vector<TreePathShardingRule::Entry>{{"w", P(nullptr, "model")}}));
  const Tree<MaybeSharding> plan =
      helper.match(rule, Tree<TensorSpec>::dict({{"w", TensorSpec{w.shape(), w.dtype()}}}));
  const Tree<Array> params =
      device_put(Tree<Tensor>::dict({{"w", w}}),
                 plan.map([](const MaybeSharding& s) { return s.value(); }), exec);
  const Array batch = device_put(x, NamedSharding(helper.mesh(), P("data")), exec);
  const Optimizer sgd = Optimizer::sgd(kRate);
  const auto loss_fn = [](const Tree<Array>& p, const Array& b) {
    const Array y = matmul(b, p.at("w").leaf());
    return sum(y * y);
  };
  auto step = sjit(helper, [&](const Tree<Array>& p, const Tree<Array>& state, const Array& b) {
    const auto [loss, grads] = value_and_grad(loss_fn)(p, b);
    const Tree<Array> updated = sgd.update(grads, state, p).first;
    return Tree<Array>::dict({{"loss", loss}, {"w", updated.at("w")}});
  });
  const Tree<Array> out = step(params, sgd.init(params), batch);
  const Tensor loss = out.at("loss").leaf().to_host();
  const Tensor new_w = out.at("w").leaf().to_host();

  double want_loss = 0;
  std::vector<double> y(kRows * kOut, 0.0);
  for (int r = 0; r < kRows; ++r) {
    for (int j = 0; j < kOut; ++j) {
      for (int i = 0; i < kIn; ++i) y[r * kOut + j] += x.get(r * kIn + i) * w.get(i * kOut + j);
      want_loss += y[r * kOut + j] * y[r * kOut + j];
    }
  }
  double worst = std::abs(loss.get(0) - want_loss) / std::max(1.0, std::abs(want_loss));
  for (int i = 0; i < kIn; ++i) {
    for (int j = 0; j < kOut; ++j) {
      double grad = 0;
      for (int r = 0; r < kRows; ++r) grad += 2 * x.get(r * kIn + i) * y[r * kOut + j];
      const double want = w.get(i * kOut + j) - kRate * grad;
      worst = std::max(worst, std::abs(new_w.get(i * kOut + j) - want));
    }
  }
  std::cout << "loss " << loss.get(0) << " (by hand " << want_loss << "), worst difference "
            << worst << "\n";
  return plan.at("w").leaf()->spec() == P(nullptr, "model") && worst < 1e-4;
}

}  // namespace

int main() { return plan_is_as_expected() && training_step_is_as_expected() ? 0 : 1; }
