// rowgemm.cpp's bfloat16 kernels without tiles: VDPBF16PS (AVX512-BF16), or pairs widened to float32 (AVX2);
// with AMX, rowgemm_amx.cpp's tiles instead.
#pragma once
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "avx2_bf16.h"
#include "parts.h"
#include "rowgemm_common.h"

namespace specdec_rowgemm {

// ---- bfloat16 (AVX512-BF16) ------------------------------------------------------------------------
// xp: bf16 pairs as uint32 [rows, K/2]; y: float32 accumulators out (converted by the caller's store).
template <int R>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512bf16"))) void bf16_avx512(
    const uint16_t* __restrict wp, const uint32_t* __restrict xp, int64_t ldx, int64_t K2,
    void* __restrict yv, int64_t ldy, int64_t nvalid, bool out_fp32, const char* pf, int64_t pf_lo,
    int64_t pf_hi) {
  __m512 a0[R], a1[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K2; ++k) {
    if (k >= pf_lo && k < pf_hi) prefetch_step(pf, k);
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wp + k * 2 * TILE);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(wp + k * 2 * TILE + 32);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh b = (__m512bh)_mm512_set1_epi32((int)xp[r * ldx + k]);
      a0[r] = _mm512_dpbf16_ps(a0[r], b, w0);
      a1[r] = _mm512_dpbf16_ps(a1[r], b, w1);
    }
  }
  const __mmask16 m0 = nvalid >= 16 ? 0xFFFF : (__mmask16)((1u << nvalid) - 1);
  const __mmask16 m1 = nvalid >= 32 ? 0xFFFF : nvalid <= 16 ? 0 : (__mmask16)((1u << (nvalid - 16)) - 1);
  for (int r = 0; r < R; ++r) {
    if (out_fp32) {
      float* y = static_cast<float*>(yv) + r * ldy;
      _mm512_mask_storeu_ps(y, m0, a0[r]);
      _mm512_mask_storeu_ps(y + 16, m1, a1[r]);
    } else {
      uint16_t* y = static_cast<uint16_t*>(yv) + r * ldy;
      _mm256_mask_storeu_epi16(y, m0, (__m256i)_mm512_cvtneps_pbh(a0[r]));
      _mm256_mask_storeu_epi16(y + 16, m1, (__m256i)_mm512_cvtneps_pbh(a1[r]));
    }
  }
}

// ---- bfloat16 on AVX2 (no native bf16 products) ------------------------------------------------------
// The same packed tiles; each dword of a weight load holds one output's (even k, odd k) pair, and a bf16
// is the top half of its float32, so a shift and a mask widen the pair exactly. Each accumulator takes the
// odd product, then the even one (VDPBF16PS's order), as two fused multiply-adds of exact products. The
// tile runs as two halves of 16 outputs (16 ymm registers: 2R accumulators, 4 widened weights, 2 inputs).
// Not bitwise the AVX512-BF16 path (no flush of denormals), which no result needs: a CPU runs one path.
__attribute__((noinline)) inline void store_u16_tail(uint16_t* y, __m128i v, int64_t count) {  // the rare ragged tile
  alignas(16) uint16_t buf[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(buf), v);
  std::memcpy(y, buf, std::max<int64_t>(0, std::min<int64_t>(count, 8)) * sizeof(uint16_t));
}

__attribute__((target("avx2,fma"))) inline void store_bf16x8(uint16_t* y, __m256 v, int64_t count) {
  const __m128i packed = specdec_avx2::narrow8(v);
  if (count >= 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y), packed);
  else if (count > 0)
    store_u16_tail(y, packed, count);
}

template <int R>
__attribute__((target("avx2,fma"))) void bf16_avx2(
    const uint16_t* __restrict wp, const uint32_t* __restrict xp, int64_t ldx, int64_t K2,
    void* __restrict yv, int64_t ldy, int64_t nvalid, bool out_fp32) {
  for (int64_t half = 0; half < 2; ++half) {
    const int64_t base = half * 16;
    __m256 a0[R], a1[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K2; ++k) {
      const uint16_t* w = wp + k * 2 * TILE + 2 * base;
      __m256 e0, o0, e1, o1;
      specdec_avx2::widen_pairs(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)), e0, o0);
      specdec_avx2::widen_pairs(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16)), e1, o1);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const uint32_t pair = xp[r * ldx + k];
        const __m256 xe = _mm256_set1_ps(__builtin_bit_cast(float, pair << 16));
        const __m256 xo = _mm256_set1_ps(__builtin_bit_cast(float, pair & 0xFFFF0000u));
        a0[r] = _mm256_fmadd_ps(xe, e0, _mm256_fmadd_ps(xo, o0, a0[r]));
        a1[r] = _mm256_fmadd_ps(xe, e1, _mm256_fmadd_ps(xo, o1, a1[r]));
      }
    }
    const int64_t count = std::min<int64_t>(16, nvalid - base);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      if (out_fp32) {
        float* y = static_cast<float*>(yv) + r * ldy + base;
        store_f32x8(y, a0[r], count);
        store_f32x8(y + 8, a1[r], count - 8);
      } else {
        uint16_t* y = static_cast<uint16_t*>(yv) + r * ldy + base;
        store_bf16x8(y, a0[r], count);
        store_bf16x8(y + 8, a1[r], count - 8);
      }
    }
  }
}

// At most 2 rows: the whole tile at each k pair, a quarter (8 outputs) at a time, next tile prefetched.
template <int R>
__attribute__((target("avx2,fma"))) void bf16_avx2_full(
    const uint16_t* __restrict wp, const uint32_t* __restrict xp, int64_t ldx, int64_t K2,
    void* __restrict yv, int64_t ldy, int64_t nvalid, bool out_fp32, const char* pf, int64_t pf_lo, int64_t pf_hi) {
  __m256 a[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) a[r][c] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K2; ++k) {
    if (k >= pf_lo && k < pf_hi) prefetch_step(pf, k);
    __m256 xe[R], xo[R];
    for (int r = 0; r < R; ++r) {
      const uint32_t pair = xp[r * ldx + k];
      xe[r] = _mm256_set1_ps(__builtin_bit_cast(float, pair << 16));
      xo[r] = _mm256_set1_ps(__builtin_bit_cast(float, pair & 0xFFFF0000u));
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      __m256 e, o;
      specdec_avx2::widen_pairs(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + k * 2 * TILE + 16 * c)), e, o);
      for (int r = 0; r < R; ++r) a[r][c] = _mm256_fmadd_ps(xe[r], e, _mm256_fmadd_ps(xo[r], o, a[r][c]));
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      if (out_fp32)
        store_f32x8(static_cast<float*>(yv) + r * ldy + 8 * c, a[r][c], nvalid - 8 * c);
      else
        store_bf16x8(static_cast<uint16_t*>(yv) + r * ldy + 8 * c, a[r][c], nvalid - 8 * c);
    }
}

inline void bf16_tile(int64_t isa, const uint16_t* wp, const uint32_t* xp, int64_t ldx, int64_t K2, char* y, int64_t ldy,
               int64_t elem, int64_t nvalid, int64_t M, bool out_fp32, const char* pf) {
  if (isa != AVX512_BF16) {
#define CALL_BF16_FULL(R) bf16_avx2_full<(R) <= 2 ? (R) : 2>(wp, xp, ldx, K2, y, ldy, nvalid, out_fp32, pf, 0, K2)
#define CALL_BF16_AVX2(R) \
  bf16_avx2<(R) <= 5 ? (R) : 5>(wp, xp + row * ldx, ldx, K2, y + row * ldy * elem, ldy, nvalid, out_fp32)
    return avx2_rows(M, 5, [&](int64_t lead) { ROWS_SWITCH(lead, CALL_BF16_FULL, 6) },
                     [&](int64_t row, int64_t rows) { ROWS_SWITCH(rows, CALL_BF16_AVX2, 6) });
  }
  const int64_t groups = (M + 11) / 12;
  for (int64_t row = 0, g = 0; row < M; ++g) {
    const int64_t rows = group_rows(M - row, 12);
    const int64_t pf_lo = K2 * g / groups, pf_hi = K2 * (g + 1) / groups;
#define CALL_BF16(R) \
  bf16_avx512<R>(wp, xp + row * ldx, ldx, K2, y + row * ldy * elem, ldy, nvalid, out_fp32, pf, pf_lo, pf_hi)
    ROWS_SWITCH(rows, CALL_BF16, 12)
    row += rows;
  }
}

// How far ahead of its tile an AVX512-BF16 call of M rows prefetches the weights into L2 (0: not at all): the
// next tile, except on AMD CPUs for 1-8 rows: one row 4 KB ahead, 2-5 rows not at all (the hardware prefetchers
// alone), 6-8 rows 8 KB ahead. Whole SmolLM2 forwards (as for float32 in rowgemm_f32.h; 256 and 1,024 cached),
// against the next tile: with none, 4 rows 8-17% faster, 6-8 rows 8-9% faster at 256 cached but 9-10% slower
// at 1,024 (8 rows), 10-24 rows 1-11% slower; 8 KB ahead, 6-8 rows at most 5% slower at 256 cached and 4-10%
// faster at 1,024 (at 12 rows 3% faster, at 16 rows 8% slower). At 2-3 rows none against 4 KB ahead: 3-21%
// faster in 7 of 8 cases (1% slower in one); 4 KB was faster than a tile ahead in 7 of 8 (2-9%).
inline int64_t bf16_prefetch_distance(int64_t M, int64_t tile_bytes) {
  if (!amd_cpu() || M > 8) return tile_bytes;
  return M == 1 ? AMD_ONE_ROW_AHEAD : M <= 5 ? 0 : 8192;
}

// The same for bfloat16 weights [tiles, K2, 32, 2] and x as K2 bf16 pairs per row.
inline void bf16_tiles(int64_t isa, const void* x, int64_t M, int64_t K2, const void* packed, int64_t n_out, void* y,
                bool out_fp32, int64_t begin, int64_t end) {
  const auto* xp = static_cast<const uint32_t*>(x);
  const auto* wd = static_cast<const uint16_t*>(packed);
  char* yd = static_cast<char*>(y);
  if (isa == AMX_BF16) return specdec_parts::bf16_amx_tiles(xp, M, K2, wd, n_out, yd, out_fp32, begin, end);
  const int64_t elem = out_fp32 ? 4 : 2;
  for (int64_t t = begin; t < end; ++t) {
    const int64_t col = t * TILE;
    const int64_t tile_bytes = K2 * 2 * TILE * 2;
    const int64_t ahead = isa == AVX512_BF16 ? bf16_prefetch_distance(M, tile_bytes) : tile_bytes;  // AVX2: its steps
    const char* pf = t + 1 < end && ahead > 0 ? reinterpret_cast<const char*>(wd + t * K2 * 2 * TILE) + ahead : nullptr;
    bf16_tile(isa, wd + t * K2 * 2 * TILE, xp, K2, K2, yd + col * elem, n_out, elem, std::min(TILE, n_out - col), M,
              out_fp32, pf);
  }
}

}  // namespace specdec_rowgemm
