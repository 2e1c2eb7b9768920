#pragma once
// Inputs several test files share: small models, meshes, a user-written rule, temporary folders.
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardplan/mesh.hpp"
#include "shardplan/sharding_rule.hpp"
#include "shardplan/tensor_spec.hpp"
#include "shardplan/tree.hpp"

namespace shardplan::test {

/// One rule decision, as the planner asks for it.
inline RuleDecision decide(const ShardingRule& rule, std::string_view path, const TensorSpec& t,
                           const Mesh& mesh) {
  return rule.apply(RuleInput{path, t, mesh});
}

/// fsdp:4,tp:2 over 8 devices, the mesh the rule tests use.
inline const Mesh& fsdp_tp_mesh() {
  static const Mesh m = Mesh::parse("fsdp:4,tp:2", 8);
  return m;
}

/// x:4,y:2 over 8 devices, the mesh the planner tests use.
inline const Mesh& xy_mesh() {
  static const Mesh m = Mesh::parse("x:4,y:2", 8);
  return m;
}

inline TensorSpec bf16(Shape s) { return TensorSpec{std::move(s), DType::kBF16}; }

/// A train state: a step counter, two layers of parameters, and one optimizer moment (7 leaves).
inline Tree<TensorSpec> small_model() {
  using Data = Tree<TensorSpec>;
  const auto layer = [] {
    return Data::dict({{"w_in", bf16({64, 256})}, {"w_out", bf16({256, 64})}});
  };
  return Data::dict({
      {"step", TensorSpec{Shape{}, DType::kI32}},
      {"params", Data::dict({{"embed", bf16({1024, 64})}, {"h", Data::list({layer(), layer()})}})},
      {"opt_state", Data::dict({{"mu", bf16({1024, 64})}})},
  });
}

/// A rule written against the public interface only, as a user would: shards dim 0 over "x"
/// when the path (relative to where the rule is applied) starts with "h/". Its third entry
/// never decides anything.
class FirstDimUnderH : public ShardingRule {
 public:
  RuleDecision apply(const RuleInput& in) const override {
    RuleDecision d;
    if (in.path.substr(0, 2) == "h/") {
      d.spec = P("x");
      d.entry = 0;
      d.reason = "under h";
    } else {
      d.entry = 1;
      d.reason = "elsewhere";
    }
    return d;
  }
  std::string name() const override { return "FirstDimUnderH"; }
  std::vector<std::string> entry_labels() const override { return {"h/", "other", "never"}; }
};

/// A fresh folder under the system's temporary directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("shardplan_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// A rule file that uses every field.
inline constexpr const char* kSampleRules = R"(# a comment
mesh: "fsdp:-1,tp:2"
strict: false
rules:
  - {match: "attn/(q|k|v)/w$", spec: [tp, fsdp]}
  - match: "mlp/up"
    spec: [[fsdp, tp], null]
  - {match: "norm", spec: []}
fsdp_fallback: {axis: fsdp, min_size: 64}
logical_axes: {batch: data, mlp: tp, embed: null, heads: [tp]}
)";

}  // namespace shardplan::test
