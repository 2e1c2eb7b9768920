// The kernels of fused attention (attention.hpp has the layouts): FlashAttention-2's blocked
// online softmax. Per (batch, kv head), the kv head's keys and values are copied once into
// contiguous buffers of the accumulator type; per query head of the group and block of queries,
// the kernel walks the blocks of keys, so that no more than one block of scores ever exists.
// Every block product is the project GEMM (row-major). A row's result depends only on the row and
// on the key blocks (which start at key 0 whatever the sharding), never on which other rows share
// its query block: a query-sharded run is bitwise the one-device run.
//
// Non-finite values follow PyTorch's scaled_dot_product_attention (docs/sjit.md, "Non-finite
// values"): a pair is masked by the mask, the causal order, or a score of -inf (a -inf bias), and
// then contributes nothing, whatever q, k, v or the bias hold there; a NaN or +inf score not
// masked makes its row NaN (the running max is NaN-propagating: numeric.hpp's maximum); a row
// with every pair masked gives 0 and a log-sum-exp of -inf.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../../../runtime/gemm.hpp"
#include "kernel_util.hpp"
#include "attention.hpp"

namespace shardplan::detail {
namespace {

// The blocks of one kernel call in the shared layout, with the broadcast strides of mask and bias
// (0 along a dimension of size 1) and the global index of the first local query and key.
template <class T>
struct View {
  using A = Calc<T>;
  const T* q = nullptr;
  const T* k = nullptr;
  const T* v = nullptr;
  const A* y = nullptr;  // packed result (gradients only)
  const A* g = nullptr;  // its cotangent (gradients only)
  const std::uint8_t* mask = nullptr;
  const T* bias = nullptr;
  std::int64_t mask_strides[5] = {}, bias_strides[5] = {};
  std::int64_t B = 0, T_ = 0, K = 0, G = 0, H = 0, S = 0;
  A scale = 1;
  bool causal = false;
  std::int64_t q_off = 0, k_off = 0;

  std::int64_t q_at(std::int64_t b, std::int64_t t, std::int64_t kh, std::int64_t gi) const {
    return (((b * T_ + t) * K + kh) * G + gi) * H;
  }
  std::int64_t y_at(std::int64_t b, std::int64_t t, std::int64_t kh, std::int64_t gi) const {
    return (((b * T_ + t) * K + kh) * G + gi) * (H + 1);
  }
  std::int64_t k_at(std::int64_t b, std::int64_t s, std::int64_t kh) const {
    return ((b * S + s) * K + kh) * H;
  }
};

void broadcast_strides(const Shape& s, std::int64_t* out) {
  std::int64_t stride = 1;
  for (int d = 4; d >= 0; --d) {
    out[d] = s[d] == 1 ? 0 : stride;
    stride *= s[d];
  }
}

template <class T>
View<T> view_of(const KernelArgs& c, int first, bool grad_kv) {
  const auto& a = c.node.attr<AttentionAttrs>();
  View<T> w;
  w.q = elems<T>(c.in[0]);
  w.k = elems<T>(c.in[1]);
  w.v = elems<T>(c.in[2]);
  if (first == 5) {
    w.y = elems<Calc<T>>(c.in[3]);
    w.g = elems<Calc<T>>(c.in[4]);
  }
  const Shape& qs = c.in[0].shape;
  w.B = qs[0];
  w.T_ = qs[1];
  w.K = qs[2];
  w.G = qs[3];
  w.H = qs[4];
  w.S = c.in[1].shape[1];
  w.scale = static_cast<Calc<T>>(a.scale);
  w.causal = a.causal;
  // The result's dimension 1 is the queries (attention, grad_q) or the keys (grad_kv); the other
  // sequence is whole on every device when causal (its factor is then replicated).
  (grad_kv ? w.k_off : w.q_off) = c.out_offset[1];
  if (const int m = mask_operand(a, first); m >= 0) {
    w.mask = elems<std::uint8_t>(c.in[static_cast<std::size_t>(m)]);
    broadcast_strides(c.in[static_cast<std::size_t>(m)].shape, w.mask_strides);
  }
  if (const int b = bias_operand(a, first); b >= 0) {
    w.bias = elems<T>(c.in[static_cast<std::size_t>(b)]);
    broadcast_strides(c.in[static_cast<std::size_t>(b)].shape, w.bias_strides);
  }
  return w;
}

// Every block product is run with a whole block's rows (the queries' blocks are padded with zero
// rows, grad_kv's key blocks with zero keys): Eigen multiplies small or one-row products another
// way, so a block of another height (a query-sharded device's last block) would round otherwise.
constexpr std::int64_t kBlockRows = kAttentionQueryBlock;

// Rows [t0, t0 + rows) of query head (b, kh, gi) against keys [s0, s0 + cols): the raw products
// in `s` become scaled, biased scores, -inf where the mask or the causal order forbids.
template <class T>
void finish_scores(const View<T>& w, std::int64_t b, std::int64_t kh, std::int64_t gi,
                   std::int64_t t0, std::int64_t rows, std::int64_t s0, std::int64_t cols,
                   std::int64_t ld, Calc<T>* s) {
  using A = Calc<T>;
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  const std::int64_t* ms = w.mask_strides;
  const std::int64_t* bs = w.bias_strides;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t t = t0 + r;
    A* row = s + r * ld;
    for (std::int64_t c = 0; c < cols; ++c) row[c] *= w.scale;
    if (w.bias != nullptr) {
      const T* br = w.bias + b * bs[0] + kh * bs[1] + gi * bs[2] + t * bs[3] + s0 * bs[4];
      for (std::int64_t c = 0; c < cols; ++c) row[c] += widen(br[c * bs[4]]);
    }
    if (w.mask != nullptr) {
      const std::uint8_t* mr =
          w.mask + b * ms[0] + kh * ms[1] + gi * ms[2] + t * ms[3] + s0 * ms[4];
      for (std::int64_t c = 0; c < cols; ++c) {
        if (mr[c * ms[4]] == 0) row[c] = kNegInf;
      }
    }
    if (w.causal) {
      // Keys after the query's global index are masked: local key c is global s0 + c + k_off.
      const std::int64_t first_hidden = std::max<std::int64_t>(0, w.q_off + t + 1 - w.k_off - s0);
      for (std::int64_t c = first_hidden; c < cols; ++c) row[c] = kNegInf;
    }
  }
}

// The end (exclusive, local) of the keys a block of queries [t0, t0 + rows) can see.
template <class T>
std::int64_t key_end(const View<T>& w, std::int64_t t0, std::int64_t rows) {
  if (!w.causal) return w.S;
  return std::clamp<std::int64_t>(w.q_off + t0 + rows - w.k_off, 0, w.S);
}

// x's H-wide rows at `stride` apart, `rows` of them, into a contiguous buffer of A.
template <class T, class A>
void pack_rows(const T* x, std::int64_t stride, std::int64_t rows, std::int64_t h, A* out) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* from = x + r * stride;
    for (std::int64_t i = 0; i < h; ++i) out[r * h + i] = widen(from[i]);
  }
}

// The kv head's keys and values, contiguous [S, H] each, followed by zero rows up to a multiple of
// `pad` keys.
template <class T>
void pack_kv(const View<T>& w, std::int64_t b, std::int64_t kh, std::vector<Calc<T>>& kc,
             std::vector<Calc<T>>& vc, std::int64_t pad = 1) {
  const std::int64_t keys = (w.S + pad - 1) / pad * pad;
  kc.assign(static_cast<std::size_t>(keys * w.H), Calc<T>(0));
  vc.assign(kc.size(), Calc<T>(0));
  pack_rows(w.k + w.k_at(b, 0, kh), w.K * w.H, w.S, w.H, kc.data());
  pack_rows(w.v + w.k_at(b, 0, kh), w.K * w.H, w.S, w.H, vc.data());
}

// A packed operand [n, h] (values, keys, queries or dO) whose rows a product multiplies by a
// block of weights. A masked pair weighs 0, but 0 * NaN is NaN: so the rows holding a value that
// is not finite are zeroed in a copy, which the product reads, and add_allowed adds them back for
// the allowed pairs alone. A masked position then has no effect whatever it holds; with every
// row finite (the usual case) nothing is copied.
template <class A>
struct Operand {
  const A* raw = nullptr;
  std::int64_t h = 0;
  std::vector<std::int64_t> bad;  // the rows not finite, ascending
  std::vector<A> clean;

  void set(const A* x, std::int64_t n, std::int64_t width) {
    raw = x;
    h = width;
    bad.clear();
    for (std::int64_t r = 0; r < n; ++r) {
      bool finite = true;
      for (std::int64_t i = 0; i < h; ++i) finite = finite && std::isfinite(x[r * h + i]);
      if (!finite) bad.push_back(r);
    }
    if (bad.empty()) return;
    clean.assign(x, x + n * h);
    for (const std::int64_t r : bad) std::fill_n(clean.data() + r * h, h, A(0));
  }
  const A* rows() const { return bad.empty() ? raw : clean.data(); }
  bool any_in(std::int64_t first, std::int64_t count) const {
    const auto it = std::lower_bound(bad.begin(), bad.end(), first);
    return it != bad.end() && *it < first + count;
  }
};

// y += what a product of the weights w [rows, cols] (leading dimension ld) with x's clean rows
// left out: for each row j of x not finite in the block (x's rows from `first`) and each pair
// (r, c) of the block that `scores` (the block's scores before they became weights) allows,
// w[r, c] times row j. `by_row`: x's rows are the block's rows (w^T x: y's row c gets
// w[r, c] x[r]); else its columns (w x: y's row r gets w[r, c] x[c]).
template <class A>
void add_allowed(const Operand<A>& x, std::int64_t first, bool by_row, std::int64_t rows,
                 std::int64_t cols, std::int64_t ld, const A* scores, const A* w, A* y) {
  const std::int64_t lines = by_row ? rows : cols, across = by_row ? cols : rows;
  for (const std::int64_t j : x.bad) {
    const std::int64_t l = j - first;
    if (l < 0 || l >= lines) continue;
    const A* xr = x.raw + j * x.h;
    for (std::int64_t o = 0; o < across; ++o) {
      const std::int64_t at = by_row ? l * ld + o : o * ld + l;
      if (scores[at] == -std::numeric_limits<A>::infinity()) continue;
      A* yr = y + o * x.h;
      for (std::int64_t i = 0; i < x.h; ++i) yr[i] += w[at] * xr[i];
    }
  }
}

// The running state of a block of query rows (online softmax).
template <class A>
struct RowState {
  std::vector<A> m, l, o, pv;
  void reset(std::int64_t rows, std::int64_t h) {
    m.assign(static_cast<std::size_t>(rows), -std::numeric_limits<A>::infinity());
    l.assign(static_cast<std::size_t>(rows), A(0));
    o.assign(static_cast<std::size_t>(rows * h), A(0));
    pv.resize(static_cast<std::size_t>(kAttentionQueryBlock * h));
  }
};

// x = exp(x - m) over n elements, vectorised (Eigen's exp), with weights below 1e-30 (f32;
// 1e-300 in f64) of the row's largest set to 0, so that a masked score (-inf) weighs nothing:
// Eigen clamps its argument, which would leave about 1e-38 there. The argument is clamped above
// the subnormal range first: a subnormal result costs a hundred cycles per element on x86.
// The exp runs in the GEMM's instruction set (gemm.hpp's exp_shifted: AVX-512 where the CPU has
// it), every element on the same vector path whatever its address.
template <class A>
void exp_shifted(A* x, std::int64_t n, A m) {
  constexpr bool single = std::is_same_v<A, float>;
  constexpr A lowest = single ? A(-80) : A(-700);
  constexpr A tiny = single ? A(1e-30) : A(1e-300);
  detail::exp_shifted(x, n, m, lowest);
  for (std::int64_t i = 0; i < n; ++i) x[i] = x[i] < tiny ? A(0) : x[i];
}

// A row of scores x becomes its weights against m (the row's running max or its log-sum-exp,
// not -inf): exp(x - m), a masked score (-inf) weighing 0. When m is NaN or +inf (a NaN or +inf
// score not masked) every allowed score weighs NaN: the row's result is NaN, as softmax's
// exp(x - max) gives it.
template <class A>
void row_weights(A* x, std::int64_t n, A m) {
  if (std::isfinite(m)) {
    exp_shifted(x, n, m);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    x[i] = x[i] == -std::numeric_limits<A>::infinity() ? A(0) : std::numeric_limits<A>::quiet_NaN();
  }
}

// The maximum of x[0..n) and `init`, NaN when any is NaN: numeric.hpp's maximum (which also
// orders -0 below +0, irrelevant to a shift), written as a plain max and a NaN flag so that it
// vectorises (0.75 ns a score against 2 ns for a loop of maximum(), -O2 on this machine).
template <class A>
A row_max(const A* x, std::int64_t n, A init) {
  A m = init;
  bool nan = std::isnan(init);
  for (std::int64_t c = 0; c < n; ++c) {
    m = std::max(m, x[c]);
    nan |= x[c] != x[c];
  }
  return nan ? std::numeric_limits<A>::quiet_NaN() : m;
}

// Scores s [rows, cols] become exp(s - new max); the row's sum and output are rescaled.
template <class A>
void online_softmax(RowState<A>& st, std::int64_t rows, std::int64_t cols, std::int64_t h, A* s) {
  for (std::int64_t r = 0; r < rows; ++r) {
    A* row = s + r * cols;
    const A mx = row_max(row, cols, st.m[static_cast<std::size_t>(r)]);
    if (mx == -std::numeric_limits<A>::infinity()) {  // nothing allowed yet
      std::fill(row, row + cols, A(0));
      continue;
    }
    const A corr = std::exp(st.m[static_cast<std::size_t>(r)] - mx);
    row_weights(row, cols, mx);
    A sum = 0;
    for (std::int64_t c = 0; c < cols; ++c) sum += row[c];
    st.m[static_cast<std::size_t>(r)] = mx;
    st.l[static_cast<std::size_t>(r)] = st.l[static_cast<std::size_t>(r)] * corr + sum;
    if (corr != A(1)) {
      A* o = st.o.data() + r * h;
      for (std::int64_t i = 0; i < h; ++i) o[i] *= corr;
    }
  }
}

template <class T>
void forward(const KernelArgs& c) {
  using A = Calc<T>;
  const View<T> w = view_of<T>(c, 3, false);
  A* out = elems<A>(c.out);
  std::vector<A> kc, vc, qc(static_cast<std::size_t>(kAttentionQueryBlock * w.H)),
      sb(static_cast<std::size_t>(kAttentionQueryBlock * kAttentionKeyBlock)), scores;
  RowState<A> st;
  Operand<A> vo;
  for (std::int64_t b = 0; b < w.B; ++b) {
    for (std::int64_t kh = 0; kh < w.K; ++kh) {
      pack_kv(w, b, kh, kc, vc);
      vo.set(vc.data(), w.S, w.H);
      for (std::int64_t gi = 0; gi < w.G; ++gi) {
        for (std::int64_t t0 = 0; t0 < w.T_; t0 += kAttentionQueryBlock) {
          const std::int64_t rows = std::min(kAttentionQueryBlock, w.T_ - t0);
          pack_rows(w.q + w.q_at(b, t0, kh, gi), w.K * w.G * w.H, rows, w.H, qc.data());
          std::fill(qc.begin() + rows * w.H, qc.end(), A(0));
          st.reset(rows, w.H);
          const std::int64_t end = key_end(w, t0, rows);
          for (std::int64_t s0 = 0; s0 < end; s0 += kAttentionKeyBlock) {
            const std::int64_t cols = std::min(kAttentionKeyBlock, w.S - s0);
            gemm(false, true, kBlockRows, cols, w.H, qc.data(), kc.data() + s0 * w.H, sb.data());
            finish_scores(w, b, kh, gi, t0, rows, s0, cols, cols, sb.data());
            const bool fix = vo.any_in(s0, cols);
            if (fix) scores.assign(sb.begin(), sb.begin() + rows * cols);
            online_softmax(st, rows, cols, w.H, sb.data());
            gemm(false, false, kBlockRows, w.H, cols, sb.data(), vo.rows() + s0 * w.H,
                 st.pv.data());
            if (fix) add_allowed(vo, s0, false, rows, cols, cols, scores.data(), sb.data(),
                                 st.pv.data());
            for (std::size_t i = 0; i < static_cast<std::size_t>(rows * w.H); ++i)
              st.o[i] += st.pv[i];
          }
          for (std::int64_t r = 0; r < rows; ++r) {
            A* y = out + w.y_at(b, t0 + r, kh, gi);
            const A l = st.l[static_cast<std::size_t>(r)];
            const A m = st.m[static_cast<std::size_t>(r)];
            const A* o = st.o.data() + r * w.H;
            // Every pair masked: 0 (PyTorch's safe softmax). Else l >= 1, or NaN.
            const bool none = m == -std::numeric_limits<A>::infinity();
            for (std::int64_t i = 0; i < w.H; ++i) y[i] = none ? A(0) : o[i] / l;
            y[w.H] = none ? m : m + std::log(l);
          }
        }
      }
    }
  }
}

// What the backward needs of a block of query rows: q, dO, the log-sum-exp and
// D = rowsum(dO * O) - d(lse) (the log-sum-exp's own cotangent enters the score gradient as
// P * d(lse), so it is folded into D).
template <class T>
void pack_backward_rows(const View<T>& w, std::int64_t b, std::int64_t kh, std::int64_t gi,
                        std::int64_t t0, std::int64_t rows, Calc<T>* qc, Calc<T>* doc, Calc<T>* lse,
                        Calc<T>* d) {
  using A = Calc<T>;
  pack_rows(w.q + w.q_at(b, t0, kh, gi), w.K * w.G * w.H, rows, w.H, qc);
  for (std::int64_t r = 0; r < rows; ++r) {
    const A* y = w.y + w.y_at(b, t0 + r, kh, gi);
    const A* g = w.g + w.y_at(b, t0 + r, kh, gi);
    A dot = 0;
    for (std::int64_t i = 0; i < w.H; ++i) {
      doc[r * w.H + i] = g[i];
      dot += g[i] * y[i];
    }
    lse[r] = y[w.H];
    d[r] = dot - g[w.H];
  }
}

// Scores s become P = exp(s - lse) (0 for a row without an allowed key), and dp becomes
// dS = P * (dP - D), 0 at a masked pair even where dP or D is NaN. `values_finite`: the block's
// values are finite, so dP is; with D finite too, P = 0 at a masked pair makes dS 0 already.
template <class A>
void score_gradient(std::int64_t rows, std::int64_t cols, std::int64_t ld, const A* lse, const A* d,
                    bool values_finite, A* s, A* dp) {
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  for (std::int64_t r = 0; r < rows; ++r) {
    A* sr = s + r * ld;
    A* dr = dp + r * ld;
    if (lse[r] == kNegInf) {
      std::fill(sr, sr + cols, A(0));
      std::fill(dr, dr + cols, A(0));
      continue;
    }
    if (values_finite && std::isfinite(d[r])) {
      row_weights(sr, cols, lse[r]);
      for (std::int64_t c = 0; c < cols; ++c) dr[c] = sr[c] * (dr[c] - d[r]);
      continue;
    }
    for (std::int64_t c = 0; c < cols; ++c) dr[c] = sr[c] == kNegInf ? A(0) : dr[c] - d[r];
    row_weights(sr, cols, lse[r]);
    for (std::int64_t c = 0; c < cols; ++c) dr[c] *= sr[c];
  }
}

template <class A>
void accumulate(std::vector<A>& acc, const std::vector<A>& x, std::int64_t n) {
  for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) acc[i] += x[i];
}

template <class T>
void grad_q(const KernelArgs& c) {
  using A = Calc<T>;
  const View<T> w = view_of<T>(c, 5, false);
  constexpr std::int64_t bq = kAttentionQueryBlock, bk = kAttentionKeyBlock;
  std::vector<A> kc, vc, qc(static_cast<std::size_t>(bq * w.H)), doc(qc.size()), dq(qc.size()),
      tmp(qc.size()), lse(bq), d(bq), sb(bq * bk), dp(bq * bk), scores;
  Operand<A> ko, vo;
  T* out = elems<T>(c.out);
  for (std::int64_t b = 0; b < w.B; ++b) {
    for (std::int64_t kh = 0; kh < w.K; ++kh) {
      pack_kv(w, b, kh, kc, vc);
      ko.set(kc.data(), w.S, w.H);
      vo.set(vc.data(), w.S, w.H);
      for (std::int64_t gi = 0; gi < w.G; ++gi) {
        for (std::int64_t t0 = 0; t0 < w.T_; t0 += bq) {
          const std::int64_t rows = std::min(bq, w.T_ - t0);
          pack_backward_rows(w, b, kh, gi, t0, rows, qc.data(), doc.data(), lse.data(), d.data());
          std::fill(qc.begin() + rows * w.H, qc.end(), A(0));
          std::fill(doc.begin() + rows * w.H, doc.end(), A(0));
          std::fill(dq.begin(), dq.end(), A(0));
          const std::int64_t end = key_end(w, t0, rows);
          for (std::int64_t s0 = 0; s0 < end; s0 += bk) {
            const std::int64_t cols = std::min(bk, w.S - s0);
            gemm(false, true, bq, cols, w.H, qc.data(), kc.data() + s0 * w.H, sb.data());
            finish_scores(w, b, kh, gi, t0, rows, s0, cols, cols, sb.data());
            const bool fix = ko.any_in(s0, cols);
            if (fix) scores.assign(sb.begin(), sb.begin() + rows * cols);
            gemm(false, true, bq, cols, w.H, doc.data(), vc.data() + s0 * w.H, dp.data());
            score_gradient(rows, cols, cols, lse.data(), d.data(), !vo.any_in(s0, cols),
                           sb.data(), dp.data());
            gemm(false, false, bq, w.H, cols, dp.data(), ko.rows() + s0 * w.H, tmp.data());
            if (fix) add_allowed(ko, s0, false, rows, cols, cols, scores.data(), dp.data(),
                                 tmp.data());
            accumulate(dq, tmp, rows * w.H);
          }
          for (std::int64_t r = 0; r < rows; ++r) {
            T* y = out + w.q_at(b, t0 + r, kh, gi);
            for (std::int64_t i = 0; i < w.H; ++i) y[i] = narrow<T>(dq[r * w.H + i] * w.scale);
          }
        }
      }
    }
  }
}

// Everything grad_kv reads of one kv head's queries, packed once: [G, T, H] and [G, T].
template <class A>
struct QueryPack {
  std::vector<A> q, d_o, lse, d;
};

template <class T>
void pack_queries(const View<T>& w, std::int64_t b, std::int64_t kh, QueryPack<Calc<T>>& p) {
  const auto n = static_cast<std::size_t>(w.G * w.T_);
  p.q.resize(n * static_cast<std::size_t>(w.H));
  p.d_o.resize(p.q.size());
  p.lse.resize(n);
  p.d.resize(n);
  for (std::int64_t gi = 0; gi < w.G; ++gi) {
    const std::int64_t at = gi * w.T_;
    pack_backward_rows(w, b, kh, gi, 0, w.T_, p.q.data() + at * w.H, p.d_o.data() + at * w.H,
                       p.lse.data() + at, p.d.data() + at);
  }
}

template <class T>
void grad_kv(const KernelArgs& c) {
  using A = Calc<T>;
  const View<T> w = view_of<T>(c, 5, true);
  constexpr std::int64_t bq = kAttentionQueryBlock, bk = kAttentionKeyBlock;
  std::vector<A> kc, vc, dk(static_cast<std::size_t>(bk * w.H)), dv(dk.size()), tmp(dk.size()),
      sb(bq * bk), dp(bq * bk), scores;
  QueryPack<A> qp;
  Operand<A> qo, doo, vo;
  T* out = elems<T>(c.out);
  for (std::int64_t b = 0; b < w.B; ++b) {
    for (std::int64_t kh = 0; kh < w.K; ++kh) {
      pack_kv(w, b, kh, kc, vc, bk);
      vo.set(vc.data(), w.S, w.H);
      pack_queries(w, b, kh, qp);
      qo.set(qp.q.data(), w.G * w.T_, w.H);
      doo.set(qp.d_o.data(), w.G * w.T_, w.H);
      for (std::int64_t s0 = 0; s0 < w.S; s0 += bk) {
        const std::int64_t cols = std::min(bk, w.S - s0);
        std::fill(dk.begin(), dk.end(), A(0));
        std::fill(dv.begin(), dv.end(), A(0));
        // Under a causal mask the query blocks wholly before this key block see none of it.
        const std::int64_t t_first =
            w.causal ? std::max<std::int64_t>(0, (w.k_off + s0 - w.q_off) / bq * bq) : 0;
        for (std::int64_t gi = 0; gi < w.G; ++gi) {
          for (std::int64_t t0 = t_first; t0 < w.T_; t0 += bq) {
            const std::int64_t rows = std::min(bq, w.T_ - t0);
            const std::int64_t at = gi * w.T_ + t0;
            const A* qb = qp.q.data() + at * w.H;
            const A* dob = qp.d_o.data() + at * w.H;
            gemm(false, true, rows, bk, w.H, qb, kc.data() + s0 * w.H, sb.data());
            finish_scores(w, b, kh, gi, t0, rows, s0, cols, bk, sb.data());
            const bool fix = qo.any_in(at, rows) || doo.any_in(at, rows);
            if (fix) scores.assign(sb.begin(), sb.begin() + rows * bk);
            gemm(false, true, rows, bk, w.H, dob, vc.data() + s0 * w.H, dp.data());
            score_gradient(rows, cols, bk, qp.lse.data() + at, qp.d.data() + at,
                           !vo.any_in(s0, cols), sb.data(), dp.data());
            gemm(true, false, bk, w.H, rows, sb.data(), doo.rows() + at * w.H, tmp.data());
            if (fix) add_allowed(doo, at, true, rows, cols, bk, scores.data(), sb.data(),
                                 tmp.data());
            accumulate(dv, tmp, cols * w.H);
            gemm(true, false, bk, w.H, rows, dp.data(), qo.rows() + at * w.H, tmp.data());
            if (fix) add_allowed(qo, at, true, rows, cols, bk, scores.data(), dp.data(),
                                 tmp.data());
            accumulate(dk, tmp, cols * w.H);
          }
        }
        for (std::int64_t r = 0; r < cols; ++r) {
          T* y = out + (((b * w.S + s0 + r) * w.K + kh) * 2) * w.H;
          for (std::int64_t i = 0; i < w.H; ++i) {
            y[i] = narrow<T>(dk[r * w.H + i] * w.scale);
            y[w.H + i] = narrow<T>(dv[r * w.H + i]);
          }
        }
      }
    }
  }
}

}  // namespace

void attention_kernel(const KernelArgs& k) {
  dispatch_if<IsFloating>(k, k.in[0].dtype, [&]<class T>(Tag<T>) { forward<T>(k); });
}
void attention_grad_q_kernel(const KernelArgs& k) {
  dispatch_if<IsFloating>(k, k.in[0].dtype, [&]<class T>(Tag<T>) { grad_q<T>(k); });
}
void attention_grad_kv_kernel(const KernelArgs& k) {
  dispatch_if<IsFloating>(k, k.in[0].dtype, [&]<class T>(Tag<T>) { grad_kv<T>(k); });
}

double attention_pairs(std::int64_t t, std::int64_t s, bool causal) {
  if (!causal) return static_cast<double>(t) * static_cast<double>(s);
  double pairs = 0;
  for (std::int64_t t0 = 0; t0 < t; t0 += kAttentionQueryBlock) {
    const std::int64_t rows = std::min(kAttentionQueryBlock, t - t0);
    const std::int64_t end = std::min(s, t0 + rows);
    const std::int64_t keys =
        (end + kAttentionKeyBlock - 1) / kAttentionKeyBlock * kAttentionKeyBlock;
    pairs += static_cast<double>(rows) * static_cast<double>(std::min(s, keys));
  }
  return pairs;
}

}  // namespace shardplan::detail
