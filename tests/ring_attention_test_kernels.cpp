// Context parallelism's other kernels (shard_map.hpp): all-gather of K/V (Llama 3) and Ulysses'
// all-to-all, against dot_product_attention over the whole sequence on one device, over 2 and 4
// devices, eagerly and under sjit; their collectives counted by hand; bad input named.
#include <string>

#include "ring_attention_test.hpp"
#include "shardplan/error.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using namespace ring_test;  // NOLINT: the suite's shared helpers

std::string what(bool causal, bool jit, int devices) {
  return std::string(causal ? "causal" : "not causal") + (jit ? ", sjit" : ", eager") + ", cp:" +
         std::to_string(devices);
}

// The output and dq are bit for bit whole-sequence attention's: each query row meets the same
// keys in the same order (the gathered K/V put back in the natural order, the causal mask given
// as the tokens' positions). dk and dv are the sum of the devices' partial gradients (the
// reduce-scatter), added in another order than one device's kernel adds them: float rounding.
TEST(AllGatherKvAttention, EqualsWholeSequenceAttention) {
  const Inputs in;
  for (const bool causal : {true, false}) {
    const Results want = reference(in, causal);
    for (const int devices : {2, 4}) {
      const Executor exec = Executor::process_local(devices);
      for (const bool jit : {false, true}) {
        const Results got = by_ring(in, causal, exec, devices, jit, RingRotate::kPermute,
                                    ContextKernel::kAllGatherKv);
        const std::string w = what(causal, jit, devices);
        EXPECT_EQ(max_diff(got.out, want.out), 0) << w << " output";
        EXPECT_EQ(max_diff(got.dq, want.dq), 0) << w << " dq";
        expect_close(got, want, 2e-5, w);
      }
    }
  }
}

// Each device attends over whole heads and the whole sequence: the values and the gradients are
// bit for bit one device's.
TEST(UlyssesAttention, IsWholeSequenceAttentionBitForBit) {
  const Inputs in;  // 4 query heads, 2 kv heads: over 2 devices only
  for (const bool causal : {true, false}) {
    const Results want = reference(in, causal);
    const Executor exec = Executor::process_local(2);
    for (const bool jit : {false, true}) {
      expect_bitwise(by_ring(in, causal, exec, 2, jit, RingRotate::kPermute,
                             ContextKernel::kUlysses),
                     want, what(causal, jit, 2));
    }
  }
}

TEST(UlyssesAttention, FourDevicesWithFourKvHeadsIsWholeSequenceAttentionBitForBit) {
  Inputs in;
  in.k = Tensor::uniform(Shape{kB, kT, kN, kH}, DType::kF32, 2, -1, 1);
  in.v = Tensor::uniform(Shape{kB, kT, kN, kH}, DType::kF32, 3, -1, 1);
  const Executor exec = Executor::process_local(4);
  for (const bool causal : {true, false}) {
    expect_bitwise(by_ring(in, causal, exec, 4, true, RingRotate::kPermute,
                           ContextKernel::kUlysses),
                   reference(in, causal), what(causal, true, 4));
  }
}

// The collectives of each kernel in one step (forward and backward), counted by hand for 4
// devices: all-gather of K/V gathers k and v (2 all-gathers) and reduce-scatters dk and dv (2);
// Ulysses moves q, k, v to the heads' split and the output back (4 all-to-alls), and the
// backward pass moves the output's cotangent and dq, dk, dv (4 more). Nothing else is sent.
TEST(ContextKernels, CollectivesCountedByHand) {
  Inputs in;
  in.k = Tensor::uniform(Shape{kB, kT, kN, kH}, DType::kF32, 2, -1, 1);
  in.v = in.k;
  const Executor exec = Executor::process_local(4);
  const Mesh m = Mesh::parse("cp:4", 4);
  const PartitionSpec spec = P(nullptr, "cp");
  const auto put = [&](const Tensor& t) { return device_put(t, NamedSharding(m, spec), exec); };
  const Array q = put(in.q), k = put(in.k), v = put(in.v), weights = put(in.w);
  struct Want {
    ContextKernel kernel;
    const char* composite;
    int gathers, scatters, all_to_alls;
  };
  for (const Want& w : {Want{ContextKernel::kAllGatherKv, composite::kAllGatherKvAttention, 2, 2, 0},
                        Want{ContextKernel::kUlysses, composite::kUlyssesAttention, 0, 0, 8}}) {
    // A weighted sum, so that the output's cotangent is no constant.
    auto f = sjit(m, [&](const Array& qq, const Array& kk, const Array& vv, const Array& ww) {
      const Tree<Array> p = Tree<Array>::list({Tree<Array>(qq), Tree<Array>(kk), Tree<Array>(vv)});
      auto [value, grads] = value_and_grad([&](const Tree<Array>& x) {
        return sum(context_parallel_attention(x.at(0).leaf(), x.at(1).leaf(), x.at(2).leaf(), m,
                                              spec, "cp", true, std::nullopt, RingRotate::kPermute,
                                              w.kernel) *
                   ww);
      })(p);
      return Tree<Array>::list({Tree<Array>(value), grads});  // the value: the output is used
    });
    int gathers = 0, scatters = 0, all_to_alls = 0, others = 0;
    for (const LoweredOp& op : f.lower(q, k, v, weights).ops()) {
      const bool gather = op.primitive == "pall_gather", scatter = op.primitive == "psum_scatter";
      const bool a2a = op.primitive == "pall_to_all";
      const bool other = op.primitive == "ppermute" || op.primitive == "psum";
      if ((gather || scatter || a2a) && op.composite != std::string(w.composite)) ++others;
      gathers += gather ? 1 : 0;
      scatters += scatter ? 1 : 0;
      all_to_alls += a2a ? 1 : 0;
      others += other ? 1 : 0;
    }
    EXPECT_EQ(gathers, w.gathers) << w.composite;
    EXPECT_EQ(scatters, w.scatters) << w.composite;
    EXPECT_EQ(all_to_alls, w.all_to_alls) << w.composite;
    EXPECT_EQ(others, 0) << w.composite;
  }
}

TEST(ContextKernels, BadInputIsNamed) {
  const Executor exec = Executor::process_local(4);
  const Mesh m = Mesh::parse("cp:4", 4);
  const PartitionSpec spec = P(nullptr, "cp");
  const auto put = [&](Shape s) {
    return device_put(Tensor::uniform(std::move(s), DType::kF32, 1, -1, 1), NamedSharding(m, spec),
                      exec);
  };
  // 4 query heads and 2 kv heads over 4 devices: the kv heads do not split.
  const Array q = put(Shape{1, 16, 4, 4}), k = put(Shape{1, 16, 2, 4});
  EXPECT_THROW_WITH(context_parallel_attention(q, k, k, m, spec, "cp", true, std::nullopt,
                                               RingRotate::kPermute, ContextKernel::kUlysses),
                    SpecError, "[ulysses_attention]", "4 query heads and 2 kv heads",
                    "4 devices of axis 'cp'");
  const Array q3 = put(Shape{1, 16, 3, 4});
  EXPECT_THROW_WITH(context_parallel_attention(q3, k, k, m, spec, "cp", true, std::nullopt,
                                               RingRotate::kPermute, ContextKernel::kAllGatherKv),
                    SpecError, "[allgather_kv_attention]", "multiple of kv heads");
  const Array odd = put(Shape{1, 4, 2, 4});  // blocks of 1 token: not two chunks
  EXPECT_THROW_WITH(context_parallel_attention(odd, odd, odd, m, spec, "cp", true, std::nullopt,
                                               RingRotate::kPermute, ContextKernel::kUlysses),
                    SpecError, "[ulysses_attention]", "even");
}

}  // namespace
}  // namespace shardplan
