// The loss and gradients of the planned step: recomputation, the fused and the naive losses,
// loss parallelism, and the memory PyTorch's cross-entropy reserves.
#include "train_plan_test.hpp"

namespace shardplan {
namespace {

using namespace test;

// The step with each layer a checkpoint (every --remat policy) gives bitwise the gradients of
// the step without (the recomputed ops are the forward ops again), and the fused loss gives the
// unfused loss's gradients (the whole-graph differentiation, itself checked against finite
// differences in autodiff_test) to float rounding; sharded over four devices, every family.
TEST(LossAndGrads, RecomputationAndTheFusedLossGiveTheSameGradients) {
  for (const char* text : {kTinyLlama, kTinyGpt2, kTinyMixtral}) {
    const ModelConfig c = ModelConfig::parse(text);
    SCOPED_TRACE(c.model_type);
    const Executor exec(4);
    const Mesh mesh = Mesh::parse("fsdp:2,tp:2", 4);
    const Tree<Array> params = uniform_parameters(c, DType::kF32, 1, mesh, exec);
    const auto [tokens, targets] = tokens_and_targets(Shape{4, 8}, mesh, P("fsdp"), exec);
    const auto run = [&](std::optional<RematPolicy> remat, bool fused_loss) {
      const train::ModelStep model{.config = c,
                                   .layout = train::Layout{{"fsdp"}, {"tp"}, 2, 2},
                                   .remat = std::move(remat),
                                   .fused_loss = fused_loss};
      return sjit(mesh, [&](const Tree<Array>& p, const Array& x, const Array& y) {
        auto [loss, grads] = train::loss_and_grads(model, p, x, y);
        return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
      })(params, tokens, targets);
    };
    const Tree<Array> plain = run(std::nullopt, true);
    const double loss = plain.at("loss").leaf().to_host().get(0);
    EXPECT_NEAR(loss, std::log(static_cast<double>(c.vocab)), 1.0);  // near uniform at the start
    const auto a = plain.at("grads").flatten();
    ASSERT_EQ(a.size(), c.parameters(DType::kF32).num_leaves());
    const std::string names = c.family_name() == "gpt2"      ? "names:mlpwi,context"
                              : c.family_name() == "mixtral" ? "names:context,out_proj"
                                                                  : "names:mlpwi_0,mlpwi_1,context";
    for (const char* form : {"full", "dots", names.c_str()}) {
      SCOPED_TRACE(form);
      const Tree<Array> rec = run(parse_remat(form), true);
      EXPECT_TRUE(rec.at("loss").leaf().to_host().bit_equal(plain.at("loss").leaf().to_host()));
      const auto b = rec.at("grads").flatten();
      ASSERT_EQ(a.size(), b.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(a[i].first, b[i].first);
        EXPECT_TRUE(a[i].second.to_host().bit_equal(b[i].second.to_host())) << a[i].first;
      }
    }
    const Tree<Array> naive = run(std::nullopt, false);
    EXPECT_NEAR(naive.at("loss").leaf().to_host().get(0), loss, 1e-5);
    const auto b = naive.at("grads").flatten();
    double largest = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const auto x = a[i].second.to_host().to_doubles(), y = b[i].second.to_host().to_doubles();
      ASSERT_EQ(x.size(), y.size());
      for (std::size_t k = 0; k < x.size(); ++k) {
        largest = std::max(largest, std::abs(x[k]));
        ASSERT_NEAR(x[k], y[k], 1e-5 + 1e-4 * std::abs(x[k])) << a[i].first << " [" << k << "]";
      }
    }
    EXPECT_GT(largest, 1e-3);  // the gradients are not all zero
  }
}

// In bf16, the naive loss (the logits taken to f32, whose cotangent is cast back by a kernel of
// its own, as PyTorch's eager .float()) gives the fused loss's loss and gradients.
TEST(LossAndGrads, TheNaiveLossInBf16GivesTheFusedLossGradients) {
  const ModelConfig c = ModelConfig::parse(kTinyLlama);
  const Executor exec(1);
  const Mesh mesh = Mesh::parse("fsdp:1,tp:1", 1);
  const Tree<Array> params = uniform_parameters(c, DType::kBF16, 5, mesh, exec);
  const auto [tokens, targets] = tokens_and_targets(Shape{2, 8}, mesh, P(), exec);
  const auto run = [&](bool fused_loss) {
    const train::ModelStep model{.config = c, .layout = train::Layout{}, .fused_loss = fused_loss};
    return to_host(sjit(mesh, [&](const Tree<Array>& p, const Array& x, const Array& y) {
      auto [loss, grads] = train::loss_and_grads(model, p, x, y);
      return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
    })(params, tokens, targets));
  };
  const Tree<Tensor> naive = run(false), fused = run(true);
  EXPECT_NEAR(naive.at("loss").leaf().get(0), fused.at("loss").leaf().get(0), 1e-3);
  const auto a = naive.at("grads").flatten(), b = fused.at("grads").flatten();
  ASSERT_EQ(a.size(), b.size());
  double largest = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].second.dtype(), DType::kBF16) << a[i].first;
    const auto x = a[i].second.to_doubles(), y = b[i].second.to_doubles();
    for (std::size_t k = 0; k < x.size(); ++k) {
      largest = std::max(largest, std::abs(x[k]));
      ASSERT_NEAR(x[k], y[k], 1e-3 + 2e-2 * std::abs(y[k])) << a[i].first << " [" << k << "]";
    }
  }
  EXPECT_GT(largest, 1e-3);
}

// With tensor parallelism the naive loss runs as DTensor's loss_parallel: the same loss and
// gradients as the unsplit formulation (one device), and its backward pass holds one more f32
// copy of the logits: four at its peak (x, grad_input, exp(x) or the product, their sum), where
// the unsplit loss holds three. On tp:4 with the head split along the vocabulary, 2 x 64 tokens
// and 4,096 classes: each copy is 128 x 1,024 x 4 bytes = 512 KiB a device.
TEST(LossAndGrads, LossParallelHoldsFourCopiesOfTheLogits) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 4096,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2})");
  // Loss and gradients of the whole step: tp:4 (loss parallel) against one device.
  const auto run = [&](const char* axes, int n, const train::Layout& layout) {
    const Executor exec(n);
    const Mesh mesh = Mesh::parse(axes, n);
    const Tree<Array> params = uniform_parameters(c, DType::kF32, 11, mesh, exec);
    const auto [x, y] = tokens_and_targets(Shape{2, 8}, mesh, PartitionSpec(), exec);
    const train::ModelStep model{.config = c, .layout = layout, .fused_loss = false};
    return to_host(sjit(mesh, [&](const Tree<Array>& p, const Array& a, const Array& b) {
      auto [loss, grads] = train::loss_and_grads(model, p, a, b);
      return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
    })(params, x, y));
  };
  const Tree<Tensor> one = run("fsdp:1,tp:1", 1, train::Layout{});
  const Tree<Tensor> four = run("fsdp:1,tp:4", 4, train::Layout{{"fsdp"}, {"tp"}, 1, 4});
  EXPECT_NEAR(four.at("loss").leaf().get(0), one.at("loss").leaf().get(0), 1e-5);
  const auto a = four.at("grads").flatten(), b = one.at("grads").flatten();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto u = a[i].second.to_doubles(), v = b[i].second.to_doubles();
    ASSERT_EQ(u.size(), v.size()) << a[i].first;
    for (std::size_t k = 0; k < u.size(); ++k) {
      ASSERT_NEAR(u[k], v[k], 1e-5 + 1e-4 * std::abs(v[k])) << a[i].first << " [" << k << "]";
    }
  }

  // The loss's peak alone: the gradient of the loss with respect to the head's input h, split
  // over tp:4 against one device with a quarter of the vocabulary (the same local logits, taken
  // whole by PyTorch's cross_entropy: three copies).
  const auto peak = [&](const train::Layout& layout, const Mesh& mesh, std::int64_t vocab) {
    const train::ModelStep model{.config = c, .layout = layout, .fused_loss = false};
    auto f = sjit(mesh, [&](const Array& norm, const Array& head, const Array& h, const Array& y) {
      const Tree<Array> rest = Tree<Array>::dict(
          {{"model", Tree<Array>::dict({{"norm", Tree<Array>::dict({{"weight", Tree<Array>(norm)}})}})},
           {"lm_head", Tree<Array>::dict({{"weight", Tree<Array>(head)}})}});
      return value_and_grad([&](const Array& x) { return model.loss(rest, x, y); })(h).second;
    }, SjitOptions{.in_shardings = RuleTree::list({RuleTree(P()), RuleTree(P("tp")),
                                                   RuleTree(P()), RuleTree(P())}),
                   .count_constants = false});  // as train-plan plans (an iota is folded)
    return f.lower(TensorSpec{Shape{32}, DType::kF32}, TensorSpec{Shape{vocab, 32}, DType::kF32},
                   TensorSpec{Shape{2, 64, 32}, DType::kF32}, TensorSpec{Shape{2, 64}, DType::kI32})
        .cost();
  };
  const ProgramCost split = peak(train::Layout{{"fsdp"}, {"tp"}, 1, 4}, Mesh::parse("fsdp:1,tp:4", 4), 4096);
  const ProgramCost whole = peak(train::Layout{}, Mesh::parse("fsdp:1,tp:1", 1), 1024);
  constexpr std::int64_t kCopy = 128 * 1024 * 4;
  // One copy more, give or take the per-token vectors ([2, 64] f32, 512 B) each formulation
  // holds beside it (the unsplit one sums the cotangent over the vocabulary, for instance).
  EXPECT_NEAR(static_cast<double>(split.peak_bytes[0] - whole.peak_bytes[0]), kCopy, 4 * 512);
  ASSERT_GE(split.timeline.live_at_peak.size(), 5u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(split.timeline.live_at_peak[static_cast<std::size_t>(i)].type, "f32[2, 64, 4096]");
    EXPECT_EQ(split.timeline.live_at_peak[static_cast<std::size_t>(i)].bytes, kCopy);
  }
  EXPECT_LT(split.timeline.live_at_peak[4].bytes, kCopy);
}

// The naive losses (eager_cross_entropy on one device, loss_parallel on tp:4) follow the losses'
// label rule (docs/sjit.md "Losses' labels"): an ignored target (-100) gives 0 and no gradient
// (the head input's rows of those tokens exactly 0), the others the fused loss's (one-hot)
// cross-entropy; a target outside the vocabulary is a named error.
TEST(LossAndGrads, TheNaiveLossesFollowTheLabelRule) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 64,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 2})");
  const auto run = [&](const char* axes, int n, const train::Layout& layout, bool fused,
                       std::int32_t bad) {
    const Executor exec(n);
    const Mesh mesh = Mesh::parse(axes, n);
    std::vector<std::int32_t> ids;
    for (int i = 0; i < 16; ++i) ids.push_back((i * 7) % 64);
    ids[3] = ids[12] = -100;
    ids[9] = bad;
    const Array y = device_put(Tensor::from(Shape{2, 8}, ids), NamedSharding(mesh, P()), exec);
    const Array norm = device_put(Tensor::uniform(Shape{32}, DType::kF32, 1, 0.5, 1.5),
                                  NamedSharding(mesh, P()), exec);
    const Array head = device_put(Tensor::uniform(Shape{64, 32}, DType::kF32, 2, -1, 1),
                                  NamedSharding(mesh, layout.model_ways > 1 ? P("tp") : P()), exec);
    const Array h = device_put(Tensor::uniform(Shape{2, 8, 32}, DType::kF32, 3, -1, 1),
                               NamedSharding(mesh, P()), exec);
    const train::ModelStep model{.config = c, .layout = layout, .fused_loss = fused};
    return to_host(sjit(mesh, [&](const Array& nw, const Array& hw, const Array& x, const Array& t) {
      const Tree<Array> rest = Tree<Array>::dict(
          {{"model", Tree<Array>::dict({{"norm", Tree<Array>::dict({{"weight", Tree<Array>(nw)}})}})},
           {"lm_head", Tree<Array>::dict({{"weight", Tree<Array>(hw)}})}});
      auto [loss, grad] = value_and_grad([&](const Array& v) { return model.loss(rest, v, t); })(x);
      return Tree<Array>::dict({{"grad", Tree<Array>(grad)}, {"loss", Tree<Array>(loss)}});
    })(norm, head, h, y));
  };
  const train::Layout one{}, tp4{{"fsdp"}, {"tp"}, 1, 4};
  const Tree<Tensor> want = run("fsdp:1,tp:1", 1, one, true, 5);  // linear_cross_entropy
  for (const auto& [axes, n, layout] : {std::tuple{"fsdp:1,tp:1", 1, one},
                                        std::tuple{"fsdp:1,tp:4", 4, tp4}}) {
    SCOPED_TRACE(axes);
    const Tree<Tensor> got = run(axes, n, layout, false, 5);
    EXPECT_NEAR(got.at("loss").leaf().get(0), want.at("loss").leaf().get(0), 1e-5);
    const Tensor& g = got.at("grad").leaf();
    const Tensor& wg = want.at("grad").leaf();
    for (std::int64_t token = 0; token < 16; ++token) {
      for (std::int64_t d = 0; d < 32; ++d) {
        const std::int64_t k = token * 32 + d;
        if (token == 3 || token == 12) {
          ASSERT_EQ(g.get(k), 0.0) << token << ", " << d;  // exactly
        } else {
          ASSERT_NEAR(g.get(k), wg.get(k), 1e-6) << token << ", " << d;
        }
      }
    }
    EXPECT_THROW_WITH(run(axes, n, layout, false, 64), DeviceError,
                      "[cross_entropy] label 64 at index [1, 1]", "[0, 64)");
  }
}

// The naive loss on whole logits reserves what eager PyTorch's cross_entropy(pred.float(), labels)
// does, worked by hand in copies of the f32 logits (c): the head writes pred (bf16, c/2), .float()
// a copy (c), log_softmax its result (c, the one array kept); pred and the copy are freed, which
// leaves a hole of 1.5c under the result. The backward pass writes nll_loss's cotangent (c) in
// the hole's first c, then log_softmax's (c), which no hole holds: the segment grows by c. 3.5c
// reserved with expandable segments for 3c live. With a segment per cudaMalloc: pred's segment
// (c/2) and the copy's (c) are cached; nll_loss's cotangent reuses the copy's, log_softmax's
// backward takes a new one: 3.5c again. Writing x - max, exp and a one-hot array in the forward
// pass (log_softmax's and cross_entropy's ops) left no such hole: 3c with expandable segments.
TEST(LossAndGrads, NaiveLossReservesAsEagerPyTorchsCrossEntropy) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 32768,
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 2})");
  const Mesh mesh = Mesh::parse("fsdp:1", 1);
  const train::ModelStep model{.config = c, .layout = train::Layout{}, .fused_loss = false};
  auto f = sjit(mesh, [&](const Array& norm, const Array& head, const Array& h, const Array& y) {
    const Tree<Array> rest = Tree<Array>::dict(
        {{"model", Tree<Array>::dict({{"norm", Tree<Array>::dict({{"weight", Tree<Array>(norm)}})}})},
         {"lm_head", Tree<Array>::dict({{"weight", Tree<Array>(head)}})}});
    return value_and_grad([&](const Array& x) { return model.loss(rest, x, y); })(h).second;
  }, SjitOptions{.count_constants = false});
  const Lowered low =
      f.lower(TensorSpec{Shape{64}, DType::kBF16}, TensorSpec{Shape{32768, 64}, DType::kBF16},
              TensorSpec{Shape{1, 2048, 64}, DType::kBF16}, TensorSpec{Shape{1, 2048}, DType::kI32});
  const ProgramCost& cost = low.cost();
  const detail::ReservedBytes reserved = detail::reserved_bytes(detail::program_of(low));
  constexpr double kCopy = 2048.0 * 32768 * 4;  // 256 MiB
  // Beside the logits' arrays: the weights, h and its gradient, per-token vectors (a few MiB),
  // and the 20 MiB pages of an expandable segment.
  constexpr double kSlack = 32.0 * 1024 * 1024;
  EXPECT_NEAR(static_cast<double>(cost.peak_bytes[0]), 3 * kCopy, kSlack);
  EXPECT_NEAR(static_cast<double>(reserved.expandable), 3.5 * kCopy, kSlack);
  EXPECT_NEAR(static_cast<double>(reserved.segments), 3.5 * kCopy, kSlack);
}

}  // namespace
}  // namespace shardplan
