// train-plan's options against the family's step and the mesh: applied, or refused by name.
#include "resolve_options.hpp"
#include "model_family.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iterator>

#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"

namespace shardplan {

namespace {

// In train::Refusal's order. docs/cli.md, "Refused combinations", prints this table (a test
// compares them).
constexpr OptionRefusal kRefusals[] = {
      {"any option taking a value", "given an empty value ('')"},
      {"--master-dtype, --reduce-dtype, --grad-dtype", "with --mixed-precision fsdp2"},
      {"--optimizer-dtype", "with --mixed-precision fsdp2"},
      {"--headroom", "without --device-memory or --hardware (no memory to keep it in)"},
      {"--target-seq", "a decoder-only model (every family but T5)"},
      {"--mesh with a cp or context axis", "a family without ring attention (t5, gpt2)"},
      {"--mesh with a cp or context axis", "two context axes (cp and context)"},
      {"--mesh with a cp or context axis", "sliding-window attention on a layer"},
      {"--attention naive", "a cp or context axis"},
      {"--attention fused", "a family without fused attention (T5)"},
      {"--loss fused", "a family without the fused loss (T5)"},
      {"--loss fused", "a sequence (T5: the decoder's) that splits into no groups of tokens"},
      {"--sequence-parallel on",
       "rules mapping activation_norm_length to no tensor-parallel axis of more than one device, "
       "or a family without annotated regions (T5)"},
      {"--sequence-parallel on", "a sequence that does not split over the axes it maps to"},
      {"--float8", "a family other than the LLaMA family (gpt2, t5)"},
      {"--float8", "--param-dtype f64"},
      {"--float8", "--hardware without float8 matrix units"},
      {"--recompute, --remat", "a family without recomputation (T5)"},
      {"--fsdp-root", "a family without FSDP's root module (T5)"},
      {"--attention fused", "soft-capped attention scores (attn_logit_softcapping)"},
      {"--loss fused", "soft-capped logits (final_logit_softcapping)"},
      {"--mesh with a cp or context axis", "soft-capped attention scores (attn_logit_softcapping)"},
      {"--remat-blocks", "no recomputation (--remat none or not given)"},
      {"--remat-blocks layers:A-B", "a layer past the model's last"},
      {"--no-reshard-last-block", "a family without a unit per block (T5)"},
      {"--optimizer-kernel fused", "--optimizer sgd (the fused kernel is Adam's and AdamW's)"},
      {"--optimizer-kernel foreach",
       "--optimizer sgd (the foreach passes planned are Adam's and AdamW's)"},
      {"--optimizer-sharding zero1",
       "rules that split no parameter over a batch or context axis of more than one device, or "
       "--optimizer sgd without --master-dtype (nothing to shard)"},
      {"--tp-plan modules",
       "rules that split no layer weight over a tensor-parallel axis of more than one device "
       "(unless a --stack sets it: then it is that stack's default)"},
      {"--cp-rotate allgather",
       "a mesh without a cp or context axis (unless a --stack sets it: then it is that stack's "
       "default)"},
      {"--async-tp", "no tensor-parallel axis of more than one device"},
      {"--async-tp", "--tp-plan partitioner (not given)"},
      {"--async-tp", "--eager"},
      {"--cp-rotate", "--cp-kernel allgather-kv or ulysses (the rotation is the ring's)"},
      {"--cp-kernel ulysses",
       "query or key/value heads per device not a multiple of the context axis's devices"},
      {"--cp-kernel allgather-kv, ulysses",
       "a mesh without a cp or context axis (unless a --stack sets it: then it is that stack's "
       "default)"},
      {"--float8-recipe, --float8-all-gather", "without --float8"},
      {"--float8-all-gather float8", "--float8-recipe rowwise or rowwise_with_gw_hp"},
      {"--dp-overlap, --dp-bucket-size",
       "without --hardware (no step time to overlap in; unless a --stack is given: then it "
       "is that stack's setting)"},
      {"--dp-bucket-size",
       "without --dp-overlap buckets or grad-buckets (no buckets to size)"},
      {"--dp-overlap grad-buckets",
       "without --optimizer-sharding zero1 (no parameter gather to leave exposed: that is "
       "buckets)"},
      {"--dp-overlap buckets, grad-buckets",
       "rules that split a parameter over a batch or context axis of more than one device, "
       "without --optimizer-sharding zero1 (FSDP gathers layer by layer: --dp-overlap fsdp)"},
      {"--loss-dtype",
       "a family whose step reads its logits as computed (T5) (unless a --stack sets it: then "
       "it is that stack's default)"},
      {"--loss-dtype bf16",
       "the fused loss (--loss fused, or --loss not given where it applies), which takes each "
       "group's logits to f32 (unless a --stack sets it: then it is that stack's default)"},
      {"--loss-dtype",
       "logits in a wider dtype (--param-dtype): bf16 of f32 or f64 logits, f32 of f64 (unless "
       "a --stack sets it: then it is that stack's default)"},
};
static_assert(std::size(kRefusals) == static_cast<std::size_t>(train::Refusal::kCount),
              "one entry per train::Refusal, in its order");

}  // namespace

const std::vector<OptionRefusal>& train_plan_refusals() {
  static const std::vector<OptionRefusal> kList(std::begin(kRefusals), std::end(kRefusals));
  return kList;
}

namespace train {

void refuse(Refusal r, const std::string& values) {
  const auto i = static_cast<std::size_t>(r);
  const OptionRefusal& x = train_plan_refusals().at(i);
  throw OptionError(i, fmt::format("[train] {} is refused: {}; {}", x.option, x.condition, values));
}

const FamilySupport& support_of(const ModelConfig& c) { return c.family->support; }

bool stack_sets(const TrainPlanOptions& o, std::string_view option) {
  return o.stack && std::find(o.stack->options_set.begin(), o.stack->options_set.end(),
                              option) != o.stack->options_set.end();
}

namespace {

std::string model_text(const ModelConfig& c) {
  return fmt::format("the model is {} ({})", c.family_name(), detail::printable(c.model_type));
}

}  // namespace

namespace {

// --remat-blocks and --no-reshard-last-block: settings of the decoder's blocks one by one.
void check_block_options(const ModelConfig& config, const TrainPlanOptions& o) {
  const std::string blocks = remat_blocks_name(o.remat_blocks);
  if (o.remat_blocks.kind != RematBlocks::Kind::kAll && !effective_remat(o)) {
    refuse(Refusal::kRematBlocksWithoutRemat,
           fmt::format("--remat-blocks {} chooses the layers a policy applies to, and there is "
                       "none: give it with --remat full|dots|names:...",
                       blocks));
  }
  for (const auto& [first, last] : o.remat_blocks.ranges) {
    if (last >= config.layers) {
      refuse(Refusal::kRematBlocksPastLayers,
             fmt::format("--remat-blocks {}: layer {} is past the last, layer {} ({})", blocks,
                         last, config.layers - 1, model_text(config)));
    }
  }
  if (o.reshard_last_block == false && !support_of(config).fsdp_root) {
    refuse(Refusal::kReshardLastBlockFamily,
           fmt::format("{}: its step is traced whole, with no FSDP unit per block; plan it "
                       "without --no-reshard-last-block",
                       model_text(config)));
  }
}

// --float8 and its recipe and all-gather options.
void check_float8_options(const ModelConfig& config, const TrainPlanOptions& o) {
  if (o.float8 && !support_of(config).float8) {
    refuse(Refusal::kFloat8Family,
           fmt::format("float8 linear layers are planned for LLaMA-family blocks ({}); {}",
                       titles_with(&FamilySupport::float8), model_text(config)));
  }
  if (!o.float8 && (o.float8_recipe || o.float8_all_gather)) {
    refuse(Refusal::kFloat8RecipeWithoutFloat8,
           fmt::format("{}{}{} choose how float8 linear layers run, and there are none: give "
                       "--float8",
                       o.float8_recipe ? fmt::format("--float8-recipe {}", name(*o.float8_recipe))
                                       : std::string(),
                       o.float8_recipe && o.float8_all_gather ? ", " : "",
                       o.float8_all_gather
                           ? fmt::format("--float8-all-gather {}", name(*o.float8_all_gather))
                           : std::string()));
  }
  if (o.float8_all_gather == Float8Gather::kFloat8 && o.float8_recipe &&
      *o.float8_recipe != Float8Scaling::kTensorwise) {
    refuse(Refusal::kFloat8GatherRowwise,
           fmt::format("--float8-recipe {} scales each weight per row, and a weight cast per "
                       "shard is gathered in float8 for tensorwise scaling only (torchao's "
                       "Float8LinearConfig: \"enable_fsdp_float8_all_gather only supports "
                       "tensorwise scaling granularity\", torchao/float8/config.py; torchtitan's "
                       "docs/float8.md: with rowwise scaling \"all distributed communication is "
                       "done in high precision\"): give --float8-all-gather bf16",
                       name(*o.float8_recipe)));
  }
  if (o.float8 && o.param_dtype != DType::kBF16 && o.param_dtype != DType::kF32) {
    refuse(Refusal::kFloat8Dtype, fmt::format("float8 linear layers take bf16 or f32 inputs, not {}",
                                              name(o.param_dtype)));
  }
}

// --dp-overlap and --dp-bucket-size: how the step time overlaps the data-parallel collectives.
void check_dp_overlap(const TrainPlanOptions& o) {
  if (o.dp_bucket_size < 0) {
    throw SpecError(
        fmt::format("[train] data-parallel bucket size {} is negative", o.dp_bucket_size));
  }
  const DpOverlap overlap = o.dp_overlap.value_or(DpOverlap::kFsdp);
  const bool buckets = overlap == DpOverlap::kBuckets || overlap == DpOverlap::kGradBuckets;
  if (!o.hardware && !o.stack && (o.dp_overlap || o.dp_bucket_size > 0)) {
    refuse(Refusal::kDpOverlapWithoutHardware,
           fmt::format("{}{}{} says how the step time overlaps the data-parallel "
                       "collectives, and without --hardware there is no step time: give "
                       "--hardware",
                       o.dp_overlap ? fmt::format("--dp-overlap {}", name(overlap)) : "",
                       o.dp_overlap && o.dp_bucket_size > 0 ? ", " : "",
                       o.dp_bucket_size > 0 ? fmt::format("--dp-bucket-size {}", o.dp_bucket_size)
                                            : std::string()));
  }
  if (o.dp_bucket_size > 0 && !buckets) {
    refuse(Refusal::kDpBucketSizeWithoutBuckets,
           fmt::format("--dp-bucket-size {} with --dp-overlap {}: only buckets and grad-buckets "
                       "reduce the gradients by bucket",
                       o.dp_bucket_size, name(overlap)));
  }
  if (overlap == DpOverlap::kGradBuckets && o.optimizer_sharding != OptimizerSharding::kZero1) {
    refuse(Refusal::kDpGradBucketsWithoutZero1,
           "without ZeRO-1 the step all-gathers no updated parameters, so grad-buckets would "
           "time it as buckets does: give --dp-overlap buckets, or --optimizer-sharding zero1");
  }
}

}  // namespace

Float8Gather effective_float8_gather(const TrainPlanOptions& o) {
  if (o.float8_all_gather) return *o.float8_all_gather;
  return o.float8_recipe.value_or(Float8Scaling::kTensorwise) == Float8Scaling::kTensorwise
             ? Float8Gather::kFloat8
             : Float8Gather::kBf16;
}

void check_options(const ModelConfig& config, const TrainPlanOptions& o) {
  const FamilySupport& can = support_of(config);
  if (o.batch < 1 || o.seq < 1 || o.grad_accum < 1) {
    throw SpecError(fmt::format(
        "[train] batch {}, sequence length {} and gradient accumulation {} must be positive",
        o.batch, o.seq, o.grad_accum));
  }
  if (o.target_seq < 0) {
    throw SpecError(fmt::format("[train] target sequence length {} is negative", o.target_seq));
  }
  if (o.target_seq > 0 && can.decoder_only) {
    refuse(Refusal::kTargetSeqDecoderOnly,
           fmt::format("--target-seq {}: {}, whose one sequence is --seq", o.target_seq,
                       model_text(config)));
  }
  check_float8_options(config, o);
  if (!can.remat && effective_remat(o)) {
    refuse(Refusal::kRematFamily,
           "recomputation is written for decoder-only models (llama, mixtral, gpt2); plan T5 "
           "without --recompute / --remat");
  }
  if (o.optimizer_kernel == OptimizerKernel::kFused && o.optimizer == OptimizerKind::kSgd) {
    refuse(Refusal::kFusedOptimizerSgd,
           "SGD's update is planned as ops (adamw_update is Adam's and AdamW's); plan it "
           "without --optimizer-kernel fused or with --optimizer adam|adamw");
  }
  if (o.optimizer_kernel == OptimizerKernel::kForeach && o.optimizer == OptimizerKind::kSgd) {
    refuse(Refusal::kForeachOptimizerSgd,
           "SGD's update is planned as ops (adamw_foreach runs Adam's and AdamW's passes); plan "
           "it without --optimizer-kernel foreach or with --optimizer adam|adamw");
  }
  if (!can.fsdp_root && o.fsdp_root) {
    refuse(Refusal::kFsdpRootFamily,
           "--fsdp-root (torchtitan's FSDP wrapping) is written for decoder-only models (llama, "
           "mixtral, gpt2); plan T5 without it");
  }
  check_block_options(config, o);
  check_dp_overlap(o);
  if (o.cp_rotate && o.cp_kernel != ContextKernel::kRing) {
    refuse(Refusal::kCpRotateNotRing,
           fmt::format("--cp-rotate {} with --cp-kernel {}: only the ring passes key/value blocks "
                       "round; plan it without --cp-rotate or with --cp-kernel ring",
                       name(*o.cp_rotate), name(o.cp_kernel)));
  }
  if (o.fused_attention == true && !can.fused_attention) {
    refuse(Refusal::kFusedAttentionFamily,
           "T5's attention adds its relative position bias to the scores, so it runs as the "
           "scores, the bias, the mask and the softmax (--attention naive)");
  }
  // The fused kernels have no soft-capping (ModelConfig::attention_softcap, logit_softcap).
  if (o.fused_attention == true && config.attention_softcap > 0) {
    refuse(Refusal::kFusedAttentionSoftcap,
           fmt::format("{}, whose attention scores are soft-capped at {} before the mask; "
                       "dot_product_attention has no soft-capping, so the scores, the cap, the "
                       "mask and the softmax run as ops (--attention naive)",
                       model_text(config), config.attention_softcap));
  }
  if (o.fused_loss == true && config.logit_softcap > 0) {
    refuse(Refusal::kFusedLossSoftcap,
           fmt::format("{}, whose logits are soft-capped at {} before the loss; "
                       "linear_cross_entropy has no soft-capping, so the logits are made whole, "
                       "capped, then the cross-entropy (--loss naive)",
                       model_text(config), config.logit_softcap));
  }
  if (o.fused_loss == true && !can.fused_loss) {
    refuse(Refusal::kFusedLossFamily,
           "T5's step computes the whole logits, then the cross-entropy (--loss naive)");
  }
  if (!(o.headroom >= 0 && o.headroom < 1)) {  // NaN too
    throw SpecError(fmt::format("[train] headroom {} is not a fraction in [0, 1)", o.headroom));
  }
  if (config.positions > 0 && o.seq > config.positions) {
    throw SpecError(
        fmt::format("[train] sequence length {} is longer than the model's {} learned positions "
                    "(n_positions)",
                    o.seq, config.positions));
  }
}

namespace {

// The tokens per sequence the head reads (T5: the decoder's).
std::int64_t head_tokens(const ModelConfig& config, const TrainPlanOptions& o) {
  return !config.family->support.decoder_only && o.target_seq > 0 ? o.target_seq : o.seq;
}

// Ulysses moves each device's heads to a split of them over the context axis: the query and
// key/value heads a device holds (ModelStep::ring's blocks: split over the model axes where they
// divide, the key/value heads repeated where the model axes outnumber them) must each divide.
void check_ulysses_heads(const ModelConfig& config, const Mesh& mesh, const Layout& layout) {
  const std::int64_t heads = config.heads, kv = config.kv_heads, ways = layout.model_ways;
  const bool repeat_kv = ways > 1 && kv % ways != 0 && heads % ways == 0;
  const auto per_device = [ways](std::int64_t h) { return h % ways == 0 ? h / ways : h; };
  const std::int64_t q_local = per_device(heads), kv_local = per_device(repeat_kv ? heads : kv);
  const std::int64_t cp = layout.context_ways;
  if (q_local % cp == 0 && kv_local % cp == 0) return;
  refuse(Refusal::kUlyssesHeads,
         fmt::format("{} has {} query heads and {} key/value heads ({} and {} per device{}), and "
                     "Ulysses splits each over the {} devices of '{}' on {}: plan it with "
                     "--cp-kernel ring or allgather-kv, or on fewer context devices",
                     model_text(config), heads, kv, q_local, kv_local,
                     ways > 1 ? fmt::format(" over {} model-parallel devices", ways) : "", cp,
                     detail::printable(layout.context.front()),
                     detail::printable(mesh.to_string())));
}

void resolve_context(const ModelConfig& config, const Mesh& mesh, const Layout& layout,
                     const TrainPlanOptions& o) {
  const std::string mesh_text = detail::printable(mesh.to_string());
  if (layout.context.empty()) {
    if (o.cp_rotate == RingRotate::kAllGather && !stack_sets(o, "--cp-rotate")) {
      refuse(Refusal::kCpRotateNoContext,
             fmt::format("the mesh {} has no cp or context axis, so there is no ring whose "
                         "key/value blocks to all-gather: plan it without --cp-rotate or with a "
                         "context axis",
                         mesh_text));
    }
    if (o.cp_kernel != ContextKernel::kRing && !stack_sets(o, "--cp-kernel")) {
      refuse(Refusal::kCpKernelNoContext,
             fmt::format("--cp-kernel {}: the mesh {} has no cp or context axis, so no attention "
                         "runs context-parallel: plan it without --cp-kernel or with a context "
                         "axis",
                         name(o.cp_kernel), mesh_text));
    }
    return;
  }
  const std::string axis = layout.context.front();
  if (!support_of(config).ring_attention) {
    refuse(Refusal::kContextFamily,
           fmt::format("{} on {}: context parallelism (ring attention) is written for the "
                       "LLaMA-family attention ({}), not {}'s, whose devices on '{}' would repeat "
                       "the same work",
                       model_text(config), mesh_text, titles_with(&FamilySupport::ring_attention),
                       config.family->title,
                       detail::printable(axis)));
  }
  if (config.attention_softcap > 0) {
    refuse(Refusal::kContextSoftcap,
           fmt::format("{} on {}: its attention scores are soft-capped at {}, and ring attention "
                       "(on the fused kernel) has no soft-capping; plan it without the context "
                       "axis '{}'",
                       model_text(config), mesh_text, config.attention_softcap,
                       detail::printable(axis)));
  }
  if (o.fused_attention == false) {
    refuse(Refusal::kContextNaiveAttention,
           fmt::format("the mesh {} splits the sequence over '{}': context parallelism runs ring "
                       "attention on the fused kernel: plan it with --attention fused",
                       mesh_text, detail::printable(axis)));
  }
  if (o.cp_kernel == ContextKernel::kUlysses) check_ulysses_heads(config, mesh, layout);
  for (std::size_t l = 0; l < static_cast<std::size_t>(std::max<std::int64_t>(config.layers, 0));
       ++l) {
    const std::int64_t w = config.window(l);
    if (w > 0 && w < o.seq) {
      refuse(Refusal::kContextWindow,
             fmt::format("sliding-window attention (window {}) with context parallelism over {} "
                         "is not supported: plan it without the context axis",
                         w, detail::printable(axis)));
    }
  }
}

// --loss-dtype: the dtype the naive loss reads the logits in. Only a widening or the logits'
// own dtype (a stack's value that cannot apply is its default there: nullopt).
std::optional<DType> resolve_loss_dtype(const ModelConfig& config, const TrainPlanOptions& o,
                                        bool fused_loss) {
  if (!o.loss_dtype) return std::nullopt;
  const DType want = *o.loss_dtype;
  const bool by_stack = stack_sets(o, "--loss-dtype");
  // The logits are computed in --param-dtype (the head cast to it under mixed precision).
  const DType logits = o.param_dtype;
  if (!support_of(config).fused_loss) {  // its step is traced whole (T5: cross_entropy on them)
    if (by_stack) return std::nullopt;
    refuse(Refusal::kLossDtypeFamily,
           fmt::format("--loss-dtype {}: {}, whose step computes the cross-entropy on its logits "
                       "as the head makes them ({}): plan it without --loss-dtype",
                       name(want), model_text(config), name(logits)));
  }
  if (want == DType::kBF16 && fused_loss) {
    if (by_stack) return std::nullopt;
    refuse(Refusal::kLossDtypeFused,
           fmt::format("--loss-dtype bf16 with {}: linear_cross_entropy takes each group's "
                       "logits to f32 inside its kernel, so no bf16 copy of the logits exists to "
                       "read: plan it with --loss naive",
                       o.fused_loss ? "--loss fused" : "the fused loss (--loss not given)"));
  }
  const auto width = [](DType d) { return d == DType::kF64 ? 8 : d == DType::kF32 ? 4 : 2; };
  if (width(want) < width(logits) || (width(want) == width(logits) && want != logits)) {
    if (by_stack) return std::nullopt;
    refuse(Refusal::kLossDtypeLogits,
           fmt::format("--loss-dtype {} with --param-dtype {}: the logits are computed in {}, "
                       "and the loss reads them as they are or in a wider copy: plan it with "
                       "--loss-dtype {} or without it",
                       name(want), name(logits), name(logits), name(logits)));
  }
  return want;
}

// Async TP decomposes the column/row-parallel modules' collectives over the tensor-parallel
// group; PyTorch does it in an inductor pass (torch._inductor.config._micro_pipeline_tp), so
// torchtitan requires torch.compile (torchtitan/config/configs.py CompileConfig.__post_init__:
// "Async TP requires 'model' in --compile.components and --compile.enable").
void check_async_tp(const Mesh& mesh, const Layout& layout, const TrainPlanOptions& o) {
  if (layout.model_ways <= 1) {
    refuse(Refusal::kAsyncTpModelAxis,
           fmt::format("the mesh {} has no tensor-parallel axis (tp, model, mp, tensor) of more "
                       "than one device: there are no tensor-parallel collectives to overlap",
                       detail::printable(mesh.to_string())));
  }
  if (o.tp_plan != TpPlan::kModules) {
    refuse(Refusal::kAsyncTpPlan,
           "async TP overlaps the all-gathers and reduce-scatters of the column- and "
           "row-parallel modules with their products: plan it with --tp-plan modules");
  }
  if (o.eager) {
    refuse(Refusal::kAsyncTpEager,
           "async TP is torch.compile's micro-pipeline pass (torchtitan refuses it without "
           "compile): plan it without --eager");
  }
}

}  // namespace

TrainPlanOptions resolve_options(const ModelConfig& config, const Mesh& mesh, const Layout& layout,
                                 const TrainPlanOptions& o) {
  TrainPlanOptions r = o;
  const FamilySupport& can = support_of(config);
  resolve_context(config, mesh, layout, o);
  r.fused_attention =
      o.fused_attention.value_or(can.fused_attention && config.attention_softcap == 0);
  // linear_cross_entropy splits the tokens into groups; with one group the logits are whole.
  const std::int64_t t = head_tokens(config, o);
  const bool groups = linear_cross_entropy_chunks(Shape{1, t, 1}) > 1;
  if (o.fused_loss == true && !groups) {
    refuse(Refusal::kFusedLossNoGroups,
           fmt::format("a sequence of {} tokens has no divisor from 2 to 64: "
                       "linear_cross_entropy's one group would hold the whole logits",
                       t));
  }
  r.fused_loss = o.fused_loss.value_or(can.fused_loss && groups && config.logit_softcap == 0);
  r.loss_dtype = resolve_loss_dtype(config, o, *r.fused_loss);

  // Sequence parallelism: the axes activation_norm_length maps to, less the context axes (the
  // sequence's split over those is context parallelism's).
  const RuleFile* file =
      o.activations && !o.activations->activations.empty() ? &*o.activations : nullptr;
  const std::string source =
      detail::printable(o.activations ? o.activations->source : std::string("none"));
  const RuleFile::LogicalMapping bind{{"activation_batch", layout.batch}};
  const AxisNames mapped =
      file != nullptr && can.annotated_regions ? file->logical_axis("activation_norm_length", bind)
                                               : AxisNames{};
  AxisNames model;
  std::int64_t ways = 1;
  for (const std::string& a : mapped) {
    ways *= mesh.axis_size(a);
    if (std::find(layout.context.begin(), layout.context.end(), a) == layout.context.end() &&
        mesh.axis_size(a) > 1) {
      model.push_back(a);
    }
  }
  if (o.sequence_parallel == true && model.empty()) {
    refuse(Refusal::kSequenceParallelUnmapped,
           fmt::format("sequence parallelism was asked for, but {}: it needs rules whose "
                       "activations map the logical axis activation_norm_length to a mesh axis "
                       "(rules: {})",
                       !can.annotated_regions
                           ? "T5's step has no annotated regions"
                           : "nothing maps the sequence to a tensor-parallel axis of more than "
                             "one device",
                       source));
  }
  const bool splits = !mapped.empty() && o.seq % ways == 0;
  if (o.sequence_parallel == true && !splits) {
    refuse(Refusal::kSequenceParallelSplit,
           fmt::format("a sequence of {} tokens does not split over [{}] ({} devices)", o.seq,
                       detail::printable(fmt::format("{}", fmt::join(mapped, ", "))), ways));
  }
  // Not asked for: on where the sequence splits (over the context axes too: their regions).
  if (!o.sequence_parallel) r.sequence_parallel = splits;
  if (o.async_tp) check_async_tp(mesh, layout, o);
  return r;
}

}  // namespace train
}  // namespace shardplan
