// --optimizer-kernel: Adam(W)'s update as the program's ops or as one fused kernel per parameter
// (adamw_update, torch.optim.AdamW(fused=True)); the plan says which the program ran.
#include "train_plan_test.hpp"

namespace shardplan::test {
namespace {

TrainPlan plan_kernel(OptimizerKernel kernel, std::optional<Hardware> hardware = std::nullopt) {
  TrainPlanOptions o;
  o.batch = 2;
  o.seq = 8;
  o.param_dtype = o.grad_dtype = o.optimizer_dtype = DType::kF32;
  o.optimizer_kernel = kernel;
  o.hardware = std::move(hardware);
  o.extrapolate = false;
  return plan_training(ModelConfig::parse(kTinyLlama), Mesh::parse("fsdp:1", 1),
                       preset("llama_fsdp"), o);
}

// On one device in f32, compiled: the ops run three chains per parameter, the moments' (read mu
// or nu and the gradient, write the new moment: 12 B per element each) and the parameter's (read
// p and both new moments, write p: 16 B), 40 B; the fused kernel reads p, g, mu, nu once and
// writes p, mu, nu once, 28 B. So the step's traffic drops by 12 B per parameter element, to a
// few bytes per parameter (the scalar kernels only the ops run per parameter: the bias
// corrections and their casts, at most 16 scalars of 8 B), and the time by that over the memory
// bandwidth achieved.
TEST(OptimizerKernel, TheFusedUpdateSavesTwelveBytesPerElementOverCompiledOps) {
  const Hardware h100 = find_hardware("h100-sxm");
  const TrainPlan ops = plan_kernel(OptimizerKernel::kOps, h100);
  const TrainPlan fused = plan_kernel(OptimizerKernel::kFused, h100);
  EXPECT_EQ(ops.optimizer_kernel, "ops");
  EXPECT_EQ(fused.optimizer_kernel, "fused");
  const std::int64_t n = fused.parameter_count;
  const std::int64_t leaves = 2 * 9 + 3;  // per layer 7 linears and 2 norms; embedding, norm, head
  const std::int64_t saved = ops.memory_traffic - fused.memory_traffic;
  EXPECT_GE(saved, 12 * n);
  EXPECT_LE(saved, 12 * n + 16 * 8 * leaves) << "the scalars' kernels";
  ASSERT_TRUE(ops.time && fused.time);
  const double rate = h100.memory_bandwidth * h100.memory_efficiency;
  EXPECT_NEAR(ops.time->memory_seconds - fused.time->memory_seconds,
              static_cast<double>(saved) / rate, 1e-15);
}

// torch's foreach passes (_multi_tensor_adamw, PyTorch 2.5), counted by hand per f32 element
// (tests/optim_test_foreach.cpp lists them): decay mul_ 8, lerp_ 12, mul_ 8, addcmul_ 12, sqrt 8,
// div_ 8, add_ 8, addcdiv_ 16: 80 B, every leaf decaying here (AdamW, no decay mask). So against
// the fused kernel's 28 B and the step count it reads a leaf (f32, 4 B; the constant rate is
// folded into its readers, as the step's constants are: step_sjit_options) the step's traffic
// grows by exactly 52 B per parameter element less 4 B per leaf, and against the compiled ops'
// 40 B (and their scalar kernels, at most 16 scalars of 8 B a leaf) by 40 B per element less
// those. The time's memory part moves by the difference over the bandwidth achieved.
TEST(OptimizerKernel, TheForeachUpdateMovesTheBytesOfItsPasses) {
  const Hardware h100 = find_hardware("h100-sxm");
  const TrainPlan ops = plan_kernel(OptimizerKernel::kOps, h100);
  const TrainPlan fused = plan_kernel(OptimizerKernel::kFused, h100);
  const TrainPlan foreach = plan_kernel(OptimizerKernel::kForeach, h100);
  EXPECT_EQ(foreach.optimizer_kernel, "foreach");
  EXPECT_THAT(foreach.table(), ::testing::HasSubstr(", optimizer kernel foreach (torch's passes"));
  std::ostringstream js;
  foreach.write_json(js);
  EXPECT_EQ(nlohmann::json::parse(js.str()).at("optimizer_kernel"), "foreach");
  const std::int64_t n = foreach.parameter_count;
  const std::int64_t leaves = 2 * 9 + 3;
  EXPECT_EQ(foreach.memory_traffic - fused.memory_traffic, 52 * n - 4 * leaves);
  const std::int64_t over_ops = foreach.memory_traffic - ops.memory_traffic;
  EXPECT_LE(over_ops, 40 * n);
  EXPECT_GE(over_ops, 40 * n - 16 * 8 * leaves) << "the scalars' kernels";
  ASSERT_TRUE(foreach.time && fused.time);
  const double rate = h100.memory_bandwidth * h100.memory_efficiency;
  EXPECT_NEAR(foreach.time->memory_seconds - fused.time->memory_seconds,
              static_cast<double>(52 * n - 4 * leaves) / rate, 1e-15);
}

// The kernels are Adam's and AdamW's: SGD's update with one is refused, naming the option.
TEST(OptimizerKernel, FusedWithSgdIsRefused) {
  TrainPlanOptions o;
  o.batch = 2;
  o.seq = 8;
  o.optimizer = OptimizerKind::kSgd;
  o.optimizer_kernel = OptimizerKernel::kFused;
  EXPECT_THROW_WITH(plan_training(ModelConfig::parse(kTinyLlama), Mesh::parse("fsdp:1", 1),
                                  preset("llama_fsdp"), o),
                    OptionError, "--optimizer-kernel fused is refused", "--optimizer sgd",
                    "--optimizer adam|adamw");
  o.optimizer_kernel = OptimizerKernel::kForeach;
  EXPECT_THROW_WITH(plan_training(ModelConfig::parse(kTinyLlama), Mesh::parse("fsdp:1", 1),
                                  preset("llama_fsdp"), o),
                    OptionError, "--optimizer-kernel foreach is refused", "--optimizer sgd",
                    "adamw_foreach", "--optimizer adam|adamw");
  EXPECT_EQ(parse_optimizer_kernel("foreach"), OptimizerKernel::kForeach);
  EXPECT_EQ(name(OptimizerKernel::kForeach), "foreach");
  EXPECT_THROW_WITH(parse_optimizer_kernel("adafactor"), SpecError,
                    "unknown optimizer kernel 'adafactor' (known: ops, fused, foreach)");
}

}  // namespace
}  // namespace shardplan::test
