// RMSNorm of rows, in AVX-512 or AVX2 where the CPU has them, with a scalar reference (and fallback):
// y = weight * to_T(x * rsqrt(mean(x^2) + eps)), the mean in float32 by a fixed order (eight running sums,
// lane l over k = l mod 8, then one fixed combine), so a row's result does not depend on the other rows.
// Every path gives the scalar path's bits (layer_rows.h's rounding helpers), and runs 5-10x faster: the
// scalar loop, with its bf16 conversions, cost ~0.8 us a row of 576, 0.2 ms of an 8-row bf16 forward.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "layer_rows.h"

namespace specdec_rows {

// 1 / sqrt(mean + eps) from the eight running sums of squares, combined in one fixed order.
inline float rms_scale(const float* lanes, int64_t H, float eps) {
  const float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  return 1.0f / std::sqrt(sum / static_cast<float>(H) + eps);
}

// The scalar reference: each product and each sum rounded on its own (no FMA).
template <typename T>
inline void norm_range_scalar(const T* x, const T* w, T* y, int64_t H, float eps, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const T* xr = x + r * H;
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t k = 0;
    for (; k + 8 <= H; k += 8)
      for (int l = 0; l < 8; ++l) lanes[l] += static_cast<float>(xr[k + l]) * static_cast<float>(xr[k + l]);
    for (; k < H; ++k) lanes[k % 8] += static_cast<float>(xr[k]) * static_cast<float>(xr[k]);
    const float scale = rms_scale(lanes, H, eps);
    for (int64_t j = 0; j < H; ++j)
      y[r * H + j] = static_cast<T>(static_cast<float>(w[j]) *
                                    static_cast<float>(static_cast<T>(static_cast<float>(xr[j]) * scale)));
  }
}

// The same sums and roundings, vectorized: lane l of the eight sums takes k = l mod 8 in the scalar order
// (a 16-lane product's two halves added one after the other), the scale is the scalar one, and each output
// is the same two rounded products (layer_rows.h's helpers: no FMA, bf16 to nearest even).
template <typename T>
ROWS_AVX512 void norm_range_avx512(const T* x, const T* w, T* y, int64_t H, float eps, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const T* xr = x + r * H;
    __m256 sums = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= H; k += 16) {
      const __m512 v = load16(xr + k, 0xFFFF);
      const __m512 sq = mul16(v, v);
      sums = _mm256_add_ps(sums, _mm512_castps512_ps256(sq));
      sums = _mm256_add_ps(sums, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sq), 1)));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, sums);
    if (k < H) {  // the tail's squares rounded as products here (a scalar x * x + s would become an FMA)
      alignas(64) float sq[16];
      const __m512 v = load16(xr + k, static_cast<__mmask16>((1u << (H - k)) - 1));
      _mm512_store_ps(sq, mul16(v, v));
      for (int64_t e = 0; k + e < H; ++e) lanes[(k + e) % 8] += sq[e];
    }
    const __m512 scale = _mm512_set1_ps(rms_scale(lanes, H, eps));
    for (int64_t j = 0; j < H; j += 16) {
      const int64_t left = std::min<int64_t>(16, H - j);
      const __mmask16 m = left == 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
      store16(y + r * H + j, mul16(load16(w + j, m), round16<T>(mul16(load16(xr + j, m), scale))), m);
    }
  }
}

template <typename T>
ROWS_AVX2 void norm_range_avx2(const T* x, const T* w, T* y, int64_t H, float eps, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const T* xr = x + r * H;
    __m256 sums = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= H; k += 8) {
      const __m256 v = load8(xr + k);
      sums = _mm256_add_ps(sums, _mm256_mul_ps(v, v));  // no "fma" in this target: two roundings
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, sums);
    for (; k < H; ++k) lanes[k % 8] += static_cast<float>(xr[k]) * static_cast<float>(xr[k]);
    const float s = rms_scale(lanes, H, eps);
    const __m256 scale = _mm256_set1_ps(s);
    int64_t j = 0;
    for (; j + 8 <= H; j += 8)
      store8(y + r * H + j, _mm256_mul_ps(load8(w + j), round8<T>(_mm256_mul_ps(load8(xr + j), scale))));
    for (; j < H; ++j)
      y[r * H + j] = static_cast<T>(static_cast<float>(w[j]) *
                                    static_cast<float>(static_cast<T>(static_cast<float>(xr[j]) * s)));
  }
}

// Rows [begin, end) of x [rows, H] normed into y: y = weight * to_T(x * rsqrt(mean(x^2) + eps)).
template <typename T>
inline void rms_norm(const T* x, const T* w, T* y, int64_t H, float eps, int64_t begin, int64_t end, Isa isa) {
  if (isa == AVX512) norm_range_avx512<T>(x, w, y, H, eps, begin, end);
  else if (isa == AVX2) norm_range_avx2<T>(x, w, y, H, eps, begin, end);
  else norm_range_scalar<T>(x, w, y, H, eps, begin, end);
}

}  // namespace specdec_rows
