#include "py_regex.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <set>

#include "py_regex_tables.hpp"
#include "shardplan/detail/utf8.hpp"

namespace shardplan::detail {

// ---- CharSet ----

void CharSet::add(char32_t lo, char32_t hi) {
  if (lo > hi) return;
  std::vector<Range> out;
  out.reserve(r_.size() + 1);
  bool placed = false;
  for (const Range& x : r_) {
    if (x.second + 1 < lo) {
      out.push_back(x);
    } else if (hi + 1 < x.first) {
      if (!placed) out.push_back({lo, hi}), placed = true;
      out.push_back(x);
    } else {
      lo = std::min(lo, x.first);
      hi = std::max(hi, x.second);
    }
  }
  if (!placed) out.push_back({lo, hi});
  r_ = std::move(out);
}

CharSet CharSet::from_ranges(std::vector<Range> ranges) {
  std::sort(ranges.begin(), ranges.end());
  CharSet s;
  for (const Range& x : ranges) {
    if (!s.r_.empty() && x.first <= s.r_.back().second + 1) {
      s.r_.back().second = std::max(s.r_.back().second, x.second);
    } else {
      s.r_.push_back(x);
    }
  }
  return s;
}

void CharSet::add(const CharSet& o) {
  std::vector<Range> all;
  all.reserve(r_.size() + o.r_.size());
  std::merge(r_.begin(), r_.end(), o.r_.begin(), o.r_.end(), std::back_inserter(all));
  r_.clear();
  for (const Range& x : all) {
    if (!r_.empty() && x.first <= r_.back().second + 1) {
      r_.back().second = std::max(r_.back().second, x.second);
    } else {
      r_.push_back(x);
    }
  }
}

CharSet CharSet::complement() const {
  CharSet s;
  char32_t next = 0;
  for (const Range& x : r_) {
    if (x.first > next) s.r_.push_back({next, x.first - 1});
    next = x.second + 1;
  }
  if (next <= kMax) s.r_.push_back({next, kMax});
  return s;
}

bool CharSet::contains(char32_t c) const {
  auto it = std::upper_bound(r_.begin(), r_.end(), c,
                             [](char32_t v, const Range& x) { return v < x.first; });
  return it != r_.begin() && std::prev(it)->second >= c;
}

namespace {
CharSet from_table(const CodeRange* t, std::size_t n) {
  std::vector<CharSet::Range> r;
  for (std::size_t i = 0; i < n; ++i) r.push_back({t[i].lo, t[i].hi});
  return CharSet::from_ranges(std::move(r));
}
}  // namespace

CharSet word_chars(bool ascii) {
  if (ascii) {
    CharSet s = CharSet::of('a', 'z');
    s.add('A', 'Z'), s.add('0', '9'), s.add('_', '_');
    return s;
  }
  static const CharSet w = from_table(kPyWord, kPyWord_size);
  return w;
}
CharSet digit_chars(bool ascii) {
  if (ascii) return CharSet::of('0', '9');
  static const CharSet d = from_table(kPyDigit, kPyDigit_size);
  return d;
}
CharSet space_chars(bool ascii) {
  if (ascii) {
    CharSet s = CharSet::of('\t', '\r');
    s.add(' ', ' ');
    return s;
  }
  static const CharSet sp = from_table(kPySpace, kPySpace_size);
  return sp;
}

// ---- UTF-8 ----

std::size_t decode_utf8(const unsigned char* p, std::size_t n, char32_t& cp, bool* incomplete) {
  const std::size_t len = utf8_decode(p, n, cp, incomplete);
  if (len != 0) return len;
  cp = 0xdc00 + p[0];  // surrogateescape
  return 1;
}

std::u32string decode_utf8(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  std::size_t i = 0;
  while (i < text.size()) {
    char32_t cp = 0;
    i += decode_utf8(p + i, text.size() - i, cp);
    out.push_back(cp);
  }
  return out;
}

}  // namespace shardplan::detail
