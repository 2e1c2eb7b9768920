#include "graph.hpp"

#include <fmt/format.h>

#include "primitive.hpp"
#include "primitives.hpp"

namespace shardplan::detail {

std::string to_string(const TensorType& t) {
  std::string s(name(t.dtype));
  s += t.shape.to_string();
  return s;
}

// Without fmt: compile() names values in origins and messages many times per node.
std::string value_name(ValueId v) {
  std::string s(1, '%');
  s += std::to_string(index(v));
  return s;
}

std::string Graph::to_string() const {
  std::string s = "{ lambda";
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].is(prim::input)) {
      s += fmt::format(" {}:{}", value_name(value_id(i)), detail::to_string(nodes[i].type));
    }
  }
  s += " .\n";
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (n.is(prim::input)) continue;
    std::string args;
    for (const ValueId o : n.operands) {
      args += ' ';  // (not " " + ...: GCC 12 warns falsely on that in Release, -Wrestrict)
      args += value_name(o);
    }
    s += fmt::format("  {}:{} = {}{}{}\n", value_name(value_id(i)), detail::to_string(n.type),
                     n.op->name, args, n.attrs.to_string());
  }
  std::string outs;
  for (const ValueId o : outputs) {
    outs += ' ';
    outs += value_name(o);
  }
  return s + fmt::format("  in ({} ) }}", outs);
}

namespace {

// A rank-0 value, a source without operands (a constant, a full), or a repetition of one.
bool scalar_like(const Graph& g, ValueId v) {
  for (int depth = 0; depth < 8; ++depth) {
    const Node& n = g[v];
    if (n.type.shape.rank() == 0 || (n.operands.empty() && !n.is(prim::input))) return true;
    if (n.op->repeat == nullptr || n.operands.size() != 1) return false;
    v = n.operands[0];
  }
  return false;
}

}  // namespace

std::optional<ValueId> argument_read(const Graph& g, ValueId v) {
  for (int depth = 0; depth < 16; ++depth) {
    const Node& n = g[v];
    if (n.is(prim::input)) return v;
    if (n.operands.size() == 1 &&
        (n.is(prim::convert) || n.op->barrier || n.op->sharding_identity)) {
      v = n.operands[0];
      continue;
    }
    if (!n.op->pointwise || n.operands.empty()) return std::nullopt;
    // One operand carries the argument; the others only scale or bound it.
    std::optional<ValueId> carried;
    for (const ValueId o : n.operands) {
      if (scalar_like(g, o)) continue;
      if (carried) return std::nullopt;
      carried = o;
    }
    if (!carried) return std::nullopt;
    v = *carried;
  }
  return std::nullopt;
}

}  // namespace shardplan::detail
