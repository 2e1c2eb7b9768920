#include "shardplan/graph.hpp"

#include <fmt/format.h>

namespace shardplan {

std::string_view name(Op op) {
  switch (op) {
    case Op::kNeg:
      return "neg";
    case Op::kExp:
      return "exp";
    case Op::kLog:
      return "log";
    case Op::kSqrt:
      return "sqrt";
    case Op::kRsqrt:
      return "rsqrt";
    case Op::kSin:
      return "sin";
    case Op::kCos:
      return "cos";
    case Op::kTanh:
      return "tanh";
    case Op::kRelu:
      return "relu";
    case Op::kGelu:
      return "gelu";
    case Op::kSigmoid:
      return "sigmoid";
    case Op::kAbs:
      return "abs";
    case Op::kAdd:
      return "add";
    case Op::kSub:
      return "sub";
    case Op::kMul:
      return "mul";
    case Op::kDiv:
      return "div";
    case Op::kMax:
      return "max";
    case Op::kMin:
      return "min";
    case Op::kPow:
      return "pow";
    case Op::kEq:
      return "eq";
    case Op::kNe:
      return "ne";
    case Op::kLt:
      return "lt";
    case Op::kLe:
      return "le";
    case Op::kGt:
      return "gt";
    case Op::kGe:
      return "ge";
    case Op::kSelect:
      return "select";
    case Op::kConvert:
      return "convert";
    case Op::kDot:
      return "dot_general";
    case Op::kReduceSum:
      return "reduce_sum";
    case Op::kReduceMax:
      return "reduce_max";
    case Op::kReduceMin:
      return "reduce_min";
    case Op::kReshape:
      return "reshape";
    case Op::kTranspose:
      return "transpose";
    case Op::kBroadcast:
      return "broadcast_in_dim";
    case Op::kSlice:
      return "slice";
    case Op::kConcat:
      return "concatenate";
    case Op::kTake:
      return "take";
    case Op::kIota:
      return "iota";
    case Op::kConstant:
      return "constant";
    case Op::kRandom:
      return "random";
    case Op::kConstraint:
      return "sharding_constraint";
    case Op::kAnnotation:
      return "sharding_annotation";
    case Op::kInput:
      return "input";
  }
  return "?";
}

bool is_elementwise(Op op) { return op <= Op::kGe; }

bool is_comparison(Op op) { return op >= Op::kEq && op <= Op::kGe; }

std::string to_string(const TensorType& t) {
  return fmt::format("{}{}", name(t.dtype), t.shape.to_string());
}

std::string Graph::to_string() const {
  std::string s = "{ lambda";
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].op == Op::kInput)
      s += fmt::format(" %{}:{}", i, shardplan::to_string(nodes[i].type));
  }
  s += " .\n";
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (n.op == Op::kInput) continue;
    std::string args;
    for (const int o : n.operands) args += fmt::format(" %{}", o);
    std::string attrs;
    if (!n.axes.empty()) attrs += fmt::format(" axes=[{}]", fmt::join(n.axes, ","));
    if (!n.starts.empty()) {
      attrs += fmt::format(" starts=[{}] limits=[{}]", fmt::join(n.starts, ","),
                           fmt::join(n.limits, ","));
    }
    if (n.op == Op::kConcat || n.op == Op::kTake || n.op == Op::kIota)
      attrs += fmt::format(" axis={}", n.axis);
    if (n.op == Op::kDot) {
      attrs += fmt::format(" batch=[{}]x[{}] contract=[{}]x[{}]", fmt::join(n.dot.lhs_batch, ","),
                           fmt::join(n.dot.rhs_batch, ","), fmt::join(n.dot.lhs_contract, ","),
                           fmt::join(n.dot.rhs_contract, ","));
    }
    if (n.spec) attrs += " spec=" + n.spec->to_string();
    if (n.like >= 0) attrs += fmt::format(" like=%{}", n.like);
    if (n.op == Op::kAnnotation) attrs += fmt::format(" name='{}'", n.name);
    s += fmt::format("  %{}:{} = {}{}{}\n", i, shardplan::to_string(n.type), name(n.op), args,
                     attrs);
  }
  std::string outs;
  for (const int o : outputs) outs += fmt::format(" %{}", o);
  return s + fmt::format("  in ({} ) }}", outs);
}

}  // namespace shardplan
