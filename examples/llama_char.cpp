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

/// The text read, its characters numbered as tokens, and its unigram entropy (nats/char).
struct Corpus {
  std::string text;
  std::map<char, int> ids;
  int characters = 0;
  double unigram = 0;
};

std::optional<Corpus> read_corpus(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  Corpus c;
  c.text = ss.str();
  for (const char ch : c.text) c.ids.emplace(ch, 0);
  for (auto& [ch, id] : c.ids) id = c.characters++;
  std::vector<double> freq(static_cast<std::size_t>(c.characters), 0);
  for (const char ch : c.text) freq[static_cast<std::size_t>(c.ids[ch])] += 1;
  const auto size = static_cast<double>(c.text.size());
  for (const double f : freq) {
    if (f > 0) c.unigram -= f / size * std::log(f / size);
  }
  return c;
}

/// What every run shares: the model's widths, the text, the preset, how long and how often to save.
struct Setup {
  Config cfg;
  Corpus corpus;
  RuleFile preset = load_preset("llama_fsdp_tp");
  int steps = 0;
  int save_every = 10;
  bool print_here = false;
};

/// Step `i`'s batch: cfg.batch windows of the text at pseudo-random places, and the next
/// character of each position as its target, placed as `batch`.
std::pair<Array, Array> batch_of(const Setup& s, int i, const NamedSharding& batch,
                                 const Executor& devices) {
  const Config& cfg = s.cfg;
  const std::string& text = s.corpus.text;
  std::vector<std::int32_t> xs, ys;
  for (std::int64_t r = 0; r < cfg.batch; ++r) {
    const auto start =
        static_cast<std::size_t>(random_uniform(1000 + i, static_cast<std::uint64_t>(r)) *
                                 static_cast<double>(text.size() - cfg.seq - 1));
    for (std::int64_t j = 0; j < cfg.seq; ++j) {
      xs.push_back(s.corpus.ids.at(text[start + static_cast<std::size_t>(j)]));
      ys.push_back(s.corpus.ids.at(text[start + static_cast<std::size_t>(j) + 1]));
    }
  }
  return {device_put(Tensor::from<std::int32_t>(Shape{cfg.batch, cfg.seq}, xs), batch, devices),
          device_put(Tensor::from<std::int32_t>(Shape{cfg.batch, cfg.seq}, ys), batch, devices)};
}

/// The compiled training step: loss and accuracy, gradients, the optimizer's update; params and
/// state donated. The preset's named activations: the norm and residual regions split along the
/// sequence over tp (sequence parallelism); the replicated run leaves them to propagation.
auto make_step(const Setup& s, const Mesh& mesh, const RuleTree& param_rules,
               const Optimizer& opt) {
  SjitOptions so;
  so.donate_argnums = {0, 1};
  const bool replicated =
      param_rules.is_leaf() && std::holds_alternative<Replicated>(param_rules.leaf());
  if (!replicated) {
    so.annotation_shardings = s.preset.activation_shardings(mesh);
  } else {
    so.allow_unknown_annotations = true;
  }
  const Config cfg = s.cfg;
  return sjit(
      mesh,
      [cfg, opt](const Tree<Array>& p, const Tree<Array>& st, const Array& x, const Array& y) {
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
}

/// The final loss of a run and the bytes per device of its parameters + optimizer state; every
/// step's loss in `losses`. With `resumable`, saves there in the background and starts from the
/// latest checkpoint in it.
std::pair<double, std::int64_t> train(const Setup& s, const Mesh& mesh, const RuleTree& param_rules,
                                      bool print, const Executor& devices,
                                      std::vector<double>& losses,
                                      const char* resumable = nullptr) {
  losses.clear();
  SjitOptions io;
  io.out_shardings = param_rules;
  io.executor = devices;
  const Config cfg = s.cfg;
  auto make = sjit(
      mesh, [cfg](std::uint64_t seed) { return llama::init(cfg, seed); }, io);
  Tree<Array> params = make(std::uint64_t{1});
  const Optimizer opt =
      Optimizer::adamw(warmup_cosine_decay_schedule(0, 3e-3, 20, s.steps, 3e-4), 0.01,
                       {"proj/weight$", "embed_tokens/weight$", "lm_head/weight$"})
          .clip_by_global_norm(1.0);
  Tree<Array> state = opt.init(params);
  const std::int64_t state_bytes = bytes_per_device(params) + bytes_per_device(state);
  auto step = make_step(s, mesh, param_rules, opt);
  const NamedSharding batch(mesh, P(mesh.axis_names()[0]));
  double last = 0;
  int first = 0;
  std::optional<AsyncCheckpointer> saver;
  if (resumable != nullptr) {
    saver.emplace(resumable, 2);
    if (const auto latest = saver->manager().latest()) {
      // The template gives shapes, dtypes and shardings; the values come from the files.
      const Tree<Array> back =
          restore_checkpoint(saver->manager().path_of(*latest),
                             Tree<Array>::dict({{"params", params}, {"state", state}}));
      params = back.at("params");
      state = back.at("state");
      first = static_cast<int>(*latest);
      if (s.print_here) std::cout << "resumed from step " << first << "\n";
    }
  }
  for (int i = first; i < s.steps; ++i) {
    const auto [x, y] = batch_of(s, i, batch, devices);
    const Tree<Array> out = step(params, state, x, y);
    params = out.at("params");
    state = out.at("state");
    if (saver && (i + 1) % s.save_every == 0) {
      // Step i + 1 is the next to run; the copy is taken before the next step donates them.
      saver->save(i + 1, Tree<Array>::dict({{"params", params}, {"state", state}}));
    }
    last = out.at("loss").leaf().to_host().get(0);
    losses.push_back(last);
    if (print) {
      // (to_host is collective over processes: every process calls it, one prints.)
      const double acc = out.at("accuracy").leaf().to_host().get(0);
      if (s.print_here) {
        // The shortest text that reads back as the same double: losses compare bit for bit.
        std::cout << fmt::format("step {}  loss {} nats/char  accuracy {}\n", i, last, acc)
                  << std::flush;  // (a killed run's lines are not lost in a buffer)
      }
    }
  }
  return std::pair{last, state_bytes};
}

int env_count(const char* name, int otherwise) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::max(1, std::atoi(value)) : otherwise;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "/usr/share/common-licenses/GPL-3";
  std::optional<Corpus> corpus = read_corpus(path);
  if (!corpus) {
    std::cerr << "cannot read " << path << "\n";
    return 2;
  }
  Setup s;
  s.corpus = std::move(*corpus);
  // Characters as tokens; the vocabulary padded to a multiple of 8 so it splits over tp and fsdp.
  s.cfg.vocab = (s.corpus.characters + 7) / 8 * 8;
  const bool small = std::getenv("SHARDPLAN_EXAMPLE_SMALL") != nullptr;
  s.steps = env_count("SHARDPLAN_EXAMPLE_STEPS", small ? 150 : 600);  // (the multi-process ctest)
  s.save_every = env_count("SHARDPLAN_SAVE_EVERY", 10);
  s.print_here = distributed::process_index() == 0;

  // 8 devices over however many processes run (mpirun -np 2: 4 each).
  const Executor exec(8);
  const RuleTree rules(s.preset.make_rule());
  const Mesh mesh = Mesh::parse("fsdp:4,tp:2", 8);
  std::vector<double> losses;  // of the last run
  if (s.print_here) {
    std::cout << "vocabulary " << s.corpus.characters << " characters (padded to " << s.cfg.vocab
              << "); unigram entropy " << s.corpus.unigram << " nats/char\n";
  }
  if (const char* checkpoint_dir = std::getenv("SHARDPLAN_CHECKPOINT_DIR")) {
    train(s, mesh, rules, true, exec, losses, checkpoint_dir);
    return 0;
  }
  const auto [loss, sharded] = train(s, mesh, rules, true, exec, losses);
  const std::vector<double> sharded_losses = losses;
  if (distributed::process_count() > 1) {
    // Over processes: the loss curve of the same run on 8 devices of one process, bit for bit.
    train(s, mesh, rules, false, Executor::process_local(8), losses);
    const bool same = losses == sharded_losses;
    if (s.print_here) {
      std::cout << distributed::process_count() << " processes x " << exec.local_devices().size()
                << " devices: every loss " << (same ? "is the same bits as" : "DIFFERS from")
                << " 1 process x 8 devices\n";
    }
    if (!same) return 1;
  }
  const auto [loss_rep, replicated] = train(s, mesh, RuleTree(Replicated{}), false, exec, losses);
  const bool ok = loss < s.corpus.unigram - 0.4;
  if (s.print_here) {
    std::cout << "parameters + optimizer state per device: " << sharded
              << " bytes with the FSDP+TP rules, " << replicated << " replicated ("
              << static_cast<double>(replicated) / static_cast<double>(sharded) << "x)\nfinal loss "
              << loss << " (replicated run " << loss_rep << ")\n";
    std::cout << (ok ? "ok: well below the unigram entropy\n"
                     : "FAILED: not below the unigram entropy\n");
  }
  return ok ? 0 : 1;
}
