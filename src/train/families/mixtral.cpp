// The Mixtral family (model_type mixtral): LLaMA's attention with Mistral's sliding window, and a
// sparse mixture of experts (block_sparse_moe: a router, experts w1/w2/w3) for the MLP.
#include <fmt/format.h>

#include <array>

#include "llama_like.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::train {
namespace {

void read_mixtral(Fields& f, ModelConfig& c) {
  read_llama_like(f, c);
  read_window_every_layer(f, c);
  c.experts = f.positive("num_local_experts");
  c.experts_per_token = f.positive("num_experts_per_tok");
  if (c.experts_per_token > c.experts) {
    throw IoError(fmt::format("[config] {}: {} experts per token of only {} experts", f.source(),
                              c.experts_per_token, c.experts));
  }
  check_tensor_count(c, f.source());  // with the experts
}

void add_experts(const ModelConfig& c, NamedSpecs& n, const std::string& p) {
  n.add(p + "block_sparse_moe.gate.weight", {c.experts, c.hidden});
  for (std::int64_t e = 0; e < c.experts; ++e) {
    const std::string x = fmt::format("{}block_sparse_moe.experts.{}.", p, e);
    n.add(x + "w1.weight", {c.intermediate, c.hidden});
    n.add(x + "w2.weight", {c.hidden, c.intermediate});
    n.add(x + "w3.weight", {c.intermediate, c.hidden});
  }
}

void add_parameters(const ModelConfig& c, NamedSpecs& n) { add_llama_like(c, n, add_experts); }

// Mixtral's sparse MLP with routing taken as perfectly balanced: the router's softmax is
// computed and differentiated, each token goes to `experts_per_token` experts, and every expert
// receives the same share of the tokens (k N / E), so each expert's matrix products have the
// sizes of a dropless top-k layer at capacity factor 1. Which tokens an expert gets is not
// modelled (the FLOPs, memory and communication do not depend on it); the gate values are the
// router's first k probabilities.
Array mixture_of_experts(const ModelStep& m, const Tree<Array>& moe, const Array& x) {
  const Layout& L = m.layout;
  const ModelConfig& c = m.config;
  const std::int64_t b = x.shape()[0], t = x.shape()[1], d = c.hidden;
  const std::int64_t n = b * t, k = c.experts_per_token, e = c.experts;
  if ((k * n) % e != 0) {
    throw SpecError(fmt::format(
        "[train] {} tokens x {} experts each do not share evenly over {} experts (balanced "
        "routing needs k x tokens divisible by the expert count)",
        n, k, e));
  }
  const std::int64_t share = k * n / e;
  const Array flat = reshape(x, Shape{n, d});
  const Array probs = softmax(linear(flat, at(moe, "gate/weight")), -1);  // [n, e]
  const Array gates = slice(probs, {0, 0}, {n, k});                       // [n, k]
  // Token copies [n, k] read as [share, e]: the token dimension stays the major one, so each
  // device's tokens are split over the experts where they are (no data moves to route them).
  const Array routed = constrain(
      transpose(reshape(broadcast_in_dim(flat, Shape{n, k, d}, {0, 2}), Shape{share, e, d}),
                {1, 0, 2}),
      {{1, &L.batch}}, L);  // [e, share, d]
  std::vector<Array> outs;
  outs.reserve(static_cast<std::size_t>(e));
  for (std::int64_t i = 0; i < e; ++i) {
    const Tree<Array>& w = moe.at("experts").at(static_cast<std::size_t>(i));
    const Array xe = reshape(slice(routed, {i, 0, 0}, {i + 1, share, d}), Shape{share, d});
    const Array g = linear(xe, at(w, "w1/weight"));
    const Array ye = linear(silu(g) * linear(xe, at(w, "w3/weight")), at(w, "w2/weight"));
    outs.push_back(reshape(ye, Shape{1, share, d}));
  }
  const Array y = reshape(transpose(constrain(concatenate(outs, 0), {{1, &L.batch}}, L), {1, 0, 2}),
                          Shape{n, k, d});
  const Array weights = broadcast_in_dim(gates, Shape{n, k, d}, {0, 1});
  return reshape(sum(y * weights, {1}), Shape{b, t, d});
}

Array mixture_of_experts_mlp(const ModelStep& m, const Tree<Array>& p, const Array& x) {
  return mixture_of_experts(m, p.at("block_sparse_moe"), x);
}

constexpr std::array<std::string_view, 1> kTypes{"mixtral"};

constexpr StepParts kStep = [] {
  StepParts s = kRmsNormDecoder;
  s.mlp = mixture_of_experts_mlp;
  return s;
}();

}  // namespace

namespace families_defs {

extern const FamilyDef mixtral;
constexpr FamilyDef mixtral{.name = "mixtral",
                            .title = "Mixtral",
                            .types = kTypes,
                            .layers_path = "model/layers",
                            .default_preset = "mixtral_ep",
                            .support = {},
                            .read = read_mixtral,
                            .add_parameters = add_parameters,
                            .experts_path = "/block_sparse_moe/experts/",
                            .step = kStep};

}  // namespace families_defs
}  // namespace shardplan::train
