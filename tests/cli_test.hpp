#pragma once
// What the tests of the `shardplan` command share (cli_test*.cpp): running it, its fixtures.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint_fixtures.hpp"
#include "json_schema.hpp"
#include "shardplan/checkpoint.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/profiler.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/safetensors.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan::test {

namespace fs = std::filesystem;

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("shardplan_cli_test_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  /// Runs the command with `args`; `shell_prefix` runs first in the same shell (a ulimit).
  Result run(const std::string& args, const std::string& shell_prefix) const {
    return run(args, 0, shell_prefix);
  }
  /// Runs the command; with `timeout_seconds`, killed after that long (exit code 124).
  Result run(const std::string& args, int timeout_seconds = 0,
             const std::string& shell_prefix = "") const {
    const fs::path err = dir_ / "stderr.txt";
    const std::string limit =
        timeout_seconds > 0 ? fmt::format("timeout -k 5 {} ", timeout_seconds) : std::string();
    const std::string cmd =
        fmt::format("{}{}'{}' {} 2>'{}'", shell_prefix, limit, SHARDPLAN_CLI, args, err.string());
    Result r;
    FILE* pipe = ::popen(cmd.c_str(), "r");
    if (pipe == nullptr) return r;
    char buf[4096];
    std::size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
    const int status = ::pclose(pipe);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream in(err);
    std::stringstream ss;
    ss << in.rdbuf();
    r.err = ss.str();
    return r;
  }

  /// A LLaMA-shaped checkpoint header (the data section is sparse zeros).
  fs::path llama_checkpoint(int layers) const {
    std::vector<std::pair<std::string, TensorSpec>> t;
    const DType bf16 = DType::kBF16;
    t.push_back({"model.embed_tokens.weight", {Shape{32000, 4096}, bf16}});
    for (int l = 0; l < layers; ++l) {
      const std::string p = fmt::format("model.layers.{}.", l);
      for (const char* w : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
        t.push_back({p + "self_attn." + w + ".weight", {Shape{4096, 4096}, bf16}});
      }
      t.push_back({p + "mlp.gate_proj.weight", {Shape{11008, 4096}, bf16}});
      t.push_back({p + "mlp.up_proj.weight", {Shape{11008, 4096}, bf16}});
      t.push_back({p + "mlp.down_proj.weight", {Shape{4096, 11008}, bf16}});
      t.push_back({p + "input_layernorm.weight", {Shape{4096}, bf16}});
      t.push_back({p + "post_attention_layernorm.weight", {Shape{4096}, bf16}});
    }
    t.push_back({"model.norm.weight", {Shape{4096}, bf16}});
    t.push_back({"lm_head.weight", {Shape{32000, 4096}, bf16}});
    const fs::path file = dir_ / "model.safetensors";
    write_safetensors_skeleton(file, t);
    return file;
  }

  /// A Hugging Face checkpoint directory `name` of `count` f32 tensors of 1 MiB each
  /// (model.layers.N.mlp.up_proj.weight, [512, 512], pseudo-random values).
  fs::path mib_checkpoint(const std::string& name, int count) const {
    std::vector<std::pair<std::string, TensorSpec>> specs;
    std::vector<Tensor> values;
    for (int i = 0; i < count; ++i) {
      values.push_back(Tensor::normal(Shape{512, 512}, DType::kF32, static_cast<std::uint64_t>(i)));
      specs.push_back(
          {fmt::format("model.layers.{}.mlp.up_proj.weight", i), {Shape{512, 512}, DType::kF32}});
    }
    const fs::path dir = dir_ / name;
    fs::create_directories(dir);
    std::ofstream out(dir / "model.safetensors", std::ios::binary);
    out << safetensors_header_bytes("model.safetensors", specs, {{"format", "pt"}});
    for (const Tensor& t : values) out.write(reinterpret_cast<const char*>(t.bytes()), t.nbytes());
    return dir;
  }

  /// The names in `dir`, sorted.
  static std::vector<std::string> names_in(const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

// train-plan: a Hugging Face config.json (LLaMA-2-7B's widths, two layers), one step sized.
class TrainPlanCli : public CliTest {
 protected:
  fs::path config(const std::string& text, const std::string& name = "config.json") const {
    const fs::path file = dir_ / name;
    std::ofstream(file) << text;
    return file;
  }
  fs::path llama() const {
    return config(R"({"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096,
      "intermediate_size": 11008, "num_hidden_layers": 2, "num_attention_heads": 32,
      "num_key_value_heads": 32})");
  }
  // A small LLaMA: two layers of width 256, planned in well under a second in Debug.
  fs::path small_llama(int kv_heads = 4) const {
    return config(fmt::format(R"({{"model_type": "llama", "vocab_size": 1024, "hidden_size": 256,
      "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": {}}})",
                              kv_heads));
  }
  // The --json plan `args` print, without what differs between two runs of one program (the
  // time it took) and the stack's record (where each option came from); null when it fails.
  nlohmann::json plan_json(const std::string& args) const {
    const Result r = run(args);
    EXPECT_EQ(r.code, 0) << args << "\n" << r.err;
    if (r.code != 0) return {};
    nlohmann::json j = nlohmann::json::parse(r.out);
    j.erase("seconds_to_plan");
    j.erase("stack");
    return j;
  }
};

}  // namespace shardplan::test
