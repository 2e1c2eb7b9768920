// train-plan's options either apply to the planned program or are refused by name (issue 39):
// the closed list of refusals against docs/cli.md, and a property over random combinations of
// options, meshes, families and hardware figures (the reported defects one by one:
// train_plan_options_property_test_defects.cpp).
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "shardplan/hardware.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/train_plan.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

/// docs/cli.md's table of refusals ("| option | refused when |" rows under "Refused
/// combinations"): (option, condition) with the backquotes taken off.
std::vector<std::pair<std::string, std::string>> documented_refusals() {
  std::ifstream in(std::string(SHARDPLAN_SOURCE_DIR) + "/docs/cli.md");
  std::vector<std::pair<std::string, std::string>> out;
  std::string line;
  bool in_section = false;
  const auto unquote = [](std::string s) {
    std::erase(s, '`');
    while (!s.empty() && s.front() == ' ') s.erase(s.begin());
    while (!s.empty() && s.back() == ' ') s.pop_back();
    // "\|" in a table cell is a literal bar.
    for (std::size_t i; (i = s.find("\\|")) != std::string::npos;) s.replace(i, 2, "|");
    return s;
  };
  while (std::getline(in, line)) {
    if (line.starts_with("#")) in_section = line.find("Refused combinations") != std::string::npos;
    if (!in_section || !line.starts_with("| ") || line.starts_with("| option") ||
        line.starts_with("|---")) {
      continue;
    }
    std::vector<std::string> cells;
    std::size_t from = 1;
    for (std::size_t bar; (bar = line.find(" |", from)) != std::string::npos; from = bar + 2) {
      cells.push_back(unquote(line.substr(from, bar - from)));
    }
    if (cells.size() >= 2) out.emplace_back(cells[0], cells[1]);
  }
  return out;
}

bool documented(const OptionRefusal& r) {
  static const auto docs = documented_refusals();
  return std::find(docs.begin(), docs.end(),
                   std::pair{std::string(r.option), std::string(r.condition)}) != docs.end();
}

TEST(TrainPlanRefusals, AreTheClosedListInTheDocs) {
  const auto docs = documented_refusals();
  std::vector<std::pair<std::string, std::string>> list;
  for (const OptionRefusal& r : train_plan_refusals()) list.emplace_back(r.option, r.condition);
  EXPECT_EQ(docs, list);
}

RulePtr preset(const char* name) { return load_preset(name).make_rule(); }

constexpr const char* kOneLayerLlama = R"({"model_type": "llama", "vocab_size": 64,
  "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
  "num_attention_heads": 4, "num_key_value_heads": 2})";
constexpr const char* kOneLayerMistralWindow = R"({"model_type": "mistral", "vocab_size": 64,
  "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
  "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": 4})";
constexpr const char* kOneLayerMixtral = R"({"model_type": "mixtral", "vocab_size": 64,
  "hidden_size": 32, "intermediate_size": 24, "num_hidden_layers": 1,
  "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
  "num_experts_per_tok": 2})";
constexpr const char* kOneLayerT5 = R"({"model_type": "t5", "vocab_size": 40, "d_model": 16,
  "d_kv": 6, "d_ff": 24, "num_layers": 1, "num_decoder_layers": 1, "num_heads": 2,
  "relative_attention_num_buckets": 8, "relative_attention_max_distance": 12,
  "feed_forward_proj": "gated-gelu", "tie_word_embeddings": true})";
constexpr const char* kOneLayerGpt2 = R"({"model_type": "gpt2", "vocab_size": 40, "n_embd": 16,
  "n_layer": 1, "n_head": 2, "n_positions": 16})";
// Soft-capped scores and logits (the fused kernels refused), a window on its one layer.
constexpr const char* kOneLayerGemma2 = R"({"model_type": "gemma2", "vocab_size": 40,
  "hidden_size": 16, "head_dim": 8, "intermediate_size": 24, "num_hidden_layers": 1,
  "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": 4})";

struct Family {
  const char* json;
  const char* rules;
  std::vector<const char*> meshes;
};

const std::vector<Family>& families() {
  static const std::vector<Family> kFamilies = {
      {kOneLayerLlama, "llama_fsdp_tp",
       {"fsdp:4,tp:1", "fsdp:2,tp:2", "fsdp:1,tp:4", "fsdp:2,tp:1,cp:2", "fsdp:1,tp:2,cp:2",
        "fsdp:1,tp:1,cp:2,context:2"}},
      {kOneLayerMistralWindow, "llama_fsdp_tp", {"fsdp:2,tp:2", "fsdp:2,tp:1,cp:2"}},
      {kOneLayerMixtral, "mixtral_ep", {"ep:2,fsdp:2", "ep:1,fsdp:4", "ep:2,fsdp:1,cp:2"}},
      {kOneLayerT5, "t5", {"fsdp:2,tp:2", "fsdp:4,tp:1", "fsdp:2,tp:1,cp:2"}},
      {kOneLayerGpt2, "gpt2", {"fsdp:2,tp:2", "fsdp:4,tp:1", "fsdp:2,tp:1,cp:2"}},
      {kOneLayerGemma2, "llama_fsdp_tp", {"fsdp:2,tp:2", "fsdp:4,tp:1", "fsdp:2,tp:1,cp:2"}},
  };
  return kFamilies;
}

template <class T>
const T& pick(std::mt19937_64& rng, const std::vector<T>& v) {
  return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)];
}

std::optional<bool> tri(std::mt19937_64& rng) {
  return pick(rng, std::vector<std::optional<bool>>{std::nullopt, true, false});
}

struct Case {
  const Family* family;
  std::string mesh;
  TrainPlanOptions o;
  std::string text;  // for the failure message
};

// The draws, each group from its own generator (seeded kSeed + i) so that adding a group leaves
// the others' draws as they were: `blocks` the block settings, `kernels` the ring's rotation,
// `overlap` async TP, `given` whether an option with nothing to apply to is kept (refused),
// `cp_kernels` the context-parallel kernel, `float8` the float8 recipe and all-gather dtype,
// `updates` the optimizer's kernel, `dp_overlap` the data-parallel overlap, `loss` the loss's
// dtype.
struct Draws {
  explicit Draws(std::uint64_t seed)
      : rng(seed), blocks(seed + 1), kernels(seed + 2), overlap(seed + 3), given(seed + 4),
        cp_kernels(seed + 5), float8(seed + 6), updates(seed + 7), dp_overlap(seed + 8),
        loss(seed + 9) {}
  std::mt19937_64 rng, blocks, kernels, overlap, given, cp_kernels, float8, updates, dp_overlap,
      loss;
};

/// --dp-overlap (own generator), with hardware only (without, it is refused: a unit test's),
/// the bucket values kept one time in sixteen (refused where the rules shard over a data axis,
/// most meshes here; their refusals are train_time_test_dp_overlap.cpp's).
void draw_dp_overlap(Draws& d, Case& k) {
  std::mt19937_64& g = d.dp_overlap;
  TrainPlanOptions& o = k.o;
  o.dp_overlap = pick(g, std::vector<std::optional<DpOverlap>>{
                             std::nullopt, std::nullopt, DpOverlap::kFsdp, DpOverlap::kOff,
                             DpOverlap::kBuckets, DpOverlap::kGradBuckets});
  if (o.dp_overlap >= DpOverlap::kBuckets && std::uniform_int_distribution<int>(0, 15)(g) != 0) {
    o.dp_overlap = DpOverlap::kOff;
  }
  if (o.dp_overlap == DpOverlap::kBuckets) o.dp_bucket_size = pick(g, std::vector<int>{0, 1, 4096});
  if (!o.hardware) o.dp_overlap.reset(), o.dp_bucket_size = 0;
}

/// The kernels' and parallel plans' draws (each group from its own generator).
void draw_kernels(Draws& d, Case& k, bool cp) {
  std::mt19937_64 &kernels = d.kernels, &overlap = d.overlap, &given = d.given,
                  &cp_kernels = d.cp_kernels, &float8 = d.float8, &updates = d.updates;
  TrainPlanOptions& o = k.o;
  // The optimizer's kernel; with SGD (refused: Adam's kernels) kept one time in eight.
  o.optimizer_kernel = pick(updates, std::vector<OptimizerKernel>{
                                         OptimizerKernel::kOps, OptimizerKernel::kFused,
                                         OptimizerKernel::kForeach});
  if (o.optimizer == OptimizerKind::kSgd && o.optimizer_kernel != OptimizerKernel::kOps &&
      std::uniform_int_distribution<int>(0, 7)(updates) != 0) {
    o.optimizer_kernel = OptimizerKernel::kOps;
  }
  o.cp_rotate = std::uniform_int_distribution<int>(0, 1)(kernels) == 0 ? RingRotate::kPermute
                                                                    : RingRotate::kAllGather;
  // Without a model or context axis these are refused: kept there one time in eight.
  const Mesh mesh = Mesh::parse(k.mesh, 4);
  const bool tp = mesh.has_axis("tp") && mesh.axis_size("tp") > 1;
  if (o.tp_plan == TpPlan::kModules && !tp && std::uniform_int_distribution<int>(0, 7)(given)) {
    o.tp_plan = TpPlan::kPartitioner;
  }
  if (o.cp_rotate == RingRotate::kAllGather && !cp &&
      std::uniform_int_distribution<int>(0, 7)(given)) {
    o.cp_rotate = RingRotate::kPermute;
  }
  // Async TP: on the modules' plan only (its refusal elsewhere is train_plan_test_async_tp's), so
  // that fewer cases are refused.
  o.async_tp = std::uniform_int_distribution<int>(0, 1)(overlap) == 0 && o.tp_plan == TpPlan::kModules;
  o.cp_kernel = pick(cp_kernels, std::vector<ContextKernel>{ContextKernel::kRing,
                                                            ContextKernel::kRing,
                                                            ContextKernel::kAllGatherKv,
                                                            ContextKernel::kUlysses});
  // The rotation is the ring's: with another kernel kept one time in eight (refused), as is
  // another kernel without a context axis.
  if (o.cp_kernel != ContextKernel::kRing &&
      std::uniform_int_distribution<int>(0, 7)(cp_kernels) != 0) {
    o.cp_rotate.reset();
  }
  if (o.cp_kernel != ContextKernel::kRing && !cp &&
      std::uniform_int_distribution<int>(0, 7)(cp_kernels) != 0) {
    o.cp_kernel = ContextKernel::kRing;
  }
  // With --float8 only, and a float8 gather with tensorwise only (their refusals have their own
  // tests, train_time_test_float8.cpp): a refusal here would move which plans are checked again
  // without each option (every eighth planned).
  if (o.float8) {
    o.float8_recipe = pick(float8, std::vector<std::optional<Float8Scaling>>{
                                       std::nullopt, Float8Scaling::kTensorwise,
                                       Float8Scaling::kRowwise, Float8Scaling::kRowwiseWithGwHp});
    const bool tensorwise = o.float8_recipe.value_or(Float8Scaling::kTensorwise) ==
                            Float8Scaling::kTensorwise;
    o.float8_all_gather = pick(
        float8, tensorwise ? std::vector<std::optional<Float8Gather>>{std::nullopt,
                                                                      Float8Gather::kBf16,
                                                                      Float8Gather::kFloat8}
                           : std::vector<std::optional<Float8Gather>>{std::nullopt,
                                                                      Float8Gather::kBf16});
  }
}

/// --loss-dtype (its own generator): where it cannot apply (the fused loss, logits in another
/// dtype, T5) kept one time in 32 (refused; its refusals have their own tests,
/// train_plan_test_loss_dtype.cpp), so that few plans move to refusals.
void draw_loss_dtype(Draws& d, Case& k) {
  TrainPlanOptions& o = k.o;
  o.loss_dtype = pick(d.loss, std::vector<std::optional<DType>>{std::nullopt, std::nullopt,
                                                                std::nullopt, DType::kF32,
                                                                DType::kBF16});
  if (!o.loss_dtype) return;
  const bool t5 = k.family->json == kOneLayerT5;
  const bool applies = !t5 && (*o.loss_dtype == DType::kF32
                                   ? o.param_dtype != DType::kF64
                                   : o.fused_loss == false && o.param_dtype == DType::kBF16);
  if (!applies && std::uniform_int_distribution<int>(0, 31)(d.loss) != 0) o.loss_dtype.reset();
}

Case random_case(Draws& d) {
  std::mt19937_64 &rng = d.rng, &blocks = d.blocks;
  Case k;
  k.family = &pick(rng, families());
  k.mesh = pick(rng, k.family->meshes);
  TrainPlanOptions& o = k.o;
  o.grad_accum = pick(rng, std::vector<int>{1, 1, 2});
  o.batch = 4 * o.grad_accum;  // 4 sequences a micro-batch: split over up to 4 batch devices
  const bool cp = k.mesh.find("cp") != std::string::npos;
  o.seq = cp ? pick(rng, std::vector<std::int64_t>{4, 8, 16})
             : pick(rng, std::vector<std::int64_t>{3, 4, 8, 12, 16, 67});
  if (k.family->json == kOneLayerGpt2) o.seq = std::min<std::int64_t>(o.seq, 16);
  o.target_seq = pick(rng, std::vector<std::int64_t>{0, 0, 4, 8});
  o.fused_attention = tri(rng);
  o.fused_loss = tri(rng);
  o.sequence_parallel = tri(rng);
  o.float8 = std::uniform_int_distribution<int>(0, 9)(rng) == 0;
  o.param_dtype = pick(rng, std::vector<DType>{DType::kBF16, DType::kBF16, DType::kF32, DType::kF64});
  o.grad_dtype = pick(rng, std::vector<DType>{o.param_dtype, DType::kF32});
  o.optimizer_dtype = pick(rng, std::vector<DType>{DType::kF32, DType::kBF16});
  if (std::uniform_int_distribution<int>(0, 3)(rng) == 0) o.master_dtype = DType::kF32;
  if (std::uniform_int_distribution<int>(0, 3)(rng) == 0) o.reduce_dtype = DType::kF32;
  o.optimizer = pick(rng, std::vector<OptimizerKind>{OptimizerKind::kAdamw, OptimizerKind::kSgd});
  o.remat = pick(rng, std::vector<std::optional<RematPolicy>>{
                          std::nullopt, std::nullopt, checkpoint_policies::nothing_saveable(),
                          checkpoint_policies::dots_with_no_batch_dims_saveable()});
  o.fsdp_root = std::uniform_int_distribution<int>(0, 4)(rng) == 0;
  o.eager = std::uniform_int_distribution<int>(0, 4)(rng) == 0;
  o.reshard_after_forward = std::uniform_int_distribution<int>(0, 3)(rng) != 0;
  if (std::uniform_int_distribution<int>(0, 1)(rng) == 0) o.activations = load_preset(k.family->rules);
  // Hardware: a built-in entry with its compute and bandwidth figures scaled.
  if (std::uniform_int_distribution<int>(0, 2)(rng) != 0) {
    Hardware hw = pick(rng, builtin_hardware());
    const std::vector<double> scales{0.25, 1.0, 3.0};
    hw.bf16_flops *= pick(rng, scales);
    hw.fp8_flops = hw.fp8_flops > 0 ? 2 * hw.bf16_flops : 0;
    hw.memory_bandwidth *= pick(rng, scales);
    hw.intra_node_bandwidth *= pick(rng, scales);
    hw.inter_node_bandwidth *= pick(rng, scales);
    hw.node_size = pick(rng, std::vector<std::int64_t>{1, 2, 8});
    o.hardware = hw;
  }
  o.tp_plan = std::uniform_int_distribution<int>(0, 2)(rng) == 0 ? TpPlan::kModules
                                                                : TpPlan::kPartitioner;
  // Some layers checkpoints; rarely a choice without a policy (refused).
  o.remat_blocks = parse_remat_blocks(
      o.remat ? pick(blocks, std::vector<const char*>{"all", "all", "every:2", "fraction:1/2",
                                                      "layers:0"})
              : std::uniform_int_distribution<int>(0, 39)(blocks) == 0 ? "every:2" : "all");
  o.reshard_last_block = pick(blocks, std::vector<std::optional<bool>>{
                                       std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                       std::nullopt, std::nullopt, false, true});
  draw_kernels(d, k, cp);
  draw_dp_overlap(d, k);
  draw_loss_dtype(d, k);
  const auto b = [](std::optional<bool> v) { return v ? (*v ? "on" : "off") : "default"; };
  const auto recipe = o.float8_recipe ? std::string(name(*o.float8_recipe)) : "default";
  const auto gather = o.float8_all_gather ? std::string(name(*o.float8_all_gather)) : "default";
  k.text = fmt::format(
      "{} on {}: batch {} seq {} target {} accum {} attention {} loss {} sp {} float8 {} "
      "param {} remat {} blocks {} fsdp_root {} reshard_last {} eager {} activations {} "
      "hardware {} tp_plan {} cp_rotate {} cp_kernel {} async_tp {} float8_recipe {} "
      "float8_all_gather {} optimizer_kernel {}",
      ModelConfig::parse(k.family->json).model_type, k.mesh, o.batch, o.seq, o.target_seq,
      o.grad_accum, b(o.fused_attention), b(o.fused_loss), b(o.sequence_parallel), o.float8,
      name(o.param_dtype), remat_name(o.remat), remat_blocks_name(o.remat_blocks), o.fsdp_root,
      b(o.reshard_last_block), o.eager, o.activations.has_value(),
      o.hardware ? o.hardware->name : "none", name(o.tp_plan),
      o.cp_rotate ? name(*o.cp_rotate) : "default", name(o.cp_kernel), o.async_tp, recipe,
      gather, name(o.optimizer_kernel));
  const auto dtype = [](std::optional<DType> t) { return t ? std::string(name(*t)) : "none"; };
  k.text += fmt::format(
      " optimizer {} grad {} optimizer_dtype {} master {} reduce {} reshard_after_forward {} "
      "loss_dtype {}",
      name(o.optimizer), name(o.grad_dtype), name(o.optimizer_dtype), dtype(o.master_dtype),
      dtype(o.reduce_dtype), o.reshard_after_forward, dtype(o.loss_dtype));
  k.text += fmt::format(" dp_overlap {} dp_bucket_size {}",
                        o.dp_overlap ? name(*o.dp_overlap) : "default", o.dp_bucket_size);
  return k;
}

std::int64_t axis_ways(const Mesh& mesh, const std::vector<std::string>& axes) {
  std::int64_t n = 1;
  for (const std::string& a : axes) n *= mesh.axis_size(a);
  return n;
}

/// The data-parallel collectives timed as asked, and said so.
void check_dp_overlap_time(const TrainPlanOptions& o, const TrainPlan& p) {
  const StepTime& t = *p.time;
  const DpOverlap asked = o.dp_overlap.value_or(DpOverlap::kFsdp);
  EXPECT_EQ(t.dp_overlap, name(asked));
  EXPECT_EQ(p.table().find("data-parallel overlap") != std::string::npos,
            asked != DpOverlap::kFsdp);
  double data = 0;  // the data-parallel collectives' seconds, all exposed when off
  for (const CommTime& c : t.comms) {
    if (c.role == CommRole::kData) data += c.seconds;
    EXPECT_FALSE(c.role == CommRole::kData && asked == DpOverlap::kOff && c.overlapped);
  }
  EXPECT_TRUE(asked != DpOverlap::kOff || t.exposed_seconds >= data * (1 - 1e-12));
  if (asked != DpOverlap::kBuckets && asked != DpOverlap::kGradBuckets) return;
  EXPECT_GE(t.dp_reduce_exposed_seconds, 0);
  EXPECT_LE(t.dp_reduce_exposed_seconds, t.dp_reduce_seconds * (1 + 1e-12));
  EXPECT_LE(t.dp_gather_exposed_seconds, t.dp_gather_seconds * (1 + 1e-12));
  ASSERT_FALSE(t.dp_bucket_elements.empty());  // each closed at the size, but the last
  for (std::size_t i = 0; i + 1 < t.dp_bucket_elements.size(); ++i) {
    EXPECT_GE(t.dp_bucket_elements[i], t.dp_bucket_size);
  }
  EXPECT_GT(t.dp_bucket_elements.back(), 0);
}

/// The text and JSON say what the program ran.
void check_report(const TrainPlanOptions& o, const TrainPlan& p) {
  const std::string text = p.table();
  EXPECT_THAT(text, ::testing::HasSubstr(p.fused_attention ? "attention fused" : "attention naive"));
  EXPECT_THAT(text, ::testing::HasSubstr(p.fused_loss ? "loss fused" : "loss naive"));
  // The loss's dtype, read from the program, said where it is not f32.
  EXPECT_EQ(text.find(fmt::format("loss {} in ", p.fused_loss ? "fused" : "naive")) !=
                std::string::npos,
            p.loss_dtype != DType::kF32);
  EXPECT_THAT(text, ::testing::HasSubstr(p.sequence_parallel ? "sequence parallel on"
                                                             : "sequence parallel off"));
  EXPECT_EQ(text.find("context parallel over") != std::string::npos, !p.context_axes.empty());
  EXPECT_EQ(text.find("key/value blocks all-gathered") != std::string::npos, p.context_gathered);
  // Async TP pairs only what --async-tp asked for, on the modules' plan; said as it is.
  if (!o.async_tp) {
    EXPECT_TRUE(p.tp_overlaps.empty());
  }
  if (!p.tp_overlaps.empty()) {
    EXPECT_TRUE(p.tp_modules);
  }
  EXPECT_EQ(text.find(", async TP (") != std::string::npos, !p.tp_overlaps.empty());
  // The optimizer's kernel as asked, read from the program's update.
  EXPECT_EQ(p.optimizer_kernel, name(o.optimizer_kernel));
  EXPECT_EQ(text.find(", optimizer kernel foreach (") != std::string::npos,
            p.optimizer_kernel == "foreach");
  EXPECT_EQ(text.find(", optimizer kernel fused (") != std::string::npos,
            p.optimizer_kernel == "fused");
  std::ostringstream js;
  p.write_json(js);
  const auto j = nlohmann::json::parse(js.str());
  EXPECT_EQ(j.contains("tp_overlaps"), !p.tp_overlaps.empty());
  EXPECT_EQ(j["sequence_parallel"], p.sequence_parallel);
  EXPECT_EQ(j["optimizer_kernel"], p.optimizer_kernel);
  EXPECT_EQ(j["attention"], p.fused_attention ? "fused" : "naive");
  EXPECT_EQ(j["loss"], p.fused_loss ? "fused" : "naive");
  EXPECT_EQ(j["loss_dtype"], name(p.loss_dtype));
  if (p.float8) {
    EXPECT_EQ(j["float8_recipe"], p.float8_recipe);
    EXPECT_EQ(j["float8_all_gather"], p.float8_all_gather);
  } else {
    EXPECT_TRUE(j["float8_recipe"].is_null());
  }
  if (p.context_axes.empty()) {
    EXPECT_TRUE(j["context_rotate"].is_null());
    EXPECT_TRUE(j["context_kernel"].is_null());
  } else {
    EXPECT_EQ(j["context_kernel"], std::string(name(p.context_kernel)));
    if (p.context_kernel == ContextKernel::kRing) {
      EXPECT_EQ(j["context_rotate"], p.context_gathered ? "allgather" : "permute");
    } else {
      EXPECT_TRUE(j["context_rotate"].is_null());
    }
  }
}

/// What a plan reports must be what its program ran and figures that hold together.
void check_plan(const Case& k, const Mesh& mesh, const TrainPlan& p) {
  const TrainPlanOptions& o = k.o;
  EXPECT_EQ(p.peak_held_bytes + p.peak_gathered_bytes + p.peak_computed_bytes, p.peak_bytes);
  // The attention the program holds: the fused kernel's FLOPs are counted apart.
  EXPECT_EQ(p.fused_attention, p.attention_flops > 0);
  if (o.fused_attention) {
    EXPECT_EQ(p.fused_attention, *o.fused_attention);
  }
  if (o.fused_loss) {
    EXPECT_EQ(p.fused_loss, *o.fused_loss);
  }
  // The loss in the dtype asked for (it applies only to the naive loss on logits no wider).
  if (o.loss_dtype) {
    EXPECT_FALSE(*o.loss_dtype == DType::kBF16 && p.fused_loss);
    EXPECT_EQ(p.loss_dtype, *o.loss_dtype);
  }
  EXPECT_EQ(p.float8, p.matmul_fp8_flops > 0);
  EXPECT_EQ(p.float8, o.float8);
  // The recipe read from the program's float8 products is the one asked for; a bf16 gather
  // moves no float8 weight.
  EXPECT_EQ(p.float8_recipe,
            p.float8 ? name(o.float8_recipe.value_or(Float8Scaling::kTensorwise)) : "");
  const bool gathers_rows = o.float8_all_gather == Float8Gather::kBf16 ||
                            (!o.float8_all_gather && o.float8_recipe &&
                             *o.float8_recipe != Float8Scaling::kTensorwise);
  if (p.float8 && gathers_rows) {
    EXPECT_NE(p.float8_all_gather, "float8");
  }
  if (o.sequence_parallel == false) {
    EXPECT_FALSE(p.sequence_parallel);
  }
  if (p.sequence_parallel) {
    EXPECT_GT(axis_ways(mesh, p.sequence_axes), 1);
    EXPECT_EQ(o.seq % axis_ways(mesh, p.sequence_axes), 0);
  }
  if (!p.context_axes.empty()) {
    EXPECT_GT(axis_ways(mesh, p.context_axes), 1);
    // The kernel as asked, read from its ops, and what it sends.
    EXPECT_EQ(p.context_kernel, o.cp_kernel);
    if (o.cp_kernel == ContextKernel::kRing) {
      EXPECT_GT(p.bytes_by_collective.count(CollectiveKind::kPermute), 0u);
    } else if (o.cp_kernel == ContextKernel::kAllGatherKv) {
      EXPECT_GT(p.bytes_by_collective.count(CollectiveKind::kAllGather), 0u);
      EXPECT_GT(p.bytes_by_collective.count(CollectiveKind::kReduceScatter), 0u);
    } else {
      EXPECT_GT(p.bytes_by_collective.count(CollectiveKind::kAllToAll), 0u);
    }
    // The ring's rotation as asked, read from its ops.
    EXPECT_EQ(p.context_gathered, o.cp_rotate == RingRotate::kAllGather);
    if (p.context_gathered) {
      EXPECT_GT(p.bytes_by_collective.count(CollectiveKind::kAllGather), 0u);
    }
  } else {
    EXPECT_FALSE(p.context_gathered);
    EXPECT_NE(o.cp_rotate, RingRotate::kAllGather);  // given without a ring: refused
    EXPECT_EQ(o.cp_kernel, ContextKernel::kRing);    // another kernel likewise
  }
  // The modules' plan where asked for (refused where no layer weight is split over a model axis).
  EXPECT_EQ(p.tp_modules, o.tp_plan == TpPlan::kModules);
  check_report(o, p);
  if (o.hardware) {
    ASSERT_TRUE(p.time);
    const StepTime& t = *p.time;
    EXPECT_TRUE(std::isfinite(t.tokens_per_second_per_device));
    EXPECT_GT(t.tokens_per_second_per_device, 0);
    EXPECT_GT(t.mfu, 0);
    EXPECT_LE(t.mfu, 1);
    // Each pair hides no more than its transfer, and the tensor-parallel time stays >= 0.
    EXPECT_EQ(t.tp_overlaps.size(), p.tp_overlaps.size());
    for (const TpOverlapTime& x : t.tp_overlaps) {
      EXPECT_GE(x.exposed_seconds, 0);
      EXPECT_LE(x.exposed_seconds, x.comm_seconds);
    }
    EXPECT_GE(t.tp_overlap_hidden_seconds, 0);
    EXPECT_GE(t.exposed_tensor_seconds, -1e-12 * (t.tp_overlap_hidden_seconds + 1e-30));
    check_dp_overlap_time(o, p);
    // Recomputed from its parts (never clamped).
    EXPECT_DOUBLE_EQ(t.mfu,
                     t.model_flops_per_token * t.tokens_per_second_per_device / o.hardware->bf16_flops);
  }
}

/// An option reported as applied changes the program: the same plan without it differs.
void check_applied_changes(const Case& k, const ModelConfig& c, const Mesh& mesh,
                           const RulePtr& rules, const TrainPlan& p) {
  const auto same = [](const TrainPlan& a, const TrainPlan& b) {
    return a.peak_bytes == b.peak_bytes && a.flops == b.flops &&
           a.memory_traffic == b.memory_traffic && a.bytes_by_axes == b.bytes_by_axes &&
           a.attention_flops == b.attention_flops && a.matmul_fp8_flops == b.matmul_fp8_flops;
  };
  const auto without = [&](const auto& change, const char* what) {
    TrainPlanOptions o = k.o;
    change(o);
    try {
      const TrainPlan q = plan_training(c, mesh, rules, o);
      EXPECT_FALSE(same(p, q)) << what << " reported applied but the program is the same";
    } catch (const OptionError& e) {
      ADD_FAILURE() << what << ": the plan without it is refused: " << e.what();
    }
  };
  if (p.sequence_parallel) {
    without([](TrainPlanOptions& o) { o.sequence_parallel = false; }, "sequence parallel");
  }
  if (p.fused_attention && p.context_axes.empty()) {
    without([](TrainPlanOptions& o) { o.fused_attention = false; }, "fused attention");
  }
  if (p.fused_loss) without([](TrainPlanOptions& o) { o.fused_loss = false; }, "fused loss");
  if (p.optimizer_kernel != "ops") {
    without([](TrainPlanOptions& o) { o.optimizer_kernel = OptimizerKernel::kOps; },
            "the optimizer's kernel");
  }
  // The loss on the bf16 logits holds no f32 copy of them: without it the program differs.
  if (!p.fused_loss && k.o.loss_dtype == DType::kBF16) {
    without([](TrainPlanOptions& o) { o.loss_dtype.reset(); }, "the loss on bf16 logits");
  }
  if (p.float8) {
    without([](TrainPlanOptions& o) {
      o.float8 = false;
      o.float8_recipe.reset();
      o.float8_all_gather.reset();
    }, "float8");
  }
  if (p.fsdp_root) {
    without([](TrainPlanOptions& o) { o.fsdp_root = false; o.reshard_last_block = true; },
            "FSDP root module");
  }
  if (p.recompute && p.remat_layers < c.layers) {
    without([](TrainPlanOptions& o) { o.remat_blocks = RematBlocks(); }, "remat per block");
  }
  // (With --float8 the blocks' linears keep their float8 weights for the backward pass
  // (float8_linear's residuals), so a LLaMA block gathers nothing again: left out here, a known
  // gap of the float8 model, not of the report.)
  if (p.reshard_after_forward && !p.float8) {
    without([](TrainPlanOptions& o) { o.reshard_after_forward = false; }, "reshard after forward");
  }
  if (p.last_block_kept_gathered && k.o.reshard_after_forward && !p.float8) {
    without([](TrainPlanOptions& o) { o.fsdp_root = false; o.reshard_last_block = true; },
            "the last block kept gathered");
  }
  if (p.kept_gathered_for_recompute && !p.float8) {
    without([](TrainPlanOptions& o) { o.reshard_after_forward = true; },
            "weights kept gathered for the recomputation");
  }
}

TEST(TrainPlanOptions, EveryCombinationAppliesOrIsRefusedByName) {
  constexpr std::uint64_t kSeed = 39;
  constexpr int kCases = 500;
  Draws draws(kSeed);
  int planned = 0, refused = 0;
  std::set<std::size_t> refusals_seen;
  std::set<ContextKernel> context_kernels;  // planned with a context axis
  for (int i = 0; i < kCases; ++i) {
    const Case k = random_case(draws);
    SCOPED_TRACE(fmt::format("seed {} case {}: {}", kSeed, i, k.text));
    const ModelConfig c = ModelConfig::parse(k.family->json);
    const Mesh mesh = Mesh::parse(k.mesh, 4);
    const RulePtr rules = preset(k.family->rules);
    try {
      const TrainPlan p = plan_training(c, mesh, rules, k.o);
      ++planned;
      check_plan(k, mesh, p);
      if (!p.context_axes.empty()) context_kernels.insert(p.context_kernel);
      // Every eighth plan again without each option it reports applied.
      if (planned % 8 == 0) check_applied_changes(k, c, mesh, rules, p);
    } catch (const OptionError& e) {
      ++refused;
      refusals_seen.insert(e.refusal_index());
      EXPECT_TRUE(documented(e.refusal())) << e.what();
      EXPECT_THAT(e.what(), ::testing::HasSubstr(std::string(e.refusal().option)));
    } catch (const Error& e) {
      ADD_FAILURE() << "neither planned nor refused by name: " << e.what();
    }
    if (HasFailure()) break;  // the first failing case, with its seed and index
  }
  EXPECT_GT(planned, kCases / 6);
  EXPECT_GT(refused, kCases / 10);
  EXPECT_GE(refusals_seen.size(), 8u);
  EXPECT_EQ(context_kernels.size(), 3u);  // each kernel planned at least once
}

}  // namespace
}  // namespace shardplan
