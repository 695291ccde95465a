// layer.cpp's element-wise steps, row by row: rotary embedding on a row's heads and the residual add, in
// AVX-512 or AVX2 where the CPU has them, with a scalar reference (and fallback).
//
// Every path gives the scalar path's bits: transformers' apply_rotary_pos_emb is three tensor ops, x * cos,
// rotate_half(x) * sin and their sum, each rounded to the dtype, so every lane computes exactly that -- a
// separate multiply, rounding, multiply, rounding, add, rounding (no FMA) -- and bfloat16 rounds to
// nearest even with every NaN becoming 0x7FC0 as at::BFloat16 does (VCVTNEPS2BF16 would not do: it reads
// subnormal inputs as zero). An element's result depends on its own inputs only, not on its lane, the
// chunk, the row count or the thread split: the forward stays row-invariant.
#pragma once
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>

namespace specdec_rows {

#define ROWS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define ROWS_AVX2 __attribute__((target("avx2")))  // no "fma": nothing to contract a product and a sum into

enum Isa : int64_t { SCALAR = 0, AVX2 = 1, AVX512 = 2 };

// The widest path this CPU runs (asked once).
inline Isa best_isa() {
  static const Isa isa = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")
                             ? AVX512
                             : __builtin_cpu_supports("avx2") ? AVX2 : SCALAR;
  return isa;
}

// ---- scalar: the reference, written as transformers' ops round ----

// x * cos + rotate_half(x) * sin on one head of d values, in place (d even).
template <typename T>
inline void rotate_scalar(T* x, const T* cos, const T* sin, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t j = 0; j < half; ++j) {
    const T x1 = x[j], x2 = x[j + half];
    const T turned = static_cast<T>(-x2);
    x[j] = static_cast<T>(static_cast<T>(x1 * cos[j]) + static_cast<T>(turned * sin[j]));
    x[j + half] = static_cast<T>(static_cast<T>(x2 * cos[j + half]) + static_cast<T>(x1 * sin[j + half]));
  }
}

template <typename T>
inline void add_scalar(const T* x, T* y, int64_t count) {
  for (int64_t j = 0; j < count; ++j) y[j] = static_cast<T>(x[j] + y[j]);
}

// ---- AVX-512: 16 lanes, masked at a tail ----

template <typename T> ROWS_AVX512 inline __m512 load16(const T* p, __mmask16 m);
template <> ROWS_AVX512 inline __m512 load16<float>(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
template <> ROWS_AVX512 inline __m512 load16<at::BFloat16>(const at::BFloat16* p, __mmask16 m) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// A NaN's bfloat16: at::BFloat16's (c10's scalar rounding). ATen's vectorized conversions give 0xFFFF.
constexpr int C10_NAN = 0x7FC0;

// A float's bfloat16 (in the low 16 bits of its lane): nearest even, NaN -> nan_bits.
ROWS_AVX512 inline __m512i bf16_bits16(__m512 v, int nan_bits = C10_NAN) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i top = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  return _mm512_mask_mov_epi32(top, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(nan_bits));
}

// v rounded to T, as a float (what T's tensor op stores and the next op reads back).
template <typename T> ROWS_AVX512 inline __m512 round16(__m512 v, int nan_bits = C10_NAN);
template <> ROWS_AVX512 inline __m512 round16<float>(__m512 v, int) { return v; }
template <> ROWS_AVX512 inline __m512 round16<at::BFloat16>(__m512 v, int nan_bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits16(v, nan_bits), 16));
}

template <typename T> ROWS_AVX512 inline void store16(T* p, __m512 v, __mmask16 m, int nan_bits = C10_NAN);
template <> ROWS_AVX512 inline void store16<float>(float* p, __m512 v, __mmask16 m, int) {
  _mm512_mask_storeu_ps(p, m, v);
}
template <> ROWS_AVX512 inline void store16<at::BFloat16>(at::BFloat16* p, __m512 v, __mmask16 m, int nan_bits) {
  _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(bf16_bits16(v, nan_bits)));
}

// A product and a sum each rounded on its own: GCC writes _mm512_mul_ps and _mm512_add_ps as plain vector
// arithmetic, which it contracts into an FMA under AVX-512's target (FMA comes with it); the explicit-rounding
// forms are builtins it leaves alone (the current rounding mode: nearest even, as the scalar ops use).
ROWS_AVX512 inline __m512 mul16(__m512 a, __m512 b) { return _mm512_mul_round_ps(a, b, _MM_FROUND_CUR_DIRECTION); }
ROWS_AVX512 inline __m512 add16(__m512 a, __m512 b) { return _mm512_add_round_ps(a, b, _MM_FROUND_CUR_DIRECTION); }

template <typename T>
ROWS_AVX512 void rotate_avx512(T* x, const T* cos, const T* sin, int64_t d) {
  const int64_t half = d / 2;
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t j = 0; j < half; j += 16) {  // lanes j.. of each half: read both before writing either
    const int64_t left = std::min<int64_t>(16, half - j);
    const __mmask16 m = left == 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    const __m512 x1 = load16(x + j, m), x2 = load16(x + j + half, m);
    const __m512 a1 = round16<T>(mul16(x1, load16(cos + j, m)));
    const __m512 b1 = round16<T>(mul16(_mm512_xor_ps(x2, sign), load16(sin + j, m)));
    const __m512 a2 = round16<T>(mul16(x2, load16(cos + j + half, m)));
    const __m512 b2 = round16<T>(mul16(x1, load16(sin + j + half, m)));
    store16(x + j, add16(a1, b1), m);
    store16(x + j + half, add16(a2, b2), m);
  }
}

template <typename T>
ROWS_AVX512 void add_avx512(const T* x, T* y, int64_t count) {
  for (int64_t j = 0; j < count; j += 16) {
    const int64_t left = std::min<int64_t>(16, count - j);
    const __mmask16 m = left == 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    store16(y + j, add16(load16(x + j, m), load16(y + j, m)), m);
  }
}

// ---- AVX2: 8 lanes, a scalar tail ----

template <typename T> ROWS_AVX2 inline __m256 load8(const T* p);
template <> ROWS_AVX2 inline __m256 load8<float>(const float* p) { return _mm256_loadu_ps(p); }
template <> ROWS_AVX2 inline __m256 load8<at::BFloat16>(const at::BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

ROWS_AVX2 inline __m256i bf16_bits8(__m256 v, int nan_bits = C10_NAN) {  // as bf16_bits16
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i top = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(top, _mm256_set1_epi32(nan_bits), nan);
}

template <typename T> ROWS_AVX2 inline __m256 round8(__m256 v, int nan_bits = C10_NAN);
template <> ROWS_AVX2 inline __m256 round8<float>(__m256 v, int) { return v; }
template <> ROWS_AVX2 inline __m256 round8<at::BFloat16>(__m256 v, int nan_bits) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits8(v, nan_bits), 16));
}

template <typename T> ROWS_AVX2 inline void store8(T* p, __m256 v, int nan_bits = C10_NAN);
template <> ROWS_AVX2 inline void store8<float>(float* p, __m256 v, int) { _mm256_storeu_ps(p, v); }
template <> ROWS_AVX2 inline void store8<at::BFloat16>(at::BFloat16* p, __m256 v, int nan_bits) {
  const __m256i top = bf16_bits8(v, nan_bits);  // 8 dwords < 2^16: pack, then the two 64-bit halves together
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(top, top), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

template <typename T>
ROWS_AVX2 void rotate_avx2(T* x, const T* cos, const T* sin, int64_t d) {
  const int64_t half = d / 2;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t j = 0;
  for (; j + 8 <= half; j += 8) {
    const __m256 x1 = load8(x + j), x2 = load8(x + j + half);
    const __m256 a1 = round8<T>(_mm256_mul_ps(x1, load8(cos + j)));
    const __m256 b1 = round8<T>(_mm256_mul_ps(_mm256_xor_ps(x2, sign), load8(sin + j)));
    const __m256 a2 = round8<T>(_mm256_mul_ps(x2, load8(cos + j + half)));
    const __m256 b2 = round8<T>(_mm256_mul_ps(x1, load8(sin + j + half)));
    store8(x + j, _mm256_add_ps(a1, b1));
    store8(x + j + half, _mm256_add_ps(a2, b2));
  }
  if (j < half) {  // the last pairs of lanes, as the scalar reference does them
    T rest[2 * 8], rc[2 * 8], rs[2 * 8];
    const int64_t left = half - j;
    for (int64_t e = 0; e < left; ++e) {
      rest[e] = x[j + e], rest[left + e] = x[j + half + e];
      rc[e] = cos[j + e], rc[left + e] = cos[j + half + e];
      rs[e] = sin[j + e], rs[left + e] = sin[j + half + e];
    }
    rotate_scalar<T>(rest, rc, rs, 2 * left);
    for (int64_t e = 0; e < left; ++e) x[j + e] = rest[e], x[j + half + e] = rest[left + e];
  }
}

template <typename T>
ROWS_AVX2 void add_avx2(const T* x, T* y, int64_t count) {
  int64_t j = 0;
  for (; j + 8 <= count; j += 8) store8(y + j, _mm256_add_ps(load8(x + j), load8(y + j)));
  add_scalar<T>(x + j, y + j, count - j);
}

// ---- dispatch ----

// One head of d values (d even) rotated in place: x * cos + rotate_half(x) * sin, rounded as above.
template <typename T>
inline void rotate(T* x, const T* cos, const T* sin, int64_t d, Isa isa) {
  if (isa == AVX512) rotate_avx512<T>(x, cos, sin, d);
  else if (isa == AVX2) rotate_avx2<T>(x, cos, sin, d);
  else rotate_scalar<T>(x, cos, sin, d);
}

// y = x + y over count elements (one rounding each).
template <typename T>
inline void add_into(const T* x, T* y, int64_t count, Isa isa) {
  if (isa == AVX512) add_avx512<T>(x, y, count);
  else if (isa == AVX2) add_avx2<T>(x, y, count);
  else add_scalar<T>(x, y, count);
}

}  // namespace specdec_rows
