// A small LLaMA-style decoder (RMS norm, rotary positions, causal attention, SwiGLU MLP) trained
// as a character-level language model on the GPL-3 text every Debian machine has, with AdamW and
// the train state donated each step, over mesh fsdp:4,tp:2 with the LLaMA FSDP+TP preset's rule
// table (Hugging Face names and layouts: a Linear weight is [out, in]). Prints the loss per step
// beside the unigram entropy of the text, and the bytes per device of parameters + optimizer
// state against a replicated run. Exits non-zero unless the loss falls well below the unigram
// entropy. SHARDPLAN_EXAMPLE_SMALL=1 (set by ctest) trains fewer steps.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "shardplan/autodiff.hpp"
#include "shardplan/optim.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/sjit.hpp"

using namespace shardplan;

namespace {

struct Config {
  std::int64_t vocab = 0, dim = 64, heads = 4, ffn = 128, layers = 2, seq = 32, batch = 16;
};

// y = x @ w^T for a Hugging Face Linear weight w [out, in].
Array linear(const Array& x, const Array& w) {
  return dot_general(x, w, DotDims{{}, {}, {x.shape().rank() - 1}, {1}});
}

// Rotary position embedding on [B, H, T, Dh] (the rotate-half form of LLaMA).
Array rotary(const Array& x) {
  const std::int64_t t = x.shape()[2], dh = x.shape()[3], half = dh / 2;
  const Shape table{t, half};
  const Array pos = astype(iota_like(full(table, DType::kF32, 0, x), 0, DType::kF32), DType::kF32);
  const Array i = astype(iota_like(full(table, DType::kF32, 0, x), 1, DType::kF32), DType::kF32);
  const Array freq = exp(i * (-2.0 * std::log(10000.0) / static_cast<double>(dh)));
  const Array angle = pos * freq;
  const Shape full_shape = x.shape();
  std::vector<std::int64_t> hs = full_shape.dims();
  hs[3] = half;
  const Array c = broadcast_in_dim(cos(angle), Shape(hs), {2, 3});
  const Array s = broadcast_in_dim(sin(angle), Shape(hs), {2, 3});
  std::vector<std::int64_t> lo(4, 0), mid = full_shape.dims(), hi = full_shape.dims();
  mid[3] = half;
  std::vector<std::int64_t> mid_start(4, 0);
  mid_start[3] = half;
  const Array x1 = slice(x, lo, mid);
  const Array x2 = slice(x, mid_start, hi);
  return concatenate({x1 * c - x2 * s, x2 * c + x1 * s}, 3);
}

Array attention(const Tree<Array>& p, const Array& x, const Config& cfg) {
  const std::int64_t b = x.shape()[0], t = x.shape()[1], dh = cfg.dim / cfg.heads;
  const auto heads = [&](const Array& y) {  // [B, T, D] -> [B, H, T, Dh]
    return transpose(reshape(y, Shape{b, t, cfg.heads, dh}), {0, 2, 1, 3});
  };
  const Array q = rotary(heads(linear(x, p.at_path("q_proj/weight").leaf())));
  const Array k = rotary(heads(linear(x, p.at_path("k_proj/weight").leaf())));
  const Array v = heads(linear(x, p.at_path("v_proj/weight").leaf()));
  const Array scores = dot_general(q, k, DotDims{{0, 1}, {0, 1}, {3}, {3}}) *
                       (1.0 / std::sqrt(static_cast<double>(dh)));
  const Array probs = softmax(causal_mask(scores), -1);
  const Array out = dot_general(probs, v, DotDims{{0, 1}, {0, 1}, {3}, {2}});  // [B, H, T, Dh]
  const Array merged = reshape(transpose(out, {0, 2, 1, 3}), Shape{b, t, cfg.dim});
  return linear(merged, p.at_path("o_proj/weight").leaf());
}

Array mlp(const Tree<Array>& p, const Array& x) {
  const Array gate = linear(x, p.at_path("gate_proj/weight").leaf());
  const Array up = linear(x, p.at_path("up_proj/weight").leaf());
  return linear(gate * sigmoid(gate) * up, p.at_path("down_proj/weight").leaf());
}

Array loss_fn(const Tree<Array>& params, const Array& tokens, const Array& targets,
              const Config& cfg) {
  const Tree<Array>& m = params.at("model");
  Array h = take(m.at_path("embed_tokens/weight").leaf(), tokens, 0);  // [B, T, D]
  for (const auto& layer : m.at("layers").children()) {
    h = h + attention(layer.at("self_attn"),
                      rms_norm(h, layer.at_path("input_layernorm/weight").leaf()), cfg);
    h = h +
        mlp(layer.at("mlp"), rms_norm(h, layer.at_path("post_attention_layernorm/weight").leaf()));
  }
  h = rms_norm(h, m.at_path("norm/weight").leaf());
  const Array logits = linear(h, params.at_path("lm_head/weight").leaf());
  return mean(cross_entropy(logits, targets));
}

// Parameters, each made on its devices by a random fill inside sjit (sharded initialisation).
Tree<Array> init(const Config& cfg, std::uint64_t seed) {
  std::uint64_t s = seed;
  const auto w = [&](std::int64_t out, std::int64_t in) {
    return Tree<Array>(random_normal(Shape{out, in}, DType::kF32, s++, 0,
                                     1.0 / std::sqrt(static_cast<double>(in))));
  };
  const auto ones = [&](std::int64_t n) {
    return Tree<Array>(random_uniform(Shape{n}, DType::kF32, s++, 1, 1));
  };
  std::vector<Tree<Array>> layers;
  for (int l = 0; l < cfg.layers; ++l) {
    layers.push_back(Tree<Array>::dict({
        {"input_layernorm", Tree<Array>::dict({{"weight", ones(cfg.dim)}})},
        {"post_attention_layernorm", Tree<Array>::dict({{"weight", ones(cfg.dim)}})},
        {"self_attn",
         Tree<Array>::dict({{"q_proj", Tree<Array>::dict({{"weight", w(cfg.dim, cfg.dim)}})},
                            {"k_proj", Tree<Array>::dict({{"weight", w(cfg.dim, cfg.dim)}})},
                            {"v_proj", Tree<Array>::dict({{"weight", w(cfg.dim, cfg.dim)}})},
                            {"o_proj", Tree<Array>::dict({{"weight", w(cfg.dim, cfg.dim)}})}})},
        {"mlp",
         Tree<Array>::dict({{"gate_proj", Tree<Array>::dict({{"weight", w(cfg.ffn, cfg.dim)}})},
                            {"up_proj", Tree<Array>::dict({{"weight", w(cfg.ffn, cfg.dim)}})},
                            {"down_proj", Tree<Array>::dict({{"weight", w(cfg.dim, cfg.ffn)}})}})},
    }));
  }
  return Tree<Array>::dict({
      {"model",
       Tree<Array>::dict({{"embed_tokens", Tree<Array>::dict({{"weight", w(cfg.vocab, cfg.dim)}})},
                          {"layers", Tree<Array>::list(layers)},
                          {"norm", Tree<Array>::dict({{"weight", ones(cfg.dim)}})}})},
      {"lm_head", Tree<Array>::dict({{"weight", w(cfg.vocab, cfg.dim)}})},
  });
}

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
  const int steps = small ? 150 : 600;

  const Executor exec(8);
  const RuleFile preset = load_preset("llama_fsdp_tp");
  const RuleTree rules(preset.make_rule());
  const auto run = [&](const Mesh& mesh, const RuleTree& param_rules, bool print) {
    SjitOptions io;
    io.out_shardings = param_rules;
    io.executor = exec;
    auto make = sjit(
        mesh, [&](std::uint64_t seed) { return init(cfg, seed); }, io);
    Tree<Array> params = make(std::uint64_t{1});
    const Optimizer opt =
        Optimizer::adamw(warmup_cosine_decay_schedule(0, 3e-3, 20, steps, 3e-4), 0.01,
                         {"proj/weight$", "embed_tokens/weight$", "lm_head/weight$"})
            .clip_by_global_norm(1.0);
    Tree<Array> state = opt.init(params);
    const std::int64_t state_bytes = bytes_per_device(params) + bytes_per_device(state);
    SjitOptions so;
    so.donate_argnums = {0, 1};
    auto step = sjit(
        mesh,
        [&](const Tree<Array>& p, const Tree<Array>& st, const Array& x, const Array& y) {
          const auto [loss, g] =
              value_and_grad([&](const Tree<Array>& pp, const Array& xx, const Array& yy) {
                return loss_fn(pp, xx, yy, cfg);
              })(p, x, y);
          auto [np, ns] = opt.update(g, st, p);
          return Tree<Array>::dict({{"loss", loss}, {"params", np}, {"state", ns}});
        },
        so);
    const NamedSharding batch(mesh, P(mesh.axis_names()[0]));
    double last = 0;
    for (int i = 0; i < steps; ++i) {
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
          device_put(Tensor::from<std::int32_t>(Shape{cfg.batch, cfg.seq}, xs), batch, exec);
      const Array y =
          device_put(Tensor::from<std::int32_t>(Shape{cfg.batch, cfg.seq}, ys), batch, exec);
      const Tree<Array> out = step(params, state, x, y);
      params = out.at("params");
      state = out.at("state");
      last = out.at("loss").leaf().to_host().get(0);
      if (print) std::cout << "step " << i << "  loss " << last << " nats/char\n";
    }
    return std::pair{last, state_bytes};
  };
  std::cout << "vocabulary " << next << " characters (padded to " << cfg.vocab
            << "); unigram entropy " << unigram << " nats/char\n";
  const auto [loss, sharded] = run(Mesh::parse("fsdp:4,tp:2", 8), rules, true);
  const auto [loss_rep, replicated] =
      run(Mesh::parse("fsdp:4,tp:2", 8), RuleTree(Replicated{}), false);
  std::cout << "parameters + optimizer state per device: " << sharded
            << " bytes with the FSDP+TP rules, " << replicated << " replicated ("
            << static_cast<double>(replicated) / static_cast<double>(sharded) << "x)\nfinal loss "
            << loss << " (replicated run " << loss_rep << ")\n";
  const bool ok = loss < unigram - 0.4;
  std::cout << (ok ? "ok: well below the unigram entropy\n"
                   : "FAILED: not below the unigram entropy\n");
  return ok ? 0 : 1;
}
