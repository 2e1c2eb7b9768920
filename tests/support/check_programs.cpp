// Linked into every test executable (tests/CMakeLists.txt): each program compile() makes while a
// test runs is checked for one source of truth. The text must print, for every value a kernel
// step computes and for every input, the sharding and pending sum that step runs with (rebuilt
// here from the step itself, not from what the text is printed from), and each kernel step must
// run on the blocks of that sharding. A mismatch fails the running test, naming the value. The
// caching allocator model's events (src/train/allocation_events.hpp, which compile() no longer
// runs) must peak where the memory plan does, for every program, not only train-plan's.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <string>
#include <unordered_map>

#include "allocation_events.hpp"
#include "../../src/program/compiler/compile.hpp"
#include "../../src/program/ir/primitives.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {
namespace {

// What the text shows of a sharding and a pending sum: "PartitionSpec('x') pending sum over y".
std::string expected_layout(const PartitionSpec& spec, const Pending& pending) {
  std::string s = spec.to_string();
  if (!pending.empty()) {
    s += fmt::format(" pending {} over {}", to_string(pending.op), fmt::join(pending.axes, ", "));
  }
  return s;
}

// The value lines of the text by value name ("%3" -> its line).
std::unordered_map<std::string, std::string> value_lines(const std::string& text) {
  std::unordered_map<std::string, std::string> lines;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    if (line == "steps:") break;
    const auto name_start = line.find('%');
    const auto eq = line.find(" = ");
    if (name_start == std::string::npos || eq == std::string::npos || name_start > eq) continue;
    lines.emplace(line.substr(name_start, eq - name_start), line);
  }
  return lines;
}

// Whether `line` shows `layout` as its layout column: the layout, then spaces, then "<- ".
bool shows(const std::string& line, const std::string& layout) {
  const auto arrow = line.find(" <- ");
  if (arrow == std::string::npos) return false;
  std::size_t end = arrow;
  while (end > 0 && line[end - 1] == ' ') --end;
  return end >= layout.size() + 1 &&
         line.compare(end - layout.size(), layout.size(), layout) == 0 &&
         line[end - layout.size() - 1] == ' ';
}

void check(const Program& program) {
  const std::string text = program.text();
  const auto lines = value_lines(text);
  const Graph& g = program.graph();
  const auto expect_shown = [&](ValueId v, const std::string& layout, std::string_view what) {
    const auto it = lines.find(value_name(v));
    if (it == lines.end()) {
      ADD_FAILURE() << "the program text has no line for " << value_name(v) << "\n" << text;
    } else if (!shows(it->second, layout)) {
      ADD_FAILURE() << "the text shows " << value_name(v) << " otherwise than " << what
                    << " runs it (" << layout << "):\n"
                    << it->second << "\n"
                    << text;
    }
  };
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!n.is(prim::input)) continue;
    const auto k = static_cast<std::size_t>(n.attr<InputAttrs>().index);
    if (k >= program.input_shardings().size()) continue;
    expect_shown(value_id(i),
                 expected_layout(program.input_shardings()[k].spec(), program.input_pending(k)),
                 "the program binds");
  }
  for (const Step& st : program.steps()) {
    if (st.kind != Step::Kind::kKernel) continue;
    expect_shown(st.node, expected_layout(st.sharding->spec(), st.pending), "its kernel step");
    const Shape block = st.sharding->shard_shape(st.type.shape);
    if (!(st.local.type.shape == block)) {
      ADD_FAILURE() << "the step of " << value_name(st.node) << " runs on blocks "
                    << st.local.type.shape.to_string() << ", not its sharding's "
                    << block.to_string() << "\n"
                    << text;
    }
    // Every device's block (small meshes: the check is per device).
    if (st.sharding->mesh().size() <= 16 && st.blocks &&
        *st.blocks != st.sharding->device_blocks(st.type.shape)) {
      ADD_FAILURE() << "the step of " << value_name(st.node)
                    << " runs on other devices' blocks than its sharding gives\n"
                    << text;
    }
  }
  try {
    (void)reserved_bytes(program);  // throws when the two counts of live bytes disagree
  } catch (const Error& e) {
    ADD_FAILURE() << e.what() << "\n" << text;
  }
}

const bool installed = [] {
  set_compile_observer(&check);
  return true;
}();

}  // namespace
}  // namespace shardplan::detail
