// Handwritten digits (the UCI 8x8 set, 1,797 images; scripts/fetch_digits.sh writes it), an MLP
// trained with SGD and momentum, data-parallel over 8 devices under sjit, beside the same
// training on one device. Prints the loss and accuracy of every step and the test accuracy; exits
// non-zero unless the test accuracy is at least 95% and the two loss curves agree.
//
//   ./scripts/fetch_digits.sh build/data/digits.csv
//   build/examples/example_digits build/data/digits.csv
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "mlp.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/optim.hpp"
#include "shardplan/sjit.hpp"

using namespace shardplan;

namespace {

struct Digits {
  std::vector<float> pixels;  // rows x 64, scaled to [0, 1]
  std::vector<std::int32_t> labels;
};

Digits load(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::cerr << "cannot read " << path << " (run ./scripts/fetch_digits.sh " << path << ")\n";
    std::exit(2);
  }
  Digits d;
  std::string line;
  while (std::getline(in, line)) {
    std::stringstream row(line);
    std::string cell;
    std::vector<int> v;
    while (std::getline(row, cell, ',')) v.push_back(std::stoi(cell));
    if (v.size() != 65) {
      std::cerr << path << ": a row with " << v.size() << " values, not 65\n";
      std::exit(2);
    }
    for (int i = 0; i < 64; ++i)
      d.pixels.push_back(static_cast<float>(v[static_cast<std::size_t>(i)]) / 16.0f);
    d.labels.push_back(v[64]);
  }
  // Shuffled once, with a fixed seed, before the split (as train_test_split does): the file is
  // ordered by writer.
  const std::size_t n = d.labels.size();
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [](std::size_t a, std::size_t b) {
    return random_uniform(42, a) < random_uniform(42, b);
  });
  Digits s;
  for (const std::size_t i : order) {
    s.pixels.insert(s.pixels.end(), d.pixels.begin() + static_cast<std::ptrdiff_t>(i * 64),
                    d.pixels.begin() + static_cast<std::ptrdiff_t>(i * 64 + 64));
    s.labels.push_back(d.labels[i]);
  }
  return s;
}

// The fraction of rows the network classifies right.
Array accuracy(const Tree<Array>& p, const Array& x, const Array& y) {
  return mlp::accuracy(mlp::logits(p, x), y);
}

struct Run {
  std::vector<double> losses;
  double test_accuracy = 0;
};

Run train(const Digits& d, const Mesh& mesh, const Executor& exec, int steps, bool print) {
  constexpr std::int64_t kTrain = 1440, kBatch = 160;
  const auto rows = static_cast<std::int64_t>(d.labels.size());
  const NamedSharding rep(mesh, P());
  const NamedSharding batch(mesh, P(mesh.axis_names()[0]));
  const auto put_rows = [&](std::int64_t from, std::int64_t n, const NamedSharding& s) {
    std::vector<float> px(d.pixels.begin() + from * 64, d.pixels.begin() + (from + n) * 64);
    std::vector<std::int32_t> lb(d.labels.begin() + from, d.labels.begin() + from + n);
    return std::pair{device_put(Tensor::from<float>(Shape{n, 64}, px), s, exec),
                     device_put(Tensor::from<std::int32_t>(Shape{n}, lb), s, exec)};
  };
  const auto layer = [&](std::int64_t in, std::int64_t out, std::uint64_t seed, double scale) {
    return Tree<Array>::dict(
        {{"w", device_put(Tensor::normal(Shape{in, out}, DType::kF32, seed, 0, scale), rep, exec)},
         {"b", device_put(Tensor::zeros(Shape{out}, DType::kF32), rep, exec)}});
  };
  Tree<Array> params = Tree<Array>::list({layer(64, 128, 1, 0.125), layer(128, 10, 2, 0.09)});
  const Optimizer opt = Optimizer::sgd(0.1, 0.9);
  Tree<Array> state = opt.init(params);
  SjitOptions o;
  o.donate_argnums = {0, 1};
  auto step = sjit(
      mesh,
      [&](const Tree<Array>& p, const Tree<Array>& s, const Array& x, const Array& y) {
        const auto [loss, g] = value_and_grad(mlp::loss)(p, x, y);
        auto [np, ns] = opt.update(g, s, p);
        return Tree<Array>::dict(
            {{"loss", loss}, {"acc", accuracy(p, x, y)}, {"params", np}, {"state", ns}});
      },
      o);
  std::vector<std::pair<Array, Array>> batches;
  for (std::int64_t b = 0; b + kBatch <= kTrain; b += kBatch)
    batches.push_back(put_rows(b, kBatch, batch));
  Run run;
  for (int i = 0; i < steps; ++i) {
    const auto& [x, y] = batches[static_cast<std::size_t>(i) % batches.size()];
    const Tree<Array> out = step(params, state, x, y);
    params = out.at("params");
    state = out.at("state");
    run.losses.push_back(out.at("loss").leaf().to_host().get(0));
    if (print) {
      // (to_host is collective over processes: every process calls it, one prints.)
      const double acc = out.at("acc").leaf().to_host().get(0);
      if (distributed::process_index() == 0) {
        std::cout << "step " << i << "  loss " << run.losses.back() << "  batch accuracy " << acc
                  << "\n";
      }
    }
  }
  const auto [tx, ty] = put_rows(kTrain, rows - kTrain, rep);
  auto eval = sjit(mesh, &accuracy);
  run.test_accuracy = eval(params, tx, ty).to_host().get(0);
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  const char* env = std::getenv("SHARDPLAN_DIGITS");
  // The build directory's copy (CMake fetches it there) whatever the working directory.
#if defined(SHARDPLAN_DIGITS_DEFAULT)
  const char* built = SHARDPLAN_DIGITS_DEFAULT;
#else
  const char* built = "build/data/digits.csv";
#endif
  const std::string path = argc > 1 ? argv[1] : env != nullptr ? env : built;
  const Digits d = load(path);
  const int steps = 270;  // 30 epochs of 9 batches
  // 8 devices over however many processes run (mpirun -np 2: 4 each); 1 device of this process.
  const Executor eight(8), one = Executor::process_local(1);
  const bool print = distributed::process_index() == 0;
  if (print) std::cout << "8 devices, data parallel (batch 160 = 8 x 20):\n";
  const Run r8 = train(d, Mesh::parse("data:8", 8), eight, steps, true);
  const Run r1 = train(d, Mesh::parse("data:1", 1), one, steps, false);
  double most = 0;
  for (std::size_t i = 0; i < r1.losses.size(); ++i)
    most = std::max(most, std::abs(r1.losses[i] - r8.losses[i]));
  if (print) {
    std::cout << "test accuracy: " << r8.test_accuracy << " (8 devices), " << r1.test_accuracy
              << " (1 device); largest difference between the loss curves: " << most << "\n";
  }
  bool ok = r8.test_accuracy >= 0.95 && most < 1e-4;
  if (distributed::process_count() > 1) {
    // Over processes: the loss curve of 8 devices in one process, bit for bit.
    const Run here = train(d, Mesh::parse("data:8", 8), Executor::process_local(8), steps, false);
    const bool same = here.losses == r8.losses && here.test_accuracy == r8.test_accuracy;
    if (print) {
      std::cout << distributed::process_count() << " processes x " << eight.local_devices().size()
                << " devices: every loss " << (same ? "is the same bits as" : "DIFFERS from")
                << " 1 process x 8 devices\n";
    }
    ok = ok && same;
  }
  if (print) std::cout << (ok ? "ok\n" : "FAILED\n");
  return ok ? 0 : 1;
}
