#pragma once
// What the attention tests share (attention_test*.cpp): one device, random values, the inputs of
// one call and a sharded step under sjit.
#include <string>
#include <tuple>
#include <vector>

#include "shardplan/autodiff.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan::test {

struct One {
  Executor exec{1};
  Mesh mesh = Mesh::parse("x:1", 1);
  Array put(const Tensor& t) const { return device_put(t, NamedSharding(mesh, P()), exec); }
};

inline Tensor values(const Shape& s, DType dtype, std::uint64_t seed) {
  return Tensor::normal(s, dtype, seed);
}

struct Inputs {
  Array q, k, v;
  AttentionOptions o;
};

// The loss and gradients under sjit over `mesh` with q, k, v sharded as given.
inline std::vector<Tensor> sharded_step(const Mesh& mesh, const Executor& exec, const Inputs& in,
                                        const Tensor& w, const PartitionSpec& spec_q,
                                        const PartitionSpec& spec_kv, std::string* text = nullptr) {
  const auto put = [&](const Array& a, const PartitionSpec& s) {
    return device_put(a.to_host(), NamedSharding(mesh, s), exec);
  };
  const AttentionOptions o = in.o;
  auto step = sjit(mesh, [o](const Array& q, const Array& k, const Array& v, const Array& wt) {
    const Tree<Array> p = Tree<Array>::dict({{"q", q}, {"k", k}, {"v", v}});
    auto [loss, g] = value_and_grad([&](const Tree<Array>& t) {
      return sum(dot_product_attention(t.at("q").leaf(), t.at("k").leaf(), t.at("v").leaf(), o) *
                 wt);
    })(p);
    const Array y = dot_product_attention(q, k, v, o);
    return Tree<Array>::list({y, g.at("q"), g.at("k"), g.at("v")});
  });
  const auto args = std::make_tuple(put(in.q, spec_q), put(in.k, spec_kv), put(in.v, spec_kv),
                                    device_put(w, NamedSharding(mesh, spec_q), exec));
  if (text != nullptr)
    *text = std::apply([&](const auto&... x) { return step.lower(x...); }, args).text();
  const Tree<Array> r = std::apply([&](const auto&... x) { return step(x...); }, args);
  std::vector<Tensor> out;
  for (const Array& a : r.leaves()) out.push_back(a.to_host());
  return out;
}

}  // namespace shardplan::test
