#pragma once
// What the stack config dialects (torchtitan TOML, Megatron arguments, MaxText YAML) share: a
// file read as a flat list of keys, each looked up in its dialect's table of keys (planned as
// an option, ignored with the reason, or refused), and the writer's checks (stack_config.hpp).
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "shardplan/stack_config.hpp"

namespace shardplan::train::stack_config {

/// One key as read: "training.seq_len" (a TOML table's key after its table's name), its value as
/// typed by the format (YAML and Megatron values are text, converted when taken) and its line.
struct Entry {
  enum class Kind { kText, kBool, kInt, kNumber, kList, kOther, kFlag };
  std::string key;
  Kind kind = Kind::kText;
  std::string text;  // the value as written (a string without its quotes; "" for a flag)
  bool b = false;
  std::int64_t i = 0;
  double d = 0;
  std::vector<std::string> list;  // a list of strings
  int line = 0;                   // from 1; 0: a default of the stack, not in the file
};

class Reading;

/// Key::only for a key refused at any value (its `why` says why).
inline constexpr std::string_view kRefused = "(refused at any value)";

/// How one key is taken. A key in a table either sets options (`take`), or is ignored with
/// `why` (at any value, or only at `only`, another value refused with `why`), or is refused.
struct Key {
  std::string_view name;  // "training.seq_len"; "job.*": every key of table job
  void (*take)(const Entry&, Reading&) = nullptr;
  std::string_view why = {};   // not planned: why (listed with the key, or the refusal)
  std::string_view only = {};  // with why: the one value ignored, as text ("1", "false")
  unsigned versions = ~0u;     // the stack versions whose config has it (torchtitan's dates)
};

/// The keys of a file being read, their settings so far and the messages' source.
class Reading {
 public:
  Reading(std::string_view source, StackConfig& out) : source_(source), out_(out) {}
  StackConfig& out() { return out_; }
  std::string_view source() const { return source_; }

  /// Throws IoError "[stack-config] SOURCE:LINE: KEY = VALUE: why".
  [[noreturn]] void fail(const Entry& e, std::string_view why) const;
  std::int64_t integer(const Entry& e) const;
  double number(const Entry& e) const;
  bool boolean(const Entry& e) const;
  const std::string& text(const Entry& e) const;  // a string (not a list, not a table)
  std::vector<std::string> strings(const Entry& e) const;

  /// Records that `e` sets `option` to `value` ("" for a flag; option "" for train-plan's own
  /// default, nothing to set).
  void set(const Entry& e, std::string option, std::string value = {});
  /// A setting made of several keys ("activation_checkpoint.mode = selective,
  /// selective_ac_option = op"), recorded under `keys`.
  void set_from(std::string keys, std::string option, std::string value = {});
  void axis(const Entry& e, std::string name);  // a parallelism degree (-1: the rest)
  /// The key `name` as read or as the stack's default (a dialect's finish step combines keys).
  const Entry* held(std::string_view name) const;
  void hold(const Entry& e) { held_[e.key] = e; }
  /// "KEY = VALUE" (with " (default)" for a key the file leaves out).
  static std::string said(const Entry& e);

 private:
  std::string_view source_;
  StackConfig& out_;
  std::map<std::string, Entry, std::less<>> held_;
};

/// One format: the stacks it serves, how a file is split into keys, its keys, the defaults of
/// the keys it combines, and its writer.
struct Dialect {
  std::string_view format;                   // "torchtitan TOML"
  bool (*serves)(std::string_view stack);    // the stack names it reads
  std::vector<std::string_view> extensions;  // ".toml"; the first stack it serves for them
  std::string_view inferred_stack;           // the stack a file of that extension is read as
  std::vector<Entry> (*parse)(std::string_view text, std::string_view source);
  const std::vector<Key>& (*keys)();
  unsigned (*version)(std::string_view stack);  // the bit of Key::versions; 1 for one version
  /// The keys the file may leave out that the stack reads with a default, as entries (line 0).
  std::vector<Entry> (*defaults)(std::string_view stack);
  void (*finish)(Reading& r, std::string_view stack);  // settings made of several keys
  std::string (*emit)(std::string_view stack, const TrainPlanOptions& o, const Mesh& mesh,
                      std::int64_t data_parallel, bool sequence_parallel);
};

const Dialect& torchtitan_dialect();
const Dialect& megatron_dialect();
const Dialect& maxtext_dialect();

/// Entry helpers for defaults.
Entry text_entry(std::string key, std::string text);
Entry int_entry(std::string key, std::int64_t i);
Entry bool_entry(std::string key, bool b);

/// The dtype spelled as torch / JAX spell it ("bfloat16", "float32").
std::string_view long_dtype(DType d);
/// The train-plan dtype ("bf16") for "bfloat16"/"float32"; empty for another.
std::string short_dtype(std::string_view long_name);

/// The per-rank batch: o.batch over `ranks` ranks and o.grad_accum micro-batches; SpecError
/// naming the emitting stack when it does not divide.
std::int64_t per_rank_batch(std::string_view stack, const TrainPlanOptions& o, std::int64_t ranks,
                            std::string_view ranks_are);

/// The mesh's axes and sizes; SpecError naming an axis not in `known` (the axes the stack's
/// config has a degree for: dp replicated, fsdp sharded, tp, cp).
std::map<std::string, std::int64_t> mesh_degrees(std::string_view stack, const Mesh& mesh,
                                                 const std::vector<std::string_view>& known);

/// What a stack's config says besides the batch, mesh, dtypes and checkpointing (Says bits).
enum Says : unsigned {
  kSaysSequenceParallel = 1,  // Megatron's --sequence-parallel
  kSaysEager = 2,             // torchtitan's compile
  kSaysFloat8 = 4,            // torchtitan's float8 converter
  kSaysReshard = 8,           // torchtitan's fsdp_reshard_after_forward (2025)
  kSaysOptimizerSharding = 16,  // Megatron's --use-distributed-optimizer
  kSaysAsyncTp = 32,  // torchtitan's enable_async_tensor_parallel, Megatron's --tp-comm-overlap
  kSaysContextKernel = 64,      // Megatron's --cp-comm-type
  kSaysDpOverlap = 128,         // Megatron's --overlap-grad-reduce, --ddp-bucket-size, ...
};

/// The train-plan options a stack's config cannot say (those not in `says`, and the loss,
/// attention, tensor-parallel plan, FSDP wrapping, batch axes) must be as the stack sets them:
/// throws SpecError "[stack-config] --emit-config for STACK: --loss fused has no key ..."
/// otherwise.
void require_stack_defaults(std::string_view stack, const TrainPlanOptions& o, unsigned says);

}  // namespace shardplan::train::stack_config
