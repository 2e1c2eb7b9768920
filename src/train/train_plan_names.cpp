// train-plan's option values by name: parse_* from the names the CLI and the stacks spell
// (--remat, --tp-plan, --cp-rotate, --cp-kernel, --float8-recipe, --float8-all-gather,
// --optimizer-kernel, --optimizer-sharding, --optimizer, sizes in bytes) and name() back.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "shardplan/remat.hpp"
#include "shardplan/train_plan.hpp"
#include "stack_remat.hpp"

namespace shardplan {

std::optional<RematPolicy> parse_remat(std::string_view text) {
  namespace cp = checkpoint_policies;
  if (text == "none") return std::nullopt;
  if (text == "full") return cp::nothing_saveable();
  if (text == "dots") return cp::dots_with_no_batch_dims_saveable();
  if (text.starts_with("names:")) {
    // names:a,b,c; an empty name (names:, names:a,,b) is not a form.
    std::vector<std::string> names;
    std::string_view rest = text.substr(6);
    for (std::size_t comma = 0; comma != std::string_view::npos;) {
      comma = rest.find(',');
      names.emplace_back(rest.substr(0, comma));
      if (comma != std::string_view::npos) rest = rest.substr(comma + 1);
    }
    if (std::none_of(names.begin(), names.end(), [](const auto& n) { return n.empty(); })) {
      return cp::save_only_these_names(std::move(names));
    }
  } else if (text.find(':') != std::string_view::npos) {
    const train::StackRematName& s = train::stack_remat_name(text);
    if (!s.policy) {
      throw SpecError(fmt::format("[train] remat policy '{}' cannot be planned: {} ({})", s.name,
                                  s.refusal, s.source));
    }
    return s.policy;
  }
  throw SpecError(fmt::format(
      "[train] unknown remat policy '{}' (known: none, full, dots, names:NAME,NAME..., "
      "STACK:NAME)",
      detail::printable(text)));
}

std::string remat_name(const std::optional<RematPolicy>& policy) {
  if (!policy) return "none";
  switch (policy->kind()) {
    case RematPolicy::Kind::kNothingSaveable:
      return "full";
    case RematPolicy::Kind::kDotsWithNoBatchDimsSaveable:
      return "dots";
    case RematPolicy::Kind::kSaveOnlyTheseNames:
      // A stack's list (it ignores the names a layer does not give) by its stack name.
      for (const train::StackRematName& s : train::stack_remat_names()) {
        if (policy->absent_names_ignored() && s.policy == policy) return std::string(s.name);
      }
      return fmt::format("names:{}", fmt::join(policy->names(), ","));
    default:
      return policy->to_string();
  }
}

namespace {
// An option's value and its name, as the CLI, the stacks and the report spell it.
template <class E>
struct Named {
  E value;
  std::string_view name;
};

// Each enum's values by name, in the order an unknown name's error lists them.
constexpr Named<TpPlan> kTpPlans[] = {{TpPlan::kPartitioner, "partitioner"},
                                      {TpPlan::kModules, "modules"}};
constexpr Named<RingRotate> kRingRotates[] = {{RingRotate::kPermute, "permute"},
                                              {RingRotate::kAllGather, "allgather"}};
constexpr Named<ContextKernel> kContextKernels[] = {{ContextKernel::kRing, "ring"},
                                                    {ContextKernel::kAllGatherKv, "allgather-kv"},
                                                    {ContextKernel::kUlysses, "ulysses"}};
constexpr Named<Float8Scaling> kFloat8Recipes[] = {
    {Float8Scaling::kTensorwise, "tensorwise"},
    {Float8Scaling::kRowwise, "rowwise"},
    {Float8Scaling::kRowwiseWithGwHp, "rowwise_with_gw_hp"}};
constexpr Named<Float8Gather> kFloat8Gathers[] = {{Float8Gather::kFloat8, "float8"},
                                                  {Float8Gather::kBf16, "bf16"}};
constexpr Named<OptimizerKernel> kOptimizerKernels[] = {{OptimizerKernel::kOps, "ops"},
                                                        {OptimizerKernel::kFused, "fused"},
                                                        {OptimizerKernel::kForeach, "foreach"}};
constexpr Named<OptimizerSharding> kOptimizerShardings[] = {{OptimizerSharding::kRules, "rules"},
                                                            {OptimizerSharding::kZero1, "zero1"}};
constexpr Named<DpOverlap> kDpOverlaps[] = {{DpOverlap::kFsdp, "fsdp"},
                                            {DpOverlap::kOff, "off"},
                                            {DpOverlap::kBuckets, "buckets"},
                                            {DpOverlap::kGradBuckets, "grad-buckets"}};
constexpr Named<OptimizerKind> kOptimizers[] = {{OptimizerKind::kSgd, "sgd"},
                                                {OptimizerKind::kAdam, "adam"},
                                                {OptimizerKind::kAdamw, "adamw"}};

template <class E, std::size_t N>
std::string_view name_in(const Named<E> (&table)[N], E value) {
  for (const Named<E>& n : table) {
    if (n.value == value) return n.name;
  }
  return table[0].name;  // not reached: every value is in its table (tested)
}

// The value named `text`, or SpecError "[train] unknown WHAT 'TEXT' (known: a, b, cNOTE)".
template <class E, std::size_t N>
E parse_in(const Named<E> (&table)[N], std::string_view text, std::string_view what,
           std::string_view note = {}) {
  std::vector<std::string_view> names;
  for (const Named<E>& n : table) {
    if (n.name == text) return n.value;
    names.push_back(n.name);
  }
  throw SpecError(fmt::format("[train] unknown {} '{}' (known: {}{})", what,
                              detail::printable(text), fmt::join(names, ", "), note));
}
}  // namespace

TpPlan parse_tp_plan(std::string_view n) {
  return parse_in(kTpPlans, n, "tensor-parallel plan");
}
std::string_view name(TpPlan plan) { return name_in(kTpPlans, plan); }

RingRotate parse_ring_rotate(std::string_view n) {
  return parse_in(kRingRotates, n, "ring rotation",
                  "; PyTorch's \"alltoall\" rotate method is permute");
}
std::string_view name(RingRotate rotate) { return name_in(kRingRotates, rotate); }

ContextKernel parse_context_kernel(std::string_view n) {
  return parse_in(kContextKernels, n, "context-parallel kernel");
}
std::string_view name(ContextKernel kernel) { return name_in(kContextKernels, kernel); }

Float8Scaling parse_float8_recipe(std::string_view n) {
  return parse_in(kFloat8Recipes, n, "float8 recipe", ": torchao's Float8LinearRecipeName");
}
std::string_view name(Float8Scaling scaling) { return name_in(kFloat8Recipes, scaling); }

Float8Gather parse_float8_gather(std::string_view n) {
  return parse_in(kFloat8Gathers, n, "float8 all-gather dtype");
}
std::string_view name(Float8Gather gather) { return name_in(kFloat8Gathers, gather); }

OptimizerKernel parse_optimizer_kernel(std::string_view n) {
  return parse_in(kOptimizerKernels, n, "optimizer kernel");
}
std::string_view name(OptimizerKernel kernel) { return name_in(kOptimizerKernels, kernel); }

OptimizerSharding parse_optimizer_sharding(std::string_view n) {
  return parse_in(kOptimizerShardings, n, "optimizer sharding");
}
std::string_view name(OptimizerSharding sharding) {
  return name_in(kOptimizerShardings, sharding);
}

DpOverlap parse_dp_overlap(std::string_view n) {
  return parse_in(kDpOverlaps, n, "data-parallel overlap");
}
std::string_view name(DpOverlap overlap) { return name_in(kDpOverlaps, overlap); }

OptimizerKind parse_optimizer(std::string_view n) {
  return parse_in(kOptimizers, n, "optimizer");
}
std::string_view name(OptimizerKind kind) { return name_in(kOptimizers, kind); }

std::int64_t parse_bytes(std::string_view text) {
  const auto fail = [&](std::string_view why) -> std::int64_t {
    throw SpecError(fmt::format(
        "[bytes] '{}' {} (write a size like 80GiB, 80GB, 1.5TiB or 1000000)", text, why));
  };
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  const std::string number(text.substr(0, i));
  if (std::count(number.begin(), number.end(), '.') == static_cast<long>(number.size()) ||
      std::count(number.begin(), number.end(), '.') > 1) {  // no digit, or two points
    return fail("is not a size");
  }
  std::string unit(text.substr(i));
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  double scale = 0;
  static constexpr std::pair<const char*, double> kUnits[] = {
      {"", 1},       {"b", 1},        {"kb", 1e3},     {"mb", 1e6},     {"gb", 1e9},
      {"tb", 1e12},  {"kib", 0x1p10}, {"mib", 0x1p20}, {"gib", 0x1p30}, {"tib", 0x1p40},
      {"k", 0x1p10}, {"m", 0x1p20},   {"g", 0x1p30},   {"t", 0x1p40},
  };
  for (const auto& [u, s] : kUnits) {
    if (unit == u) scale = s;
  }
  if (scale == 0) return fail("has an unknown unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
  // strtod, not stod: a number too large for a double is +inf (refused below), not an
  // exception.
  const double value = std::strtod(number.c_str(), nullptr) * scale;
  if (!(value >= 1) || value >= 0x1p62) return fail("is out of range (1 byte to 4 EiB)");
  return static_cast<std::int64_t>(std::llround(value));
}

}  // namespace shardplan
