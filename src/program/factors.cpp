#include "factors.hpp"

#include <algorithm>

namespace shardplan::detail {
namespace {

const Shape& shape_of(const Graph& g, int id) {
  return g.nodes[static_cast<std::size_t>(id)].type.shape;
}

// One pass factor per dimension, shared by every operand (of the same shape) and the result.
OpFactors same_dims(const Graph& g, const Node& n) {
  OpFactors f;
  const Shape& s = n.type.shape;
  for (int d = 0; d < s.rank(); ++d) f.result.push_back(f.add(s[d], FactorKind::kPass));
  for (const int o : n.operands) {
    std::vector<int> dims(static_cast<std::size_t>(shape_of(g, o).rank()));
    for (int d = 0; d < static_cast<int>(dims.size()); ++d) dims[static_cast<std::size_t>(d)] = d;
    f.operands.push_back(std::move(dims));
  }
  return f;
}

OpFactors dot_factors(const Graph& g, const Node& n) {
  OpFactors f;
  const Shape& l = shape_of(g, n.operands[0]);
  const Shape& r = shape_of(g, n.operands[1]);
  std::vector<int> lf(static_cast<std::size_t>(l.rank()), -1),
      rf(static_cast<std::size_t>(r.rank()), -1);
  for (std::size_t i = 0; i < n.dot.lhs_batch.size(); ++i) {
    const int id = f.add(l[n.dot.lhs_batch[i]], FactorKind::kPass);
    lf[static_cast<std::size_t>(n.dot.lhs_batch[i])] = id;
    rf[static_cast<std::size_t>(n.dot.rhs_batch[i])] = id;
    f.result.push_back(id);
  }
  for (std::size_t i = 0; i < n.dot.lhs_contract.size(); ++i) {
    const int id = f.add(l[n.dot.lhs_contract[i]], FactorKind::kReduce);
    lf[static_cast<std::size_t>(n.dot.lhs_contract[i])] = id;
    rf[static_cast<std::size_t>(n.dot.rhs_contract[i])] = id;
  }
  for (int d = 0; d < l.rank(); ++d) {
    if (lf[static_cast<std::size_t>(d)] < 0) {
      lf[static_cast<std::size_t>(d)] = f.add(l[d], FactorKind::kPass);
      f.result.push_back(lf[static_cast<std::size_t>(d)]);
    }
  }
  for (int d = 0; d < r.rank(); ++d) {
    if (rf[static_cast<std::size_t>(d)] < 0) {
      rf[static_cast<std::size_t>(d)] = f.add(r[d], FactorKind::kPass);
      f.result.push_back(rf[static_cast<std::size_t>(d)]);
    }
  }
  f.operands = {lf, rf};
  return f;
}

OpFactors reduce_factors(const Graph& g, const Node& n) {
  OpFactors f;
  const Shape& in = shape_of(g, n.operands[0]);
  std::vector<int> dims(static_cast<std::size_t>(in.rank()));
  for (int d = 0; d < in.rank(); ++d) {
    const bool reduced = std::find(n.axes.begin(), n.axes.end(), d) != n.axes.end();
    dims[static_cast<std::size_t>(d)] =
        f.add(in[d], reduced ? FactorKind::kReduce : FactorKind::kPass);
    if (!reduced) f.result.push_back(dims[static_cast<std::size_t>(d)]);
  }
  f.operands = {dims};
  return f;
}

// Dimensions equal from the front and from the back are shared; in between, a dimension split
// into several (or several merged into one) shares its major part; the rest must be whole.
OpFactors reshape_factors(const Graph& g, const Node& n) {
  OpFactors f;
  const Shape& in = shape_of(g, n.operands[0]);
  const Shape& out = n.type.shape;
  std::vector<int> inf(static_cast<std::size_t>(in.rank()), -1);
  std::vector<int> outf(static_cast<std::size_t>(out.rank()), -1);
  int a = 0, b = 0;
  while (a < in.rank() && b < out.rank() && in[a] == out[b]) {
    inf[static_cast<std::size_t>(a)] = outf[static_cast<std::size_t>(b)] =
        f.add(in[a], FactorKind::kPass);
    ++a;
    ++b;
  }
  int ea = in.rank() - 1, eb = out.rank() - 1;
  while (ea >= a && eb >= b && in[ea] == out[eb]) {
    inf[static_cast<std::size_t>(ea)] = outf[static_cast<std::size_t>(eb)] =
        f.add(in[ea], FactorKind::kPass);
    --ea;
    --eb;
  }
  // The middle: in[a..ea] and out[b..eb] hold the same number of elements.
  if (ea >= a && eb >= b) {
    // Their major dimensions share a factor of the smaller size when one divides the other.
    const std::int64_t x = in[a], y = out[b];
    const std::int64_t m = std::min(x, y);
    if (m > 0 && std::max(x, y) % m == 0) {
      const int id = f.add(m, FactorKind::kPass);
      if (x == m) inf[static_cast<std::size_t>(a)] = id;
      if (y == m) outf[static_cast<std::size_t>(b)] = id;
      // The larger side's dimension is a compound: sharding it over the factor's axes is the
      // same blocks as sharding the factor, so it is shared too (sizes are checked on use).
      if (x != m) inf[static_cast<std::size_t>(a)] = id;
      if (y != m) outf[static_cast<std::size_t>(b)] = id;
    }
    for (int d = a; d <= ea; ++d) {
      if (inf[static_cast<std::size_t>(d)] < 0)
        inf[static_cast<std::size_t>(d)] = f.add(in[d], FactorKind::kReplicate);
    }
    for (int d = b; d <= eb; ++d) {
      if (outf[static_cast<std::size_t>(d)] < 0)
        outf[static_cast<std::size_t>(d)] = f.add(out[d], FactorKind::kReplicate);
    }
  }
  f.operands = {inf};
  f.result = outf;
  return f;
}

OpFactors transpose_factors(const Graph& g, const Node& n) {
  OpFactors f;
  const Shape& in = shape_of(g, n.operands[0]);
  std::vector<int> inf(static_cast<std::size_t>(in.rank()));
  for (int d = 0; d < in.rank(); ++d)
    inf[static_cast<std::size_t>(d)] = f.add(in[d], FactorKind::kPass);
  for (const int p : n.axes) f.result.push_back(inf[static_cast<std::size_t>(p)]);
  f.operands = {inf};
  return f;
}

OpFactors broadcast_factors(const Graph& g, const Node& n) {
  OpFactors f;
  const Shape& in = shape_of(g, n.operands[0]);
  const Shape& out = n.type.shape;
  f.result.assign(static_cast<std::size_t>(out.rank()), -1);
  std::vector<int> inf(static_cast<std::size_t>(in.rank()), -1);
  for (int d = 0; d < in.rank(); ++d) {
    const int od = n.axes[static_cast<std::size_t>(d)];
    if (in[d] == out[od]) {
      inf[static_cast<std::size_t>(d)] = f.result[static_cast<std::size_t>(od)] =
          f.add(in[d], FactorKind::kPass);
    }
  }
  for (int d = 0; d < out.rank(); ++d) {
    if (f.result[static_cast<std::size_t>(d)] < 0)
      f.result[static_cast<std::size_t>(d)] = f.add(out[d], FactorKind::kPass);
  }
  f.operands = {inf};
  return f;
}

OpFactors slice_factors(const Graph& g, const Node& n) {
  OpFactors f;
  const Shape& in = shape_of(g, n.operands[0]);
  std::vector<int> inf(static_cast<std::size_t>(in.rank()));
  for (int d = 0; d < in.rank(); ++d) {
    const bool whole = n.starts[static_cast<std::size_t>(d)] == 0 &&
                       n.limits[static_cast<std::size_t>(d)] == in[d];
    if (whole) {
      inf[static_cast<std::size_t>(d)] = f.add(in[d], FactorKind::kPass);
      f.result.push_back(inf[static_cast<std::size_t>(d)]);
    } else {
      inf[static_cast<std::size_t>(d)] = f.add(in[d], FactorKind::kReplicate);
      f.result.push_back(f.add(n.type.shape[d], FactorKind::kReplicate));
    }
  }
  f.operands = {inf};
  return f;
}

OpFactors concat_factors(const Graph& g, const Node& n) {
  OpFactors f;
  const Shape& out = n.type.shape;
  for (int d = 0; d < out.rank(); ++d) {
    f.result.push_back(f.add(out[d], d == n.axis ? FactorKind::kReplicate : FactorKind::kPass));
  }
  for (const int o : n.operands) {
    std::vector<int> dims = f.result;
    dims[static_cast<std::size_t>(n.axis)] = f.add(shape_of(g, o)[n.axis], FactorKind::kReplicate);
    f.operands.push_back(std::move(dims));
  }
  return f;
}

OpFactors take_factors(const Graph& g, const Node& n) {
  OpFactors f;
  const Shape& x = shape_of(g, n.operands[0]);
  const Shape& idx = shape_of(g, n.operands[1]);
  std::vector<int> xf(static_cast<std::size_t>(x.rank())),
      idf(static_cast<std::size_t>(idx.rank()));
  for (int d = 0; d < n.axis; ++d) {
    xf[static_cast<std::size_t>(d)] = f.add(x[d], FactorKind::kPass);
    f.result.push_back(xf[static_cast<std::size_t>(d)]);
  }
  xf[static_cast<std::size_t>(n.axis)] = f.add(x[n.axis], FactorKind::kReplicate);
  for (int d = 0; d < idx.rank(); ++d) {
    idf[static_cast<std::size_t>(d)] = f.add(idx[d], FactorKind::kPass);
    f.result.push_back(idf[static_cast<std::size_t>(d)]);
  }
  for (int d = n.axis + 1; d < x.rank(); ++d) {
    xf[static_cast<std::size_t>(d)] = f.add(x[d], FactorKind::kPass);
    f.result.push_back(xf[static_cast<std::size_t>(d)]);
  }
  f.operands = {xf, idf};
  return f;
}

// Results only (iota, constant, input): any sharding of the result can be made locally.
OpFactors result_only(const Node& n) {
  OpFactors f;
  for (int d = 0; d < n.type.shape.rank(); ++d)
    f.result.push_back(f.add(n.type.shape[d], FactorKind::kPass));
  return f;
}

}  // namespace

OpFactors factors_of(const Graph& graph, const Node& node) {
  switch (node.op) {
    case Op::kDot:
      return dot_factors(graph, node);
    case Op::kReduceSum:
    case Op::kReduceMax:
    case Op::kReduceMin:
      return reduce_factors(graph, node);
    case Op::kReshape:
      return reshape_factors(graph, node);
    case Op::kTranspose:
      return transpose_factors(graph, node);
    case Op::kBroadcast:
      return broadcast_factors(graph, node);
    case Op::kSlice:
      return slice_factors(graph, node);
    case Op::kConcat:
      return concat_factors(graph, node);
    case Op::kTake:
      return take_factors(graph, node);
    case Op::kIota:
    case Op::kConstant:
    case Op::kRandom:
    case Op::kInput:
      return result_only(node);
    default:  // elementwise, select, convert, constraint, annotation
      return same_dims(graph, node);
  }
}

}  // namespace shardplan::detail
