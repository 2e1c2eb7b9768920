#include "graph.hpp"

#include <fmt/format.h>

#include "primitive.hpp"
#include "primitives.hpp"

namespace shardplan::detail {

std::string to_string(const TensorType& t) {
  return fmt::format("{}{}", name(t.dtype), t.shape.to_string());
}

std::string value_name(ValueId v) { return fmt::format("%{}", index(v)); }

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

}  // namespace shardplan::detail
