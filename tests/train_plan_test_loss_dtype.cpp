// --loss-dtype: the naive loss on a float32 copy of the logits (the default) or on the bf16
// logits as the head computes them (F.cross_entropy on bf16: torch's _log_softmax keeps its
// result in the input's dtype, tools/autograd/derivatives.yaml). The memory it saves worked by
// hand, the loss it gives, what the report reads from the program, its refusals and the stacks
// that declare it.
#include <gmock/gmock.h>

#include "shardplan/training_stack.hpp"
#include "train_plan_test.hpp"

namespace shardplan {
namespace {

using namespace test;

// A model whose step is mostly its loss: 32,768 classes over 64 hidden units.
constexpr const char* kWideVocab = R"({"model_type": "llama", "vocab_size": 32768,
  "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
  "num_attention_heads": 4, "num_key_value_heads": 2})";
constexpr std::int64_t kTokens = 2048, kVocab = 32768;
constexpr std::int64_t kElems = kTokens * kVocab;  // one [tokens, vocab] array

// The gradient of the loss alone with respect to the head's input, bf16 weights and input, the
// loss read in `loss_dtype` (nullopt: the default).
Lowered loss_program(const ModelConfig& c, std::optional<DType> loss_dtype) {
  const Mesh mesh = Mesh::parse("fsdp:1", 1);
  const train::ModelStep model{
      .config = c, .layout = train::Layout{}, .fused_loss = false, .loss_dtype = loss_dtype};
  auto f = sjit(mesh, [&](const Array& norm, const Array& head, const Array& h, const Array& y) {
    const Tree<Array> rest = Tree<Array>::dict(
        {{"model", Tree<Array>::dict({{"norm", Tree<Array>::dict({{"weight", Tree<Array>(norm)}})}})},
         {"lm_head", Tree<Array>::dict({{"weight", Tree<Array>(head)}})}});
    return value_and_grad([&](const Array& x) { return model.loss(rest, x, y); })(h).second;
  }, SjitOptions{.count_constants = false});
  return f.lower(TensorSpec{Shape{64}, DType::kBF16}, TensorSpec{Shape{kVocab, 64}, DType::kBF16},
                 TensorSpec{Shape{1, kTokens, 64}, DType::kBF16},
                 TensorSpec{Shape{1, kTokens}, DType::kI32});
}

// The ops whose result is a whole [1, tokens, vocab] array of `dtype`.
int logits_sized(const Lowered& low, DType dtype) {
  int n = 0;
  for (const LoweredOp& op : low.ops()) {
    n += op.type.shape == Shape{1, kTokens, kVocab} && op.type.dtype == dtype;
  }
  return n;
}

// By hand, in copies of the logits: the f32 loss's backward pass holds log_softmax's kept result,
// nll_loss's cotangent and log_softmax's cotangent, three f32 arrays (4 B an element: 3 x 4 =
// 12 B); in bf16 the same three are bf16 (3 x 2 = 6 B), and there is no .float() copy (written
// in the forward pass, 4 B an element) nor the backward pass's cast back (ToCopyBackward). The
// peak drops by 3 x 2 B an element. The kernels' traffic, in bytes an element: .float() (read 2,
// write 4: 6) and the cast back (read 4, write 2: 6) are gone; log_softmax reads and writes 2 B
// less each (4), nll_loss's cotangent is written (2), log_softmax's backward reads g for its sum
// (2) and g and y and writes its result (6): 26 (take_along_axis reads one element a row).
TEST(LossDtype, Bf16LogitsDropTheFloat32CopiesWorkedByHand) {
  const ModelConfig c = ModelConfig::parse(kWideVocab);
  const Lowered f32 = loss_program(c, std::nullopt);
  const Lowered bf16 = loss_program(c, DType::kBF16);
  const ProgramCost &a = f32.cost(), &b = bf16.cost();
  // Beside the logits' arrays both hold the weights, h and its gradient and per-token vectors
  // (a few MiB), the same in both but for the per-token vectors' dtype.
  constexpr double kSlack = 64.0 * 1024;
  EXPECT_NEAR(static_cast<double>(a.peak_bytes[0] - b.peak_bytes[0]), 3.0 * kElems * 2, kSlack);
  ASSERT_GE(a.timeline.live_at_peak.size(), 3u);
  ASSERT_GE(b.timeline.live_at_peak.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(a.timeline.live_at_peak[i].type, "f32[1, 2048, 32768]");
    EXPECT_EQ(b.timeline.live_at_peak[i].type, "bf16[1, 2048, 32768]");
    EXPECT_EQ(b.timeline.live_at_peak[i].bytes, kElems * 2);
  }
  EXPECT_NEAR(static_cast<double>(a.memory_traffic - b.memory_traffic),
              static_cast<double>(kElems) * (6 + 6 + 4 + 2 + 2 + 6), kSlack);
  // No f32 array of the logits' size at all in bf16: log_softmax reads the head's output.
  EXPECT_GT(logits_sized(f32, DType::kF32), 0);
  EXPECT_EQ(logits_sized(bf16, DType::kF32), 0);
  for (const LoweredOp& op : bf16.ops()) {
    if (op.primitive == "fused_log_softmax") {
      EXPECT_EQ(op.type.dtype, DType::kBF16);
    }
  }
}

// A small step run, loss and gradients: in bf16 as in f32 to bf16's precision (8 bits of
// mantissa: the log-probabilities, near log 64 = 4.2, rounded to 2^-6; their mean over 16
// tokens), the loss returned in the dtype the cross-entropy ran in.
TEST(LossDtype, TheLossInBf16IsTheFloat32LossToBf16Precision) {
  const ModelConfig c = ModelConfig::parse(kTinyLlama);
  const Executor exec(1);
  const Mesh mesh = Mesh::parse("fsdp:1,tp:1", 1);
  const Tree<Array> params = uniform_parameters(c, DType::kBF16, 5, mesh, exec);
  const std::pair<Array, Array> batch = tokens_and_targets(Shape{2, 8}, mesh, P(), exec);
  const auto run = [&](std::optional<DType> loss_dtype) {
    const train::ModelStep model{
        .config = c, .layout = train::Layout{}, .fused_loss = false, .loss_dtype = loss_dtype};
    return to_host(sjit(mesh, [&](const Tree<Array>& p, const Array& x, const Array& y) {
      auto [loss, grads] = train::loss_and_grads(model, p, x, y);
      return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
    })(params, batch.first, batch.second));
  };
  const Tree<Tensor> f32 = run(std::nullopt), bf16 = run(DType::kBF16);
  EXPECT_EQ(f32.at("loss").leaf().dtype(), DType::kF32);
  EXPECT_EQ(bf16.at("loss").leaf().dtype(), DType::kBF16);
  const double want = f32.at("loss").leaf().get(0);
  EXPECT_NEAR(want, std::log(64.0), 1.0);
  EXPECT_NEAR(bf16.at("loss").leaf().get(0), want, 0.02);
  const auto a = bf16.at("grads").flatten(), b = f32.at("grads").flatten();
  ASSERT_EQ(a.size(), b.size());
  double largest = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].second.dtype(), DType::kBF16) << a[i].first;
    const auto x = a[i].second.to_doubles(), y = b[i].second.to_doubles();
    for (std::size_t k = 0; k < x.size(); ++k) {
      largest = std::max(largest, std::abs(y[k]));
      ASSERT_NEAR(x[k], y[k], 2e-3 + 5e-2 * std::abs(y[k])) << a[i].first << " [" << k << "]";
    }
  }
  EXPECT_GT(largest, 1e-3);
}

TrainPlanOptions naive_options(std::optional<DType> loss_dtype) {
  TrainPlanOptions o;
  o.batch = 1;
  o.seq = kTokens;
  o.fused_loss = false;
  o.loss_dtype = loss_dtype;
  o.extrapolate = false;
  return o;
}

// The plan's peak drops by the three arrays' halved bytes (the loss's backward pass is the
// step's peak on this model), and the report says the dtype the program's loss ran in.
TEST(LossDtype, ThePlanSaysTheDtypeItsLossRanIn) {
  const ModelConfig c = ModelConfig::parse(kWideVocab);
  const Mesh mesh = Mesh::parse("fsdp:1", 1);
  const TrainPlan f32 = plan_training(c, mesh, preset("llama_fsdp"), naive_options(std::nullopt));
  const TrainPlan bf16 = plan_training(c, mesh, preset("llama_fsdp"), naive_options(DType::kBF16));
  EXPECT_EQ(f32.loss_dtype, DType::kF32);
  EXPECT_EQ(bf16.loss_dtype, DType::kBF16);
  EXPECT_NEAR(static_cast<double>(f32.peak_bytes - bf16.peak_bytes), 3.0 * kElems * 2,
              64.0 * 1024);
  EXPECT_THAT(bf16.table(), ::testing::HasSubstr("attention fused, loss naive in bf16,"));
  EXPECT_THAT(f32.table(), ::testing::HasSubstr("attention fused, loss naive,"));
  for (const TrainPlan* p : {&f32, &bf16}) {
    std::ostringstream js;
    p->write_json(js);
    EXPECT_EQ(nlohmann::json::parse(js.str()).at("loss_dtype"), name(p->loss_dtype));
  }
  // f32 given is the default's program; the fused loss runs its groups in f32.
  EXPECT_EQ(plan_training(c, mesh, preset("llama_fsdp"), naive_options(DType::kF32)).peak_bytes,
            f32.peak_bytes);
  TrainPlanOptions fused = naive_options(std::nullopt);
  fused.fused_loss = std::nullopt;
  EXPECT_EQ(plan_training(c, mesh, preset("llama_fsdp"), fused).loss_dtype, DType::kF32);
  // T5 computes its cross-entropy on the bf16 logits: read from its program, not an option.
  TrainPlanOptions t5;
  t5.batch = 4;
  t5.seq = 8;
  const TrainPlan p = plan_training(ModelConfig::parse(kTinyT5), Mesh::parse("fsdp:2,tp:2", 4),
                                    preset("t5"), t5);
  EXPECT_EQ(p.loss_dtype, DType::kBF16);
  EXPECT_THAT(p.table(), ::testing::HasSubstr("loss naive in bf16"));
}

TEST(LossDtype, WhereItCannotApplyItIsRefused) {
  const ModelConfig c = ModelConfig::parse(kTinyLlama);
  const Mesh mesh = Mesh::parse("fsdp:2", 2);
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 16;
  o.loss_dtype = DType::kBF16;
  EXPECT_THROW_WITH(plan_training(c, mesh, preset("llama_fsdp"), o), OptionError,
                    "[train] --loss-dtype bf16 is refused", "the fused loss (--loss not given)",
                    "takes each group's logits to f32");
  o.fused_loss = true;
  EXPECT_THROW_WITH(plan_training(c, mesh, preset("llama_fsdp"), o), OptionError,
                    "--loss-dtype bf16 with --loss fused");
  o.fused_loss = false;
  o.param_dtype = o.grad_dtype = DType::kF32;
  EXPECT_THROW_WITH(plan_training(c, mesh, preset("llama_fsdp"), o), OptionError,
                    "[train] --loss-dtype is refused", "logits in a wider dtype",
                    "--loss-dtype bf16 with --param-dtype f32");
  o.param_dtype = o.grad_dtype = DType::kF64;
  o.loss_dtype = DType::kF32;
  EXPECT_THROW_WITH(plan_training(c, mesh, preset("llama_fsdp"), o), OptionError,
                    "--loss-dtype f32 with --param-dtype f64");
  TrainPlanOptions t5;
  t5.batch = 4;
  t5.seq = 8;
  t5.loss_dtype = DType::kF32;
  EXPECT_THROW_WITH(plan_training(ModelConfig::parse(kTinyT5), Mesh::parse("fsdp:2,tp:2", 4),
                                  preset("t5"), t5),
                    OptionError, "[train] --loss-dtype is refused", "T5",
                    "plan it without --loss-dtype");
  // Applies: bf16 logits, naive loss.
  o.param_dtype = o.grad_dtype = DType::kBF16;
  o.loss_dtype = DType::kBF16;
  EXPECT_EQ(plan_training(c, mesh, preset("llama_fsdp"), o).loss_dtype, DType::kBF16);
}

// The stacks that run the cross-entropy on the bf16 logits declare it, torchtitan of mid-2024
// its model's float32 cast: planned, not "not modelled". A stack's bf16 where it cannot apply
// (the fused loss given over it) is its default there, not a refusal.
TEST(LossDtype, TheStacksDeclareTheirLossDtype) {
  const ModelConfig c = ModelConfig::parse(kTinyLlama);
  const Mesh mesh = Mesh::parse("fsdp:2", 2);
  for (const auto& [stack, want] : {std::pair{"torchtitan-2024-07", DType::kF32},
                                    std::pair{"llm-foundry", DType::kBF16},
                                    std::pair{"fms-fsdp", DType::kBF16}}) {
    SCOPED_TRACE(stack);
    const TrainingStack& s = find_training_stack(stack);
    EXPECT_THAT(explain_stack(s),
                ::testing::HasSubstr("\nloss dtype\n  runs:    "));
    EXPECT_THAT(explain_stack(s), ::testing::HasSubstr(fmt::format(
                                      "  planned: --loss-dtype {}\n", name(want))));
    TrainPlanOptions o;
    o.batch = 4;
    o.seq = 16;
    apply_stack(s, o);
    ASSERT_TRUE(o.stack);
    EXPECT_THAT(o.stack->not_modelled, ::testing::Not(::testing::Contains("loss dtype")));
    EXPECT_EQ(plan_training(c, mesh, preset("llama_fsdp"), o).loss_dtype, want);
    TrainPlanOptions fused;
    fused.batch = 4;
    fused.seq = 16;
    fused.fused_loss = true;
    apply_stack(s, fused, [](std::string_view option) {
      return option == "--loss" ? std::string("--loss") : std::string();
    });
    EXPECT_EQ(plan_training(c, mesh, preset("llama_fsdp"), fused).loss_dtype, DType::kF32);
  }
}

}  // namespace
}  // namespace shardplan
