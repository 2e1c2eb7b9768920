// plan_html: the report as a self-contained HTML page. Expectations are written out by hand from
// the mesh layout (device id = row-major mesh position), not taken from the page itself.
#include "shardplan/plan_html.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "shardplan/error.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using namespace shardplan::test;  // NOLINT: test fixtures
using Data = Tree<TensorSpec>;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

std::size_t count(const std::string& text, std::string_view part) {
  std::size_t n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

struct DrawnBar {
  double height = 0;
  std::string title;
};

std::vector<DrawnBar> bars_of(const std::string& html) {
  static const std::regex bar(
      R"re(<rect class="bar" x="[-0-9.]+" y="[-0-9.]+" width="[0-9.]+" height="([0-9.]+)"[^>]*><title>([^<]*)</title>)re");
  std::vector<DrawnBar> out;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), bar); it != std::sregex_iterator();
       ++it) {
    out.push_back({std::stod((*it)[1].str()), (*it)[2].str()});
  }
  return out;
}

/// Each tensor's figure, in page order.
std::vector<std::string> figures_of(const std::string& html) {
  std::vector<std::string> out;
  const std::string open = "<figure class=\"tensor\">";
  for (auto at = html.find(open); at != std::string::npos;) {
    const auto end = html.find("</figure>", at);
    out.push_back(html.substr(at, end - at));
    at = html.find(open, end);
  }
  return out;
}

/// The tooltip of each block of a figure, in drawing order (row by row).
std::vector<std::string> block_titles(const std::string& figure) {
  static const std::regex block(R"re(<rect class="block"[^>]*><title>([^<]*)</title>)re");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(figure.begin(), figure.end(), block);
       it != std::sregex_iterator(); ++it) {
    out.push_back((*it)[1].str());
  }
  return out;
}

/// A report with the given bytes per device and no leaves.
PlanReport device_only_report(const Mesh& mesh, std::vector<std::int64_t> bytes) {
  PlanReport r{mesh, {}, std::move(bytes), 0, {}, {}};
  return r;
}

TEST(PlanHtml, TitleIsEscapedInTheTitleAndTheHeading) {
  const PlanReport report =
      MeshShardingHelper(xy_mesh()).plan(RuleTree(Replicated{}), small_model());
  const std::string html = plan_html(report, "shardplan: m<1> & 'x' on \"y\"</title>");
  const std::string escaped =
      "shardplan: m&lt;1&gt; &amp; &#39;x&#39; on &quot;y&quot;&lt;/title&gt;";
  EXPECT_THAT(html, HasSubstr("<title>" + escaped + "</title>"));
  EXPECT_THAT(html, HasSubstr("<h1>" + escaped + "</h1>"));
  EXPECT_EQ(count(html, "<title>shardplan"), 1u);
  EXPECT_THAT(html, HasSubstr("Mesh(&#39;x&#39;: 4, &#39;y&#39;: 2) · 8 devices"));
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_TRUE(html.ends_with("</html>\n"));
}

TEST(PlanHtml, SummaryGivesTotalMinMaxAndTensorCount) {
  // Three replicated bf16 leaves on 8 devices, plus an unspecified one that no device holds.
  const Data data = Data::dict({{"a", bf16({1024, 512})},   // 1 MiB
                                {"b", bf16({1024, 1024})},  // 2 MiB
                                {"c", bf16({512})},         // 1 KiB
                                {"d", bf16({2048, 1024})}});
  const RuleTree rules = RuleTree::dict(
      {{"a", Replicated{}}, {"b", P("x")}, {"c", Replicated{}}, {"d", Unspecified{}}});
  const PlanReport report = MeshShardingHelper(xy_mesh()).plan(rules, data);
  const std::string html = plan_html(report, "t");
  const auto from = html.find("<dl class=\"summary\">");
  ASSERT_NE(from, std::string::npos);
  const std::string summary = html.substr(from, html.find("</dl>", from) - from);
  EXPECT_THAT(summary, HasSubstr("<dd>7.00 MiB</dd>"));  // total: 1 + 2 + 4 MiB + 1 KiB
  // Every device holds 1 MiB + 2 MiB / 4 + 1 KiB, shown as 1.50 MiB.
  EXPECT_EQ(count(summary, "<dd>1.50 MiB</dd>"), 2u);  // max and min
  EXPECT_THAT(summary, HasSubstr("<dd>4</dd>"));       // tensors
}

TEST(PlanHtml, OneBarPerDeviceWithHeightsInProportion) {
  std::vector<std::int64_t> bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back((i + 1) * kMiB);
  const std::string html = plan_html(device_only_report(xy_mesh(), bytes), "t");
  EXPECT_EQ(count(html, "<rect class=\"bar\""), 8u);
  const auto bars = bars_of(html);
  ASSERT_EQ(bars.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(bars[static_cast<std::size_t>(i)].title,
              fmt::format("device {}: {}.00 MiB", i, i + 1));
    // Heights are written to a tenth of a pixel: bar i is (i + 1) / 8 of the tallest.
    EXPECT_NEAR(bars[static_cast<std::size_t>(i)].height * 8, bars[7].height * (i + 1), 1.0) << i;
  }
  // 8 MiB: power-of-two ticks of 2 MiB up to 8 MiB.
  for (const char* tick : {">0 B<", ">2.00 MiB<", ">4.00 MiB<", ">6.00 MiB<", ">8.00 MiB<"}) {
    EXPECT_THAT(html, HasSubstr(tick));
  }
  EXPECT_THAT(html, HasSubstr("Bytes each of the 8 devices holds: min 1.00 MiB, max 8.00 MiB."));
}

TEST(PlanHtml, A1024DeviceMeshIsDrawnAsAtMost64BarsOfEachGroupsLargest) {
  const Mesh mesh = Mesh::parse("data:1024", 1024);
  // In group k (devices 16k..16k+15), device 16k+5 holds k+1 MiB and the others 1 KiB.
  std::vector<std::int64_t> bytes(1024, 1024);
  for (int k = 0; k < 64; ++k) bytes[static_cast<std::size_t>(16 * k + 5)] = (k + 1) * kMiB;
  const std::string html = plan_html(device_only_report(mesh, bytes), "t");
  const auto bars = bars_of(html);
  ASSERT_EQ(bars.size(), 64u);
  for (int k = 0; k < 64; ++k) {
    EXPECT_EQ(bars[static_cast<std::size_t>(k)].title,
              fmt::format("devices {}–{}: largest {}.00 MiB", 16 * k, 16 * k + 15, k + 1));
  }
  EXPECT_THAT(html, HasSubstr("1024 devices drawn as 64 bars of 16 consecutive device ids; each "
                              "bar shows the largest of its group"));
  EXPECT_THAT(html, HasSubstr("device id (first of each group of 16)"));
}

TEST(PlanHtml, EveryMeshSizeFitsIn64BarsCoveringEveryDevice) {
  for (const std::int64_t n : {1, 63, 64, 65, 100, 1000, 4096, 1 << 20}) {
    const Mesh mesh = Mesh::parse(fmt::format("d:{}", n), n);
    const std::string html = plan_html(
        device_only_report(mesh, std::vector<std::int64_t>(static_cast<std::size_t>(n), 1)), "t");
    const std::int64_t group = (n + 63) / 64;
    const auto bars = bars_of(html);
    ASSERT_EQ(static_cast<std::int64_t>(bars.size()), (n + group - 1) / group) << n;
    EXPECT_LE(bars.size(), 64u);
    EXPECT_EQ(bars.front().title.rfind(group == 1 ? "device 0:" : "devices 0–", 0), 0u) << n;
    EXPECT_THAT(bars.back().title, HasSubstr(fmt::format("{}: ", n - 1))) << n;
  }
}

TEST(PlanHtml, EscapesPathsRuleNamesLabelsAndBytesThatAreNotUtf8) {
  class Evil : public ShardingRule {
   public:
    RuleDecision apply(const RuleInput&) const override { return {P("x"), 0, "said <so>", false}; }
    std::string name() const override { return "Evil<rule>&\"'"; }
    std::vector<std::string> entry_labels() const override { return {"<all>", "<never>&"}; }
  };
  const Data data = Data::dict({{"w<&>\"'", bf16({64, 64})}, {"bad\xff", bf16({64, 64})}});
  const RuleTree rules(RulePtr(std::make_shared<Evil>()));
  const PlanReport report = MeshShardingHelper(xy_mesh()).plan(rules, data);
  const std::string html = plan_html(report, "t");
  EXPECT_THAT(html, HasSubstr("w&lt;&amp;&gt;&quot;&#39;"));
  EXPECT_THAT(html, HasSubstr("Evil&lt;rule&gt;&amp;&quot;&#39;"));
  EXPECT_THAT(html, HasSubstr("said &lt;so&gt;"));
  EXPECT_THAT(html, HasSubstr("&lt;never&gt;&amp;"));  // the unmatched entry
  EXPECT_THAT(html, HasSubstr("bad\xEF\xBF\xBD"));     // U+FFFD
  for (const char* raw : {"w<&>", "<rule>", "<so>", "<never>", "<all>", "bad\xff"}) {
    EXPECT_THAT(html, Not(HasSubstr(raw))) << raw;
  }
}

TEST(PlanHtml, IsSelfContained) {
  const RuleTree rules = RuleTree::dict(
      {{"step", Replicated{}}, {"params", P(nullptr, "y")}, {"opt_state", P("x", "y")}});
  const std::string html =
      plan_html(MeshShardingHelper(xy_mesh()).plan(rules, small_model()), "shardplan: small");
  for (const char* ref : {"http", "src=", "href", "<script", "<link", "<img", "<iframe", "url(",
                          "@import", "xlink"}) {
    EXPECT_THAT(html, Not(HasSubstr(ref))) << ref;
  }
  EXPECT_THAT(html, HasSubstr("<style>"));
  EXPECT_THAT(html, HasSubstr("<svg class=\"bars\""));
}

TEST(PlanHtml, LargestTensorsAreDrawnBlockByBlockWithTheirDevices) {
  // x:4,y:2: device id = 2 * x + y.
  const RuleTree rules = RuleTree::dict({
      {"step", Replicated{}},
      {"params", RuleTree::dict({{"embed", P("x")}, {"h", P(nullptr, "y")}})},
      {"opt_state", P("x", "y")},
  });
  const PlanReport report = MeshShardingHelper(xy_mesh()).plan(rules, small_model());
  const auto figures = figures_of(plan_html(report, "t", 3));
  ASSERT_EQ(figures.size(), 3u);
  // opt_state/mu [1024, 64] over x and y: 4 x 2 blocks, one device each.
  EXPECT_THAT(figures[0], HasSubstr("opt_state/mu"));
  EXPECT_EQ(count(figures[0], "<rect class=\"block\""), 8u);
  EXPECT_THAT(block_titles(figures[0]),
              ElementsAre("device 0", "device 1", "device 2", "device 3", "device 4", "device 5",
                          "device 6", "device 7"));
  // params/embed [1024, 64] over x: 4 blocks of rows, each on the two devices of an x.
  EXPECT_THAT(figures[1], HasSubstr("params/embed"));
  EXPECT_EQ(count(figures[1], "<rect class=\"block\""), 4u);
  EXPECT_THAT(block_titles(figures[1]),
              ElementsAre("devices 0,1 (2 devices)", "devices 2,3 (2 devices)",
                          "devices 4,5 (2 devices)", "devices 6,7 (2 devices)"));
  EXPECT_THAT(figures[1], HasSubstr(">devices 0,1</text>"));  // labelled in the drawing
  // params/h/0/w_in [64, 256], columns over y: 2 blocks, each on the four devices of a y.
  EXPECT_THAT(figures[2], HasSubstr("params/h/0/w_in"));
  EXPECT_THAT(block_titles(figures[2]),
              ElementsAre("devices 0,2,4,6 (4 devices)", "devices 1,3,5,7 (4 devices)"));
  EXPECT_THAT(figures[2], HasSubstr("PartitionSpec(None, &#39;y&#39;)"));
  EXPECT_THAT(figures[2], HasSubstr("[64, 128]"));  // each device's block
  EXPECT_THAT(figures[2], HasSubstr("16.00 KiB of 32.00 KiB"));
  EXPECT_THAT(figures[2], HasSubstr("each block on 4 devices"));
  EXPECT_THAT(figures[2], HasSubstr("dim 1 · 256 · y"));
  EXPECT_THAT(figures[2], HasSubstr("dim 0 · 64 · not sharded"));
}

TEST(PlanHtml, HigherRanksDrawTheirTwoLargestShardedDimensions) {
  // x:2,y:2,z:2: device id = 4x + 2y + z.
  const Mesh mesh = Mesh::parse("x:2,y:2,z:2", 8);
  const Data data = Data::dict({{"t", bf16({4, 8, 16})}, {"u", bf16({4, 8, 16})}});
  const RuleTree rules = RuleTree::dict({{"t", P("x", "y", "z")}, {"u", P(nullptr, nullptr, "x")}});
  const auto figures = figures_of(plan_html(MeshShardingHelper(mesh).plan(rules, data), "t"));
  ASSERT_EQ(figures.size(), 2u);
  // t: dims 1 (y) and 2 (z) are drawn; each cell holds both blocks along dim 0 (x).
  EXPECT_THAT(block_titles(figures[0]),
              ElementsAre("devices 0,4 (2 devices)", "devices 1,5 (2 devices)",
                          "devices 2,6 (2 devices)", "devices 3,7 (2 devices)"));
  EXPECT_THAT(figures[0], HasSubstr("dim 1 · 8 · y"));
  EXPECT_THAT(figures[0], HasSubstr("dim 2 · 16 · z"));
  EXPECT_THAT(figures[0], HasSubstr("dim 0 (4, sharded 2 ways) is not drawn"));
  // u: one sharded dimension (2, over x), drawn against the first unsharded one (0).
  EXPECT_THAT(block_titles(figures[1]),
              ElementsAre("devices 0–3 (4 devices)", "devices 4–7 (4 devices)"));
  EXPECT_THAT(figures[1], HasSubstr("dim 0 · 4 · not sharded"));
  EXPECT_THAT(figures[1], HasSubstr("dim 2 · 16 · x"));
}

TEST(PlanHtml, ManyBlocksShareACell) {
  const Mesh mesh = Mesh::parse("data:1024", 1024);
  const Data data = Data::dict({{"v", bf16({4096})}});
  const PlanReport report = MeshShardingHelper(mesh).plan(RuleTree::dict({{"v", P("data")}}), data);
  const auto figures = figures_of(plan_html(report, "t"));
  ASSERT_EQ(figures.size(), 1u);
  std::vector<std::string> expected;
  for (int c = 0; c < 32; ++c) {
    expected.push_back(fmt::format("devices {}–{} (32 devices)", 32 * c, 32 * c + 31));
  }
  EXPECT_THAT(block_titles(figures[0]), ElementsAreArray(expected));
  EXPECT_THAT(figures[0], HasSubstr("each cell is 1×32 blocks (1×1024 in all)"));
}

TEST(PlanHtml, UnspecifiedTensorIsOneDashedBlock) {
  const RuleTree rules = RuleTree::dict(
      {{"step", Replicated{}}, {"params", Replicated{}}, {"opt_state", Unspecified{}}});
  const auto figures =
      figures_of(plan_html(MeshShardingHelper(xy_mesh()).plan(rules, small_model()), "t", 1));
  ASSERT_EQ(figures.size(), 1u);
  EXPECT_THAT(figures[0], HasSubstr("opt_state/mu"));
  EXPECT_EQ(count(figures[0], "<rect class=\"block unspecified\""), 1u);
  EXPECT_EQ(count(figures[0], "<rect class=\"block\""), 0u);
}

TEST(PlanHtml, WriteRenamesACompletePageAndNamesAPathItCannotWrite) {
  const TempDir dir;
  const PlanReport report =
      MeshShardingHelper(xy_mesh()).plan(RuleTree(Replicated{}), small_model());
  const std::string path = (dir.path() / "plan.html").string();
  write_plan_html(path, report, "title here");
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), plan_html(report, "title here"));
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));

  const std::string missing = (dir.path() / "no_such_dir" / "plan.html").string();
  EXPECT_THROW_WITH(write_plan_html(missing, report, "t"), IoError, std::string("[html]"), missing,
                    std::string("No such file or directory"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "no_such_dir"));
}

TEST(PlanHtml, WriteNeverFollowsALinkAndNamesWhatItWillNotReplace) {
  const TempDir dir;
  namespace fs = std::filesystem;
  const PlanReport report =
      MeshShardingHelper(xy_mesh()).plan(RuleTree(Replicated{}), small_model());
  const auto read = [](const fs::path& p) {
    std::stringstream text;
    text << std::ifstream(p, std::ios::binary).rdbuf();
    return text.str();
  };
  std::ofstream(dir.path() / "victim") << "keep";
  // A link planted at the temporary name of earlier versions is neither followed nor removed.
  fs::create_symlink(dir.path() / "victim", dir.path() / "plan.html.partial");
  const fs::path path = dir.path() / "plan.html";
  write_plan_html(path.string(), report, "one");
  write_plan_html(path.string(), report, "two");  // an existing page is replaced
  EXPECT_EQ(read(path), plan_html(report, "two"));
  EXPECT_EQ(read(dir.path() / "victim"), "keep");
  EXPECT_TRUE(fs::is_symlink(dir.path() / "plan.html.partial"));
  // A directory or a link at the path itself is an error naming it, and left as it was.
  fs::create_directory(dir.path() / "d.html");
  EXPECT_THROW_WITH(write_plan_html((dir.path() / "d.html").string(), report, "t"), IoError,
                    std::string("[html]"), (dir.path() / "d.html").string(),
                    std::string("is a directory"));
  fs::create_symlink(dir.path() / "victim", dir.path() / "l.html");
  EXPECT_THROW_WITH(write_plan_html((dir.path() / "l.html").string(), report, "t"), IoError,
                    (dir.path() / "l.html").string(), std::string("symbolic link"));
  EXPECT_EQ(read(dir.path() / "victim"), "keep");
  EXPECT_THROW_WITH(write_plan_html("", report, "t"), IoError, std::string("[html]"),
                    std::string("empty"));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"d.html", "l.html", "plan.html", "plan.html.partial",
                                             "victim"}));
}

}  // namespace
}  // namespace shardplan
