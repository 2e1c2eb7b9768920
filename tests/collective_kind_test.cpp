// The kinds of collective: their printed names, and an order that is the order of those names
// (maps keyed by kind print as they did when keyed by name).
#include "shardplan/collective_kind.hpp"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace shardplan {
namespace {

TEST(CollectiveKind, PrintsItsName) {
  std::vector<std::string> names;
  for (const CollectiveKind k : kCollectiveKinds) names.emplace_back(to_string(k));
  EXPECT_EQ(names, (std::vector<std::string>{"all_gather", "all_reduce", "all_to_all", "general",
                                             "permute", "reduce_scatter", "slice"}));
  std::ostringstream os;
  os << CollectiveKind::kReduceScatter;
  EXPECT_EQ(os.str(), "reduce_scatter");
}

TEST(CollectiveKind, OrderIsTheOrderOfTheNames) {
  for (std::size_t i = 1; i < std::size(kCollectiveKinds); ++i) {
    EXPECT_LT(kCollectiveKinds[i - 1], kCollectiveKinds[i]);
    EXPECT_LT(to_string(kCollectiveKinds[i - 1]), to_string(kCollectiveKinds[i]));
  }
}

}  // namespace
}  // namespace shardplan
