// Row-invariant attention on AVX2 (8 float lanes), for CPUs without AVX-512: attention.cpp's algorithm
// with the same promise. Each (query row, head) pair's result comes in a fixed order that does not depend
// on the other pairs of the call: a key's score as four chains over the dims (dd mod 4) combined as
// (c0 + c1) + (c2 + c3), the max, exp lane by lane (a polynomial), then probabilities summed and value
// rows weighed in key order from key 0; hidden keys get probability exactly 0 and add nothing. So on such
// a CPU a verify forward's rows equal one-token decode steps. The figures are not bitwise the AVX-512
// path's (its exp scales by scalef, this one by an exponent add; same polynomial), which exactness does
// not need: a machine runs one path for every call.
//
// Work units as in attention.cpp (attention_units.h): a block of 8 keys is read once, transposed (keys
// across lanes: a score needs no horizontal sum) and scored for every pair of the unit; value rows are
// weighed into every pair's accumulators a block of KEY_BLOCK rows and half a head (32 floats) at a time,
// which keeps two pairs' accumulators and the value vectors in AVX2's 16 registers.
#include <torch/extension.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_units.h"
#include "avx2_bf16.h"
#include "parts.h"

namespace {

using specdec_attention_units::Call;
using specdec_attention_units::Split;
using specdec_attention_units::Unit;

#define AVX2 SPECDEC_AVX2

constexpr int64_t KEY_BLOCK = 64;  // value rows weighed into every pair's accumulators while in L1
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

template <typename T> AVX2 inline __m256 load8(const T* p);
template <> AVX2 inline __m256 load8<float>(const float* p) { return _mm256_loadu_ps(p); }
template <> AVX2 inline __m256 load8<at::BFloat16>(const at::BFloat16* p) {
  return specdec_avx2::widen8(reinterpret_cast<const uint16_t*>(p));
}

template <typename T> AVX2 inline void store8(T* p, __m256 v);
template <> AVX2 inline void store8<float>(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
template <> AVX2 inline void store8<at::BFloat16>(at::BFloat16* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), specdec_avx2::narrow8(v));
}

// e^x lane by lane (attention_simd.h's polynomial, ~1 ulp); exactly 0 below -87. x <= 0 here (a score
// minus the row's max), so 2^n is a normal number built in the exponent field.
AVX2 inline __m256 exp8(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(two_n)));
}

// 8 rows of 8 floats transposed in registers: r[e] lane i <- r[i] lane e.
AVX2 inline __attribute__((always_inline)) void transpose8(__m256* r) {
  __m256 t[8], s[8];
  for (int i = 0; i < 4; ++i) {  // per 128-bit half: a0 b0 a1 b1 | a2 b2 a3 b3
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {  // s[4i + e], per half: column e (+4 in the high half) of rows 4i..4i+3
    s[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int e = 0; e < 4; ++e) {
    r[e] = _mm256_permute2f128_ps(s[e], s[4 + e], 0x20);
    r[4 + e] = _mm256_permute2f128_ps(s[e], s[4 + e], 0x31);
  }
}

// Scores of 8 keys (kt: keys across lanes, d vectors of 8) for G queries q_stride apart.
template <int G>
AVX2 inline __attribute__((always_inline)) void scores8(const float* q, int64_t q_stride, const float* kt, int64_t d,
                                                        __m256* s) {
  __m256 a[G][4];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < 4; ++c) a[g][c] = _mm256_setzero_ps();
  for (int64_t dd = 0; dd < d; dd += 4) {
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m256 kc = _mm256_loadu_ps(kt + 8 * (dd + c));
#pragma GCC unroll 2
      for (int g = 0; g < G; ++g) a[g][c] = _mm256_fmadd_ps(_mm256_set1_ps(q[g * q_stride + dd + c]), kc, a[g][c]);
    }
  }
  for (int g = 0; g < G; ++g) s[g] = _mm256_add_ps(_mm256_add_ps(a[g][0], a[g][1]), _mm256_add_ps(a[g][2], a[g][3]));
}

// One thread's working memory, reused unit after unit (plain floats: every load is unaligned-safe).
struct Scratch {
  std::vector<float> kt, qf, probs, acc, sums, top;  // [d, 8] keys across lanes; [pairs, d]; [pairs, stride];
                                                     // [pairs, d]; [pairs]; [pairs, 8] running maxima
  std::vector<int64_t> visible;                      // [pairs] keys each pair sees
  Scratch(int64_t pairs, int64_t stride, int64_t d)
      : kt(8 * d), qf(pairs * d), probs(pairs * stride), acc(pairs * d), sums(pairs), top(8 * pairs), visible(pairs) {}
};

// Every pair's unnormalized probabilities exp(q . k_j * scale + mask_j - max) into w.probs, zero from its
// own visible count up to the unit's largest, which is returned.
template <typename T>
AVX2 int64_t unit_probs(const Call<T>& c, const Unit& u, Scratch& w, int64_t stride) {
  const int64_t pairs = u.rows * u.heads, d = c.d, chunks = d / 8;
  const T* keys = c.keys() + u.b * c.k_b + u.g * c.k_g;
  int64_t most = 0;
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t i = u.row0 + p / u.heads, h = u.g * c.group + u.head0 + p % u.heads;
    const T* qp = c.queries() + c.q_at(u.b, h, i);
    for (int64_t ch = 0; ch < chunks; ++ch) _mm256_storeu_ps(w.qf.data() + p * d + 8 * ch, load8(qp + 8 * ch));
    w.visible[p] = c.visible(i);
    _mm256_storeu_ps(w.top.data() + 8 * p, _mm256_set1_ps(NEG_INF));
    most = std::max(most, w.visible[p]);
  }
  const __m256 scale8 = _mm256_set1_ps(c.scale), lane_ids = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  alignas(32) float masked[8];
  __m256 s[2], r[8];
  for (int64_t j = 0; j < most; j += 8) {  // 8 keys read and transposed once, scored for every pair
    const int64_t count = std::min<int64_t>(8, most - j);
    for (int64_t ch = 0; ch < chunks; ++ch) {
      for (int e = 0; e < 8; ++e) r[e] = e < count ? load8(keys + (j + e) * c.k_row + 8 * ch) : _mm256_setzero_ps();
      transpose8(r);
      for (int e = 0; e < 8; ++e) _mm256_storeu_ps(w.kt.data() + 8 * (8 * ch + e), r[e]);
    }
    for (int64_t p = 0; p < pairs;) {
      const int64_t group = std::min<int64_t>(2, pairs - p);  // 3 would spill AVX2's 16 registers
      const float* q = w.qf.data() + p * d;
      if (group == 1) scores8<1>(q, d, w.kt.data(), d, s);
      else scores8<2>(q, d, w.kt.data(), d, s);
      for (int64_t g = 0; g < group; ++g, ++p) {
        const int64_t seen = std::min<int64_t>(8, w.visible[p] - j);
        if (seen <= 0) continue;
        __m256 sc = _mm256_mul_ps(s[g], scale8);
        if (c.mask != nullptr) {
          const float* m = c.mask + u.b * c.m_b + (u.row0 + p / u.heads) * c.m_i + j * c.m_j;
          for (int64_t e = 0; e < 8; ++e) masked[e] = e < seen ? m[e * c.m_j] : 0.0f;
          sc = _mm256_add_ps(sc, _mm256_load_ps(masked));
        }
        const __m256 lanes = _mm256_cmp_ps(lane_ids, _mm256_set1_ps(static_cast<float>(seen)), _CMP_LT_OQ);
        float* top = w.top.data() + 8 * p;
        _mm256_storeu_ps(top, _mm256_max_ps(_mm256_loadu_ps(top), _mm256_blendv_ps(_mm256_set1_ps(NEG_INF), sc, lanes)));
        _mm256_store_ps(masked, sc);
        std::memcpy(w.probs.data() + p * stride + j, masked, seen * sizeof(float));
      }
    }
  }
  for (int64_t p = 0; p < pairs; ++p) {
    float* sp = w.probs.data() + p * stride;
    const int64_t visible = w.visible[p];
    float top = *std::max_element(w.top.begin() + 8 * p, w.top.begin() + 8 * p + 8);
    if (top == NEG_INF) top = 0.0f;  // every key hidden: a row of zeros
    const __m256 topv = _mm256_set1_ps(top);
    for (int64_t t = 0; t < visible; t += 8) {  // exp lane by lane: a key's p depends on its score alone
      const int64_t left = std::min<int64_t>(8, visible - t);
      for (int64_t e = 0; e < 8; ++e) masked[e] = e < left ? sp[t + e] : NEG_INF;
      _mm256_store_ps(masked, exp8(_mm256_sub_ps(_mm256_load_ps(masked), topv)));
      std::memcpy(sp + t, masked, left * sizeof(float));
    }
    std::fill(sp + visible, sp + most, 0.0f);  // keys past its own: p = 0, which adds exactly nothing below
  }
  return most;
}

// Keys [j0, j1) into GB pairs' accumulators, chunks [c0, c0 + SL) of 8 floats each: each pair's chain
// is the one it runs alone, in key order; p = 0 is skipped (it would add exactly nothing). Sums are
// counted once, with the first slice.
template <typename T, int SL, int GB>
AVX2 void weigh_slice(const float* probs, int64_t stride, const T* v, int64_t v_row, int64_t j0, int64_t j1,
                      float* acc, int64_t acc_stride, float* sums, int64_t c0) {
  __m256 a[GB][SL];
  float sum[GB];
  for (int g = 0; g < GB; ++g) {
    sum[g] = sums[g];
    for (int c = 0; c < SL; ++c) a[g][c] = _mm256_loadu_ps(acc + g * acc_stride + 8 * (c0 + c));
  }
  for (int64_t j = j0; j < j1; ++j) {
    __m256 vv[SL];
    const T* vj = v + j * v_row + 8 * c0;
    for (int c = 0; c < SL; ++c) vv[c] = load8(vj + 8 * c);
    for (int g = 0; g < GB; ++g) {
      const float p = probs[g * stride + j];
      sum[g] += p;
      if (p == 0.0f) continue;
      const __m256 pv = _mm256_set1_ps(p);
      for (int c = 0; c < SL; ++c) a[g][c] = _mm256_fmadd_ps(pv, vv[c], a[g][c]);
    }
  }
  for (int g = 0; g < GB; ++g) {
    if (c0 == 0) sums[g] = sum[g];
    for (int c = 0; c < SL; ++c) _mm256_storeu_ps(acc + g * acc_stride + 8 * (c0 + c), a[g][c]);
  }
}

// out = sum_j p_j v_j / sum_j p_j for every pair of the unit. A slice is 4 chunks (32 floats: two pairs'
// accumulators and the value vectors fit AVX2's 16 registers), or 2 where the head size is 16 mod 32.
template <typename T>
AVX2 void unit_weigh(const Call<T>& c, const Unit& u, Scratch& w, int64_t stride, int64_t most) {
  const int64_t pairs = u.rows * u.heads, d = c.d, chunks = d / 8;
  std::fill(w.acc.begin(), w.acc.begin() + pairs * d, 0.0f);
  std::fill(w.sums.begin(), w.sums.begin() + pairs, 0.0f);
  const T* values = c.values() + u.b * c.v_b + u.g * c.v_g;
  const bool wide = chunks % 4 == 0;
  for (int64_t j0 = 0; j0 < most; j0 += KEY_BLOCK) {
    const int64_t j1 = std::min(j0 + KEY_BLOCK, most);
    for (int64_t c0 = 0; c0 < chunks; c0 += wide ? 4 : 2)
      for (int64_t p = 0; p < pairs; p += 2) {
        float* acc = w.acc.data() + p * d;
        float* sums = w.sums.data() + p;
        const float* probs = w.probs.data() + p * stride;
        const bool two = pairs - p >= 2;
        if (wide && two) weigh_slice<T, 4, 2>(probs, stride, values, c.v_row, j0, j1, acc, d, sums, c0);
        else if (wide) weigh_slice<T, 4, 1>(probs, stride, values, c.v_row, j0, j1, acc, d, sums, c0);
        else if (two) weigh_slice<T, 2, 2>(probs, stride, values, c.v_row, j0, j1, acc, d, sums, c0);
        else weigh_slice<T, 2, 1>(probs, stride, values, c.v_row, j0, j1, acc, d, sums, c0);
      }
  }
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t i = u.row0 + p / u.heads, h = u.g * c.group + u.head0 + p % u.heads;
    T* o = c.output() + (c.out_row(u.b, i) * c.H + h) * d;
    const __m256 norm = _mm256_set1_ps(w.sums[p] > 0.0f ? w.sums[p] : 1.0f);
    for (int64_t ch = 0; ch < chunks; ++ch) store8(o + 8 * ch, _mm256_div_ps(_mm256_loadu_ps(w.acc.data() + p * d + 8 * ch), norm));
  }
}

// Part `part` of `parts` of the call's units (the split sized for `parts` threads).
template <typename T>
void attend_share(const specdec_parts::AttendArgs& a, int64_t part, int64_t parts) {
  const Call<T> c(a);
  const Split split = specdec_attention_units::split_work(a.B, a.kv_heads, a.n, c.group, parts);
  const std::vector<Unit> units = specdec_attention_units::split_units(
      split, a.B, a.kv_heads, a.n, c.group, part, parts, [&a](int64_t b) { return a.rows_of(b); });
  if (units.empty()) return;
  const int64_t stride = c.L + 16;
  Scratch w(split.rows * split.heads, stride, c.d);
  for (const Unit& u : units) unit_weigh<T>(c, u, w, stride, unit_probs<T>(c, u, w, stride));
}

}  // namespace

void specdec_parts::attend_part_avx2(bool bf16, const AttendArgs& a, int64_t part, int64_t parts) {
  if (bf16)
    attend_share<at::BFloat16>(a, part, parts);
  else
    attend_share<float>(a, part, parts);
}
