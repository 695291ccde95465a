// silu(gate) * up, the Llama MLP's activation, one row's run of columns at a time, bit for bit what ATen's
// two tensor ops (at::silu_out, then mul_) store, which is what transformers' walk computes: the lean
// forward's hidden states stay bitwise the walk's. Written out because the two ATen calls, with their
// views, cost ~7 us a layer on each thread however few the elements (0.2 ms of a one-row bf16 forward).
//
// What ATen runs, and so what this does, follows its CPU capability (at::get_cpu_capability, which
// ATEN_CPU_CAPABILITY can lower): with AVX-512 or AVX2 its loop over a run of n elements takes whole steps
// of vectors (silu: 2 x 16 floats or 2 x 32 bf16 on AVX-512, half that on AVX2) and the rest one by one,
// so a run here splits at the same places (found by test). Vector lanes: silu = x / (1 + exp(-x)) with exp
// by Sleef_expf16_u10 (AVX-512) or Sleef_expf8_u10 (AVX2), libtorch's own; bf16 rounds to nearest even
// with NaN -> 0xFFFF.
// Elements one by one (and every element under DEFAULT): std::exp, and c10's rounding (NaN -> 0x7FC0).
// tests/kernels/test_rows.py holds each capability's path to ATen's ops, every bf16 value included.
#pragma once
#include <ATen/Version.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "layer_rows.h"

extern "C" {
__m512 Sleef_expf16_u10(__m512);  // in libtorch_cpu, as ATen's vectorized exp calls them
__m256 Sleef_expf8_u10(__m256);
}

namespace specdec_rows {

// The path ATen's element-wise kernels take in this process (asked once).
inline Isa aten_isa() {
  static const Isa isa = [] {
    const std::string cap = at::get_cpu_capability();
    return cap == "AVX512" ? AVX512 : cap == "AVX2" ? AVX2 : SCALAR;
  }();
  return isa;
}

template <typename T>
inline T silu_one(T g) {
  const float x = static_cast<float>(g);
  return static_cast<T>(x / (1.0f + std::exp(-x)));
}

template <typename T>
inline T silu_mul_one(T g, T u) {
  return static_cast<T>(static_cast<float>(silu_one(g)) * static_cast<float>(u));
}

constexpr int ATEN_NAN = 0xFFFF;  // a NaN's bf16 from ATen's vectorized conversion (c10's scalar one: C10_NAN)

// ATen's vector silu of a bf16 lane, rounded, for every one of the 65536 bf16 bit patterns (bits [k] for
// pattern k; 16 spare entries so a 4-byte gather of the last one stays inside): a lane's result depends on its
// own bits alone, so looking it up gives the bits computing it gives. A Sleef exp and a division cost ~30
// cycles a vector here, a gather ~10.
ROWS_AVX512 inline void fill_silu_bf16(uint16_t* bits) {
  const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int32_t k = 0; k < 65536; k += 16) {
    const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_set1_epi32(k), iota), 16));
    const __m512 s = _mm512_div_ps(x, add16(one, Sleef_expf16_u10(_mm512_xor_ps(x, sign))));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits + k), _mm512_cvtepi32_epi16(bf16_bits16(s, ATEN_NAN)));
  }
}

inline const uint16_t* silu_bf16_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> bits(65536 + 16, 0);
    fill_silu_bf16(bits.data());
    return bits;
  }();
  return table.data();
}

// On AVX-512 ATen's bf16 silu takes 64 elements a step but its bf16 product 32, so a run's elements
// [n / 64 * 64, n / 32 * 32) have silu one by one and the product by vector (which shows in a NaN's bits).
template <typename T>
ROWS_AVX512 void silu_mul_avx512(const T* gate, const T* up, T* out, int64_t n) {
  constexpr bool bf16 = std::is_same<T, at::BFloat16>::value;
  const int64_t silu_end = n / (bf16 ? 64 : 32) * (bf16 ? 64 : 32), mul_end = bf16 ? n / 32 * 32 : silu_end;
  const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
  const uint16_t* const table = bf16 ? silu_bf16_table() : nullptr;
  for (int64_t j = 0; j < mul_end; j += 16) {
    __m512 s;
    if (bf16 && j < silu_end) {  // the table's rounded silu of each lane (fill_silu_bf16)
      const __m512i k = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gate + j)));
      s = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_i32gather_epi32(k, table, 2), 16));
    } else if (j < silu_end) {
      const __m512 x = load16(gate + j, 0xFFFF);
      s = round16<T>(_mm512_div_ps(x, add16(one, Sleef_expf16_u10(_mm512_xor_ps(x, sign)))), ATEN_NAN);
    } else {
      alignas(64) float each[16];
      for (int e = 0; e < 16; ++e) each[e] = static_cast<float>(silu_one(gate[j + e]));
      s = _mm512_load_ps(each);
    }
    store16(out + j, mul16(s, load16(up + j, 0xFFFF)), 0xFFFF, ATEN_NAN);
  }
  for (int64_t j = mul_end; j < n; ++j) out[j] = silu_mul_one(gate[j], up[j]);
}

template <typename T>
ROWS_AVX2 void silu_mul_avx2(const T* gate, const T* up, T* out, int64_t n) {
  constexpr bool bf16 = std::is_same<T, at::BFloat16>::value;
  const int64_t vec_end = n / (bf16 ? 32 : 16) * (bf16 ? 32 : 16);
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  for (int64_t j = 0; j < vec_end; j += 8) {
    const __m256 x = load8(gate + j);
    const __m256 e = Sleef_expf8_u10(_mm256_xor_ps(x, sign));
    const __m256 s = round8<T>(_mm256_div_ps(x, _mm256_add_ps(one, e)), ATEN_NAN);
    store8(out + j, _mm256_mul_ps(s, load8(up + j)), ATEN_NAN);  // no "fma" in this target: nothing to contract
  }
  for (int64_t j = vec_end; j < n; ++j) out[j] = silu_mul_one(gate[j], up[j]);
}

// out[j] = silu(gate[j]) * up[j] for j < n, as ATen's silu_out then mul_ over a run of n store it.
template <typename T>
inline void silu_mul(const T* gate, const T* up, T* out, int64_t n) {
  const Isa isa = aten_isa();
  if (isa == AVX512) silu_mul_avx512<T>(gate, up, out, n);
  else if (isa == AVX2) silu_mul_avx2<T>(gate, up, out, n);
  else for (int64_t j = 0; j < n; ++j) out[j] = silu_mul_one(gate[j], up[j]);
}

}  // namespace specdec_rows
