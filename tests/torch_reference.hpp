#pragma once
// Reference values computed by PyTorch in float64 (scripts/gen_*_reference.py write them to
// tests/data/; the tests do not need torch): the file's format and the inputs' formula.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "shardplan/tensor.hpp"

namespace shardplan::test {

struct RefTensor {
  std::vector<std::int64_t> shape;
  std::vector<double> v;
};
using RefCase = std::map<std::string, RefTensor>;

/// tests/data/`file`: "# comment" lines, "case NAME" lines, then per tensor a line "name d0 d1 ..."
/// and a line of its values (row-major).
inline std::map<std::string, RefCase> read_torch_reference(const std::string& file) {
  std::ifstream in(std::string(SHARDPLAN_SOURCE_DIR) + "/tests/data/" + file);
  EXPECT_TRUE(in.good()) << "tests/data/" << file;
  std::map<std::string, RefCase> cases;
  std::string line, current;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream head(line);
    std::string name;
    head >> name;
    if (name == "case") {
      head >> current;
      continue;
    }
    RefTensor t;
    for (std::int64_t d = 0; head >> d;) t.shape.push_back(d);
    std::getline(in, line);
    std::istringstream values(line);
    for (double x = 0; values >> x;) t.v.push_back(x);
    cases[current][name] = std::move(t);
  }
  return cases;
}

/// sin(a * i + c) of the flat index, as the scripts make their inputs.
inline Tensor formula(const Shape& s, DType dtype, double a, double c) {
  Tensor t(s, dtype);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, std::sin(a * static_cast<double>(i) + c));
  return t;
}

}  // namespace shardplan::test
