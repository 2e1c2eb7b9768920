#include "shardplan/rule_file.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <iterator>
#include <set>

#include "input_file.hpp"
#include "yaml_input.hpp"
#include "shardplan/error.hpp"
#include "shardplan/rules/logical_axis_rule.hpp"
#include "shardplan/rules/rule_table_sharding_rule.hpp"

namespace shardplan {
namespace detail {
// Generated at build time from rules/presets/*.yaml (cmake/embed_files.cmake).
const std::vector<std::pair<std::string_view, std::string_view>>& embedded_presets();
}  // namespace detail

namespace {

class Parser {
 public:
  explicit Parser(std::string_view source) : source_(source) {}

  [[noreturn]] void fail(const YAML::Node& at, const std::string& what) const {
    const YAML::Mark m = at.Mark();
    if (m.line >= 0) throw IoError(fmt::format("[rules] {}:{}: {}", source_, m.line + 1, what));
    throw IoError(fmt::format("[rules] {}: {}", source_, what));
  }

  static std::string describe(const YAML::Node& n) {
    switch (n.Type()) {
      case YAML::NodeType::Null: return "null";
      case YAML::NodeType::Scalar: return fmt::format("'{}'", n.Scalar());
      case YAML::NodeType::Sequence: return "a list";
      case YAML::NodeType::Map: return "a mapping";
      default: return "nothing";
    }
  }

  /// Keys of a mapping, checking for duplicates and unknown keys.
  void check_keys(const YAML::Node& map, const std::set<std::string>& allowed,
                  std::string_view what) const {
    std::set<std::string> seen;
    for (const auto& kv : map) {
      if (!kv.first.IsScalar()) fail(kv.first, fmt::format("{}: keys must be strings", what));
      const std::string key = kv.first.Scalar();
      if (!seen.insert(key).second) fail(kv.first, fmt::format("{}: duplicate key '{}'", what, key));
      if (!allowed.empty() && !allowed.count(key)) {
        std::string names;
        for (const auto& a : allowed) names += (names.empty() ? "" : ", ") + a;
        fail(kv.first, fmt::format("{}: unknown key '{}'; expected one of {}", what, key, names));
      }
    }
  }

  std::string string(const YAML::Node& n, std::string_view what) const {
    if (!n.IsScalar()) fail(n, fmt::format("expected {} as a string, got {}", what, describe(n)));
    return n.Scalar();
  }

  /// An axis name: a plain non-empty scalar.
  std::string axis(const YAML::Node& n, std::string_view what) const {
    if (!n.IsScalar() || n.Scalar().empty()) {
      fail(n, fmt::format("expected {} (a mesh axis name), got {}", what, describe(n)));
    }
    return n.Scalar();
  }

  PartitionSpec spec(const YAML::Node& n) const {
    if (!n.IsSequence()) {
      fail(n, fmt::format("expected a spec: a list with one entry per dimension (null, an axis "
                          "name, or a list of axis names), got {}",
                          describe(n)));
    }
    std::vector<AxisNames> dims;
    for (const auto& e : n) {
      if (e.IsNull()) {
        dims.emplace_back();
      } else if (e.IsScalar()) {
        dims.push_back({axis(e, "a spec entry")});
      } else if (e.IsSequence()) {
        AxisNames group;
        for (const auto& a : e) group.push_back(axis(a, "an axis name in a spec group"));
        dims.push_back(std::move(group));
      } else {
        fail(e, fmt::format("expected a spec entry (null, an axis name, or a list of axis names), "
                            "got {}",
                            describe(e)));
      }
    }
    return PartitionSpec(std::move(dims));
  }

  bool boolean(const YAML::Node& n, std::string_view what) const {
    bool v = false;
    if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v)) {
      fail(n, fmt::format("expected {} as true or false, got {}", what, describe(n)));
    }
    return v;
  }

  std::int64_t positive(const YAML::Node& n, std::string_view what) const {
    std::int64_t v = 0;
    if (!n.IsScalar() || !YAML::convert<std::int64_t>::decode(n, v) || v <= 0) {
      fail(n, fmt::format("expected {} as a positive integer, got {}", what, describe(n)));
    }
    return v;
  }

  RuleFile parse(std::string_view text) const {
    detail::check_yaml_depth(text, "rules", source_);
    YAML::Node root;
    try {
      root = YAML::Load(std::string(text));
    } catch (const YAML::ParserException& e) {
      throw IoError(fmt::format("[rules] {}:{}: not valid YAML: {}", source_, e.mark.line + 1, e.msg));
    } catch (const YAML::Exception& e) {
      throw IoError(fmt::format("[rules] {}: not valid YAML: {}", source_, e.what()));
    }
    RuleFile file;
    file.source = std::string(source_);
    if (!root.IsMap()) {
      fail(root, fmt::format("expected a mapping with 'rules' (and optionally mesh, strict, "
                             "fsdp_fallback, logical_axes, activations, axis_roles), got {}",
                             describe(root)));
    }
    check_keys(root,
               {"mesh", "strict", "rules", "fsdp_fallback", "logical_axes", "activations",
                "axis_roles"},
               "rule file");
    if (const auto n = root["mesh"]) file.mesh = string(n, "'mesh' (like \"fsdp:-1,tp:2\")");
    if (const auto n = root["strict"]) file.strict = boolean(n, "'strict'");
    const auto rules = root["rules"];
    if (!rules) fail(root, "missing 'rules': an ordered list of {match: REGEX, spec: SPEC}");
    if (!rules.IsSequence()) {
      fail(rules, fmt::format("expected 'rules' as a list of {{match: REGEX, spec: SPEC}}, got {}",
                              describe(rules)));
    }
    for (const auto& r : rules) {
      if (!r.IsMap()) fail(r, fmt::format("expected a rule {{match: REGEX, spec: SPEC}}, got {}", describe(r)));
      check_keys(r, {"match", "spec"}, "rule");
      if (!r["match"]) fail(r, "rule is missing 'match' (a regex over the tensor path)");
      if (!r["spec"]) fail(r, "rule is missing 'spec' (a list, one entry per dimension)");
      RuleFile::Rule rule;
      rule.match = string(r["match"], "'match' (a regex)");
      rule.spec = spec(r["spec"]);
      rule.line = r.Mark().line + 1;
      file.rules.push_back(std::move(rule));
    }
    if (const auto n = root["fsdp_fallback"]) {
      if (!n.IsMap()) fail(n, fmt::format("expected 'fsdp_fallback' as {{axis: NAME, min_size: N}}, got {}", describe(n)));
      check_keys(n, {"axis", "min_size"}, "fsdp_fallback");
      RuleFile::FsdpFallback f;
      if (n["axis"]) f.axis = axis(n["axis"], "'axis'");
      if (n["min_size"]) f.min_size = positive(n["min_size"], "'min_size'");
      file.fsdp_fallback = f;
    }
    if (const auto n = root["logical_axes"]) {
      if (!n.IsMap()) {
        fail(n, fmt::format("expected 'logical_axes' as a mapping of logical name -> mesh axis, "
                            "list of axes, or null, got {}",
                            describe(n)));
      }
      check_keys(n, {}, "logical_axes");
      for (const auto& kv : n) {
        const std::string name = kv.first.Scalar();
        const YAML::Node& v = kv.second;
        if (v.IsNull()) {
          file.logical_axes.emplace_back(name, std::nullopt);
        } else if (v.IsScalar()) {
          file.logical_axes.emplace_back(name, AxisNames{axis(v, "a mesh axis")});
        } else if (v.IsSequence()) {
          AxisNames group;
          for (const auto& a : v) group.push_back(axis(a, "a mesh axis"));
          file.logical_axes.emplace_back(name, std::move(group));
        } else {
          fail(v, fmt::format("logical axis '{}': expected a mesh axis, a list of axes or null, "
                              "got {}",
                              name, describe(v)));
        }
      }
    }
    if (const auto n = root["activations"]) activations(n, file);
    if (const auto n = root["axis_roles"]) axis_roles(n, file);
    return file;
  }

  /// `axis_roles:`, a mapping of mesh axis -> batch, model, context, pipeline or expert.
  void axis_roles(const YAML::Node& n, RuleFile& file) const {
    constexpr AxisRole kRoles[] = {AxisRole::kBatch, AxisRole::kModel, AxisRole::kContext,
                                   AxisRole::kPipeline, AxisRole::kExpert};
    if (!n.IsMap()) {
      fail(n, fmt::format("expected 'axis_roles' as a mapping of mesh axis -> role (batch, "
                          "model, context, pipeline or expert), got {}",
                          describe(n)));
    }
    check_keys(n, {}, "axis_roles");
    for (const auto& kv : n) {
      const std::string axis_name = axis(kv.first, "an axis_roles key");
      const std::string role = kv.second.IsScalar() ? kv.second.Scalar() : "";
      const auto* it = std::find_if(std::begin(kRoles), std::end(kRoles),
                                    [&](AxisRole r) { return name(r) == role; });
      if (it == std::end(kRoles)) {
        fail(kv.second, fmt::format("axis_roles: axis '{}': expected batch, model, context, "
                                    "pipeline or expert, got {}",
                                    axis_name, describe(kv.second)));
      }
      file.axis_roles.emplace_back(axis_name, *it);
    }
  }

  /// `activations:`, a mapping of name -> a list of logical axes (null: not sharded), each
  /// one of the file's logical_axes.
  void activations(const YAML::Node& n, RuleFile& file) const {
    if (!n.IsMap()) {
      fail(n, fmt::format("expected 'activations' as a mapping of activation name -> a list of "
                          "logical axes (null for a dimension not sharded), got {}",
                          describe(n)));
    }
    check_keys(n, {}, "activations");
    for (const auto& kv : n) {
      RuleFile::Activation a;
      a.name = kv.first.Scalar();
      a.line = kv.first.Mark().line + 1;
      const YAML::Node& v = kv.second;
      if (!v.IsSequence()) {
        fail(v, fmt::format("activation '{}': expected a list of logical axes, one per dimension "
                            "(null for a dimension not sharded), got {}",
                            a.name, describe(v)));
      }
      for (const auto& e : v) {
        if (e.IsNull()) {
          a.logical_axes.emplace_back();
          continue;
        }
        if (!e.IsScalar() || e.Scalar().empty()) {
          fail(e, fmt::format("activation '{}': expected a logical axis name or null, got {}",
                              a.name, describe(e)));
        }
        const std::string& axis = e.Scalar();
        const auto known = [&](const auto& entry) { return entry.first == axis; };
        if (std::none_of(file.logical_axes.begin(), file.logical_axes.end(), known)) {
          std::string names;
          for (const auto& [name, axes] : file.logical_axes)
            names += (names.empty() ? "" : ", ") + name;
          fail(e, fmt::format("activation '{}': unknown logical axis '{}' (logical_axes gives: {})",
                              a.name, axis, names.empty() ? std::string("none") : names));
        }
        a.logical_axes.push_back(axis);
      }
      file.activations.push_back(std::move(a));
    }
  }

 private:
  std::string_view source_;
};

}  // namespace

std::string_view name(AxisRole role) {
  switch (role) {
    case AxisRole::kBatch:
      return "batch";
    case AxisRole::kModel:
      return "model";
    case AxisRole::kContext:
      return "context";
    case AxisRole::kPipeline:
      return "pipeline";
    case AxisRole::kExpert:
      return "expert";
  }
  return "batch";
}

AxisRole default_axis_role(std::string_view axis) {
  if (axis == "tp" || axis == "model" || axis == "mp" || axis == "tensor") return AxisRole::kModel;
  if (axis == "cp" || axis == "context") return AxisRole::kContext;
  return AxisRole::kBatch;
}

AxisRole RuleFile::axis_role(std::string_view axis) const {
  for (const auto& [a, role] : axis_roles) {
    if (a == axis) return role;
  }
  return default_axis_role(axis);
}

RulePtr RuleFile::make_rule() const {
  std::vector<TreePathShardingRule::Entry> entries;
  entries.reserve(rules.size());
  for (const Rule& r : rules) entries.push_back({r.match, r.spec});
  std::shared_ptr<const TreePathShardingRule> table;
  try {
    table = std::make_shared<TreePathShardingRule>(entries, /*strict=*/false);
  } catch (const RuleError&) {
    // Find the bad pattern and name its line.
    for (const Rule& r : rules) {
      try {
        TreePathShardingRule one({{r.match, r.spec}}, false);
      } catch (const RuleError& e) {
        std::string what = e.what();
        const auto pos = what.find("bad regex");
        throw RuleError(fmt::format("[rules] {}:{}: {}", source, r.line,
                                    pos == std::string::npos ? what : what.substr(pos)));
      }
    }
    throw;
  }
  std::optional<FSDPShardingRule> fallback;
  if (fsdp_fallback)
    fallback.emplace(FSDPShardingRule::Options{.axis = fsdp_fallback->axis,
                                               .min_size = fsdp_fallback->min_size});
  std::optional<LogicalAxisRule> logical;
  if (!logical_axes.empty()) logical.emplace(logical_axes);
  std::vector<std::string> activation_axes;
  for (const Activation& a : activations) {
    for (const std::string& axis : a.logical_axes) {
      if (!axis.empty()) activation_axes.push_back(axis);
    }
  }
  return std::make_shared<RuleTableShardingRule>(source, std::move(table), std::move(fallback),
                                                 std::move(logical), strict,
                                                 std::move(activation_axes));
}

namespace {

/// A named activation's sharding: its logical axes' mesh axes, each dimension sharded only
/// where its size divides by them (so a sequence that does not split over tp stays whole).
class ActivationRule : public ShardingRule {
 public:
  ActivationRule(std::string source, RuleFile::Activation activation, std::vector<AxisNames> dims)
      : source_(std::move(source)), activation_(std::move(activation)), dims_(std::move(dims)) {}

  RuleDecision apply(const RuleInput& in) const override {
    const Shape& shape = in.tensor.shape;
    if (static_cast<std::size_t>(shape.rank()) != dims_.size()) {
      throw RuleError(fmt::format(
          "[rules] {}:{}: activation '{}' has {} logical axes [{}] but the value annotated with "
          "it has shape {} (rank {})",
          source_, activation_.line, activation_.name, dims_.size(),
          fmt::join(activation_.logical_axes, ", "), shape.to_string(), shape.rank()));
    }
    RuleDecision d;
    std::vector<AxisNames> dims = dims_;
    std::vector<std::string> whole;
    for (std::size_t i = 0; i < dims.size(); ++i) {
      std::int64_t ways = 1;
      for (const std::string& a : dims[i]) ways *= in.mesh.axis_size(a);
      if (shape[static_cast<int>(i)] % ways != 0) {
        whole.push_back(activation_.logical_axes[i]);
        dims[i].clear();
      }
    }
    d.spec = PartitionSpec(std::move(dims));
    d.reason = fmt::format("activation '{}' [{}]", activation_.name,
                           fmt::join(activation_.logical_axes, ", "));
    if (!whole.empty()) {
      d.reason +=
          fmt::format(", {} not sharded (the size does not divide)", fmt::join(whole, ", "));
    }
    return d;
  }
  std::string name() const override {
    return fmt::format("activation '{}' of {}", activation_.name, source_);
  }

 private:
  std::string source_;
  RuleFile::Activation activation_;
  std::vector<AxisNames> dims_;
};

}  // namespace

AxisNames RuleFile::logical_axis(std::string_view name, const LogicalMapping& bind) const {
  for (const LogicalMapping* m : {&bind, &logical_axes}) {
    for (const auto& [logical, axes] : *m) {
      if (logical == name) return axes.value_or(AxisNames{});
    }
  }
  return {};
}

std::map<std::string, RuleTree> RuleFile::activation_shardings(const Mesh& on_mesh,
                                                               const LogicalMapping& bind) const {
  LogicalMapping mapping = bind;
  mapping.insert(mapping.end(), logical_axes.begin(), logical_axes.end());
  const LogicalAxisRule logical(std::move(mapping));
  std::map<std::string, RuleTree> out;
  for (const Activation& a : activations) {
    std::vector<AxisNames> dims;
    try {
      dims = logical.to_mesh_spec(a.logical_axes).dims();
    } catch (const RuleError& e) {  // a logical axis named twice
      throw RuleError(
          fmt::format("[rules] {}:{}: activation '{}': {}", source, a.line, a.name, e.what()));
    }
    dims.resize(a.logical_axes.size());
    for (std::size_t i = 0; i < dims.size(); ++i) {
      for (const std::string& axis : dims[i]) {
        const auto& names = on_mesh.axis_names();
        if (std::find(names.begin(), names.end(), axis) != names.end()) continue;
        throw RuleError(fmt::format(
            "[rules] {}:{}: activation '{}': logical axis '{}' maps to mesh axis '{}', which the "
            "mesh {} does not have",
            source, a.line, a.name, a.logical_axes[i], axis, on_mesh.to_string()));
      }
    }
    out.emplace(a.name,
                RuleTree(RulePtr(std::make_shared<ActivationRule>(source, a, std::move(dims)))));
  }
  return out;
}

RuleFile parse_rule_file(std::string_view yaml, std::string_view source) {
  return Parser(source).parse(yaml);
}

RuleFile load_rule_file(const std::filesystem::path& file) {
  return parse_rule_file(detail::read_input_file(file, "rules"), file.string());
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, text] : detail::embedded_presets()) names.emplace_back(name);
  return names;
}

std::string_view preset_text(std::string_view name) {
  for (const auto& [file, text] : detail::embedded_presets()) {
    if (file == name || (file.size() == name.size() + 5 && file.substr(0, name.size()) == name &&
                         file.substr(name.size()) == ".yaml")) {
      return text;
    }
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw IoError(fmt::format("[rules] unknown preset '{}'; the presets are: {}", name,
                            known.empty() ? std::string("none") : known));
}

RuleFile load_preset(std::string_view name) {
  const std::string_view text = preset_text(name);
  std::string file(name);
  if (file.size() < 5 || file.substr(file.size() - 5) != ".yaml") file += ".yaml";
  return parse_rule_file(text, "preset:" + file);
}

}  // namespace shardplan
