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

TpPlan parse_tp_plan(std::string_view n) {
  if (n == "partitioner") return TpPlan::kPartitioner;
  if (n == "modules") return TpPlan::kModules;
  throw SpecError(fmt::format("[train] unknown tensor-parallel plan '{}' (known: partitioner, "
                              "modules)",
                              detail::printable(n)));
}

std::string_view name(TpPlan plan) {
  return plan == TpPlan::kModules ? "modules" : "partitioner";
}

RingRotate parse_ring_rotate(std::string_view n) {
  if (n == "permute") return RingRotate::kPermute;
  if (n == "allgather") return RingRotate::kAllGather;
  throw SpecError(fmt::format("[train] unknown ring rotation '{}' (known: permute, allgather; "
                              "PyTorch's \"alltoall\" rotate method is permute)",
                              detail::printable(n)));
}

std::string_view name(RingRotate rotate) {
  return rotate == RingRotate::kAllGather ? "allgather" : "permute";
}

ContextKernel parse_context_kernel(std::string_view n) {
  for (const ContextKernel k :
       {ContextKernel::kRing, ContextKernel::kAllGatherKv, ContextKernel::kUlysses}) {
    if (n == name(k)) return k;
  }
  throw SpecError(fmt::format("[train] unknown context-parallel kernel '{}' (known: ring, "
                              "allgather-kv, ulysses)",
                              detail::printable(n)));
}

std::string_view name(ContextKernel kernel) {
  switch (kernel) {
    case ContextKernel::kAllGatherKv:
      return "allgather-kv";
    case ContextKernel::kUlysses:
      return "ulysses";
    case ContextKernel::kRing:
      break;
  }
  return "ring";
}

Float8Scaling parse_float8_recipe(std::string_view n) {
  for (const Float8Scaling s :
       {Float8Scaling::kTensorwise, Float8Scaling::kRowwise, Float8Scaling::kRowwiseWithGwHp}) {
    if (n == name(s)) return s;
  }
  throw SpecError(fmt::format("[train] unknown float8 recipe '{}' (known: tensorwise, rowwise, "
                              "rowwise_with_gw_hp: torchao's Float8LinearRecipeName)",
                              detail::printable(n)));
}

std::string_view name(Float8Scaling scaling) {
  switch (scaling) {
    case Float8Scaling::kRowwise:
      return "rowwise";
    case Float8Scaling::kRowwiseWithGwHp:
      return "rowwise_with_gw_hp";
    case Float8Scaling::kTensorwise:
      break;
  }
  return "tensorwise";
}

Float8Gather parse_float8_gather(std::string_view n) {
  if (n == "float8") return Float8Gather::kFloat8;
  if (n == "bf16") return Float8Gather::kBf16;
  throw SpecError(fmt::format("[train] unknown float8 all-gather dtype '{}' (known: float8, bf16)",
                              detail::printable(n)));
}

std::string_view name(Float8Gather gather) {
  return gather == Float8Gather::kBf16 ? "bf16" : "float8";
}

OptimizerKernel parse_optimizer_kernel(std::string_view n) {
  if (n == "ops") return OptimizerKernel::kOps;
  if (n == "fused") return OptimizerKernel::kFused;
  if (n == "foreach") return OptimizerKernel::kForeach;
  throw SpecError(fmt::format("[train] unknown optimizer kernel '{}' (known: ops, fused, foreach)",
                              detail::printable(n)));
}

std::string_view name(OptimizerKernel kernel) {
  switch (kernel) {
    case OptimizerKernel::kFused:
      return "fused";
    case OptimizerKernel::kForeach:
      return "foreach";
    case OptimizerKernel::kOps:
      break;
  }
  return "ops";
}

OptimizerSharding parse_optimizer_sharding(std::string_view n) {
  if (n == "rules") return OptimizerSharding::kRules;
  if (n == "zero1") return OptimizerSharding::kZero1;
  throw SpecError(fmt::format("[train] unknown optimizer sharding '{}' (known: rules, zero1)",
                              detail::printable(n)));
}

std::string_view name(OptimizerSharding sharding) {
  return sharding == OptimizerSharding::kZero1 ? "zero1" : "rules";
}

DpOverlap parse_dp_overlap(std::string_view n) {
  if (n == "fsdp") return DpOverlap::kFsdp;
  if (n == "off") return DpOverlap::kOff;
  if (n == "buckets") return DpOverlap::kBuckets;
  if (n == "grad-buckets") return DpOverlap::kGradBuckets;
  throw SpecError(fmt::format(
      "[train] unknown data-parallel overlap '{}' (known: fsdp, off, buckets, grad-buckets)",
      detail::printable(n)));
}

std::string_view name(DpOverlap overlap) {
  switch (overlap) {
    case DpOverlap::kFsdp:
      return "fsdp";
    case DpOverlap::kOff:
      return "off";
    case DpOverlap::kBuckets:
      return "buckets";
    case DpOverlap::kGradBuckets:
      return "grad-buckets";
  }
  return "fsdp";
}

OptimizerKind parse_optimizer(std::string_view n) {
  if (n == "sgd") return OptimizerKind::kSgd;
  if (n == "adam") return OptimizerKind::kAdam;
  if (n == "adamw") return OptimizerKind::kAdamw;
  throw SpecError(fmt::format("[train] unknown optimizer '{}' (known: sgd, adam, adamw)", n));
}

std::string_view name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kAdamw:
      break;
  }
  return "adamw";
}

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
