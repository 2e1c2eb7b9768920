// A small LLaMA-style decoder (RMS norm, rotary positions, causal attention, SwiGLU MLP) trained
// as a character-level language model on the GPL-3 text every Debian machine has, with AdamW and
// the train state donated each step, over mesh fsdp:4,tp:2 with the LLaMA FSDP+TP preset's rule
// table (Hugging Face names and layouts: a Linear weight is [out, in]). Prints the loss per step
// beside the unigram entropy of the text, and the bytes per device of parameters + optimizer
// state against a replicated run. Exits non-zero unless the loss falls well below the unigram
// entropy. SHARDPLAN_EXAMPLE_SMALL=1 (set by ctest) trains fewer steps.
//
// With SHARDPLAN_CHECKPOINT_DIR=DIR it trains the sharded run only, saving params + optimizer
// state every SHARDPLAN_SAVE_EVERY steps (default 10) in the background (AsyncCheckpointer,
// keeping the last 2), and resumes from the latest checkpoint in DIR when there is one: killed
// and restarted, it prints the same losses as a run never stopped (scripts/llama_resume_check.sh).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <variant>

#include "llama_model.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/checkpoint.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/optim.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/sjit.hpp"

using namespace shardplan;

namespace {

using llama::Config;

std::int64_t bytes_per_device(const Tree<Array>& t) {
  std::int64_t n = 0;
  for (const Array& a : t.leaves()) n += a.shard_nbytes();
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "/usr/share/common-licenses/GPL-3";
  std::ifstream in(path);
  if (!in) {
    std::cerr << "cannot read " << path << "\n";
    return 2;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  // Characters as tokens; the vocabulary padded to a multiple of 8 so it splits over tp and fsdp.
  std::map<char, int> ids;
  for (const char c : text) ids.emplace(c, 0);
  int next = 0;
  for (auto& [c, id] : ids) id = next++;
  Config cfg;
  cfg.vocab = (next + 7) / 8 * 8;
  std::vector<double> freq(static_cast<std::size_t>(next), 0);
  for (const char c : text) freq[static_cast<std::size_t>(ids[c])] += 1;
  double unigram = 0;
  for (const double f : freq) {
    if (f > 0)
      unigram -=
          f / static_cast<double>(text.size()) * std::log(f / static_cast<double>(text.size()));
  }
  const bool small = std::getenv("SHARDPLAN_EXAMPLE_SMALL") != nullptr;
  const char* steps_env = std::getenv("SHARDPLAN_EXAMPLE_STEPS");  // (the multi-process ctest)
  const int steps = steps_env != nullptr ? std::max(1, std::atoi(steps_env)) : small ? 150 : 600;
  const bool print_here = distributed::process_index() == 0;

  // 8 devices over however many processes run (mpirun -np 2: 4 each).
  const Executor exec(8);
  const RuleFile preset = load_preset("llama_fsdp_tp");
  const RuleTree rules(preset.make_rule());
  std::vector<double> losses;  // of the last run
  const char* checkpoint_dir = std::getenv("SHARDPLAN_CHECKPOINT_DIR");
  const char* every_env = std::getenv("SHARDPLAN_SAVE_EVERY");
  const int save_every = every_env != nullptr ? std::max(1, std::atoi(every_env)) : 10;
  const auto run = [&](const Mesh& mesh, const RuleTree& param_rules, bool print,
                       const Executor& devices, const char* resumable = nullptr) {
    losses.clear();
    SjitOptions io;
    io.out_shardings = param_rules;
    io.executor = devices;
    auto make = sjit(
        mesh, [&](std::uint64_t seed) { return llama::init(cfg, seed); }, io);
    Tree<Array> params = make(std::uint64_t{1});
    const Optimizer opt =
        Optimizer::adamw(warmup_cosine_decay_schedule(0, 3e-3, 20, steps, 3e-4), 0.01,
                         {"proj/weight$", "embed_tokens/weight$", "lm_head/weight$"})
            .clip_by_global_norm(1.0);
    Tree<Array> state = opt.init(params);
    const std::int64_t state_bytes = bytes_per_device(params) + bytes_per_device(state);
    SjitOptions so;
    so.donate_argnums = {0, 1};
    // The preset's named activations: the norm and residual regions split along the sequence
    // over tp (sequence parallelism); the replicated run leaves them to propagation.
    const bool replicated =
        param_rules.is_leaf() && std::holds_alternative<Replicated>(param_rules.leaf());
    if (!replicated) {
      so.annotation_shardings = preset.activation_shardings(mesh);
    } else {
      so.allow_unknown_annotations = true;
    }
    auto step = sjit(
        mesh,
        [&](const Tree<Array>& p, const Tree<Array>& st, const Array& x, const Array& y) {
          const auto [loss_aux, g] =
              value_and_grad_with_aux([&](const Tree<Array>& pp, const Array& xx, const Array& yy) {
                return llama::loss_and_accuracy(pp, xx, yy, cfg);
              })(p, x, y);
          const auto& [loss, aux] = loss_aux;
          auto [np, ns] = opt.update(g, st, p);
          return Tree<Array>::dict(
              {{"loss", loss}, {"accuracy", aux.at("accuracy")}, {"params", np}, {"state", ns}});
        },
        so);
    const NamedSharding batch(mesh, P(mesh.axis_names()[0]));
    double last = 0;
    int first = 0;
    std::optional<AsyncCheckpointer> saver;
    if (resumable != nullptr) {
      saver.emplace(resumable, 2);
      if (const auto latest = saver->manager().latest()) {
        // The template gives shapes, dtypes and shardings; the values come from the files.
        const Tree<Array> back = restore_checkpoint(
            saver->manager().path_of(*latest),
            Tree<Array>::dict({{"params", params}, {"state", state}}));
        params = back.at("params");
        state = back.at("state");
        first = static_cast<int>(*latest);
        if (print_here) std::cout << "resumed from step " << first << "\n";
      }
    }
    for (int i = first; i < steps; ++i) {
      std::vector<std::int32_t> xs, ys;
      for (std::int64_t r = 0; r < cfg.batch; ++r) {
        const auto start =
            static_cast<std::size_t>(random_uniform(1000 + i, static_cast<std::uint64_t>(r)) *
                                     static_cast<double>(text.size() - cfg.seq - 1));
        for (std::int64_t j = 0; j < cfg.seq; ++j) {
          xs.push_back(ids[text[start + static_cast<std::size_t>(j)]]);
          ys.push_back(ids[text[start + static_cast<std::size_t>(j) + 1]]);
        }
      }
      const Array x =
          device_put(Tensor::from<std::int32_t>(Shape{cfg.batch, cfg.seq}, xs), batch, devices);
      const Array y =
          device_put(Tensor::from<std::int32_t>(Shape{cfg.batch, cfg.seq}, ys), batch, devices);
      const Tree<Array> out = step(params, state, x, y);
      params = out.at("params");
      state = out.at("state");
      if (saver && (i + 1) % save_every == 0) {
        // Step i + 1 is the next to run; the copy is taken before the next step donates them.
        saver->save(i + 1, Tree<Array>::dict({{"params", params}, {"state", state}}));
      }
      last = out.at("loss").leaf().to_host().get(0);
      losses.push_back(last);
      if (print) {
        // (to_host is collective over processes: every process calls it, one prints.)
        const double acc = out.at("accuracy").leaf().to_host().get(0);
        if (print_here) {
          // The shortest text that reads back as the same double: losses compare bit for bit.
          std::cout << fmt::format("step {}  loss {} nats/char  accuracy {}\n", i, last, acc)
                    << std::flush;  // (a killed run's lines are not lost in a buffer)
        }
      }
    }
    return std::pair{last, state_bytes};
  };
  if (print_here) {
    std::cout << "vocabulary " << next << " characters (padded to " << cfg.vocab
              << "); unigram entropy " << unigram << " nats/char\n";
  }
  if (checkpoint_dir != nullptr) {
    run(Mesh::parse("fsdp:4,tp:2", 8), rules, true, exec, checkpoint_dir);
    return 0;
  }
  const auto [loss, sharded] = run(Mesh::parse("fsdp:4,tp:2", 8), rules, true, exec);
  const std::vector<double> sharded_losses = losses;
  if (distributed::process_count() > 1) {
    // Over processes: the loss curve of the same run on 8 devices of one process, bit for bit.
    run(Mesh::parse("fsdp:4,tp:2", 8), rules, false, Executor::process_local(8));
    const bool same = losses == sharded_losses;
    if (print_here) {
      std::cout << distributed::process_count() << " processes x " << exec.local_devices().size()
                << " devices: every loss " << (same ? "is the same bits as" : "DIFFERS from")
                << " 1 process x 8 devices\n";
    }
    if (!same) return 1;
  }
  const auto [loss_rep, replicated] =
      run(Mesh::parse("fsdp:4,tp:2", 8), RuleTree(Replicated{}), false, exec);
  const bool ok = loss < unigram - 0.4;
  if (print_here) {
    std::cout << "parameters + optimizer state per device: " << sharded
              << " bytes with the FSDP+TP rules, " << replicated << " replicated ("
              << static_cast<double>(replicated) / static_cast<double>(sharded)
              << "x)\nfinal loss " << loss << " (replicated run " << loss_rep << ")\n";
    std::cout << (ok ? "ok: well below the unigram entropy\n"
                     : "FAILED: not below the unigram entropy\n");
  }
  return ok ? 0 : 1;
}
