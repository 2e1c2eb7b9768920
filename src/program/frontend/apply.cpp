// apply(): the one way an op becomes a node. Inside a trace the node is recorded; outside, a
// one-op program is compiled (once per key, cached by the executor) and run at once.
#include <fmt/format.h>

#include <exception>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>

#include "../compiler/compile.hpp"
#include "../ir/array_access.hpp"
#include "../ir/primitives.hpp"
#include "../compiler/spmd_check.hpp"
#include "trace.hpp"

namespace shardplan::detail {
namespace {

// What a one-op program depends on: the primitive, its attributes (compared field by field,
// floats bitwise, host tensors by value), and each operand's type, sharding and pending state on
// one mesh. Equality decides; the hash only picks the bucket.
struct EagerKey {
  const Primitive* op = nullptr;
  Attrs attrs;
  std::vector<TensorType> types;
  std::vector<PartitionSpec> specs;
  std::vector<Pending> pending;
  Mesh mesh;
  friend bool operator==(const EagerKey&, const EagerKey&) = default;
};

struct EagerKeyHash {
  std::size_t operator()(const EagerKey& k) const {
    std::size_t h = hash_combine(std::hash<const void*>()(k.op), k.attrs.hash());
    for (std::size_t i = 0; i < k.types.size(); ++i) {
      h = hash_combine(h, hash_of(k.types[i].shape));
      h = hash_combine(h, static_cast<std::size_t>(k.types[i].dtype));
      h = hash_combine(h, hash_of(k.specs[i]));
      h = hash_combine(h, hash_of(k.pending[i].axes));
    }
    return hash_combine(h, hash_of(k.mesh.devices()));
  }
};

// The one-op programs an executor has run. They hold no arrays (compiled without cached
// constants), so they keep no device memory and no reference to the executor. Full
// (kEagerProgramsKept), the least recently used is dropped: one program freed per program made,
// its memory reused by the next (clearing all at once freed 4,096 programs in one call: a third
// of BM_EagerAddFirstCall's time, in the allocator on memory long out of the caches).
struct EagerCache {
  struct Entry {
    std::shared_ptr<const Program> program;
    std::list<const EagerKey*>::iterator used;  // its place in `order`
  };
  std::mutex mu;
  std::unordered_map<EagerKey, Entry, EagerKeyHash> programs;
  std::list<const EagerKey*> order;  // the keys of `programs`, least recently used first

  // The program of `key` (null when none), now the most recently used.
  std::shared_ptr<const Program> find(const EagerKey& key) {
    const auto it = programs.find(key);
    if (it == programs.end()) return nullptr;
    order.splice(order.end(), order, it->second.used);
    return it->second.program;
  }
  // Adds `prog` for `key` (a program made while the lock was not held may already be there);
  // returns the program dropped to make room, for the caller to free outside the lock.
  std::shared_ptr<const Program> add(EagerKey key, std::shared_ptr<const Program> prog) {
    std::shared_ptr<const Program> dropped;
    if (programs.count(key) != 0) return dropped;
    if (programs.size() >= kEagerProgramsKept) {
      const auto oldest = programs.find(*order.front());
      dropped = std::move(oldest->second.program);
      order.pop_front();
      programs.erase(oldest);
    }
    const auto it = programs.emplace(std::move(key), Entry{std::move(prog), {}}).first;
    it->second.used = order.insert(order.end(), &it->first);
    return dropped;
  }
};
constexpr char kEagerCacheTag = 0;  // its address names the executor's attachment

EagerCache& eager_cache(const Executor& executor) {
  const std::shared_ptr<void> p = executor.attachment(&kEagerCacheTag, [] {
    return std::static_pointer_cast<void>(std::make_shared<EagerCache>());
  });
  return *static_cast<EagerCache*>(p.get());  // the executor keeps it alive
}

// The one-op program of `n` on `ins` (compiled once per key, cached by the executor); in `text`,
// when given, the call as every process must make it (its operands and the op, no addresses).
std::shared_ptr<const Program> eager_program(Node n, const std::vector<Array>& ins,
                                             const Array& placement, std::string* text) {
  for (std::size_t k = 1; k < ins.size(); ++k) check_same_placement(ins[0], ins[k], n.op->name);
  EagerKey key{n.op, n.attrs, {}, {}, {}, placement.mesh()};
  Graph g;
  CompileSpec spec{.mesh = placement.mesh(),
                   .outputs = {std::nullopt},
                   .cache_constants = false,
                   .devices_per_process = devices_per_process(&placement.executor(), placement.mesh())};
  // Sized once: a first call builds all of this, a cached one the key and the graph.
  g.nodes.reserve(ins.size() + 1);
  n.operands.reserve(ins.size());
  spec.inputs.reserve(ins.size());
  key.types.reserve(ins.size());
  key.specs.reserve(ins.size());
  key.pending.reserve(ins.size());
  for (std::size_t k = 0; k < ins.size(); ++k) {
    const TensorType type{ins[k].shape(), ins[k].dtype()};
    n.operands.push_back(g.add(
        Node{.op = &prim::input, .type = type, .attrs = InputAttrs{static_cast<int>(k), type}}));
    spec.inputs.push_back(InputSpec{.spec = ins[k].sharding().spec(),
                                    .pending = ins[k].pending(),
                                    .origin = "operand " + std::to_string(k),
                                    .padded = ins[k].sharding().uneven() == Uneven::kPad});
    key.types.push_back(type);
    key.specs.push_back(ins[k].sharding().spec());
    key.pending.push_back(ins[k].pending());
    if (text != nullptr) {
      *text += fmt::format("{} pending over [{}]\n", ins[k].sharding().spec().to_string(),
                           fmt::join(ins[k].pending().axes, ","));
    }
  }
  g.num_inputs = static_cast<int>(ins.size());
  g.outputs = {g.add(std::move(n))};
  if (text != nullptr) *text += g.to_string();
  EagerCache& cache = eager_cache(placement.executor());
  std::shared_ptr<const Program> prog;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    prog = cache.find(key);
  }
  if (!prog) {
    prog = std::make_shared<const Program>(compile(g, spec));
    std::shared_ptr<const Program> dropped;  // freed after the lock is released
    std::lock_guard<std::mutex> lock(cache.mu);
    dropped = cache.add(std::move(key), prog);
  }
  return prog;
}

// An op run eagerly. Over processes (its mesh spans them), as an sjit call: every process checks
// that all are about to run the same one-op program, and a failure to check or compile it on
// some processes (an operand its shape rule refuses on one of them) is named on every process
// before the program's first collective (check_same_program), instead of the others waiting
// there. One all-gather per op over processes; nothing in one process.
Array run_eager(const Primitive& op, Attrs attrs, const std::vector<Array>& ins,
                const Array& placement) {
  const auto node = [&] {
    return Node{.op = &op, .type = infer_type(op, attrs, ins), .attrs = std::move(attrs)};
  };
  if (placement.executor().holds_all(placement.mesh().devices())) {
    return eager_program(node(), ins, placement, nullptr)->run(placement.executor(), ins)[0];
  }
  std::shared_ptr<const Program> prog;
  std::string text;
  std::exception_ptr failed;
  try {
    prog = eager_program(node(), ins, placement, &text);
  } catch (...) {
    failed = std::current_exception();
  }
  check_same_program(fmt::format("eager {}", op.name), failed ? nullptr : &text, 0, "", failed);
  return prog->run(placement.executor(), ins)[0];
}

}  // namespace

TensorType infer_type(const Primitive& op, const Attrs& attrs, const std::vector<Array>& operands) {
  const auto count = static_cast<int>(operands.size());
  if (op.arity == kVariadic ? count == 0 : count != op.arity) {
    throw SpecError(
        fmt::format("[{}] takes {} operand{}, got {}", op.name,
                    op.arity == kVariadic ? std::string("one or more") : std::to_string(op.arity),
                    op.arity == 1 ? "" : "s", count));
  }
  std::vector<TensorType> types;
  types.reserve(operands.size());
  for (const Array& a : operands) types.push_back(TensorType{a.shape(), a.dtype()});
  const Node probe{.op = &op, .attrs = attrs};
  return op.infer(probe, types);
}

Array apply(const Primitive& op, Attrs attrs, const std::vector<Array>& operands,
            const Array* placement) {
  TraceContext* ctx = current_trace();
  bool traced = ctx != nullptr;
  for (const Array& a : operands) traced = traced || a.is_tracer();
  if (!traced) {
    if (placement == nullptr && operands.empty()) (void)infer_type(op, attrs, operands);
    return run_eager(op, std::move(attrs), operands,
                     placement != nullptr ? *placement : operands.at(0));
  }
  TensorType type = infer_type(op, attrs, operands);
  Node n{.op = &op, .type = std::move(type), .attrs = std::move(attrs)};
  if (ctx == nullptr) {
    throw ArrayError(fmt::format("[{}] {} is a tracer used outside the sjit that made it",
                                 op.name, type_str(operands[0])));
  }
  // Inside shard_map: the axes the result varies over, its operands made to vary alike.
  std::vector<Array> ins = operands;
  bool pass = false;
  const std::int64_t vary = vary_operands(*ctx, op, n, ins, pass);
  if (pass) return ins[0];
  for (const Array& a : ins) n.operands.push_back(ctx->node_of(a));
  return ctx->record(std::move(n), vary);
}

std::vector<Array> keep_for_backward(const Primitive& op, const Attrs& attrs,
                                     const std::vector<Array>& operands, const Array& result) {
  const Node n{.op = &op, .type = TensorType{result.shape(), result.dtype()}, .attrs = attrs};
  std::vector<Array> kept = op.kept->keep(n, operands, result);
  TraceContext* ctx = current_trace();
  if (ctx != nullptr && result.is_tracer() && ArrayAccess::trace(result) == ctx) {
    std::vector<ValueId>& ids = ctx->kept[ctx->node_of(result)];
    ids.clear();
    for (const Array& k : kept) ids.push_back(ctx->node_of(k));
  }
  return kept;
}

}  // namespace shardplan::detail
