#include "shardplan/sjit.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "../../profiler/recorder.hpp"
#include "../compiler/compile.hpp"
#include "../ir/fields.hpp"
#include "../ir/array_access.hpp"
#include "../ir/primitives.hpp"
#include "../compiler/reshard_cost.hpp"
#include "../compiler/resolve_rules.hpp"
#include "../compiler/spmd_check.hpp"
#include "shardplan/collectives.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "trace.hpp"

namespace shardplan {
namespace detail {

struct Compiled {
  explicit Compiled(Program p) : program(std::move(p)) {}
  Program program;
  Tree<int> out_structure;      // leaf: output position
  std::vector<Array> captured;  // arrays the function used from outside, extra inputs
  std::string jaxpr;
};

void add_array_arg(CallArgs& call, int position, const Tree<Array>& tree) {
  call.positions.push_back(position);
  call.structures.push_back(tree.map([&](const Array& a) {
    call.leaves.push_back(ArgLeaf{TensorSpec{a.shape(), a.dtype()}, a});
    return static_cast<int>(call.leaves.size()) - 1;
  }));
}

void add_spec_arg(CallArgs& call, int position, const Tree<TensorSpec>& tree) {
  call.positions.push_back(position);
  call.structures.push_back(tree.map([&](const TensorSpec& t) {
    call.leaves.push_back(ArgLeaf{TensorSpec{t.shape, t.dtype}, Array()});
    return static_cast<int>(call.leaves.size()) - 1;
  }));
}

namespace {

// Per leaf of the call's array arguments, its name for messages and origins: "argument 2" for a
// plain Array argument, "argument 0 'params/w'" for a leaf of a tree or struct argument.
// O(leaves): computed once when compiling, or on an error path.
std::vector<std::string> leaf_names(const CallArgs& call) {
  std::vector<std::string> names(call.leaves.size());
  for (std::size_t k = 0; k < call.structures.size(); ++k) {
    const Tree<int>& st = call.structures[k];
    if (st.is_leaf()) {
      names[static_cast<std::size_t>(st.leaf())] = fmt::format("argument {}", call.positions[k]);
      continue;
    }
    st.for_each_leaf([&](const std::string& path, int i) {
      names[static_cast<std::size_t>(i)] = fmt::format("argument {} '{}'", call.positions[k], path);
    });
  }
  return names;
}

// The name of one leaf (an error path: O(leaves)).
std::string leaf_name(const CallArgs& call, std::size_t leaf) { return leaf_names(call)[leaf]; }

ArrayError donated_error(const CallArgs& call, std::size_t leaf) {
  return ArrayError(fmt::format(
      "[sjit] {} was donated to another sjit call (donate_argnums) and its buffers are gone; "
      "pass that call's result instead",
      leaf_name(call, leaf)));
}

Tree<TensorSpec> specs_of(const CallArgs& call) {
  std::vector<Tree<TensorSpec>> args;
  for (const auto& s : call.structures) {
    args.push_back(s.map([&](int i) {
      const auto& t = call.leaves[static_cast<std::size_t>(i)].type;
      return TensorSpec{t.shape, t.dtype};
    }));
  }
  return Tree<TensorSpec>::list(std::move(args));
}

// The leaf shardings one of the options' rule trees gives `tree` (nullopt where unspecified or
// when the option is not set). Errors keep their type, with "[sjit] {what}: " before them.
template <class T>
std::vector<MaybeSharding> resolve(const Mesh& mesh, const std::optional<RuleTree>& rules,
                                   const Tree<T>& tree, std::string_view what, Uneven uneven) {
  if (!rules) return std::vector<MaybeSharding>(tree.num_leaves());
  return resolve_rules(mesh, *rules, tree, fmt::format("[sjit] {}", what), uneven);
}

// A donated array may not also be passed undonated, or captured: the program would read freed
// buffers. `inputs`: the program's inputs, the call's leaves first.
void check_donated_alone(const CallArgs& call, const std::vector<char>& donated,
                         const std::vector<Array>& inputs) {
  for (std::size_t i = 0; i < donated.size(); ++i) {
    if (!donated[i]) continue;
    const void* id = ArrayAccess::identity(call.leaves[i].array);
    for (std::size_t j = 0; j < inputs.size(); ++j) {
      if (j == i || ArrayAccess::identity(inputs[j]) != id) continue;
      const std::string other = j < call.leaves.size()
                                    ? leaf_name(call, j)
                                    : std::string("an array the function captures from outside");
      throw ArrayError(fmt::format(
          "[sjit] {} is donated, but the same array is also {}{}; donate a copy, or do not "
          "donate it",
          leaf_name(call, i), j < call.leaves.size() ? "passed as " : "", other));
    }
  }
}

// Per argument leaf: whether `positions` (donate_argnums, batch_argnums) names its argument.
std::vector<char> leaves_at(const CallArgs& call, const std::vector<int>& positions) {
  std::vector<char> out(call.leaves.size(), 0);
  for (const int p : positions) {
    for (std::size_t k = 0; k < call.positions.size(); ++k) {
      if (call.positions[k] != p) continue;
      call.structures[k].for_each_leaf(
          [&](const std::string&, int i) { out[static_cast<std::size_t>(i)] = 1; });
    }
  }
  return out;
}

}  // namespace

// A cache key: the call's structure (argument positions and trees), each array leaf's shape,
// dtype, sharding (with its mesh's devices) and pending state, and the static values (compared
// by value, see static_equal). Equality decides; the hash only picks the bucket.
struct LeafKey {
  Shape shape;
  DType dtype = DType::kF32;
  std::optional<NamedSharding> sharding;  // nullopt: an abstract (TensorSpec) argument
  Pending pending;
  friend bool operator==(const LeafKey&, const LeafKey&) = default;
};
struct CacheKey {
  int num_args = 0;
  std::vector<int> positions;
  std::vector<Tree<int>> structures;
  std::vector<LeafKey> leaves;
  std::vector<StaticValue> statics;
  /// CompileSpec::devices_per_process of the executor called on: a program over processes plans
  /// what its collectives stage, one in a process does not.
  int devices_per_process = 0;
  friend bool operator==(const CacheKey&, const CacheKey&) = default;

  /// The arrays' part as text, for telling processes apart when their programs differ.
  std::string text() const {
    std::string key = std::to_string(num_args);
    auto out = std::back_inserter(key);
    for (std::size_t k = 0; k < structures.size(); ++k) {
      if (structures[k].is_leaf()) {  // a plain Array argument (no tree text prints as '@')
        fmt::format_to(out, "|arg{}:@", positions[k]);
        continue;
      }
      std::ostringstream os;
      os << structures[k];
      fmt::format_to(out, "|arg{}:{}", positions[k], os.str());
    }
    for (const LeafKey& l : leaves) {
      fmt::format_to(out, "|{}", to_string(TensorType{l.shape, l.dtype}));
      if (!l.sharding) {
        key += "~abstract";
        continue;
      }
      fmt::format_to(out, "{}{}", l.sharding->to_string(),
                     fmt::join(l.sharding->mesh().devices(), ","));
      if (!l.pending.empty()) {
        fmt::format_to(out, "~{}:{}", static_cast<int>(l.pending.op),
                       fmt::join(l.pending.axes, ","));
      }
    }
    return key;
  }
};
struct CacheKeyHash {
  std::size_t operator()(const CacheKey& k) const {
    std::size_t h = hash_combine(static_cast<std::size_t>(k.num_args), k.leaves.size());
    for (const int p : k.positions) h = hash_combine(h, static_cast<std::size_t>(p));
    for (const LeafKey& l : k.leaves) {
      for (const std::int64_t d : l.shape) h = hash_combine(h, static_cast<std::size_t>(d));
      h = hash_combine(h, static_cast<std::size_t>(l.dtype));
      h = hash_combine(h, l.sharding ? hash_of(l.sharding->spec()) : 1);
      h = hash_combine(h, l.pending.axes.size());
    }
    for (const StaticValue& v : k.statics) h = hash_combine(h, v.hash());
    return hash_combine(h, static_cast<std::size_t>(k.devices_per_process));
  }
};

CacheKey cache_key(const CallArgs& call) {
  CacheKey key{.num_args = call.num_args,
               .positions = call.positions,
               .structures = call.structures,
               .statics = call.statics};
  key.leaves.reserve(call.leaves.size());
  for (std::size_t i = 0; i < call.leaves.size(); ++i) {
    const ArgLeaf& l = call.leaves[i];
    LeafKey leaf{.shape = l.type.shape, .dtype = l.type.dtype};
    if (l.array.valid()) {
      if (ArrayAccess::is_donated(l.array)) throw donated_error(call, i);
      leaf.sharding = ArrayAccess::sharding(l.array);
      leaf.pending = l.array.pending();
    }
    key.leaves.push_back(std::move(leaf));
  }
  return key;
}

struct SjitCore::State {
  State(Mesh m, SjitOptions o) : mesh(std::move(m)), options(std::move(o)) {}
  Mesh mesh;
  SjitOptions options;
  mutable std::mutex mu;
  std::unordered_map<CacheKey, std::shared_ptr<const Compiled>, CacheKeyHash> cache;
};

SjitCore::SjitCore(Mesh mesh, SjitOptions options)
    : s_(std::make_unique<State>(std::move(mesh), std::move(options))) {
  // Built inside a MeshContext on the same mesh: its annotation shardings serve the names the
  // options do not give (taken now, so that the cached programs do not depend on the caller).
  if (const MeshContext* c = get_context(); c != nullptr && c->mesh() == s_->mesh) {
    for (const auto& [name, rule] : c->annotation_shardings()) {
      s_->options.annotation_shardings.emplace(name, rule);
    }
  }
  const SjitOptions& o = s_->options;
  if (o.links) {
    // A figure for an axis the mesh lacks would apply to nothing.
    for (const auto& [axis, link] : o.links->axes) {
      if (!s_->mesh.has_axis(axis)) {
        throw SpecError(fmt::format("[sjit] links: axis '{}' is not an axis of the mesh {}",
                                    printable(axis), s_->mesh.to_string()));
      }
    }
    check_links(*o.links, s_->mesh, "sjit");
  }
  for (std::size_t i = 0; i < o.batch_argnums.size(); ++i) {
    const int p = o.batch_argnums[i];
    if (p < 0 || std::count(o.batch_argnums.begin(), o.batch_argnums.end(), p) > 1 ||
        std::count(o.static_argnums.begin(), o.static_argnums.end(), p) > 0) {
      throw SpecError(fmt::format(
          "[sjit] batch_argnums: position {} is negative, listed twice or static; each names "
          "one array argument",
          p));
    }
  }
  for (std::size_t i = 0; i < o.donate_argnums.size(); ++i) {
    const int p = o.donate_argnums[i];
    if (p < 0) {
      throw SpecError(fmt::format("[sjit] donate_argnums: position {} is negative", p));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (o.donate_argnums[j] == p) {
        throw SpecError(fmt::format("[sjit] donate_argnums: position {} is listed twice", p));
      }
    }
    for (const int q : o.static_argnums) {
      if (q == p) {
        throw SpecError(fmt::format(
            "[sjit] donate_argnums: position {} is also in static_argnums; a static argument has "
            "no buffers to donate",
            p));
      }
    }
  }
}
SjitCore::~SjitCore() = default;

std::size_t SjitCore::cache_size() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->cache.size();
}

namespace {

/// With a mesh whose devices span processes, every process must run the same program (SPMD):
/// the same argument signature, statics and traced program, checked on every call
/// (check_same_program, spmd_check.hpp), which also carries the failure of a process that could
/// not trace or compile the call (`failed`, with `key` or `compiled` then null).
void check_same_sjit_program(const CacheKey* key, const Compiled* compiled,
                             std::exception_ptr failed) {
  std::string text;
  std::uint64_t statics = 0;
  if (!failed) {
    text = key->text() + "\n" + compiled->jaxpr;  // no addresses: the same on every process
    for (const StaticValue& v : key->statics) statics = hash_combine(statics, v.hash());
  }
  check_same_program("sjit", failed ? nullptr : &text, statics, "the static arguments", failed);
}

/// The executor the call's arrays live on (or the options'), or null for abstract arguments.
const Executor* executor_of(const CallArgs& call, const SjitOptions& o) {
  if (o.executor) return &*o.executor;
  for (const ArgLeaf& l : call.leaves) {
    if (l.array.valid()) return &l.array.executor();
  }
  return nullptr;
}

// static_argnums name no array argument; donate_argnums name array arguments of the call.
void check_argnums(const SjitOptions& o, const CallArgs& call) {
  for (const int p : o.static_argnums) {
    for (const int q : call.positions) {
      if (p == q) {
        throw SpecError(
            fmt::format("[sjit] argument {} is listed in static_argnums but is an "
                        "array argument",
                        p));
      }
    }
  }
  // donate_argnums and batch_argnums each name array arguments of this call (a position past
  // the arguments or a non-array one would apply to nothing).
  const auto check_arrays = [&](const std::vector<int>& positions, std::string_view option,
                                std::string_view why) {
    for (const int p : positions) {
      if (p >= call.num_args) {
        throw SpecError(fmt::format(
            "[sjit] {}: position {} is out of range: the function was called with {} "
            "argument{}",
            option, p, call.num_args, call.num_args == 1 ? "" : "s"));
      }
      if (std::find(call.positions.begin(), call.positions.end(), p) == call.positions.end()) {
        throw SpecError(
            fmt::format("[sjit] {}: argument {} is static (not an array), so {}", option, p, why));
      }
    }
  };
  check_arrays(o.donate_argnums, "donate_argnums", "it has no buffers to donate");
  check_arrays(o.batch_argnums, "batch_argnums", "it holds no batch of examples");
}

// Traces the call and compiles its program (not cached yet).
std::shared_ptr<const Compiled> trace_and_compile(const Mesh& mesh, const SjitOptions& o,
                                                  const CallArgs& call, const TraceFn& trace) {
  check_argnums(o, call);
  const Executor* exec = o.executor ? &*o.executor : nullptr;
  for (const ArgLeaf& l : call.leaves) {
    if (exec == nullptr && l.array.valid()) exec = &l.array.executor();
    if (l.array.valid() && !(l.array.mesh() == mesh)) {
      throw ArrayError(fmt::format(
          "[sjit] an argument is on {} with devices {}, but this sjit runs on {} with devices {}",
          l.array.mesh().to_string(), fmt::join(l.array.mesh().devices(), ","), mesh.to_string(),
          fmt::join(mesh.devices(), ",")));
    }
  }
  TraceContext ctx(exec ? std::optional<Executor>(*exec) : std::nullopt, mesh);
  ctx.annotation_rules = &o.annotation_shardings;
  ctx.allow_unknown_annotations = o.allow_unknown_annotations;
  ctx.uneven = o.uneven;
  const Tree<TensorSpec> arg_specs = specs_of(call);
  const auto in_sh = resolve(mesh, o.in_shardings, arg_specs, "in_shardings", o.uneven);
  const auto constraint_sh =
      resolve(mesh, o.args_sharding_constraint, arg_specs, "args_sharding_constraint", o.uneven);
  Tree<Array> out;
  {
    TraceScope scope(&ctx);
    // Scopes relative to the function; each call's scope is joined at run (program_profile.cpp).
    const profiler::detail::ScopeOverride relative(nullptr);
    std::vector<Array> leaf_tracers;
    for (std::size_t i = 0; i < call.leaves.size(); ++i) {
      Array t = ctx.add_argument(TensorType{call.leaves[i].type.shape, call.leaves[i].type.dtype});
      if (constraint_sh[i]) t = constrain_to(t, *constraint_sh[i]);
      leaf_tracers.push_back(std::move(t));
    }
    std::vector<Tree<Array>> tracers;
    for (const auto& s : call.structures) {
      tracers.push_back(s.map([&](int i) { return leaf_tracers[static_cast<std::size_t>(i)]; }));
    }
    out = trace(tracers);
  }
  const Graph g = ctx.finish(out.leaves());
  int next_output = 0;
  Tree<int> out_structure = out.map([&](const Array&) { return next_output++; });
  CompileSpec spec{.mesh = mesh,
                   .cache_constants = o.kept_constant_bytes > 0,
                   .kept_constant_bytes = o.kept_constant_bytes,
                   .count_constants = o.count_constants,
                   .fuse = o.fuse, .eager = o.eager,
                   .devices_per_process = devices_per_process(exec, mesh),
                   .links = o.links};
  const std::vector<char> donated = leaves_at(call, o.donate_argnums);
  const std::vector<char> batch = leaves_at(call, o.batch_argnums);
  const std::vector<std::string> names = leaf_names(call);
  for (std::size_t i = 0; i < call.leaves.size(); ++i) {
    const ArgLeaf& l = call.leaves[i];
    InputSpec in;
    if (in_sh[i]) {
      in.spec = in_sh[i]->spec();
      in.padded = in_sh[i]->uneven() == Uneven::kPad;
      in.origin = fmt::format("in_shardings ({})", names[i]);
    } else if (l.array.valid()) {
      in.spec = l.array.sharding().spec();
      in.padded = l.array.sharding().uneven() == Uneven::kPad;
      in.pending = l.array.pending();
      in.origin = fmt::format("{} as passed", names[i]);
    }
    in.donated = donated[i] != 0;
    in.batch = batch[i] != 0;
    in.name = names[i];
    spec.inputs.push_back(std::move(in));
  }
  for (std::size_t k = 0; k < ctx.captured.size(); ++k) {
    const Array& a = ctx.captured[k];
    spec.inputs.push_back(InputSpec{.spec = a.sharding().spec(),
                                    .pending = a.pending(),
                                    .origin = fmt::format("array captured from outside ({})", k),
                                    .name = fmt::format("array captured from outside ({})", k),
                                    .padded = a.sharding().uneven() == Uneven::kPad});
  }
  spec.pad_outputs = o.uneven == Uneven::kPad;
  for (const MaybeSharding& s : resolve(mesh, o.out_shardings, out, "out_shardings", o.uneven)) {
    spec.outputs.push_back(s ? std::optional<PartitionSpec>(s->spec()) : std::nullopt);
  }
  auto compiled = std::make_shared<Compiled>(compile(g, spec));
  compiled->out_structure = std::move(out_structure);
  compiled->captured = ctx.captured;
  compiled->jaxpr = g.to_string();
  return compiled;
}

// With the profiler on: when this thread's sjit call began (get), for its dispatch event.
thread_local std::int64_t t_call_began = 0;

// The host's part of an sjit call, from get() to its program's first step.
void profile_dispatch() {
  if (!profiler::detail::on()) return;
  namespace pd = profiler::detail;
  const std::int64_t now = pd::stamp();
  pd::record(pd::Event{.cat = pd::Category::kDispatch,
                       .device = pd::kHostTid,
                       .start_ns = t_call_began > 0 ? t_call_began : now,
                       .end_ns = now,
                       .name = "sjit",
                       .scope = pd::current_scope()});
  t_call_began = 0;
}

}  // namespace

std::shared_ptr<const Compiled> SjitCore::get(const CallArgs& call, const TraceFn& trace) {
  if (profiler::detail::on()) t_call_began = profiler::detail::stamp();
  auto cached = [&](const CacheKey& key) -> std::shared_ptr<const Compiled> {
    std::lock_guard<std::mutex> lock(s_->mu);
    const auto it = s_->cache.find(key);
    return it == s_->cache.end() ? nullptr : it->second;
  };
  auto keep = [&](CacheKey key, std::shared_ptr<const Compiled> compiled) {
    std::lock_guard<std::mutex> lock(s_->mu);
    return s_->cache.emplace(std::move(key), std::move(compiled)).first->second;
  };
  auto compile_call = [&] { return trace_and_compile(s_->mesh, s_->options, call, trace); };
  const Executor* on = executor_of(call, s_->options);
  if (on == nullptr || on->holds_all(s_->mesh.devices())) {
    CacheKey key = cache_key(call);
    key.devices_per_process = devices_per_process(on, s_->mesh);
    if (auto hit = cached(key)) return hit;
    return keep(std::move(key), compile_call());
  }
  // Over processes anything up to the program's hash (a tracing error, a shape one process
  // computes differently, an out-of-memory) may fail on some processes only: it is caught and
  // sent with the hash (check_same_sjit_program), so that every process throws naming it.
  std::optional<CacheKey> key;
  std::shared_ptr<const Compiled> compiled;
  std::exception_ptr failed;
  bool hit = false;
  try {
    key = cache_key(call);
    key->devices_per_process = devices_per_process(on, s_->mesh);
    compiled = cached(*key);
    hit = compiled != nullptr;
    if (!hit) compiled = compile_call();
  } catch (...) {
    failed = std::current_exception();
  }
  check_same_sjit_program(failed ? nullptr : &*key, compiled.get(), failed);
  return hit ? compiled : keep(std::move(*key), std::move(compiled));
}

bool tracing() { return current_trace() != nullptr; }

Tree<Array> SjitCore::trace_inline(const CallArgs& call, const TraceFn& trace) {
  TraceContext& ctx = *current_trace();
  const Mesh& mesh = s_->mesh;
  const SjitOptions& o = s_->options;
  if (!(ctx.mesh == mesh)) {
    throw ArrayError(fmt::format(
        "[sjit] a nested sjit runs on {} with devices {}, but the enclosing trace runs on {} with "
        "devices {}",
        mesh.to_string(), fmt::join(mesh.devices(), ","), ctx.mesh.to_string(),
        fmt::join(ctx.mesh.devices(), ",")));
  }
  for (std::size_t i = 0; i < call.leaves.size(); ++i) {
    if (!call.leaves[i].array.valid()) {
      throw ArrayError(
          fmt::format("[sjit] {} of a nested sjit is a TensorSpec: inside a trace, pass arrays",
                      leaf_name(call, i)));
    }
  }
  for (const int p : o.static_argnums) {
    if (std::find(call.positions.begin(), call.positions.end(), p) != call.positions.end()) {
      throw SpecError(fmt::format(
          "[sjit] argument {} is listed in static_argnums but is an array argument", p));
    }
  }
  const Tree<TensorSpec> arg_specs = specs_of(call);
  const auto in_sh = resolve(mesh, o.in_shardings, arg_specs, "in_shardings", o.uneven);
  const auto constraint_sh =
      resolve(mesh, o.args_sharding_constraint, arg_specs, "args_sharding_constraint", o.uneven);
  auto constrain = [](const Array& x, const NamedSharding& sharding, std::string origin) {
    return constrain_to(x, sharding, std::move(origin));
  };
  const std::vector<std::string> names = leaf_names(call);
  std::vector<Array> leaf_args;
  for (std::size_t i = 0; i < call.leaves.size(); ++i) {
    Array t = call.leaves[i].array;
    if (in_sh[i]) {
      t = constrain(t, *in_sh[i], fmt::format("nested sjit in_shardings ({})", names[i]));
    }
    if (constraint_sh[i]) {
      t = constrain(t, *constraint_sh[i],
                    fmt::format("nested sjit args_sharding_constraint ({})", names[i]));
    }
    leaf_args.push_back(std::move(t));
  }
  std::vector<Tree<Array>> args;
  for (const auto& st : call.structures) {
    args.push_back(st.map([&](int i) { return leaf_args[static_cast<std::size_t>(i)]; }));
  }
  // This sjit's annotation shardings apply inside its body (over the enclosing ones), then the
  // enclosing trace's are restored.
  std::map<std::string, RuleTree> merged;
  if (ctx.annotation_rules != nullptr) merged = *ctx.annotation_rules;
  for (const auto& [k, v] : o.annotation_shardings) merged.insert_or_assign(k, v);
  struct Restore {
    TraceContext& ctx;
    const std::map<std::string, RuleTree>* rules;
    bool allow;
    ~Restore() {
      ctx.annotation_rules = rules;
      ctx.allow_unknown_annotations = allow;
    }
  } restore{ctx, ctx.annotation_rules, ctx.allow_unknown_annotations};
  ctx.annotation_rules = &merged;
  ctx.allow_unknown_annotations = ctx.allow_unknown_annotations || o.allow_unknown_annotations;
  Tree<Array> out = trace(args);
  if (!o.out_shardings) return out;
  const auto out_sh = resolve(mesh, o.out_shardings, out, "out_shardings", o.uneven);
  std::size_t k = 0;
  return out.map([&](const Array& x) {
    const MaybeSharding& sh = out_sh[k];
    const std::size_t leaf = k++;
    return sh ? constrain(x, *sh,
                          fmt::format("nested sjit out_shardings (output leaf {})", leaf))
              : x;
  });
}

Tree<Array> SjitCore::run(const Compiled& compiled, const CallArgs& call) {
  std::vector<Array> inputs;
  inputs.reserve(call.leaves.size() + compiled.captured.size());
  const Executor* exec = s_->options.executor ? &*s_->options.executor : nullptr;
  const Array* first = nullptr;  // the array the executor was taken from
  for (const ArgLeaf& l : call.leaves) {
    if (!l.array.valid()) {
      throw ArrayError(
          "[sjit] an argument is a TensorSpec: call with arrays, or use lower() to "
          "compile without running");
    }
    if (first == nullptr) first = &l.array;
    if (exec == nullptr) exec = &l.array.executor();
    inputs.push_back(l.array);
  }
  if (exec == nullptr) {
    throw ArrayError(
        "[sjit] no array argument says which executor to run on: set "
        "SjitOptions::executor");
  }
  // Every array, arguments and captured ones alike, must live on the executor the call runs on,
  // as for eager ops.
  const bool exec_from_options = s_->options.executor.has_value();
  for (std::size_t i = 0; i < call.leaves.size(); ++i) {
    const Array& a = call.leaves[i].array;
    if (a.executor() == *exec) continue;
    throw ArrayError(
        exec_from_options
            ? fmt::format("[sjit] {} lives on another executor than SjitOptions::executor: {}",
                          leaf_name(call, i), a.to_string())
            : fmt::format("[sjit] the arrays live on different executors: {} {} and {} {}",
                          leaf_name(call, 0), first->to_string(), leaf_name(call, i),
                          a.to_string()));
  }
  for (std::size_t k = 0; k < compiled.captured.size(); ++k) {
    const Array& c = compiled.captured[k];
    if (!(c.executor() == *exec)) {
      throw ArrayError(fmt::format(
          "[sjit] the arrays live on different executors: {} captured by the function (from "
          "outside it) and the call's {}",
          c.to_string(),
          first != nullptr ? fmt::format("{} {}", leaf_name(call, 0), first->to_string())
                           : std::string("SjitOptions::executor")));
    }
  }
  inputs.insert(inputs.end(), compiled.captured.begin(), compiled.captured.end());
  if (s_->options.donate_argnums.empty()) {
    profile_dispatch();
    const std::vector<Array> outs = compiled.program.run(*exec, inputs);
    return compiled.out_structure.map([&](int i) { return outs[static_cast<std::size_t>(i)]; });
  }
  // Donated arguments give their buffers to the program, which frees them after their last use
  // (the executor's block cache hands them to outputs of the same size). A donated array may not
  // also be passed undonated, or captured: the program would read freed buffers.
  const std::vector<char> donated = leaves_at(call, s_->options.donate_argnums);
  check_donated_alone(call, donated, inputs);
  std::vector<std::size_t> taken;
  auto give_back = [&] {
    for (const std::size_t i : taken) {
      if (inputs[i].valid()) ArrayAccess::give_back(call.leaves[i].array, inputs[i]);
    }
  };
  for (std::size_t i = 0; i < donated.size(); ++i) {
    if (!donated[i]) continue;
    Array t = ArrayAccess::take(call.leaves[i].array);
    if (!t.valid()) {
      give_back();
      throw donated_error(call, i);
    }
    inputs[i] = std::move(t);
    taken.push_back(i);
  }
  std::vector<Array> outs;
  profile_dispatch();
  try {
    outs = compiled.program.run(*exec, inputs);
  } catch (...) {
    // The program put back the donated inputs it had not freed yet: their arrays stay usable.
    give_back();
    throw;
  }
  inputs.clear();
  return compiled.out_structure.map([&](int i) { return outs[static_cast<std::size_t>(i)]; });
}

}  // namespace detail

std::string Lowered::text() const { return c_->program.text(); }
std::string Lowered::jaxpr() const { return c_->jaxpr; }
const ProgramCost& Lowered::cost() const { return c_->program.cost(); }

const detail::Program& detail::program_of(const Lowered& lowered) { return lowered.c_->program; }
std::vector<NamedSharding> Lowered::input_shardings() const {
  return c_->program.input_shardings();
}
std::vector<LoweredOp> Lowered::ops() const {
  const detail::Program& program = c_->program;
  const detail::Graph& g = program.graph();
  std::vector<LoweredOp> out;
  out.reserve(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    const detail::Node& n = g.nodes[i];
    LoweredOp op{std::string(n.op->name), TensorSpec{n.type.shape, n.type.dtype},
                 program.layout(detail::value_id(i)).spec, "", n.scope ? *n.scope : "",
                 n.composite != nullptr ? n.composite : ""};
    if (n.is(detail::prim::sharding_annotation)) {
      op.annotation = n.attr<detail::AnnotationAttrs>().name;
    }
    out.push_back(std::move(op));
  }
  return out;
}
std::vector<NamedSharding> Lowered::output_shardings() const {
  return c_->program.output_shardings();
}
Tree<TensorSpec> Lowered::output_specs() const {
  const detail::Graph& g = c_->program.graph();
  return c_->out_structure.map([&](int i) {
    const detail::TensorType& t = g[g.outputs[static_cast<std::size_t>(i)]].type;
    return TensorSpec{t.shape, t.dtype};
  });
}

}  // namespace shardplan
