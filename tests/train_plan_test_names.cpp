// train-plan's option values by name (train_plan_names.cpp): every value's name parses back to
// it, the names are the ones docs/cli.md spells, and an unknown name is refused listing them all,
// printed safely.
#include <string>
#include <vector>

#include "train_plan_test.hpp"

namespace shardplan::test {
namespace {

// Each value, the name docs/cli.md gives it, and that name parsed back.
template <class E, class Parse>
void expect_names(const std::vector<std::pair<E, std::string>>& values, Parse parse) {
  for (const auto& [value, spelled] : values) {
    EXPECT_EQ(name(value), spelled);
    EXPECT_EQ(parse(spelled), value) << spelled;
  }
}

TEST(TrainPlanNames, EveryValueParsesBackFromItsName) {
  expect_names<TpPlan>({{TpPlan::kPartitioner, "partitioner"}, {TpPlan::kModules, "modules"}},
                       parse_tp_plan);
  expect_names<RingRotate>(
      {{RingRotate::kPermute, "permute"}, {RingRotate::kAllGather, "allgather"}},
      parse_ring_rotate);
  expect_names<ContextKernel>({{ContextKernel::kRing, "ring"},
                               {ContextKernel::kAllGatherKv, "allgather-kv"},
                               {ContextKernel::kUlysses, "ulysses"}},
                              parse_context_kernel);
  expect_names<Float8Scaling>({{Float8Scaling::kTensorwise, "tensorwise"},
                               {Float8Scaling::kRowwise, "rowwise"},
                               {Float8Scaling::kRowwiseWithGwHp, "rowwise_with_gw_hp"}},
                              parse_float8_recipe);
  expect_names<Float8Gather>({{Float8Gather::kFloat8, "float8"}, {Float8Gather::kBf16, "bf16"}},
                             parse_float8_gather);
  expect_names<OptimizerKernel>({{OptimizerKernel::kOps, "ops"},
                                 {OptimizerKernel::kFused, "fused"},
                                 {OptimizerKernel::kForeach, "foreach"}},
                                parse_optimizer_kernel);
  expect_names<OptimizerSharding>(
      {{OptimizerSharding::kRules, "rules"}, {OptimizerSharding::kZero1, "zero1"}},
      parse_optimizer_sharding);
  expect_names<DpOverlap>({{DpOverlap::kFsdp, "fsdp"},
                           {DpOverlap::kOff, "off"},
                           {DpOverlap::kBuckets, "buckets"},
                           {DpOverlap::kGradBuckets, "grad-buckets"}},
                          parse_dp_overlap);
  expect_names<OptimizerKind>({{OptimizerKind::kSgd, "sgd"},
                               {OptimizerKind::kAdam, "adam"},
                               {OptimizerKind::kAdamw, "adamw"}},
                              parse_optimizer);
}

TEST(TrainPlanNames, AnUnknownNameIsRefusedListingTheKnownOnes) {
  EXPECT_THROW_WITH(parse_ring_rotate("alltoall"), SpecError,
                    "[train] unknown ring rotation 'alltoall' (known: permute, allgather; "
                    "PyTorch's \"alltoall\" rotate method is permute)");
  EXPECT_THROW_WITH(parse_context_kernel("p2p"), SpecError,
                    "[train] unknown context-parallel kernel 'p2p' (known: ring, allgather-kv, "
                    "ulysses)");
  EXPECT_THROW_WITH(parse_dp_overlap("on"), SpecError,
                    "[train] unknown data-parallel overlap 'on' (known: fsdp, off, buckets, "
                    "grad-buckets)");
  // Matched whole: a name that only starts like a known one, or differs in case, is unknown.
  EXPECT_THROW_WITH(parse_optimizer("adamw8bit"), SpecError, "unknown optimizer 'adamw8bit'");
  EXPECT_THROW_WITH(parse_optimizer_kernel("Fused"), SpecError, "unknown optimizer kernel");
  // A name from a file or a terminal is printed with its control and invalid bytes escaped.
  EXPECT_THROW_WITH(parse_optimizer(std::string("sgd\x1b[2J\xff", 8)), SpecError,
                    "unknown optimizer 'sgd\\x1b[2J\\xff' (known: sgd, adam, adamw)");
}

}  // namespace
}  // namespace shardplan::test
