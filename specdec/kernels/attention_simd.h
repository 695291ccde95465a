// SIMD pieces of attention.cpp (AVX-512): loads and stores of float32 / bfloat16 as 16 float lanes, a
// lane-wise exp, and 16 keys' dot products with one query summed by a fixed reduction tree. Each
// result depends on its own inputs only, which is what makes attention.cpp's rows invariant.
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

constexpr int MAX_CHUNKS = 16;  // head_dim up to 256

// q . k for 16 keys at once, each key's 16 lanes summed by exactly the additions _mm512_reduce_add_ps
// makes (upper half + lower half, then quarters, then lanes 0+2 and 1+3, then the last pair), done
// lane-wise across keys: bitwise the one-key loop's sums, at a fraction of its horizontal work.
// CH: the head's chunks of 16 known at compile time (2, 4, 8: unrolled, the 16 keys' chains interleaved
// in registers; the same operations per key), or 0: `chunks` at run time.
template <typename T, int CH>
SPECDEC_AVX512 inline __attribute__((always_inline)) __m512 dots16(const __m512* qv, int64_t chunks, const T* k,
                                                                   int64_t k_row) {
  __m512 acc[16];
  if constexpr (CH > 0) {
#pragma GCC unroll 16
    for (int key = 0; key < 16; ++key) acc[key] = _mm512_mul_ps(qv[0], load16(k + key * k_row));
#pragma GCC unroll 8
    for (int c = 1; c < CH; ++c) {
#pragma GCC unroll 16
      for (int key = 0; key < 16; ++key) acc[key] = _mm512_fmadd_ps(qv[c], load16(k + key * k_row + 16 * c), acc[key]);
    }
  } else {
    for (int key = 0; key < 16; ++key) {
      const T* kj = k + key * k_row;
      acc[key] = _mm512_mul_ps(qv[0], load16(kj));
      for (int64_t c = 1; c < chunks; ++c) acc[key] = _mm512_fmadd_ps(qv[c], load16(kj + 16 * c), acc[key]);
    }
  }
  __m512 half[8], quarter[4], eighth[2];
  for (int p = 0; p < 8; ++p)  // keys 2p, 2p+1: 8 lanes each, lane i = x[i] + x[i + 8]
    half[p] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * p], acc[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)),
                            _mm512_shuffle_f32x4(acc[2 * p], acc[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)));
  for (int p = 0; p < 4; ++p)  // keys 4p..4p+3, one per 128-bit lane: lane i = h[i] + h[i + 4]
    quarter[p] = _mm512_add_ps(_mm512_shuffle_f32x4(half[2 * p], half[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)),
                               _mm512_shuffle_f32x4(half[2 * p], half[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)));
  for (int p = 0; p < 2; ++p)  // per 128-bit lane: [r0+r2, r1+r3] of two keys
    eighth[p] = _mm512_add_ps(_mm512_shuffle_ps(quarter[2 * p], quarter[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(quarter[2 * p], quarter[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(eighth[0], eighth[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_ps(eighth[0], eighth[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // lane 4j + e holds key 4e + j: back to key order
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), sums);
}

}  // namespace specdec_attention
