#include "example_cmd.hpp"

#include <fmt/format.h>

#include <iostream>
#include <utility>
#include <vector>

#include "../formats/output_file.hpp"
#include "example_model.hpp"
#include "output_path_option.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/checkpoint.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/format_bytes.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/model_loader.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/optim.hpp"
#include "shardplan/profiler.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/sjit.hpp"

namespace shardplan::cli {

namespace {

constexpr const char* kMesh = "fsdp:4,tp:2";
constexpr std::int64_t kDevices = 8;

int write_example_trace(const std::string& path) {
  // The outputs contract (docs/cli.md "Outputs"), checked before the steps run.
  detail::OutputFiles file({{"trace FILE", path}});
  const Executor exec(kDevices);
  const Mesh mesh = Mesh::parse(kMesh, kDevices);
  constexpr std::int64_t kBatch = 64, kIn = 256, kHidden = 512, kClasses = 16;
  // A two-layer MLP, the hidden layer split over tp as Megatron's MLP, every matrix over fsdp.
  const Tree<Array> params = Tree<Array>::dict({
      {"w_in", Array::normal(Shape{kIn, kHidden}, DType::kF32, NamedSharding(mesh, P("fsdp", "tp")),
                             exec, 1, 0, 0.05)},
      {"w_out", Array::normal(Shape{kHidden, kClasses}, DType::kF32,
                              NamedSharding(mesh, P("tp", "fsdp")), exec, 2, 0, 0.05)},
  });
  const Array x =
      Array::normal(Shape{kBatch, kIn}, DType::kF32, NamedSharding(mesh, P("fsdp")), exec, 3);
  std::vector<std::int32_t> labels(kBatch);
  for (std::int64_t i = 0; i < kBatch; ++i) labels[i] = static_cast<std::int32_t>(i % kClasses);
  const Array y = device_put(Tensor::from<std::int32_t>(Shape{kBatch}, labels),
                             NamedSharding(mesh, P("fsdp")), exec);
  const Optimizer sgd = Optimizer::sgd(0.1);
  const auto loss_fn = [](const Tree<Array>& p, const Array& xb, const Array& yb) {
    Array h;
    {
      auto scope = named_scope("mlp_in");
      h = relu(matmul(xb, p.at("w_in").leaf()));
    }
    auto scope = named_scope("mlp_out");
    return mean(cross_entropy(matmul(h, p.at("w_out").leaf()), yb));
  };
  auto step =
      sjit(mesh, [&](const Tree<Array>& p, const Tree<Array>& s, const Array& xb, const Array& yb) {
        const auto [loss, grads] = value_and_grad(loss_fn)(p, xb, yb);
        auto [next, state] = sgd.update(grads, s, p);
        return Tree<Array>::dict({{"loss", loss}, {"params", next}, {"state", state}});
      });
  Tree<Array> p = params, s = sgd.init(params);
  std::vector<double> losses;
  profiler::start(profiler::ProfileOptions{.memory = true});
  for (int i = 0; i < 2; ++i) {
    const Tree<Array> out = step(p, s, x, y);
    p = out.at("params");
    s = out.at("state");
    losses.push_back(out.at("loss").leaf().to_host().get(0));
  }
  profiler::stop();
  const std::size_t events = profiler::event_count();
  file[0].write(profiler::trace_json());
  file.commit();
  std::cout << fmt::format(
      "wrote {}: two training steps (loss {:.4f}, then {:.4f}) of a 2-layer MLP on Mesh('fsdp': "
      "4, 'tp': 2), {} events\n"
      "try: shardplan trace summarize {}\n"
      "     shardplan trace memory {}\n",
      detail::printable(path), losses[0], losses[1], events, detail::printable(path),
      detail::printable(path));
  return 0;
}

int write_example_checkpoint(const std::string& dir) {
  const Executor exec(kDevices);
  const MeshShardingHelper helper(Mesh::parse(kMesh, kDevices));
  const auto named = llama_tensors(
      LlamaDims{.vocab = 512, .hidden = 64, .intermediate = 128, .layers = 2}, DType::kF32);
  const Tree<TensorSpec> specs = tree_from_names(named);
  const Tree<MaybeSharding> shardings =
      helper.match(RuleTree(load_preset("llama_fsdp_tp").make_rule()), specs);
  // Saved under their tree paths (model/layers/0/...), which the rules match, as `plan` reads
  // a checkpoint's names.
  std::uint64_t seed = 100;
  const Tree<Array> weights =
      specs.map_with_path([&](const std::string& path, const TensorSpec& spec) {
        return Array::normal(spec.shape, spec.dtype, shardings.at_path(path).leaf().value(), exec,
                             seed++, 0, 0.02);
      });
  std::int64_t bytes = 0;
  for (const auto& [name, spec] : named) bytes += spec.bytes();
  save_checkpoint(dir, weights);
  std::cout << fmt::format(
      "wrote {}: a LLaMA of {} tensors ({}; vocab 512, hidden 64, 2 layers, f32) saved from "
      "Mesh('fsdp': 4, 'tp': 2) by preset llama_fsdp_tp\n"
      "try: shardplan checkpoint inspect {}\n"
      "     shardplan plan --model {}\n"
      "     shardplan checkpoint reshard {} {}-tp4 --mesh fsdp:2,tp:4\n",
      detail::printable(dir), named.size(), format_bytes(bytes), detail::printable(dir),
      detail::printable(dir), detail::printable(dir), detail::printable(dir));
  return 0;
}

}  // namespace

ExampleCommand& add_example_commands(CLI::App& app, ExampleCommand& c) {
  c.command = app.add_subcommand(
      "example", "Make small inputs to try the other commands on: a trace, a checkpoint");
  c.command->require_subcommand(1);
  c.trace = c.command->add_subcommand(
      "trace",
      "Run two training steps of a small MLP on 8 virtual devices (Mesh fsdp:4,tp:2) with the "
      "profiler on and write the trace (for `trace summarize` and `trace memory`)");
  c.trace->add_option("file", c.path, "The trace file to write. Example: step.trace.json")
      ->required()
      ->check(non_empty_output_path());
  c.checkpoint = c.command->add_subcommand(
      "checkpoint",
      "Save a small LLaMA (Hugging Face names, random f32 weights) sharded over fsdp:4,tp:2 (for "
      "`checkpoint inspect|reshard|consolidate` and `plan --model`)");
  c.checkpoint->add_option("dir", c.path, "The checkpoint directory to create (must not exist)")
      ->required()
      ->check(non_empty_output_path());
  return c;
}

int run_example(const ExampleCommand& c) {
  return c.trace->parsed() ? write_example_trace(c.path) : write_example_checkpoint(c.path);
}

}  // namespace shardplan::cli
