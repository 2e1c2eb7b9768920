// Megatron-LM's command-line arguments as a stack config (stack_config.hpp): a file of the
// arguments given to pretrain_gpt.py ("--tensor-model-parallel-size 8 \", one or more a line;
// '#' starts a comment). The names are those of NVIDIA/Megatron-LM@d98e8a6:
// megatron/training/arguments.py, whose ArgumentGroupFactory (megatron/training/
// argument_utils.py) makes "--a-b" of each field a_b of megatron/core/model_parallel_config.py
// (tensor_model_parallel_size, context_parallel_size, sequence_parallel, bf16, fp16),
// megatron/core/transformer/transformer_config.py (recompute_granularity, recompute_method,
// recompute_num_layers) and megatron/training/config/training_config.py (micro_batch_size,
// global_batch_size).
#include <fmt/format.h>

#include <algorithm>

#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "stack_config_impl.hpp"

namespace shardplan::train::stack_config {
namespace {

/// The words of `text` with their lines: comments dropped, a trailing '\' joins lines, quotes
/// group a word.
std::vector<std::pair<std::string, int>> words(std::string_view text, std::string_view source) {
  std::vector<std::pair<std::string, int>> out;
  int line = 1;
  std::size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '\n') {
      ++line, ++i;
    } else if (c == ' ' || c == '\t' || c == '\r' || c == '\\') {
      ++i;
    } else if (c == '#') {
      while (i < text.size() && text[i] != '\n') ++i;
    } else {
      std::string w;
      const int at = line;
      while (i < text.size() && text[i] != ' ' && text[i] != '\t' && text[i] != '\n' &&
             text[i] != '\r') {
        if (text[i] == '"' || text[i] == '\'') {
          const char q = text[i];
          const std::size_t end = text.find(q, i + 1);
          if (end == std::string_view::npos) {
            throw IoError(fmt::format("[stack-config] {}:{}: a quote {} that does not close",
                                      detail::printable(source), at, q));
          }
          w.append(text.substr(i + 1, end - i - 1));
          line +=
              static_cast<int>(std::count(text.begin() + static_cast<std::ptrdiff_t>(i),
                                          text.begin() + static_cast<std::ptrdiff_t>(end), '\n'));
          i = end + 1;
        } else {
          w += text[i++];
        }
      }
      if (w != "\\") out.emplace_back(std::move(w), at);
    }
  }
  return out;
}

std::vector<Entry> parse(std::string_view text, std::string_view source) {
  std::vector<Entry> out;
  for (auto& [w, line] : words(text, source)) {
    if (w.starts_with("--")) {
      Entry e{.key = w, .kind = Entry::Kind::kFlag, .line = line};
      if (const std::size_t eq = w.find('='); eq != std::string::npos) {
        e.key = w.substr(0, eq), e.kind = Entry::Kind::kText, e.text = w.substr(eq + 1);
      }
      out.push_back(std::move(e));
    } else if (out.empty()) {
      throw IoError(
          fmt::format("[stack-config] {}:{}: '{}' before the first argument (the file "
                      "holds the arguments only, each starting with --)",
                      detail::printable(source), line, detail::printable(w)));
    } else if (Entry& e = out.back(); e.kind == Entry::Kind::kFlag) {
      e.kind = Entry::Kind::kText, e.text = w;
    } else {
      if (e.kind == Entry::Kind::kText) e.kind = Entry::Kind::kList, e.list = {e.text};
      e.list.push_back(w);
      e.text += " " + w;
    }
  }
  return out;
}

void flag(const Entry& e, Reading& r) {
  if (e.kind != Entry::Kind::kFlag) r.fail(e, "a flag takes no value");
  r.hold(e);
}
void valued(const Entry& e, Reading& r) {
  if (e.kind != Entry::Kind::kText) r.fail(e, "expected one value");
  r.hold(e);
}
void tp(const Entry& e, Reading& r) { r.axis(e, "tp"); }
// Transformer Engine's userbuffers overlap of the tp collectives with the linear layers' GEMMs
// (ModelParallelConfig.tp_comm_overlap): planned as --async-tp pairs them.
void tp_comm_overlap(const Entry& e, Reading& r) {
  if (e.kind != Entry::Kind::kFlag) r.fail(e, "a flag takes no value");
  r.set(e, "--async-tp");
}
void cp(const Entry& e, Reading& r) { r.axis(e, "cp"); }
void seq(const Entry& e, Reading& r) {
  if (r.integer(e) < 1) r.fail(e, "expected at least 1 token");
  r.set(e, "--seq", std::to_string(r.integer(e)));
}
void micro_batch(const Entry& e, Reading& r) {
  if (r.integer(e) < 1) r.fail(e, "expected at least 1 sequence");
  r.out().local_batch = static_cast<double>(r.integer(e));
  r.hold(e);
}
void global_batch(const Entry& e, Reading& r) {
  if (r.integer(e) < 1) r.fail(e, "expected at least 1 sequence");
  r.out().global_batch = r.integer(e);
  r.hold(e);
}
void optimizer(const Entry& e, Reading& r) {
  const std::string& v = r.text(e);
  if (v != "adam" && v != "sgd") r.fail(e, "expected adam or sgd");
  // Its adam is AdamW (decoupled weight decay): the megatron-core stack's optimizer choice.
  r.set(e, "--optimizer", v == "adam" ? "adamw" : "sgd");
}
void attention_backend(const Entry& e, Reading& r) {
  const std::string& v = r.text(e);
  if (v == "unfused" || v == "local") return r.set(e, "--attention", "naive");
  if (v != "flash" && v != "fused" && v != "auto") {
    r.fail(e, "expected flash, fused, unfused, local or auto");
  }
  r.set(e, "--attention", "fused");
}

/// --cp-comm-type (arguments.py at d98e8a6: nargs '+', default ["p2p"], one type for every layer
/// or one a layer; transformer_config.py's cp_comm_type): planned when every layer has the same.
void cp_comm_type(const Entry& e, Reading& r) {
  const std::vector<std::string> values =
      e.kind == Entry::Kind::kList ? e.list : std::vector<std::string>{r.text(e)};
  for (const std::string& v : values) {
    if (v != values.front()) {
      r.fail(e, "a kernel per layer is not planned: give every layer the same type");
    }
  }
  const std::string& v = values.front();
  if (v == "a2a+p2p") {
    r.fail(e,
           "a2a+p2p (hierarchical: all-to-all within --hierarchical-context-parallel-sizes' "
           "groups, the ring between them) is not planned; p2p, all_gather and a2a are");
  }
  if (v != "p2p" && v != "all_gather" && v != "a2a") {
    r.fail(e, "expected p2p, all_gather, a2a or a2a+p2p");
  }
  r.set(e, "--cp-kernel", v == "p2p" ? "ring" : v == "all_gather" ? "allgather-kv" : "ulysses");
}

constexpr std::string_view kModel = "the model is --config's";
constexpr std::string_view kNotStep = "not part of a training step's memory or time";
constexpr std::string_view kValue = "a value of the update, not its size or time";

const std::vector<Key>& keys() {
  static const std::vector<Key> k = {
      {"--tensor-model-parallel-size", tp},
      {"--context-parallel-size", cp},
      {"--cp-comm-type", cp_comm_type},
      {"--pipeline-model-parallel-size", nullptr, "pipeline parallelism is not planned", "1"},
      {"--expert-model-parallel-size", nullptr, "expert parallelism is not planned", "1"},
      {"--seq-length", seq},
      {"--micro-batch-size", micro_batch},
      {"--global-batch-size", global_batch},
      {"--bf16", flag},
      {"--fp16", nullptr, "fp16 with loss scaling is not planned (bf16 or float32 are)", kRefused},
      {"--fp8-format", nullptr, "Transformer Engine's FP8 is not planned", kRefused},
      {"--accumulate-allreduce-grads-in-fp32", flag},
      {"--sequence-parallel", flag},
      {"--tp-comm-overlap", tp_comm_overlap},
      {"--use-distributed-optimizer", flag},
      {"--recompute-activations", flag},
      {"--recompute-granularity", valued},
      {"--recompute-method", valued},
      {"--recompute-num-layers", valued},
      {"--optimizer", optimizer},
      {"--attention-backend", attention_backend},
      {"--use-flash-attn", nullptr, "the attention as --attention-backend says, fused by default"},
      {"--transformer-impl", nullptr, "kernels as the stack's 'kernels' choice"},
      {"--use-mcore-models", nullptr, "the model's code, not its work"},
      {"--overlap-grad-reduce", flag},
      {"--overlap-param-gather", flag},
      {"--ddp-bucket-size", valued},
      {"--cross-entropy-loss-fusion", nullptr, "the loss as the stack's 'loss' choice"},
      {"--num-layers", nullptr, kModel},
      {"--hidden-size", nullptr, kModel},
      {"--ffn-hidden-size", nullptr, kModel},
      {"--num-attention-heads", nullptr, kModel},
      {"--num-query-groups", nullptr, kModel},
      {"--group-query-attention", nullptr, kModel},
      {"--kv-channels", nullptr, kModel},
      {"--max-position-embeddings", nullptr, kModel},
      {"--position-embedding-type", nullptr, kModel},
      {"--rotary-base", nullptr, kModel},
      {"--normalization", nullptr, kModel},
      {"--norm-epsilon", nullptr, kModel},
      {"--swiglu", nullptr, kModel},
      {"--untie-embeddings-and-output-weights", nullptr, kModel},
      {"--disable-bias-linear", nullptr, kModel},
      {"--vocab-size", nullptr, kModel},
      {"--make-vocab-size-divisible-by", nullptr, kModel},
      {"--tokenizer-type", nullptr, kModel},
      {"--tokenizer-model", nullptr, kModel},
      {"--init-method-std", nullptr, kValue},
      {"--attention-dropout", nullptr, kValue},
      {"--hidden-dropout", nullptr, kValue},
      {"--lr", nullptr, kValue},
      {"--min-lr", nullptr, kValue},
      {"--lr-decay-style", nullptr, kValue},
      {"--lr-warmup-iters", nullptr, kValue},
      {"--lr-decay-iters", nullptr, kValue},
      {"--weight-decay", nullptr, kValue},
      {"--clip-grad", nullptr, "gradient clipping: a norm of the gradients, a scalar"},
      {"--adam-beta1", nullptr, kValue},
      {"--adam-beta2", nullptr, kValue},
      {"--adam-eps", nullptr, kValue},
      {"--train-iters", nullptr, kNotStep},
      {"--train-samples", nullptr, kNotStep},
      {"--seed", nullptr, kNotStep},
      {"--data-path", nullptr, kNotStep},
      {"--split", nullptr, kNotStep},
      {"--save", nullptr, kNotStep},
      {"--load", nullptr, kNotStep},
      {"--save-interval", nullptr, kNotStep},
      {"--log-interval", nullptr, kNotStep},
      {"--eval-interval", nullptr, kNotStep},
      {"--eval-iters", nullptr, kNotStep},
      {"--tensorboard-dir", nullptr, kNotStep},
      {"--distributed-backend", nullptr, kNotStep},
  };
  return k;
}

std::vector<Entry> defaults(std::string_view) { return {}; }

/// The remat of --recompute-*: transformer_config.py's recompute_granularity, _method and
/// _num_layers ("uniform" checkpoints groups of N layers, "block" the first N of each stage).
void recompute(Reading& r) {
  const Entry* granularity = r.held("--recompute-granularity");
  const Entry* activations = r.held("--recompute-activations");  // = selective
  if (granularity == nullptr && activations == nullptr) {
    return r.set_from("no --recompute-granularity", "--remat", "none");
  }
  const Entry& g = granularity != nullptr ? *granularity : *activations;
  const std::string kind = granularity != nullptr ? r.text(g) : "selective";
  if (kind == "selective") {
    try {
      (void)parse_remat("megatron:selective");
    } catch (const SpecError& e) {
      r.fail(g, e.what());
    }
  }
  if (kind != "full") r.fail(g, "expected full or selective");
  const Entry* method = r.held("--recompute-method");
  const Entry* layers = r.held("--recompute-num-layers");
  const std::int64_t n = layers != nullptr ? r.integer(*layers) : 1;
  if (n < 1) r.fail(*layers, "expected at least 1 layer");
  const std::string m = method != nullptr ? r.text(*method) : "uniform";
  std::string keys = Reading::said(g);
  if (method != nullptr) keys += ", " + Reading::said(*method);
  if (layers != nullptr) keys += ", " + Reading::said(*layers);
  if (m == "uniform" && n == 1) return r.set_from(keys, "--remat", "megatron:full");
  if (m == "uniform") {
    r.fail(*layers,
           "uniform recomputation of groups of layers (one input kept per group) is "
           "not planned; --recompute-num-layers 1 is");
  }
  if (m != "block") r.fail(*method, "expected uniform or block");
  r.set_from(keys, "--remat", "megatron:full");
  r.set_from(keys, "--remat-blocks", fmt::format("layers:0-{}", n - 1));
}

/// --overlap-grad-reduce, --overlap-param-gather and --ddp-bucket-size (DistributedDataParallel-
/// Config's overlap_grad_reduce, overlap_param_gather, bucket_size at d98e8a6; arguments.py
/// asserts the gather's overlap with the reduction's and the distributed optimizer).
void dp_overlap(Reading& r, const Entry* zero) {
  const Entry* grad = r.held("--overlap-grad-reduce");
  const Entry* gather = r.held("--overlap-param-gather");
  const Entry* size = r.held("--ddp-bucket-size");
  if (gather != nullptr && grad == nullptr) {
    r.fail(*gather, "Megatron asserts --overlap-grad-reduce with it (arguments.py)");
  }
  if (gather != nullptr && zero == nullptr) {
    r.fail(*gather, "Megatron asserts the distributed optimizer with it (arguments.py)");
  }
  if (size != nullptr && r.integer(*size) < 1) r.fail(*size, "expected at least 1 element");
  if (grad == nullptr) {
    if (size != nullptr) {
      r.out().ignored.push_back(
          fmt::format("{} (no buckets without --overlap-grad-reduce: DistributedDataParallel "
                      "sets bucket_size to None)",
                      Reading::said(*size)));
    }
    return r.set_from("no --overlap-grad-reduce", "--dp-overlap", "off");
  }
  std::string keys = Reading::said(*grad);
  if (gather != nullptr) keys += ", " + Reading::said(*gather);
  r.set_from(keys, "--dp-overlap",
             zero != nullptr && gather == nullptr ? "grad-buckets" : "buckets");
  if (size != nullptr) r.set(*size, "--dp-bucket-size", std::to_string(r.integer(*size)));
}

void finish(Reading& r, std::string_view) {
  const bool bf16 = r.held("--bf16") != nullptr;
  const bool fp32_grads = r.held("--accumulate-allreduce-grads-in-fp32") != nullptr;
  std::string keys = bf16 ? "--bf16" : "no --bf16";
  if (fp32_grads) keys += ", --accumulate-allreduce-grads-in-fp32";
  r.set_from(keys, "--param-dtype", bf16 ? "bf16" : "f32");
  if (bf16) r.set_from(keys, "--master-dtype", "f32");
  r.set_from(keys, "--grad-dtype", bf16 && !fp32_grads ? "bf16" : "f32");
  if (bf16) r.set_from(keys, "--reduce-dtype", fp32_grads ? "f32" : "bf16");
  r.set_from(keys, "--optimizer-dtype", "f32");
  recompute(r);
  // arguments.py (line 1433 at d98e8a6) turns sequence parallelism off when tp is 1.
  const bool sp_flag = r.held("--sequence-parallel") != nullptr;
  const auto& given = r.out().axes;
  const bool tp = std::any_of(given.begin(), given.end(),
                              [](const auto& a) { return a.first == "tp" && a.second > 1; });
  r.set_from(sp_flag ? (tp ? "--sequence-parallel" : "--sequence-parallel (off with tp 1)")
                     : "no --sequence-parallel",
             "--sequence-parallel", sp_flag && tp ? "on" : "off");
  // The data-parallel ranks: the world size over tp x cp (not an argument). Replicated (DDP);
  // with the distributed optimizer (ZeRO-1) an fsdp axis, so that the rules shard the master
  // weights and state over it, and --optimizer-sharding zero1 keeps the bf16 parameters whole.
  const Entry* zero = r.held("--use-distributed-optimizer");
  if (zero != nullptr) r.set(*zero, "--optimizer-sharding", "zero1");
  dp_overlap(r, zero);
  auto& axes = r.out().axes;
  axes.insert(axes.begin(), {zero != nullptr ? "fsdp" : "dp", -1});
  r.out().mesh_keys += fmt::format(
      "{}data parallel -1 (the world size over tp x cp{})", r.out().mesh_keys.empty() ? "" : ", ",
      zero != nullptr ? "; --use-distributed-optimizer: the state sharded over fsdp" : "");
  const Entry* micro = r.held("--micro-batch-size");
  if (micro == nullptr) {
    r.fail(Entry{.key = "--micro-batch-size", .kind = Entry::Kind::kFlag, .line = 1},
           "missing: Megatron requires it (arguments.py asserts it)");
  }
  r.out().batch_keys = Reading::said(*micro);
  if (const Entry* g = r.held("--global-batch-size"))
    r.out().batch_keys += ", " + Reading::said(*g);
}

// Megatron's recomputation arguments for the plan's (full, uniform or the first N layers);
// empty without recomputation. Throws SpecError for a policy Megatron has no arguments for.
std::string recompute_arguments(std::string_view stack, const TrainPlanOptions& o) {
  const std::string remat = remat_name(o.remat);
  const auto& b = o.remat_blocks;
  std::string recompute;
  if ((o.remat || o.recompute) && (remat == "megatron:full" || remat == "full" || o.recompute)) {
    if (b.kind == RematBlocks::Kind::kAll) {
      recompute =
          "--recompute-granularity full --recompute-method uniform "
          "--recompute-num-layers 1\n";
    } else if (b.kind == RematBlocks::Kind::kLayers && b.ranges.size() == 1 &&
               b.ranges[0].first == 0) {
      recompute = fmt::format(
          "--recompute-granularity full --recompute-method block "
          "--recompute-num-layers {}\n",
          b.ranges[0].second + 1);
    }
  }
  if ((o.remat || o.recompute) && recompute.empty()) {
    throw SpecError(
        fmt::format("[stack-config] --emit-config for {}: --remat {} --remat-blocks "
                    "{} is not Megatron's recomputation (full, uniform or the first "
                    "N layers)",
                    stack, remat, remat_blocks_name(b)));
  }
  return recompute;
}

std::string emit(std::string_view stack, const TrainPlanOptions& o, const Mesh& mesh,
                 std::int64_t data_parallel, bool sequence_parallel) {
  require_stack_defaults(stack, o,
                         kSaysSequenceParallel | kSaysOptimizerSharding | kSaysAsyncTp |
                             kSaysContextKernel | kSaysDpOverlap);
  auto deg = mesh_degrees(stack, mesh, {"dp", "fsdp", "tp", "cp"});
  // Megatron's data parallelism shards no parameter: fsdp is its distributed optimizer's axis.
  if (deg.count("fsdp") != 0 && o.optimizer_sharding != OptimizerSharding::kZero1) {
    throw SpecError(fmt::format(
        "[stack-config] --emit-config for {}: an fsdp axis with --optimizer-sharding rules "
        "(FSDP) has no key in Megatron's arguments; --use-distributed-optimizer is "
        "--optimizer-sharding zero1",
        stack));
  }
  if (deg.count("fsdp") == 0 && o.optimizer_sharding == OptimizerSharding::kZero1) {
    throw SpecError(fmt::format(
        "[stack-config] --emit-config for {}: --optimizer-sharding zero1 shards the state over "
        "the data-parallel ranks, which Megatron's config names only on an fsdp axis (dp is "
        "replicated)",
        stack));
  }
  if (deg.count("dp") && deg.count("fsdp")) {
    throw SpecError(
        fmt::format("[stack-config] --emit-config for {}: data parallelism is "
                    "replicated (dp) or with the distributed optimizer (fsdp), not "
                    "both",
                    stack));
  }
  const std::int64_t micro = per_rank_batch(stack, o, data_parallel, "data-parallel ranks");
  const bool bf16 = o.param_dtype == DType::kBF16 && o.master_dtype == DType::kF32 &&
                    o.optimizer_dtype == DType::kF32 && o.reduce_dtype == o.grad_dtype &&
                    (o.grad_dtype == DType::kBF16 || o.grad_dtype == DType::kF32);
  const bool f32 = o.param_dtype == DType::kF32 && o.grad_dtype == DType::kF32 &&
                   o.optimizer_dtype == DType::kF32 &&
                   o.master_dtype.value_or(DType::kF32) == DType::kF32 &&
                   o.reduce_dtype.value_or(DType::kF32) == DType::kF32;
  if (!bf16 && !f32) {
    throw SpecError(fmt::format(
        "[stack-config] --emit-config for {}: the dtypes (param {}, grad {}, optimizer {}) are "
        "not --bf16's (float32 main parameters and state, gradients reduced in bf16 or with "
        "--accumulate-allreduce-grads-in-fp32 in f32) or float32",
        stack, name(o.param_dtype), name(o.grad_dtype), name(o.optimizer_dtype)));
  }
  const DpOverlap dp = o.dp_overlap.value_or(DpOverlap::kFsdp);
  if (dp == DpOverlap::kFsdp) {
    throw SpecError(
        fmt::format("[stack-config] --emit-config for {}: --dp-overlap fsdp (FSDP's layer-by-layer "
                    "pipeline) has no key in Megatron's arguments: its DDP overlaps by bucket "
                    "(--dp-overlap buckets, grad-buckets) or not at all (off)",
                    stack));
  }
  const std::string recompute = recompute_arguments(stack, o);
  const auto degree = [&](const char* a) { return deg.count(a) ? deg[a] : 1; };
  std::string out = fmt::format(
      "# Megatron-LM arguments for {} written by shardplan train-plan --emit-config. The model\n"
      "# (--num-layers, --hidden-size, ...) is train-plan's --config; the data-parallel size is\n"
      "# the world size over tp x cp ({} here: train-plan --devices {}).\n",
      stack, data_parallel, mesh.size());
  out += fmt::format(
      "--tensor-model-parallel-size {}\n--context-parallel-size {}\n"
      "--pipeline-model-parallel-size 1\n--seq-length {}\n--micro-batch-size {}\n"
      "--global-batch-size {}\n",
      degree("tp"), degree("cp"), o.seq, micro, o.batch);
  if (bf16) out += "--bf16\n";
  if (bf16 && o.grad_dtype == DType::kF32) out += "--accumulate-allreduce-grads-in-fp32\n";
  if (sequence_parallel) out += "--sequence-parallel\n";
  if (o.async_tp) out += "--tp-comm-overlap\n";
  if (deg.count("fsdp")) out += "--use-distributed-optimizer\n";
  if (dp == DpOverlap::kBuckets || dp == DpOverlap::kGradBuckets) {
    out += "--overlap-grad-reduce\n";
  }
  if (dp == DpOverlap::kBuckets && deg.count("fsdp")) out += "--overlap-param-gather\n";
  if (o.dp_bucket_size > 0) out += fmt::format("--ddp-bucket-size {}\n", o.dp_bucket_size);
  if (o.cp_kernel != ContextKernel::kRing) {
    out += fmt::format("--cp-comm-type {}\n",
                       o.cp_kernel == ContextKernel::kAllGatherKv ? "all_gather" : "a2a");
  }
  out += recompute;
  out += fmt::format("--optimizer {}\n", o.optimizer == OptimizerKind::kSgd ? "sgd" : "adam");
  if (o.optimizer == OptimizerKind::kAdam) {
    throw SpecError(
        fmt::format("[stack-config] --emit-config for {}: --optimizer adam (without "
                    "decoupled weight decay) is not Megatron's (its adam is AdamW)",
                    stack));
  }
  return out;
}

}  // namespace

const Dialect& megatron_dialect() {
  static const Dialect d{
      .format = "Megatron-LM arguments",
      .serves = [](std::string_view s) { return s == "megatron-core"; },
      .extensions = {".args", ".sh", ".txt"},
      .inferred_stack = "megatron-core",
      .parse = parse,
      .keys = keys,
      .version = [](std::string_view) { return 1u; },
      .defaults = defaults,
      .finish = finish,
      .emit = emit,
  };
  return d;
}

}  // namespace shardplan::train::stack_config
