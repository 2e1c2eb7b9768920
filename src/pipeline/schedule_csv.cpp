// torch.distributed.pipelining's schedule CSV (PipelineScheduleMulti._dump_csv / _load_csv): a row
// per rank, a cell per action spelled [stage][type][micro-batch] ("2F5", "1SEND_F0"), an empty
// cell an idle slot. torch infers each stage's rank from the row it appears in; so does this.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <map>
#include <optional>
#include <utility>

#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "shardplan/pipeline_schedule.hpp"

namespace shardplan::pipeline {

namespace {

constexpr int kMaxStages = 1 << 16;
constexpr int kMaxMicrobatches = 1'000'000;
constexpr std::size_t kMaxCells = 4'000'000;  // and simulate() takes 1,000,000 stage micro-batches

struct Where {
  std::string_view origin;
  int line = 0;
  int column = 0;
  [[noreturn]] void fail(const std::string& what) const {
    if (line == 0) throw IoError(fmt::format("[pipeline] {}: {}", detail::printable(origin), what));
    throw IoError(fmt::format("[pipeline] {}:{}:{}: {}", detail::printable(origin), line, column,
                              what));
  }
};

// A number of digits at the front of `s`, consumed; nullopt when there is none.
std::optional<long long> digits(std::string_view& s) {
  std::size_t n = 0;
  while (n < s.size() && s[n] >= '0' && s[n] <= '9') ++n;
  if (n == 0) return std::nullopt;
  long long v = 1LL << 40;  // past every bound (refused by the caller) when longer than 9 digits
  if (n <= 9) std::from_chars(s.data(), s.data() + n, v);
  s.remove_prefix(n);
  return v;
}

Action parse_action(std::string_view cell, const Where& at) {
  static constexpr std::array<std::pair<std::string_view, Op>, 8> kTypes = {
      {{"SEND_F", Op::kSendForward},
       {"RECV_F", Op::kRecvForward},
       {"SEND_B", Op::kSendBackward},
       {"RECV_B", Op::kRecvBackward},
       {"F", Op::kForward},
       {"B", Op::kBackward},
       {"I", Op::kBackwardInput},
       {"W", Op::kBackwardWeight}}};
  std::string_view s = cell;
  const auto stage = digits(s);
  if (!stage)
    at.fail(fmt::format("'{}' is not an action: it should be [stage][type][micro-batch], e.g. 2F0",
                        detail::printable(cell)));
  for (const std::string_view fsdp : {"UNSHARD", "RESHARD", "REDUCE_GRAD"})
    if (s.starts_with(fsdp))
      at.fail(fmt::format("'{}': FSDP's {} actions in a schedule are not modelled (the planner "
                          "places FSDP's gathers and reductions in each stage's program)",
                          detail::printable(cell), fsdp));
  const auto type = std::find_if(kTypes.begin(), kTypes.end(),
                                 [&](const auto& t) { return s.starts_with(t.first); });
  if (type == kTypes.end())
    at.fail(fmt::format("'{}' has no action type after its stage (F, B, I, W, SEND_F, RECV_F, "
                        "SEND_B or RECV_B)",
                        detail::printable(cell)));
  s.remove_prefix(type->first.size());
  const auto mb = digits(s);
  if (!mb || !s.empty())
    at.fail(fmt::format("'{}' does not end in its micro-batch number", detail::printable(cell)));
  if (*stage >= kMaxStages || *mb >= kMaxMicrobatches)
    at.fail(fmt::format("'{}': stages up to {} and micro-batches up to {}",
                        detail::printable(cell), kMaxStages - 1, kMaxMicrobatches - 1));
  return Action{type->second, static_cast<int>(*stage), static_cast<int>(*mb)};
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

}  // namespace

Schedule parse_csv(std::string_view text, std::string_view origin) {
  Schedule s;
  s.name = detail::printable(origin);
  std::map<int, std::pair<int, Where>> stage_rank;  // stage -> (rank, first seen at)
  bool has_transfers = false;
  std::size_t cells = 0;
  int line = 0;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    const std::string_view row = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line;
    const int rank = static_cast<int>(s.steps.size());
    s.steps.emplace_back();
    for (std::size_t start = 0; start <= row.size();) {
      const std::size_t comma = std::min(row.find(',', start), row.size());
      const std::string_view cell = trim(row.substr(start, comma - start));
      const Where at{origin, line, static_cast<int>(start) + 1};
      start = comma + 1;
      if (cell.empty()) continue;  // an idle slot
      if (++cells > kMaxCells) at.fail(fmt::format("more than {} actions", kMaxCells));
      const Action a = parse_action(cell, at);
      const auto [it, fresh] = stage_rank.emplace(a.stage, std::pair{rank, at});
      if (!fresh && it->second.first != rank)
        at.fail(fmt::format("stage {} is in row {} (rank {}) and in row {} (line {}): a stage is "
                            "on one rank",
                            a.stage, rank + 1, rank, it->second.first + 1,
                            it->second.second.line));
      s.microbatches = std::max(s.microbatches, a.microbatch + 1);
      has_transfers |= !is_compute(a.op);
      s.steps.back().push_back(Step{is_compute(a.op) ? Step::Kind::kCompute : Step::Kind::kTransfers,
                                    {a},
                                    false});
    }
  }
  while (!s.steps.empty() && s.steps.back().empty()) s.steps.pop_back();  // trailing blank lines
  const Where file{origin, 0, 0};
  if (s.steps.empty()) file.fail("no actions: a schedule CSV has a row of actions per rank");
  s.ranks = static_cast<int>(s.steps.size());
  s.stages = stage_rank.rbegin()->first + 1;
  for (int st = 0; st < s.stages; ++st) {
    const auto it = stage_rank.find(st);
    if (it == stage_rank.end())
      file.fail(fmt::format("stage {} has no action, but stage {} has: stages are numbered from 0 "
                            "along the pipeline",
                            st, s.stages - 1));
    s.stage_rank.push_back(it->second.first);
  }
  if (!has_transfers) s = with_transfers(std::move(s));
  check(s);
  return s;
}

std::string to_csv(const Schedule& s) {
  std::string out;
  for (const auto& steps : s.steps) {
    std::string row;
    for (const Step& step : steps)
      if (step.kind != Step::Kind::kTransfers)
        for (const Action& a : step.actions) row += (row.empty() ? "" : ",") + to_string(a);
    out += row + "\n";
  }
  return out;
}

}  // namespace shardplan::pipeline
