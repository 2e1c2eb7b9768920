// SjitOptions::links: ranking the partitioner's choices by time on given links instead of by
// bytes, and the refusal of figures that would rank nothing or apply to nothing.
#include "sjit_test.hpp"

namespace shardplan {
namespace {

using test::Meshes;

// exp(w - s), s the column sums of x split over data (pending until reduced) and the result
// wanted whole: a reduce-scatter then an all-gather of s moves the same bytes as one all-reduce
// (the tie goes to the pair, which computes the subtraction on a quarter of s each); with a link
// whose start-up latency dominates, one collective is cheaper.
std::vector<CollectiveKind> update_collectives(const std::optional<LinkFigures>& links) {
  Meshes s;
  const Array x = s.put(Tensor::ones(Shape{8, 16}, DType::kF32), P("data"));
  const Array w = s.put(Tensor::ones(Shape{16}, DType::kF32), P());
  SjitOptions o{.out_shardings = RuleTree(Replicated{})};
  o.links = links;
  auto f = sjit(
      s.mesh, [](const Array& a, const Array& b) { return exp(b - sum(a, {0})); }, o);
  std::vector<CollectiveKind> kinds;
  for (const auto& [kind, bytes] : f.lower(x, w).cost().bytes_by_kind) {
    if (kind != CollectiveKind::kSlice) kinds.push_back(kind);
  }
  return kinds;
}

LinkFigures links_of(double bytes_per_second, double latency) {
  LinkFigures l;
  l.axes["data"] = AxisLink{.bytes_per_second = bytes_per_second, .latency_seconds = latency};
  l.axes["model"] = AxisLink{.bytes_per_second = bytes_per_second, .latency_seconds = latency};
  return l;
}

TEST(SjitLinks, ALinkWhoseLatencyDominatesChoosesOneCollectiveWhereBytesTie) {
  EXPECT_EQ(update_collectives(std::nullopt),
            (std::vector<CollectiveKind>{CollectiveKind::kAllGather,
                                         CollectiveKind::kReduceScatter}));
  EXPECT_EQ(update_collectives(links_of(100e9, 1e-3)),
            (std::vector<CollectiveKind>{CollectiveKind::kAllReduce}));
  // Without latency the time is the bytes over one bandwidth: the same choice as by bytes.
  EXPECT_EQ(update_collectives(links_of(100e9, 0)), update_collectives(std::nullopt));
}

TEST(SjitLinks, FiguresThatApplyToNothingOrRankNothingAreRefusedNamingTheAxis) {
  Meshes s;
  const auto f = [](const Array& x) { return x + x; };
  const auto with = [&](const LinkFigures& l) {
    SjitOptions o;
    o.links = l;
    return sjit(s.mesh, f, o);
  };
  LinkFigures extra = links_of(1e9, 0);
  extra.axes["tp"] = AxisLink{.bytes_per_second = 1e9};
  EXPECT_THROW_WITH(with(extra), SpecError, "links", "'tp'", "not an axis of the mesh");
  LinkFigures missing = links_of(1e9, 0);
  missing.axes.erase("model");
  EXPECT_THROW_WITH(with(missing), SpecError, "links", "'model'", "no figure");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const AxisLink bad : {AxisLink{0, 0}, AxisLink{-1, 0}, AxisLink{nan, 0}, AxisLink{inf, 0},
                             AxisLink{1e9, -1}, AxisLink{1e9, nan}, AxisLink{1e9, inf}}) {
    LinkFigures l = links_of(1e9, 0);
    l.axes["data"] = bad;
    EXPECT_THROW_WITH(with(l), SpecError, "links", "'data'", "bandwidth");
  }
  for (const double rate : {-1.0, nan, inf}) {
    LinkFigures l = links_of(1e9, 0);
    l.flops_per_second = rate;
    EXPECT_THROW_WITH(with(l), SpecError, "links", "flops_per_second");
  }
  // In range, it compiles and runs as without.
  const Array x = s.put(Tensor::ones(Shape{8}, DType::kF32), P("data"));
  EXPECT_EQ(with(links_of(1e9, 1e-6))(x).to_host().get(3), 2.0);
}

}  // namespace
}  // namespace shardplan
