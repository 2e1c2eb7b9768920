// The registry test: every primitive of all_primitives() is checked from what its definition
// declares (Primitive::tests, src/program/ir/primitive_tests.hpp), one test per primitive. For each
// declared dtype and case: the result against the declared reference; in f64, the VJP against
// central finite differences of the reference; and the case run under sjit over 4 devices on two
// meshes, operands sharded, against the one-device result. A primitive without a declaration
// fails, by name. Then docs/sjit.md's op list and ops.hpp are checked against the public ops.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "../src/program/ir/primitive_tests.hpp"
#include "../src/program/ir/primitives.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan::detail {
namespace {

// Elementwise error allowed against the reference, relative to 1 + |reference|: a few roundings
// of the result dtype (a sum of 48 floats, a dot over 12 products included); for the float8
// formats (only converted to), one rounding: half their relative step, 2^-4 (e4m3) and 2^-3
// (e5m2). Integers and bool are exact.
double tolerance(DType d) {
  switch (d) {
    case DType::kF8E4M3:
      return 0x1p-4;
    case DType::kF8E5M2:
      return 0x1p-3;
    case DType::kF64:
      return 1e-12;
    case DType::kF32:
      return 2e-5;
    case DType::kBF16:
      return 8e-3;
    default:
      return 0;
  }
}

// One device, and 4 devices as a 4 x 1 and a 2 x 2 mesh (axes x, y: the names the cases'
// shardings use).
struct Devices {
  Executor one{1};
  Mesh one_mesh = Mesh::parse("x:1,y:1", 1);
  Executor four{4};
  std::vector<Mesh> meshes = {Mesh::parse("x:4,y:1", 4), Mesh::parse("x:2,y:2", 4)};
};

// Values from the operand's domain, rounded to its dtype (the host values are what was sent).
Tensor sample(const CaseOperand& op, std::mt19937_64& rng) {
  Tensor t(op.type.shape, op.type.dtype);
  std::uniform_real_distribution<double> u(op.domain.low, op.domain.high);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    double v = u(rng);
    if (std::abs(v) < op.domain.min_abs) v = v < 0 ? -op.domain.min_abs : op.domain.min_abs;
    if (op.domain.whole || !is_floating(op.type.dtype)) v = std::round(v);
    if (op.type.dtype == DType::kBool) v = static_cast<double>(rng() % 2);
    set_host_value(t, i, v);
  }
  return t;
}

std::vector<Tensor> sample_operands(const TestCase& c, std::mt19937_64& rng) {
  std::vector<Tensor> in;
  for (const CaseOperand& op : c.operands) in.push_back(sample(op, rng));
  return in;
}

std::vector<HostValues> host_values(const std::vector<Tensor>& in) {
  std::vector<HostValues> h;
  for (const Tensor& t : in) h.push_back({t.shape(), host_doubles(t)});
  return h;
}

// The node the case applies (result type inferred by the primitive).
Node node_of(const Primitive& p, const TestCase& c) {
  std::vector<TensorType> types;
  for (const CaseOperand& op : c.operands) types.push_back(op.type);
  Node n{.op = &p, .attrs = c.attrs};
  n.type = p.infer(n, types);
  return n;
}

std::string describe_case(const Node& n, const TestCase& c) {
  std::vector<TensorType> types;
  for (const CaseOperand& op : c.operands) types.push_back(op.type);
  return fmt::format("{}{} ({}) -> {}", n.op->name, n.attrs.to_string(), describe(types),
                     to_string(n.type));
}

std::vector<double> reference(const PrimitiveTests& t, const Node& n,
                              std::span<const HostValues> in) {
  if (t.reference != nullptr) return t.reference(n, in);
  std::vector<double> y(static_cast<std::size_t>(n.type.shape.numel()));
  std::vector<double> x(in.size());
  for (std::size_t i = 0; i < y.size(); ++i) {
    for (std::size_t k = 0; k < in.size(); ++k) x[k] = in[k].v[i];
    y[i] = t.elementwise(x);
  }
  return y;
}

// Fails with the first few elements that differ by more than the dtype's tolerance, relative to
// 1 + |want| or, when given, 1 + scale (the size of the terms a sum adds).
void expect_close(const std::vector<double>& got, const std::vector<double>& want, DType dtype,
                  std::string_view what, const std::vector<double>& scale = {}) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double tol = tolerance(dtype);
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool same = got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]));
    const double size = scale.empty() ? std::abs(want[i]) : scale[i];
    if (!same && !(std::abs(got[i] - want[i]) <= tol * (1 + size)) && ++bad <= 3) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", want " << want[i];
    }
  }
}

Array put(const Tensor& t, const Mesh& mesh, const PartitionSpec& spec, const Executor& exec) {
  return device_put(t, NamedSharding(mesh, spec), exec);
}

// Axis x on the first dimension its size divides, y on the next one: a sharded operand or
// result wherever the shape allows.
PartitionSpec spread(const Shape& s, const Mesh& mesh) {
  std::vector<AxisNames> dims(static_cast<std::size_t>(s.rank()));
  int d = 0;
  for (const std::string axis : {"x", "y"}) {
    const std::int64_t size = mesh.axis_size(axis);
    while (d < s.rank() && (s[d] % size != 0 || s[d] < size)) ++d;
    if (d < s.rank()) dims[static_cast<std::size_t>(d++)] = {axis};
  }
  return PartitionSpec(dims);
}

// The operands on one device, and the node applied to them eagerly.
std::vector<Array> on_one(const Devices& dev, const std::vector<Tensor>& in) {
  std::vector<Array> xs;
  for (const Tensor& t : in) xs.push_back(put(t, dev.one_mesh, P(), dev.one));
  return xs;
}
Array apply_on_one(const Devices& dev, const Primitive& p, const TestCase& c,
                   const std::vector<Array>& xs) {
  const Array placement = put(Tensor(), dev.one_mesh, P(), dev.one);
  return apply(p, c.attrs, xs, &placement);
}
Tensor run_one(const Devices& dev, const Primitive& p, const TestCase& c,
               const std::vector<Tensor>& in) {
  return apply_on_one(dev, p, c, on_one(dev, in)).to_host();
}

// The node under sjit over `mesh`, its operands sharded by `spread`, and its result too when
// `shard_result` (else left to propagation).
Tensor run_sharded(const Devices& dev, const Mesh& mesh, const Primitive& p, const TestCase& c,
                   const std::vector<Tensor>& in, bool shard_result) {
  std::vector<Tree<Array>> args;
  for (const Tensor& t : in) args.emplace_back(put(t, mesh, spread(t.shape(), mesh), dev.four));
  auto f = sjit(mesh,
                [&](const Tree<Array>& xs) {
                  std::vector<Array> ops;
                  for (const Tree<Array>& x : xs.children()) ops.push_back(x.leaf());
                  const Array y = apply(p, c.attrs, ops);
                  return shard_result ? with_sharding_constraint(y, spread(y.shape(), mesh)) : y;
                },
                {.executor = dev.four});
  return f(Tree<Array>::list(std::move(args))).to_host();
}

// Whether the op sums (or takes the max of) partial results once sharded: then the sharded
// result may differ from one device's by the order of float operations, else not at all.
bool combines_partials(const Primitive& p, const Node& n, const TestCase& c) {
  std::vector<Shape> shapes;
  for (const CaseOperand& op : c.operands) shapes.push_back(op.type.shape);
  const OpFactors f = p.factors(n, shapes);
  return std::find(f.kinds.begin(), f.kinds.end(), FactorKind::kReduce) != f.kinds.end();
}

// The reference on the operands' absolute values: the size of the terms each result element sums
// (each partial result is rounded to the dtype before they are combined).
std::vector<double> term_size(const PrimitiveTests& t, const Node& n,
                              const std::vector<Tensor>& in) {
  std::vector<HostValues> h = host_values(in);
  for (HostValues& x : h) {
    for (double& v : x.v) v = std::abs(v);
  }
  std::vector<double> size = reference(t, n, h);
  for (double& v : size) v = std::abs(v);
  return size;
}

void check_sharded(const Devices& dev, const Primitive& p, const TestCase& c, const Node& n,
                   const std::vector<Tensor>& in, const Tensor& one) {
  const bool exact = !combines_partials(p, n, c) || !is_floating(n.type.dtype);
  const std::vector<double> size = exact ? std::vector<double>() : term_size(*p.tests, n, in);
  for (std::size_t m = 0; m < dev.meshes.size(); ++m) {
    const Mesh& mesh = dev.meshes[m];
    const std::string what = fmt::format("sharded over {}", mesh.to_string());
    const Tensor got = run_sharded(dev, mesh, p, c, in, m == 0);
    if (exact) {
      EXPECT_TRUE(got == one) << what << " differs from one device";
    } else {
      expect_close(host_doubles(got), host_doubles(one), n.type.dtype, what, size);
    }
  }
}

// The VJP against central finite differences of the reference, for the loss sum(y * w) with a
// random cotangent w; operands that are not float get no cotangent.
void check_vjp(const Devices& dev, const Primitive& p, const TestCase& c, const Node& n,
               const std::vector<Tensor>& in, std::mt19937_64& rng) {
  const std::vector<Array> xs = on_one(dev, in);
  const Array y = apply_on_one(dev, p, c, xs);
  const Tensor w = sample({n.type, kAnyReal}, rng);
  const std::vector<Array> cts = p.vjp(n, xs, y, put(w, dev.one_mesh, P(), dev.one));
  ASSERT_EQ(cts.size(), in.size()) << "cotangents of the operands";
  std::vector<HostValues> h = host_values(in);
  const std::vector<double> wv = w.to_doubles();
  const auto loss = [&] {
    const std::vector<double> r = reference(*p.tests, n, h);
    double l = 0;
    for (std::size_t i = 0; i < r.size(); ++i) l += r[i] * wv[i];
    return l;
  };
  for (std::size_t k = 0; k < in.size(); ++k) {
    if (!is_floating(in[k].dtype())) {
      EXPECT_FALSE(cts[k].valid()) << "operand " << k << " is not float, yet has a cotangent";
      continue;
    }
    ASSERT_TRUE(cts[k].valid()) << "no cotangent for operand " << k;
    const Tensor g = cts[k].to_host();
    ASSERT_EQ(g.shape(), in[k].shape()) << "cotangent of operand " << k;
    int bad = 0;
    for (std::int64_t j = 0; j < g.numel() && bad < 3; ++j) {
      double& x = h[k].v[static_cast<std::size_t>(j)];
      const double x0 = x, step = 1e-6 * std::max(1.0, std::abs(x0));
      x = x0 + step;
      const double up = loss();
      x = x0 - step;
      const double down = loss();
      x = x0;
      const double fd = (up - down) / (2 * step);
      if (!(std::abs(g.get(j) - fd) <= 1e-6 * (1 + std::abs(fd)))) {
        ++bad;
        ADD_FAILURE() << "the cotangent of operand " << k << " element " << j << " (at " << x0
                      << ") is " << g.get(j) << ", finite differences give " << fd;
      }
    }
  }
}

// Declared without a gradient: no operand gets a cotangent.
void check_no_vjp(const Devices& dev, const Primitive& p, const TestCase& c, const Node& n,
                  const std::vector<Tensor>& in) {
  const std::vector<Array> xs = on_one(dev, in);
  const Array y = apply_on_one(dev, p, c, xs);
  if (p.tests->gradient_refused) {
    EXPECT_THROW_WITH(p.vjp(n, xs, y, y), SpecError, std::string(p.name), std::string("not supported"));
    return;
  }
  const std::vector<Array> cts = p.vjp(n, xs, y, y);
  ASSERT_EQ(cts.size(), in.size()) << "cotangents of the operands";
  for (std::size_t k = 0; k < cts.size(); ++k) {
    EXPECT_FALSE(cts[k].valid()) << "declared without a gradient, yet operand " << k
                                 << " gets a cotangent";
  }
}

void check_reference(const Primitive& p) {
  const PrimitiveTests& t = *p.tests;
  ASSERT_TRUE((t.elementwise != nullptr) != (t.reference != nullptr))
      << p.name << " declares neither or both of a per-element and a whole reference";
  ASSERT_TRUE(!t.gradient || t.dtypes.contains(DType::kF64))
      << p.name << " has a gradient: its VJP is checked in f64, which it does not declare";
  Devices dev;
  std::mt19937_64 rng(std::hash<std::string_view>()(p.name));
  int gradients = 0;
  for (const DType dtype : t.dtypes.list()) {
    const std::vector<TestCase> cases = t.cases(p, dtype);
    ASSERT_FALSE(cases.empty()) << p.name << " declares no cases for " << name(dtype);
    for (const TestCase& c : cases) {
      ASSERT_TRUE(p.arity == kVariadic || static_cast<int>(c.operands.size()) == p.arity)
          << p.name << " takes " << p.arity << " operands, a case gives " << c.operands.size();
      const Node n = node_of(p, c);
      SCOPED_TRACE(describe_case(n, c));
      const std::vector<Tensor> in = sample_operands(c, rng);
      const Tensor one = run_one(dev, p, c, in);
      ASSERT_EQ(one.shape(), n.type.shape);
      ASSERT_EQ(one.dtype(), n.type.dtype);
      expect_close(host_doubles(one), reference(t, n, host_values(in)), n.type.dtype,
                   "against the reference");
      check_sharded(dev, p, c, n, in, one);
      // A float8 result carries no cotangent (convert's VJP): nothing computes in 8 bits.
      const bool differentiable = is_floating(n.type.dtype) && is_computable(n.type.dtype);
      if (t.gradient && dtype == DType::kF64 && differentiable) {
        check_vjp(dev, p, c, n, in, rng);
        ++gradients;
      } else if (!t.gradient && dtype == t.dtypes.list().front()) {
        check_no_vjp(dev, p, c, n, in);
      }
    }
  }
  EXPECT_TRUE(!t.gradient || gradients > 0) << p.name << " has a gradient but no f64 case";
}

// Same attributes, same values; sharded equal to one device; in range, with the moments.
void check_random(const Primitive& p) {
  const PrimitiveTests& t = *p.tests;
  ASSERT_NE(t.moments, nullptr) << p.name << " is random but declares no moments";
  Devices dev;
  for (const DType dtype : t.dtypes.list()) {
    for (const TestCase& c : t.cases(p, dtype)) {
      const Node n = node_of(p, c);
      SCOPED_TRACE(describe_case(n, c));
      const Tensor one = run_one(dev, p, c, {});
      EXPECT_TRUE(run_one(dev, p, c, {}) == one) << "the same attributes gave other values";
      check_sharded(dev, p, c, n, {}, one);
      const Moments want = t.moments(n);
      const std::vector<double> v = one.to_doubles();
      double mean = 0, var = 0;
      for (const double x : v) mean += x / static_cast<double>(v.size());
      for (const double x : v) var += (x - mean) * (x - mean) / static_cast<double>(v.size());
      const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
      EXPECT_GE(*lo, want.low);
      EXPECT_LE(*hi, want.high);
      EXPECT_NEAR(mean, want.mean, 5 * want.stddev / std::sqrt(static_cast<double>(v.size())));
      EXPECT_NEAR(std::sqrt(var), want.stddev, 0.1 * want.stddev);
    }
  }
}

// input: an sjit argument comes back bitwise, on one device and sharded; no cotangent to give.
void check_argument(const Primitive& p) {
  const PrimitiveTests& t = *p.tests;
  Devices dev;
  std::mt19937_64 rng(1);
  EXPECT_TRUE(p.vjp(Node{.op = &p}, std::vector<Array>{}, Array(), Array()).empty());
  for (const DType dtype : t.dtypes.list()) {
    for (const TestCase& c : t.cases(p, dtype)) {
      ASSERT_EQ(c.operands.size(), 1u) << "an input case is the argument's type";
      SCOPED_TRACE(to_string(c.operands[0].type));
      const Tensor x = sample(c.operands[0], rng);
      auto one = sjit(dev.one_mesh, [](const Array& a) { return a; });
      const Array on_one = put(x, dev.one_mesh, P(), dev.one);
      EXPECT_TRUE(one(on_one).to_host() == x);
      const std::string jaxpr = one.lower(on_one).jaxpr();
      EXPECT_NE(jaxpr.find("lambda %0:" + to_string(c.operands[0].type) + " ."), std::string::npos)
          << jaxpr;
      for (const Mesh& mesh : dev.meshes) {
        auto f = sjit(mesh, [](const Array& a) { return a; });
        EXPECT_TRUE(f(put(x, mesh, spread(x.shape(), mesh), dev.four)).to_host() == x)
            << mesh.to_string();
      }
    }
  }
}

std::string read_source(const std::string& path);
std::vector<std::string> split(std::string_view text);

// A shard_map op: tests/shard_map_test.cpp calls each of its public functions.
void check_shard_map_tested(const Primitive& p) {
  const std::string tests = read_source("tests/shard_map_test.cpp");
  ASSERT_FALSE(tests.empty());
  for (const std::string& op : split(p.tests->public_ops)) {
    const std::string call = op == "shard_map" ? "shard_map(" : "lax::" + op + "(";
    EXPECT_NE(tests.find(call), std::string::npos)
        << p.name << ": tests/shard_map_test.cpp never calls " << call;
  }
}

class Registry : public ::testing::TestWithParam<const Primitive*> {};

TEST_P(Registry, ChecksWhatTheDefinitionDeclares) {
  const Primitive& p = *GetParam();
  ASSERT_NE(p.tests, nullptr) << p.name
                              << " declares no tests: give its definition a PrimitiveTests "
                                 "(src/program/ir/primitive_tests.hpp)";
  ASSERT_NE(p.tests->cases, nullptr) << p.name << " declares no cases";
  ASSERT_FALSE(p.tests->dtypes.list().empty()) << p.name << " declares no dtypes";
  switch (p.tests->kind) {
    case TestKind::kReference:
      return check_reference(p);
    case TestKind::kRandom:
      return check_random(p);
    case TestKind::kArgument:
      return check_argument(p);
    case TestKind::kShardMap:
      return check_shard_map_tested(p);
  }
}

INSTANTIATE_TEST_SUITE_P(All, Registry,
                         ::testing::ValuesIn(all_primitives().begin(), all_primitives().end()),
                         [](const auto& i) { return std::string(i.param->name); });

std::string read_source(const std::string& path) {
  std::ifstream in(std::string(SHARDPLAN_SOURCE_DIR) + "/" + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The words inside `backticks` of docs/sjit.md's "## Ops" section.
std::set<std::string> documented_ops() {
  const std::string doc = read_source("docs/sjit.md");
  const std::size_t from = doc.find("\n## Ops");
  const std::size_t to = doc.find("\n## ", from + 1);
  std::set<std::string> words;
  if (from == std::string::npos) return words;
  const std::string section = doc.substr(from, to - from);
  for (std::size_t open = section.find('`'); open != std::string::npos;) {
    const std::size_t close = section.find('`', open + 1);
    if (close == std::string::npos) break;
    std::istringstream span(section.substr(open + 1, close - open - 1));
    for (std::string w; span >> w;) words.insert(w);
    open = section.find('`', close + 1);
  }
  return words;
}

std::vector<std::string> split(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

TEST(PrimitiveRegistry, DocsAndOpsHeaderNameEveryPublicOp) {
  const std::set<std::string> documented = documented_ops();
  ASSERT_FALSE(documented.empty()) << "docs/sjit.md has no '## Ops' section with `ops`";
  const std::string ops_header = read_source("include/shardplan/ops.hpp");
  const std::string shard_map_header = read_source("include/shardplan/shard_map.hpp");
  for (const Primitive* p : all_primitives()) {
    if (p->tests == nullptr) continue;  // the registry test names it
    const bool lax = p->tests->kind == TestKind::kShardMap;
    const std::string& header = lax ? shard_map_header : ops_header;
    const std::vector<std::string> ops = split(p->tests->public_ops);
    EXPECT_EQ(ops.empty(), p->tests->kind == TestKind::kArgument)
        << p->name << ": every primitive but input names its public functions";
    for (const std::string& op : ops) {
      EXPECT_EQ(documented.count(op), 1u)
          << p->name << "'s public function '" << op << "' is not in docs/sjit.md's op list";
      // A multi-result op (adamw_update) or one of several passes over lists (adamw_foreach,
      // which declares their traffic) returns its results in a struct of Arrays.
      const bool declared =
          header.find((op == "shard_map" ? "auto " : "Array ") + op + "(") != std::string::npos ||
          ((p->shared_reads || p->traffic != nullptr) &&
           header.find(" " + op + "(") != std::string::npos);
      EXPECT_TRUE(declared) << p->name << "'s public function '" << op << "' is not declared in "
                            << (lax ? "shard_map.hpp" : "ops.hpp");
    }
  }
}

}  // namespace
}  // namespace shardplan::detail
