// Uneven shards in train-plan (issue 41): a dimension the mesh axes do not divide is padded as
// FSDP2 and JAX split it, and the bytes per device are the padded blocks'; strict mode refuses.
#include "train_plan_test.hpp"

namespace shardplan {
namespace {

using namespace test;

// FSDP over 5 devices of a model none of whose weight dimensions 5 divides: planned, each device
// holding ceil(n/5) rows of each weight, bytes worked out by hand; under strict mode
// (TrainPlanOptions::uneven = kRefuse, --strict-shards) the refusal every plan gave before,
// naming the tensor, its shape and the axis.
TEST(PlanTraining, FsdpOverDevicesThatDoNotDivideCountsThePaddedShards) {
  const ModelConfig c = ModelConfig::parse(kTinyLlama);
  const Mesh mesh = Mesh::parse("fsdp:5", 5);
  TrainPlanOptions o;
  o.batch = 5;
  o.seq = 8;
  const TrainPlan p = plan_training(c, mesh, preset("llama_fsdp"), o);
  // llama_fsdp: the embedding and the head [64, 32] split on dim 1 (ceil(32/5) = 7 columns),
  // the projections [out, in] on dim 0 (q, o: 7 of 32 rows; k, v: 4 of 16; gate, up: 10 of 48;
  // down: 7 of 32 rows of 48), the norms [32] replicated.
  const std::int64_t per_layer = 2 * 7 * 32 + 2 * 4 * 32 + 2 * 10 * 32 + 7 * 48 + 2 * 32;
  const std::int64_t elements = 2 * 64 * 7 + 2 * per_layer + 32;
  EXPECT_EQ(p.parameter_bytes, elements * 2);  // bf16
  EXPECT_EQ(p.gradient_bytes, elements * 2);
  EXPECT_EQ(p.optimizer_bytes, 2 * elements * 4 + 4);  // mu, nu in f32 and the count
  EXPECT_EQ(p.batch_bytes, 2 * 1 * 8 * 4);             // a sequence of tokens and targets each
  EXPECT_GT(p.bytes_by_collective.at(CollectiveKind::kAllGather), 0);  // FSDP gathers its weights
  EXPECT_GT(p.bytes_by_collective.at(CollectiveKind::kReduceScatter), 0);  // and scatters grads
  o.uneven = Uneven::kRefuse;
  EXPECT_THROW_WITH(plan_training(c, mesh, preset("llama_fsdp"), o), SpecError, "lm_head/weight",
                    "(shape [64, 32])", "'fsdp' (size 5)", "32 is not a multiple of 5");
}

}  // namespace
}  // namespace shardplan
