// bfloat16 <-> float32 on AVX2, shared by rowgemm.cpp and attention_avx2.cpp. A bf16 is the top half of
// its float32, so widening is a shift (or a mask) and narrowing rounds to nearest even, as
// _mm512_cvtneps_pbh and at::BFloat16 do for finite values.
#pragma once
#include <immintrin.h>
#include <cstdint>

namespace specdec_avx2 {

#define SPECDEC_AVX2 __attribute__((target("avx2,fma")))

// 8 consecutive bf16 -> 8 floats.
SPECDEC_AVX2 inline __m256 widen8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// 8 dwords each holding a (low, high) bf16 pair -> the lows and the highs as floats.
SPECDEC_AVX2 inline void widen_pairs(__m256i pairs, __m256& low, __m256& high) {
  low = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
  high = _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// 8 floats -> 8 bf16 (in the low 128 bits), rounded to nearest even.
SPECDEC_AVX2 inline __m128i narrow8(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i top = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(top, top), 0x08));
}

}  // namespace specdec_avx2
