// SIMD pieces of attention.cpp (AVX-512): loads and stores of float32 / bfloat16 as 16 float lanes, a
// lane-wise exp, 16 keys' scores with several queries (the keys transposed across lanes), and value rows
// weighed into several queries' accumulators. Each query's result depends on its own inputs only, in an
// order fixed by the key index: what makes attention.cpp's rows invariant.
#pragma once
#include <torch/extension.h>
#include <immintrin.h>
#include <cstdint>

namespace specdec_attention {

#define SPECDEC_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,fma")))

template <typename T> SPECDEC_AVX512 inline __m512 load16(const T* p);
template <> SPECDEC_AVX512 inline __m512 load16<float>(const float* p) { return _mm512_loadu_ps(p); }
template <> SPECDEC_AVX512 inline __m512 load16<at::BFloat16>(const at::BFloat16* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

template <typename T> SPECDEC_AVX512 inline void store16(T* p, __m512 v);
template <> SPECDEC_AVX512 inline void store16<float>(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
template <> SPECDEC_AVX512 inline void store16<at::BFloat16>(at::BFloat16* p, __m512 v) {  // round to nearest even
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
}

// A pair's output: its accumulators (chunks x 16 floats) over its sum of probabilities (0: all keys hidden).
template <typename T>
SPECDEC_AVX512 inline void store_normalized(T* out, const float* acc, float sum, int64_t chunks) {
  const __m512 norm = _mm512_set1_ps(sum > 0.0f ? sum : 1.0f);
  for (int64_t ch = 0; ch < chunks; ++ch) store16(out + 16 * ch, _mm512_div_ps(_mm512_loadu_ps(acc + 16 * ch), norm));
}

// e^x lane by lane (Cephes-style polynomial, ~1 ulp); exactly 0 below -87 (hidden keys, far tails).
SPECDEC_AVX512 inline __m512 exp16(__m512 x) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~tiny), _mm512_scalef_ps(p, n));
}

SPECDEC_AVX512 inline __m512 lo(__m512 x, __m512 y) {  // 64-bit halves interleaved, low ones
  return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)));
}
SPECDEC_AVX512 inline __m512 hi(__m512 x, __m512 y) {  // and the high ones
  return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)));
}

// 16 rows of 16 floats transposed in registers: r[e] lane i <- r[i] lane e (unpacks within 128-bit
// lanes, then 128-bit lanes across rows).
SPECDEC_AVX512 inline __attribute__((always_inline)) void transpose16(__m512* r) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: a0 b0 a1 b1 and a2 b2 a3 b3
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4i + e], 128-bit lane L: column 4L + e of rows 4i..4i+3
    r[4 * i] = lo(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = hi(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = lo(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = hi(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int e = 0; e < 4; ++e) {
    t[e] = _mm512_shuffle_f32x4(r[e], r[4 + e], 0x88);
    t[4 + e] = _mm512_shuffle_f32x4(r[e], r[4 + e], 0xdd);
    t[8 + e] = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0x88);
    t[12 + e] = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0xdd);
  }
  for (int e = 0; e < 4; ++e) {
    r[e] = _mm512_shuffle_f32x4(t[e], t[8 + e], 0x88);
    r[8 + e] = _mm512_shuffle_f32x4(t[e], t[8 + e], 0xdd);
    r[4 + e] = _mm512_shuffle_f32x4(t[4 + e], t[12 + e], 0x88);
    r[12 + e] = _mm512_shuffle_f32x4(t[4 + e], t[12 + e], 0xdd);
  }
}

// How far ahead the key and value streams are asked for, in bytes of rows (a head's keys or values are
// contiguous rows of d elements). Into L2, not L1: the streams come from memory in a forward (its layers'
// caches are read once each, after megabytes of weights), and L2 requests are not held back by L1's few
// line-fill buffers. Attention alone over cold caches (benchmarks/attention_cost.py --threads 2 --layers 48
// --repeats 300, AMD EPYC, two rounds each, medians; against 64 rows ahead into L1), 1,024 cached: float32
// 1 / 8 / 16 rows 132-134 / 214-218 / 325-334 -> 119-134 / 167-174 / 266-275 us, bf16 8 / 16 rows 118-125 /
// 216-221 -> 112-121 / 200-204, bf16 one row 53-57 -> 56; 256 cached: float32 16 rows 81-97 -> 75-77.
constexpr int64_t KV_AHEAD_BYTES = 16384;

// One row of `bytes` into L2, a line at a time: a key or value row KV_AHEAD_BYTES ahead, asked for a row per
// row worked on (a whole block asked at once filled the line-fill buffers and stalled the loop).
template <typename T>
SPECDEC_AVX512 inline void prefetch_row(const T* row, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64) _mm_prefetch(reinterpret_cast<const char*>(row) + at, _MM_HINT_T1);
}

// A block of keys across lanes: kt[dd] lane e = k[e][dd] for keys e < count (count <= 16; lanes past it 0).
// ahead: that many keys on from k are there to prefetch (the block KV_AHEAD_BYTES on, row by row).
template <typename T>
SPECDEC_AVX512 void keys_across_lanes(const T* k, int64_t k_row, int64_t count, int64_t chunks, __m512* kt,
                                      int64_t ahead) {
  const int64_t row_bytes = chunks * 16 * int64_t{sizeof(T)}, AHEAD = KV_AHEAD_BYTES / row_bytes;
  for (int e = 0; e < 16 && e + AHEAD < ahead; ++e) prefetch_row(k + (e + AHEAD) * k_row, row_bytes);
  for (int64_t c = 0; c < chunks; ++c) {
    __m512 r[16];
    for (int e = 0; e < 16; ++e) r[e] = e < count ? load16(k + e * k_row + 16 * c) : _mm512_setzero_ps();
    transpose16(r);
    for (int e = 0; e < 16; ++e) kt[16 * c + e] = r[e];
  }
}

// Scores of 16 keys (kt: keys across lanes, d vectors) for G queries (q: float32, q_stride apart): four
// chains from zero over the dims (dd mod 4), then (c0 + c1) + (c2 + c3). A key's score depends on its
// values and the query's alone, not on the block, the lane, or the other queries: row invariance.
template <int G>
SPECDEC_AVX512 inline __attribute__((always_inline)) void scores16(const float* q, int64_t q_stride, const __m512* kt,
                                                                   int64_t d, __m512* s) {
  __m512 a[G][4];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < 4; ++c) a[g][c] = _mm512_setzero_ps();
  for (int64_t dd = 0; dd < d; dd += 4) {
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512 kc = kt[dd + c];
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) a[g][c] = _mm512_fmadd_ps(_mm512_set1_ps(q[g * q_stride + dd + c]), kc, a[g][c]);
    }
  }
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) s[g] = _mm512_add_ps(_mm512_add_ps(a[g][0], a[g][1]), _mm512_add_ps(a[g][2], a[g][3]));
}

// bf16 scores by dot-pairs (AVX512-BF16): VDPBF16PS adds a pair of dims' two exact products to a float32
// lane, so a key's score takes half the multiply instructions, and its keys half the transposes, of the
// widened path above. A CPU with AVX512-BF16 takes this path for every bf16 call with d a multiple of 32
// (one row or many: its rows stay invariant among themselves; other CPUs keep the widened path's bits).
#define SPECDEC_AVX512_BF16 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,fma,avx512bf16")))

// A block of keys across lanes as pairs: kt[i] lane e = key e's dims (2i, 2i + 1), two bf16 in one 32-bit
// lane, for keys e < count (count <= 16; lanes past it 0); d a multiple of 32. ahead: as keys_across_lanes.
SPECDEC_AVX512_BF16 inline void key_pairs_across_lanes(const at::BFloat16* k, int64_t k_row, int64_t count, int64_t d,
                                                       __m512* kt, int64_t ahead) {
  const int64_t AHEAD = KV_AHEAD_BYTES / (d * 2);
  for (int e = 0; e < 16 && e + AHEAD < ahead; ++e) prefetch_row(k + (e + AHEAD) * k_row, d * 2);
  for (int64_t c = 0; c < d / 32; ++c) {
    __m512 r[16];
    for (int e = 0; e < 16; ++e)
      r[e] = e < count ? _mm512_castsi512_ps(_mm512_loadu_si512(k + e * k_row + 32 * c)) : _mm512_setzero_ps();
    transpose16(r);  // 32-bit lanes: a pair moves as one
    for (int e = 0; e < 16; ++e) kt[16 * c + e] = r[e];
  }
}

// Scores of 16 keys (kt: key pairs across lanes, `pairs` vectors) for G queries (q: their bf16 pairs as
// 32-bit words, q_stride words apart): four chains from zero over the pairs (pair mod 4), then (c0 + c1) +
// (c2 + c3). A key's score depends on its values and the query's alone: row invariance, as scores16.
template <int G>
SPECDEC_AVX512_BF16 inline __attribute__((always_inline)) void scores16_pairs(const uint32_t* q, int64_t q_stride,
                                                                              const __m512* kt, int64_t pairs,
                                                                              __m512* s) {
  __m512 a[G][4];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < 4; ++c) a[g][c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < pairs; i += 4) {
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512bh kc = (__m512bh)_mm512_castps_si512(kt[i + c]);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g)
        a[g][c] = _mm512_dpbf16_ps(a[g][c], (__m512bh)_mm512_set1_epi32(static_cast<int>(q[g * q_stride + i + c])), kc);
    }
  }
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) s[g] = _mm512_add_ps(_mm512_add_ps(a[g][0], a[g][1]), _mm512_add_ps(a[g][2], a[g][3]));
}

// Whether none of G pairs' probabilities of keys [j0, j1) is 0 (probs: G rows, stride apart).
SPECDEC_AVX512 inline bool none_zero(const float* probs, int64_t stride, int64_t G, int64_t j0, int64_t j1) {
  for (int64_t g = 0; g < G; ++g)
    for (int64_t j = j0; j < j1; j += 16) {
      const __mmask16 lanes = j1 - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (j1 - j)) - 1);
      const __m512 p = _mm512_maskz_loadu_ps(lanes, probs + g * stride + j);
      if (_mm512_mask_cmp_ps_mask(lanes, p, _mm512_setzero_ps(), _CMP_EQ_OQ) != 0) return false;
    }
  return true;
}

// Keys [j0, j1) into GB pairs' value accumulators (acc: GB rows of acc_stride floats), CH chunks of 16:
// each pair's chain is the one it runs alone (a masked FMA skips p = 0), the pairs interleaved so each
// value row is loaded once for all of them. The sums of p are taken with the exp (attention_probs.h), so
// a pair's p is broadcast here straight from memory: a load, not a shuffle on a port the FMAs need, and
// no scalar chain beside them (attention alone, float32, 16 rows x 1,024 keys, one thread: 5-10% faster).
// DENSE: the caller saw no p = 0 in the block, so every mask would be all ones and plain FMAs give the
// same bits without the per-key test (most blocks: only a causal row's last keys and far tails are 0).
// ahead: prefetch value row j + KEY_AHEAD (KV_AHEAD_BYTES on) while weighing row j, for rows before `ahead`
// (0: none).
template <typename T, int CH, int GB, bool DENSE>
SPECDEC_AVX512 void weigh_block(const float* probs, int64_t stride, const T* v, int64_t v_row, int64_t j0, int64_t j1,
                        float* acc, int64_t acc_stride, int64_t ahead) {
  constexpr int64_t KEY_AHEAD = KV_AHEAD_BYTES / (CH * 16 * int64_t{sizeof(T)});
  __m512 a[GB][CH];
  for (int g = 0; g < GB; ++g)
    for (int c = 0; c < CH; ++c) a[g][c] = _mm512_loadu_ps(acc + g * acc_stride + 16 * c);
  for (int64_t j = j0; j < j1; ++j) {
    __m512 vv[CH];
    const T* vj = v + j * v_row;
    if (j + KEY_AHEAD < ahead) prefetch_row(vj + KEY_AHEAD * v_row, CH * 16 * int64_t{sizeof(T)});
    for (int c = 0; c < CH; ++c) vv[c] = load16(vj + 16 * c);
    for (int g = 0; g < GB; ++g) {
      const __m512 pv = _mm512_set1_ps(probs[g * stride + j]);
      if (DENSE) {
        for (int c = 0; c < CH; ++c) a[g][c] = _mm512_fmadd_ps(pv, vv[c], a[g][c]);
      } else {
        const __mmask16 seen = probs[g * stride + j] != 0.0f ? 0xFFFF : 0;
        for (int c = 0; c < CH; ++c) a[g][c] = _mm512_mask3_fmadd_ps(pv, vv[c], a[g][c], seen);
      }
    }
  }
  for (int g = 0; g < GB; ++g)
    for (int c = 0; c < CH; ++c) _mm512_storeu_ps(acc + g * acc_stride + 16 * c, a[g][c]);
}

// Any head size (chunks of 16 at run time), one pair: the same chain as weigh_block.
template <typename T>
SPECDEC_AVX512 void weigh_any(const float* probs, const T* v, int64_t v_row, int64_t j0, int64_t j1, int64_t chunks,
                      float* acc) {
  for (int64_t j = j0; j < j1; ++j) {
    const float p = probs[j];
    if (p == 0.0f) continue;
    const __m512 pv = _mm512_set1_ps(p);
    const T* vj = v + j * v_row;
    for (int64_t c = 0; c < chunks; ++c)
      _mm512_storeu_ps(acc + 16 * c, _mm512_fmadd_ps(pv, load16(vj + 16 * c), _mm512_loadu_ps(acc + 16 * c)));
  }
}

}  // namespace specdec_attention
