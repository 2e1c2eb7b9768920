// linear_cross_entropy (ops.hpp): equal to cross_entropy(h @ w^T) in value and gradients (f64 to
// 1e-12, f32 to float rounding), sharded over data and vocabulary as on one device, a peak of
// at most 1/8 of the unfused loss's at a 128,256 vocabulary over 8,192 tokens, bad input named.
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "shardplan/autodiff.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/profiler.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"
#include "torch_reference.hpp"

namespace shardplan {
namespace {

Array unfused(const Array& h, const Array& w, const Array& labels) {
  const int r = h.shape().rank();
  Array logits = dot_general(h, w, DotDims{{}, {}, {r - 1}, {1}});
  if (logits.dtype() != DType::kF64) logits = astype(logits, DType::kF32);
  return cross_entropy(logits, labels);
}

struct Problem {
  Executor exec{8};
  Mesh mesh = Mesh::parse("data:2,model:4", 8);
  Array h, w, labels;
  Problem(DType dtype, const PartitionSpec& hs, const PartitionSpec& ws, std::int64_t b = 2,
          std::int64_t t = 12, std::int64_t d = 8, std::int64_t v = 40) {
    h = device_put(Tensor::uniform(Shape{b, t, d}, dtype, 3, -1, 1), NamedSharding(mesh, hs),
                   exec);
    w = device_put(Tensor::uniform(Shape{v, d}, dtype, 4, -1, 1), NamedSharding(mesh, ws), exec);
    Tensor l(Shape{b, t}, DType::kI32);
    for (std::int64_t i = 0; i < b * t; ++i) l.set(i, static_cast<double>((i * 7 + 3) % v));
    labels = device_put(l, NamedSharding(mesh, PartitionSpec()), exec);
  }
};

// Loss weighted per token (so that every token's gradient differs), with its gradients.
std::vector<Tensor> value_and_grads(const Problem& p, int chunks, bool fused) {
  const auto f = [&](const Tree<Array>& x) {
    const Array h = x.at("h").leaf(), w = x.at("w").leaf();
    const Array l = fused ? linear_cross_entropy(h, w, p.labels, chunks) : unfused(h, w, p.labels);
    const Array weight = astype(iota_like(l, 1, DType::kF32), l.dtype()) * 0.25 + 1.0;
    return sum(l * weight);
  };
  const Tree<Array> x = Tree<Array>::dict({{"h", Tree<Array>(p.h)}, {"w", Tree<Array>(p.w)}});
  auto [v, g] = value_and_grad(f)(x);
  return {v.to_host(), g.at("h").leaf().to_host(), g.at("w").leaf().to_host()};
}

void expect_close(const std::vector<Tensor>& a, const std::vector<Tensor>& b, double rel,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].shape(), b[i].shape()) << what;
    for (std::int64_t k = 0; k < a[i].shape().numel(); ++k) {
      const double x = a[i].get(k), y = b[i].get(k);
      EXPECT_NEAR(x, y, rel * std::max(1.0, std::abs(y))) << what << ": output " << i << " [" << k << "]";
    }
  }
}

TEST(LinearCrossEntropy, EqualsTheUnfusedLossAndGradientsInF64) {
  const Problem p(DType::kF64, PartitionSpec(), PartitionSpec());
  const std::vector<Tensor> want = value_and_grads(p, 0, false);
  for (const int chunks : {0, 1, 3, 4, 12}) {
    expect_close(value_and_grads(p, chunks, true), want, 1e-12, std::to_string(chunks) + " chunks");
  }
}

TEST(LinearCrossEntropy, EqualsTheUnfusedLossInF32AndBf16) {
  const Problem p(DType::kF32, PartitionSpec(), PartitionSpec());
  expect_close(value_and_grads(p, 4, true), value_and_grads(p, 0, false), 2e-6, "f32");
  // bf16 hidden and weight: the logits are a bf16 product either way, the softmax in f32.
  const Problem q(DType::kBF16, PartitionSpec(), PartitionSpec());
  const Array fused = linear_cross_entropy(q.h, q.w, q.labels, 3);
  EXPECT_EQ(fused.dtype(), DType::kF32);
  expect_close({fused.to_host()}, {unfused(q.h, q.w, q.labels).to_host()}, 1e-6, "bf16");
}

// Tokens over `data`, the vocabulary over `model` (Megatron's vocab-parallel head): the chunks'
// max and sum are reduced over `model`, nothing gathers the tokens; equal to one device to
// float rounding (the vocabulary and token sums are split, and the GEMM's rounding depends on
// its row count).
TEST(LinearCrossEntropy, ShardedOverDataAndVocabulary) {
  const Problem whole(DType::kF32, PartitionSpec(), PartitionSpec());
  const std::vector<Tensor> want = value_and_grads(whole, 4, true);
  const Problem vocab(DType::kF32, P("data"), P("model"));
  expect_close(value_and_grads(vocab, 4, true), want, 2e-6, "vocab-parallel");
  const Problem data(DType::kF32, P("data"), PartitionSpec());
  expect_close(value_and_grads(data, 4, true), want, 2e-6, "data-parallel");
  // Under sjit: no collective moves hidden states (tokens stay on their devices).
  auto step = sjit(data.mesh, [&](const Array& h, const Array& w, const Array& l) {
    return value_and_grad([&](const Array& hh) { return sum(linear_cross_entropy(hh, w, l, 4)); })(h)
        .second;
  });
  const std::string text = step.lower(vocab.h, vocab.w, vocab.labels).text();
  EXPECT_EQ(text.find("reshard %0 ->"), std::string::npos) << text;
  EXPECT_NE(text.find("%0 = input 0"), std::string::npos) << text;
}

// A program says it holds the fused loss by the composite linear_cross_entropy declares on its
// ops (and their backward ops), not from a scope's name: a user's scope named
// "linear_cross_entropy" marks nothing (train-plan's "loss fused" reads this).
TEST(LinearCrossEntropy, ItsOpsAreTheCompositesAndAScopeOfItsNameIsNot) {
  const Problem data(DType::kF32, P("data"), PartitionSpec());
  auto fused = sjit(data.mesh, [&](const Array& h, const Array& w, const Array& l) {
    return value_and_grad([&](const Array& hh) { return sum(linear_cross_entropy(hh, w, l, 4)); })(h)
        .second;
  });
  int dots = 0, dots_in_composite = 0;
  for (const LoweredOp& op : fused.lower(data.h, data.w, data.labels).ops()) {
    if (op.primitive != "dot_general") continue;
    ++dots;
    dots_in_composite += op.composite == composite::kLinearCrossEntropy;
  }
  // Only h's gradient is asked for, so per group (4): the logits made again for the backward
  // pass (the forward's are dead) and the product giving h's gradient. All of them the loss's,
  // the one made again included (it is named as the one it remakes).
  EXPECT_EQ(dots, 2 * 4);
  EXPECT_EQ(dots_in_composite, dots);
  auto lookalike = sjit(data.mesh, [&](const Array& h, const Array& w) {
    const NamedScope scope("linear_cross_entropy");
    return matmul(h, transpose(w, {1, 0}));
  });
  for (const LoweredOp& op : lookalike.lower(data.h, data.w).ops()) {
    EXPECT_EQ(op.composite, "") << op.primitive;
  }
}

// The size: a 128,256 vocabulary over 8,192 tokens (hidden 256, f32, one device, the
// loss and its gradients), planned without allocating: the fused step's peak is at most 1/8 of
// the unfused one's (whose f32 logits alone are 8,192 x 128,256 x 4 B = 3.9 GiB).
TEST(LinearCrossEntropy, PeakIsAtMostAnEighthOfTheUnfusedLoss) {
  const Mesh mesh = Mesh::parse("x:1", 1);
  const TensorSpec h(Shape{1, 8192, 256}, DType::kF32), w(Shape{128256, 256}, DType::kF32);
  const TensorSpec labels(Shape{1, 8192}, DType::kI32);
  const auto peak = [&](bool fused) {
    auto step = sjit(mesh, [fused](const Array& hh, const Array& ww, const Array& l) {
      const auto f = [&](const Tree<Array>& x) {
        const Array a = x.at(0).leaf(), b = x.at(1).leaf();
        return mean(fused ? linear_cross_entropy(a, b, l) : unfused(a, b, l));
      };
      auto [v, g] = value_and_grad(f)(Tree<Array>::list({Tree<Array>(hh), Tree<Array>(ww)}));
      return Tree<Array>::list({Tree<Array>(v), g});
    });
    return step.lower(h, w, labels).cost().peak_bytes[0];
  };
  const std::int64_t fused = peak(true), plain = peak(false);
  EXPECT_GT(plain, 8192LL * 128256 * 4);
  EXPECT_LE(fused * 8, plain) << "fused " << fused << " B, unfused " << plain << " B";
}

// Against PyTorch (tests/data/fused_loss_reference.txt, scripts/gen_fused_loss_reference.py:
// torch.nn.functional.cross_entropy of h @ w^T and its autograd gradients in float64): f64 to
// 1e-12, f32 at float32 rounding (relative 2e-6), 3 groups and the default.
TEST(LinearCrossEntropy, EqualsPyTorch) {
  const auto ref = test::read_torch_reference("fused_loss_reference.txt");
  ASSERT_EQ(ref.size(), 2u);
  const Executor exec(1);
  const Mesh mesh = Mesh::parse("x:1", 1);
  for (const auto& [name, want] : ref) {
    const auto& hs = want.at("dh").shape;
    const std::int64_t b = hs[0], t = hs[1], d = hs[2], v = want.at("dw").shape[0];
    for (const DType dtype : {DType::kF64, DType::kF32}) {
      for (const int chunks : {3, 0}) {
        SCOPED_TRACE(fmt::format("{} {} {} groups", name, shardplan::name(dtype), chunks));
        const auto put = [&](const Tensor& x) { return device_put(x, NamedSharding(mesh, P()), exec); };
        Tensor l(Shape{b, t}, DType::kI32);
        for (std::int64_t i = 0; i < b * t; ++i) l.set(i, static_cast<double>((7 * i + 3) % v));
        const Array labels = put(l);
        const Tree<Array> x = Tree<Array>::dict(
            {{"h", Tree<Array>(put(test::formula(Shape{b, t, d}, dtype, 0.37, 0.11)))},
             {"w", Tree<Array>(put(test::formula(Shape{v, d}, dtype, 0.53, -0.2)))}});
        Array per_token;
        auto [value, g] = value_and_grad([&](const Tree<Array>& p) {
          per_token = linear_cross_entropy(p.at("h").leaf(), p.at("w").leaf(), labels, chunks);
          const Array weight = astype(iota_like(per_token, 1, DType::kF32), per_token.dtype()) * 0.25 + 1.0;
          return sum(per_token * weight);
        })(x);
        const double tol = dtype == DType::kF64 ? 1e-12 : 2e-6;
        const Tensor loss = linear_cross_entropy(x.at("h").leaf(), x.at("w").leaf(), labels, chunks).to_host();
        for (const auto& [key, got] : {std::pair{"loss", loss}, std::pair{"dh", g.at("h").leaf().to_host()},
                                       std::pair{"dw", g.at("w").leaf().to_host()}}) {
          const test::RefTensor& r = want.at(key);
          ASSERT_EQ(got.shape().dims(), r.shape) << key;
          for (std::size_t i = 0; i < r.v.size(); ++i) {
            EXPECT_NEAR(got.get(static_cast<std::int64_t>(i)), r.v[i], tol * std::max(1.0, std::abs(r.v[i])))
                << key << " [" << i << "]";
          }
        }
      }
    }
  }
}

TEST(LinearCrossEntropy, DefaultGroups) {
  EXPECT_EQ(linear_cross_entropy_chunks(Shape{2, 8192, 4}), 16);
  EXPECT_EQ(linear_cross_entropy_chunks(Shape{2, 12, 4}), 12);
  EXPECT_EQ(linear_cross_entropy_chunks(Shape{2, 51, 4}), 17);   // 3 x 17
  EXPECT_EQ(linear_cross_entropy_chunks(Shape{2, 2 * 67, 4}), 2);  // 67 > 64: the largest below 16
  EXPECT_EQ(linear_cross_entropy_chunks(Shape{4099, 4}), 1);     // prime
}

TEST(LinearCrossEntropy, BadInputIsNamed) {
  const Problem p(DType::kF32, PartitionSpec(), PartitionSpec());
  EXPECT_THROW_WITH(linear_cross_entropy(p.h, p.w, p.labels, 5), SpecError,
                    "[linear_cross_entropy]", "5 chunks do not divide the 12 tokens");
  const Array w2 = reshape(p.w, Shape{80, 4});
  EXPECT_THROW_WITH(linear_cross_entropy(p.h, w2, p.labels), SpecError, "f32[80, 4]",
                    "the weight's d (4)");
  const Array l2 = reshape(p.labels, Shape{24});
  EXPECT_THROW_WITH(linear_cross_entropy(p.h, p.w, l2), SpecError, "labels must be shaped [2, 12]");
  EXPECT_THROW_WITH(linear_cross_entropy(p.h, p.w, astype(p.labels, DType::kF32)), SpecError,
                    "labels must be i32");
  EXPECT_THROW_WITH(linear_cross_entropy(reshape(p.h, Shape{192}), p.w, p.labels), SpecError,
                    "rank 2 or more");
  EXPECT_THROW_WITH(linear_cross_entropy(p.h, reshape(p.w, Shape{40, 2, 4}), p.labels), SpecError,
                    "f32[40, 2, 4]", "the weight must be [vocab, d]");
  EXPECT_THROW_WITH(linear_cross_entropy(p.h, astype(p.w, DType::kF64), p.labels), SpecError,
                    "f64[40, 8]", "one dtype");
  EXPECT_THROW_WITH(linear_cross_entropy(astype(p.h, DType::kI32), astype(p.w, DType::kI32),
                                         p.labels),
                    SpecError, "i32[2, 12, 8]", "a float array");
  EXPECT_THROW_WITH(linear_cross_entropy(p.h, p.w, p.labels, -1), SpecError,
                    "-1 chunks do not divide");
}

// FSDP's layout: the tokens and the weight's vocabulary rows split over the same axis (fsdp:8),
// the mean loss differentiated under sjit: the loss and both gradients equal the unfused loss's
// (logits written whole, cross_entropy) computed eagerly on replicated arrays, to float rounding.
TEST(LinearCrossEntropy, FsdpShardedUnderSjitEqualsTheUnfusedLoss) {
  Executor exec{8};
  const Mesh mesh = Mesh::parse("fsdp:8", 8);
  const Tensor h = Tensor::uniform(Shape{8, 32, 16}, DType::kF32, 5, -1, 1);
  const Tensor w = Tensor::uniform(Shape{64, 16}, DType::kF32, 6, -1, 1);
  Tensor labels(Shape{8, 32}, DType::kI32);
  for (std::int64_t i = 0; i < 8 * 32; ++i) labels.set(i, static_cast<double>((i * 11 + 5) % 64));
  const auto put = [&](const Tensor& t, const PartitionSpec& spec) {
    return device_put(t, NamedSharding(mesh, spec), exec);
  };
  const auto loss_and_grads = [](const Array& hh, const Array& ww, const Array& l, bool fused) {
    const auto f = [&](const Tree<Array>& x) {
      const Array a = x.at(0).leaf(), b = x.at(1).leaf();
      return mean(fused ? linear_cross_entropy(a, b, l, 4) : unfused(a, b, l));
    };
    auto [v, g] = value_and_grad(f)(Tree<Array>::list({Tree<Array>(hh), Tree<Array>(ww)}));
    return Tree<Array>::list({Tree<Array>(v), g});
  };
  auto step = sjit(mesh, [&](const Array& hh, const Array& ww, const Array& l) {
    return loss_and_grads(hh, ww, l, true);
  });
  const Tree<Array> got = step(put(h, P("fsdp")), put(w, P("fsdp")), put(labels, P("fsdp")));
  const Tree<Array> want =
      loss_and_grads(put(h, PartitionSpec()), put(w, PartitionSpec()), put(labels, PartitionSpec()),
                     false);
  const auto host = [](const Tree<Array>& t) {
    return std::vector<Tensor>{t.at(0).leaf().to_host(), t.at(1).at(0).leaf().to_host(),
                               t.at(1).at(1).leaf().to_host()};
  };
  expect_close(host(got), host(want), 2e-6, "fsdp");
}

}  // namespace
}  // namespace shardplan
