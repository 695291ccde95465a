// Row-invariant attention for small query counts (decode and verify steps), AVX-512.
//
// Every (batch, head, query row) gets its result in a fixed order that does not depend on how many
// other rows share the call: scores key by key (16-lane dot products, one fixed horizontal sum), the
// max, exp (a lane-wise polynomial), then the keys' probabilities summed and the value rows weighted in
// key order from key 0. Keys a mask hides get probability exactly 0 and add nothing, so a row that sees
// the first m keys of a longer cache gets bitwise what it gets when the cache holds exactly m keys: a
// verify forward's rows equal one-token decode steps, which is what greedy equality needs. (torch's
// CPU flash attention blocks queries and keys by the call's shape, so its rows are not invariant.)
//
// Tiled for many rows: a work unit is a block of (query row, head) pairs of one kv group (the GQA heads
// sharing its keys x a block of rows). A block of 16 keys is read once and scored for every pair of
// the unit from L1; then a block of KEY_BLOCK value rows is weighed into every pair's accumulators
// (kept in memory between blocks, each pair's chain still in key order). So the keys and values stream
// once per unit instead of once per row, and each pair's arithmetic is exactly what it is alone.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "attention_simd.h"

namespace {

using namespace specdec_attention;
#define AVX512 SPECDEC_AVX512

constexpr int64_t MOST_PAIRS = 24;  // (query row, head) pairs per unit: each key block is applied to all
constexpr int64_t KEY_BLOCK = 64;   // value rows weighed into every pair's accumulators while in L1
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// The call's tensors as pointers and element strides (q [B, H, n, d], k / v [B, kv_heads, L, d],
// mask [B|1, 1, n, L] or null, out [B, n, H, d]).
template <typename T>
struct Call {
  const T *q, *k, *v;
  T* out;
  const float* mask;
  int64_t q_b, q_h, q_i, k_b, k_g, k_row, v_b, v_g, v_row, m_b, m_i, m_j;
  int64_t H, n, d, L, group, chunks;
  float scale;
  int64_t visible(int64_t i) const { return mask != nullptr ? L : L - n + i + 1; }  // no mask: causal
};

// Query rows [row0, row0 + rows) x heads [head0, head0 + heads) of kv group g (head indices within the
// group) of sequence b; pair p is (row0 + p / heads, head0 + p % heads).
struct Unit {
  int64_t b, g, row0, rows, head0, heads;
};

// Rows and heads per unit: up to MOST_PAIRS pairs (more reuse of every key block read), split further
// while there are fewer than two units per thread, so both threads work even at batch 1 and one row.
struct Split {
  int64_t rows, heads, row_blocks, head_blocks;
};

Split split_work(int64_t B, int64_t kv_heads, int64_t n, int64_t group, int64_t threads) {
  int64_t rows = std::min<int64_t>(n, std::max<int64_t>(1, MOST_PAIRS / group)), heads = group;
  const auto blocks = [](int64_t total, int64_t each) { return (total + each - 1) / each; };
  const auto units = [&] { return B * kv_heads * blocks(n, rows) * blocks(group, heads); };
  while (units() < 2 * threads && rows > 1) rows = blocks(rows, 2);
  while (units() < 2 * threads && heads > 1) heads = blocks(heads, 2);
  rows = blocks(n, blocks(n, rows));  // even blocks: 10 rows as 5 + 5, not 8 + 2
  heads = blocks(group, blocks(group, heads));
  return {rows, heads, blocks(n, rows), blocks(group, heads)};
}

// Floats on a 64-byte boundary (std::vector<__m512> does not promise it here), viewed as vectors.
class Vectors {
 public:
  explicit Vectors(int64_t count) : raw_(16 * count + 16) {}
  __m512* data() {
    const auto at = reinterpret_cast<uintptr_t>(raw_.data());
    return reinterpret_cast<__m512*>((at + 63) & ~uintptr_t{63});
  }

 private:
  std::vector<float> raw_;
};

// One thread's working memory, reused unit after unit.
struct Scratch {
  Vectors qv, top16;  // [pairs, chunks] the pairs' queries; [pairs] running maxima
  std::vector<float> probs, acc, sums;  // [pairs, stride] scores then probabilities; [pairs, d]; [pairs]
  std::vector<int64_t> visible;  // [pairs] keys each pair sees
  Scratch(int64_t pairs, int64_t chunks, int64_t stride, int64_t d)
      : qv(pairs * chunks), top16(pairs), probs(pairs * stride), acc(pairs * d), sums(pairs), visible(pairs) {}
};

// Every pair's unnormalized probabilities exp(q . k_j * scale + mask_j - max) into w.probs, zero from its
// own visible count up to the unit's largest, which is returned.
template <typename T, int CH>
AVX512 int64_t unit_probs(const Call<T>& c, const Unit& u, Scratch& w, int64_t stride) {
  const int64_t pairs = u.rows * u.heads;
  const T* keys = c.k + u.b * c.k_b + u.g * c.k_g;
  __m512* const qvs = w.qv.data();
  __m512* const top16 = w.top16.data();
  int64_t most = 0;
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t i = u.row0 + p / u.heads, h = u.g * c.group + u.head0 + p % u.heads;
    const T* qp = c.q + u.b * c.q_b + h * c.q_h + i * c.q_i;
    for (int64_t ch = 0; ch < c.chunks; ++ch) qvs[p * c.chunks + ch] = load16(qp + 16 * ch);
    w.visible[p] = c.visible(i);
    top16[p] = _mm512_set1_ps(NEG_INF);
    most = std::max(most, w.visible[p]);
  }
  const auto mask_row = [&](int64_t p) { return c.mask + u.b * c.m_b + (u.row0 + p / u.heads) * c.m_i; };
  const __m512 scale16 = _mm512_set1_ps(c.scale);
  alignas(64) float masked[16];
  for (int64_t j = 0; j + 16 <= most; j += 16) {  // 16 keys read once, scored for every pair from L1
    for (int64_t p = 0; p < pairs; ++p) {
      if (j + 16 > w.visible[p]) continue;  // its last keys: one by one below
      __m512 s = _mm512_mul_ps(dots16<T, CH>(qvs + p * c.chunks, c.chunks, keys + j * c.k_row, c.k_row), scale16);
      if (c.mask != nullptr) {
        const float* m = mask_row(p) + j * c.m_j;
        if (c.m_j != 1)
          for (int e = 0; e < 16; ++e) masked[e] = m[e * c.m_j];
        s = _mm512_add_ps(s, c.m_j == 1 ? _mm512_loadu_ps(m) : _mm512_load_ps(masked));
      }
      _mm512_storeu_ps(w.probs.data() + p * stride + j, s);
      top16[p] = _mm512_max_ps(top16[p], s);
    }
  }
  for (int64_t p = 0; p < pairs; ++p) {
    float* sp = w.probs.data() + p * stride;
    const __m512* qv = qvs + p * c.chunks;
    const int64_t visible = w.visible[p], full = visible / 16 * 16;
    float top = full > 0 ? _mm512_reduce_max_ps(top16[p]) : NEG_INF;
    for (int64_t t = full; t < visible; ++t) {
      const T* kj = keys + t * c.k_row;
      __m512 acc = _mm512_mul_ps(qv[0], load16(kj));
      for (int64_t ch = 1; ch < c.chunks; ++ch) acc = _mm512_fmadd_ps(qv[ch], load16(kj + 16 * ch), acc);
      float s = _mm512_reduce_add_ps(acc) * c.scale;
      if (c.mask != nullptr) s += mask_row(p)[t * c.m_j];
      sp[t] = s;
      top = s > top ? s : top;
    }
    if (top == NEG_INF) top = 0.0f;  // every key hidden: a row of zeros
    const __m512 topv = _mm512_set1_ps(top);
    for (int64_t t = 0; t < visible; t += 16) {  // exp lane by lane: a key's p depends on its score alone
      const __mmask16 lanes = visible - t >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (visible - t)) - 1);
      const __m512 sc = _mm512_mask_loadu_ps(_mm512_set1_ps(NEG_INF), lanes, sp + t);
      _mm512_mask_storeu_ps(sp + t, lanes, exp16(_mm512_sub_ps(sc, topv)));
    }
    std::fill(sp + visible, sp + most, 0.0f);  // keys past its own: p = 0, which adds exactly nothing below
  }
  return most;
}

// Keys [j0, j1) into GB pairs' running sums and value accumulators (acc: GB rows of acc_stride floats),
// CH chunks of 16: each pair's chain is the one it runs alone (a masked FMA skips p = 0; adding p = +0
// to the sum changes nothing), the pairs interleaved so each value row is loaded once for all of them.
template <typename T, int CH, int GB>
AVX512 void weigh_block(const float* probs, int64_t stride, const T* v, int64_t v_row, int64_t j0, int64_t j1,
                        float* acc, int64_t acc_stride, float* sums) {
  __m512 a[GB][CH];
  float sum[GB];
  for (int g = 0; g < GB; ++g) {
    sum[g] = sums[g];
    for (int c = 0; c < CH; ++c) a[g][c] = _mm512_loadu_ps(acc + g * acc_stride + 16 * c);
  }
  for (int64_t j = j0; j < j1; ++j) {
    __m512 vv[CH];
    const T* vj = v + j * v_row;
    for (int c = 0; c < CH; ++c) vv[c] = load16(vj + 16 * c);
    for (int g = 0; g < GB; ++g) {
      const float p = probs[g * stride + j];
      sum[g] += p;
      const __mmask16 seen = p != 0.0f ? 0xFFFF : 0;
      const __m512 pv = _mm512_set1_ps(p);
      for (int c = 0; c < CH; ++c) a[g][c] = _mm512_mask3_fmadd_ps(pv, vv[c], a[g][c], seen);
    }
  }
  for (int g = 0; g < GB; ++g) {
    sums[g] = sum[g];
    for (int c = 0; c < CH; ++c) _mm512_storeu_ps(acc + g * acc_stride + 16 * c, a[g][c]);
  }
}

// Any head size (chunks of 16 at run time), one pair: the same chain as weigh_block.
template <typename T>
AVX512 void weigh_any(const float* probs, const T* v, int64_t v_row, int64_t j0, int64_t j1, int64_t chunks,
                      float* acc, float* sum) {
  for (int64_t j = j0; j < j1; ++j) {
    const float p = probs[j];
    *sum += p;
    if (p == 0.0f) continue;
    const __m512 pv = _mm512_set1_ps(p);
    const T* vj = v + j * v_row;
    for (int64_t c = 0; c < chunks; ++c)
      _mm512_storeu_ps(acc + 16 * c, _mm512_fmadd_ps(pv, load16(vj + 16 * c), _mm512_loadu_ps(acc + 16 * c)));
  }
}

// out = sum_j p_j v_j / sum_j p_j for every pair of the unit, value rows in blocks of KEY_BLOCK.
template <typename T>
AVX512 void unit_weigh(const Call<T>& c, const Unit& u, Scratch& w, int64_t stride, int64_t most) {
  const int64_t pairs = u.rows * u.heads, d = c.d;
  std::fill(w.acc.begin(), w.acc.begin() + pairs * d, 0.0f);
  std::fill(w.sums.begin(), w.sums.begin() + pairs, 0.0f);
  const T* values = c.v + u.b * c.v_b + u.g * c.v_g;
  for (int64_t j0 = 0; j0 < most; j0 += KEY_BLOCK) {
    const int64_t j1 = std::min(j0 + KEY_BLOCK, most);
    for (int64_t p = 0; p < pairs;) {
      const int64_t left = pairs - p;
      const float* probs = w.probs.data() + p * stride;
#define WEIGH(CH, GB) \
  weigh_block<T, CH, GB>(probs, stride, values, c.v_row, j0, j1, w.acc.data() + p * d, d, w.sums.data() + p); \
  p += GB;                                                                                                   \
  continue
      if (c.chunks == 4 && left >= 6) { WEIGH(4, 6); }
      if (c.chunks == 4 && left >= 4) { WEIGH(4, 4); }
      if (c.chunks == 4 && left >= 2) { WEIGH(4, 2); }
      if (c.chunks == 2 && left >= 8) { WEIGH(2, 8); }
      if (c.chunks == 2 && left >= 4) { WEIGH(2, 4); }
      if (c.chunks == 8 && left >= 3) { WEIGH(8, 3); }
      if (c.chunks == 8 && left >= 2) { WEIGH(8, 2); }
#undef WEIGH
      weigh_any<T>(probs, values, c.v_row, j0, j1, c.chunks, w.acc.data() + p * d, w.sums.data() + p);
      ++p;
    }
  }
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t i = u.row0 + p / u.heads, h = u.g * c.group + u.head0 + p % u.heads;
    T* o = c.out + ((u.b * c.n + i) * c.H + h) * d;
    const __m512 norm = _mm512_set1_ps(w.sums[p] > 0.0f ? w.sums[p] : 1.0f);
    for (int64_t ch = 0; ch < c.chunks; ++ch)
      store16(o + 16 * ch, _mm512_div_ps(_mm512_loadu_ps(w.acc.data() + p * d + 16 * ch), norm));
  }
}

template <typename T>
void attend_all(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask,
                torch::Tensor& out, double scale) {
  const int64_t B = q.size(0), H = q.size(1), n = q.size(2), d = q.size(3), kv_heads = k.size(1), L = k.size(2);
  const bool masked = mask.defined();
  const Call<T> c{q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), out.data_ptr<T>(),
                  masked ? mask.data_ptr<float>() : nullptr, q.stride(0), q.stride(1), q.stride(2),
                  k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
                  masked && mask.size(0) > 1 ? mask.stride(0) : 0, masked ? mask.stride(2) : 0, masked ? mask.stride(3) : 0,
                  H, n, d, L, H / kv_heads, d / 16, static_cast<float>(scale)};
  const Split split = split_work(B, kv_heads, n, c.group, at::get_num_threads());
  const int64_t per_group = split.row_blocks * split.head_blocks, stride = L + 16;
  at::parallel_for(0, B * kv_heads * per_group, 1, [&](int64_t begin, int64_t end) {
    Scratch w(split.rows * split.heads, c.chunks, stride, d);
    for (int64_t item = begin; item < end; ++item) {  // a (b, g)'s units one after another: its keys stay in L2
      const int64_t b = item / (kv_heads * per_group), g = (item / per_group) % kv_heads;
      const int64_t r = (item % per_group) / split.head_blocks, hb = item % split.head_blocks;
      const Unit u{b, g, r * split.rows, std::min(split.rows, n - r * split.rows), hb * split.heads,
                   std::min(split.heads, c.group - hb * split.heads)};
      const int64_t most = c.chunks == 4   ? unit_probs<T, 4>(c, u, w, stride)
                           : c.chunks == 2 ? unit_probs<T, 2>(c, u, w, stride)
                           : c.chunks == 8 ? unit_probs<T, 8>(c, u, w, stride)
                                           : unit_probs<T, 0>(c, u, w, stride);
      unit_weigh<T>(c, u, w, stride, most);
    }
  });
}

}  // namespace

// q [B, H, n, d], k / v [B, kv_heads, L, d] (any strides, unit stride along d), mask: undefined or float32
// additive [B|1, 1, n, L] (any strides); float32 or bfloat16 -> out [B, n, H, d] in q's dtype.
torch::Tensor attend(torch::Tensor q, torch::Tensor k, torch::Tensor v, c10::optional<torch::Tensor> mask,
                     double scale) {
  TORCH_CHECK(__builtin_cpu_supports("avx512f"), "attend: needs AVX-512");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(3) % 16 == 0 && q.size(3) <= 256 &&
                  q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1 && q.size(1) % k.size(1) == 0 &&
                  q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "attend: q [B, H, n, d], k / v [B, kv_heads, L, d] of one dtype, d a multiple of 16 up to 256");
  torch::Tensor m;
  if (mask.has_value() && mask->defined()) {
    m = mask->to(at::kFloat);
    TORCH_CHECK(m.dim() == 4 && m.size(2) == q.size(2) && m.size(3) == k.size(2), "attend: mask [B, 1, n, L]");
  }
  auto out = torch::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options());
  if (q.scalar_type() == at::kFloat) {
    attend_all<float>(q, k, v, m, out, scale);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kBFloat16, "attend: float32 or bfloat16");
    attend_all<at::BFloat16>(q, k, v, m, out, scale);
  }
  return out;
}
