// rowgemm.cpp's float32 kernels (AVX-512, AVX2, scalar): one FMA chain over k in order for every (row,
// output), so every path, row grouping and chunking gives the same bits.
#pragma once
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "rowgemm_common.h"

namespace specdec_rowgemm {

// AVX-512 runs a tile (32 outputs) in chunks of F32_CHUNK steps of k (16 KB, in L1): every row group of the
// call takes the chunk before the next chunk comes in, the first group from memory (the prefetched L2), the
// others from L1, carrying its accumulators from chunk to chunk through y's own float32 slots (stored and
// reloaded exactly: the chain over k is unbroken). Run a whole tile per group instead, only the first group
// met the memory stream and the others computed from L2 with the stream idle: 16 rows (8 + 8) cost as much
// more than one row as their arithmetic took (products of SmolLM2, 2 threads: 27.4 ms against 17.7 for one
// row; chunked 22.0). The weights F32_AHEAD bytes ahead of the chunk (one SmolLM2 tile, across tile ends
// within the thread's range) are prefetched into L2, spread over the chunk's row groups so the stream never
// waits for one group to finish.
constexpr int64_t F32_CHUNK = 128;
constexpr int64_t F32_AHEAD = 73728;

// Row groups per chunk: at most 12 rows each, and two at least from 5 rows on. One group of 8 rows waits on
// the stream at every chunk; 4 + 4 lets the second group compute from L1 while the stream catches up (8 rows
// of SmolLM2's products, 2 threads: 22.9 -> 21.5 ms, one row 19.4). Fewer than 5 rows have little to hide.
inline int64_t f32_groups(int64_t M) { return M < 5 ? 1 : std::max<int64_t>(2, (M + 11) / 12); }

// Steps [k0, k1) of one tile for R rows. x: first row, ldx floats between rows; y: the rows' 32 outputs of
// this tile, ldy between rows, holding the accumulators when !first and given them back (masked to nvalid).
// pf .. pf_end: bytes to prefetch into L2, `pstep` of them per step of k (64 or 128).
template <int R>
__attribute__((target("avx512f,avx512vl,avx512bw,fma"))) void f32_avx512(
    const float* __restrict wp, const float* __restrict x, int64_t ldx, int64_t k0, int64_t k1, bool first,
    float* __restrict y, int64_t ldy, int64_t nvalid, const char* pf, const char* pf_end, int64_t pstep) {
  const __mmask16 m0 = nvalid >= 16 ? 0xFFFF : (__mmask16)((1u << nvalid) - 1);
  const __mmask16 m1 = nvalid >= 32 ? 0xFFFF : nvalid <= 16 ? 0 : (__mmask16)((1u << (nvalid - 16)) - 1);
  __m512 a0[R], a1[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    if (first) {
      a0[r] = a1[r] = _mm512_setzero_ps();
    } else {
      a0[r] = _mm512_maskz_loadu_ps(m0, y + r * ldy);
      a1[r] = _mm512_maskz_loadu_ps(m1, y + r * ldy + 16);
    }
  }
  for (int64_t k = k0; k < k1; ++k) {
    if (pf < pf_end) {
      _mm_prefetch(pf, _MM_HINT_T1);
      if (pstep > 64) _mm_prefetch(pf + 64, _MM_HINT_T1);
      pf += pstep;
    }
    const __m512 w0 = _mm512_loadu_ps(wp + k * TILE), w1 = _mm512_loadu_ps(wp + k * TILE + 16);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(x[r * ldx + k]);
      a0[r] = _mm512_fmadd_ps(b, w0, a0[r]);
      a1[r] = _mm512_fmadd_ps(b, w1, a1[r]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, m0, a0[r]);
    _mm512_mask_storeu_ps(y + r * ldy + 16, m1, a1[r]);
  }
}

// AVX2: the tile as two halves of 16 outputs (16 ymm registers: 12 accumulators, 2 weights, 1 broadcast).
// A half reads every other line of the tile: it runs on a tile the full-width rows below brought into L2.
template <int R>
__attribute__((target("avx2,fma"))) void f32_avx2(
    const float* __restrict wp, const float* __restrict x, int64_t ldx, int64_t K,
    float* __restrict y, int64_t ldy, int64_t nvalid) {
  for (int64_t half = 0; half < 2; ++half) {
    const int64_t base = half * 16;
    __m256 a0[R], a1[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
      const __m256 w0 = _mm256_loadu_ps(wp + k * TILE + base), w1 = _mm256_loadu_ps(wp + k * TILE + base + 8);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m256 b = _mm256_broadcast_ss(x + r * ldx + k);
        a0[r] = _mm256_fmadd_ps(b, w0, a0[r]);
        a1[r] = _mm256_fmadd_ps(b, w1, a1[r]);
      }
    }
    const int64_t count = std::min<int64_t>(16, nvalid - base);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      store_f32x8(y + r * ldy + base, a0[r], count);
      store_f32x8(y + r * ldy + base + 8, a1[r], count - 8);
    }
  }
}

// AVX2, at most 2 rows (3 would need 19 registers): the whole tile at each k (128 contiguous bytes, one sequential stream from memory;
// the halves above read every other line of it twice over) and the next tile prefetched into L2.
// The same chains as every path: the same bits.
template <int R>
__attribute__((target("avx2,fma"))) void f32_avx2_full(
    const float* __restrict wp, const float* __restrict x, int64_t ldx, int64_t K,
    float* __restrict y, int64_t ldy, int64_t nvalid, const char* pf, int64_t pf_lo, int64_t pf_hi) {
  __m256 a[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) a[r][c] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    if (k >= pf_lo && k < pf_hi) prefetch_step(pf, k);
    __m256 b[R];
    for (int r = 0; r < R; ++r) b[r] = _mm256_broadcast_ss(x + r * ldx + k);
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m256 w = _mm256_loadu_ps(wp + k * TILE + 8 * c);
      for (int r = 0; r < R; ++r) a[r][c] = _mm256_fmadd_ps(b[r], w, a[r][c]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) store_f32x8(y + r * ldy + 8 * c, a[r][c], nvalid - 8 * c);
}

inline void f32_scalar(const float* wp, const float* x, int64_t ldx, int64_t K, float* y, int64_t ldy,
                int64_t nvalid, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t n = 0; n < nvalid; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc = std::fma(x[r * ldx + k], wp[k * TILE + n], acc);
      y[r * ldy + n] = acc;
    }
}

// pf: the next tile (nullptr: none), AVX2 prefetches its K steps of 128 bytes; AVX-512 prefetches from
// pf_ahead up to pf_end.
inline void f32_tile(int64_t isa, const float* wp, const float* x, int64_t ldx, int64_t K, float* y, int64_t ldy,
              int64_t nvalid, int64_t M, const char* pf_next, const char* pf, const char* pf_end) {
  if (isa == SCALAR) return f32_scalar(wp, x, ldx, K, y, ldy, nvalid, M);
  if (isa == AVX2) {
#define CALL_AVX2_FULL(R) f32_avx2_full<(R) <= 2 ? (R) : 2>(wp, x, ldx, K, y, ldy, nvalid, pf_next, 0, K)
#define CALL_AVX2(R) f32_avx2<(R) <= 6 ? (R) : 6>(wp, x + row * ldx, ldx, K, y + row * ldy, ldy, nvalid)
    return avx2_rows(M, 6, [&](int64_t lead) { ROWS_SWITCH(lead, CALL_AVX2_FULL, 6) },
                     [&](int64_t row, int64_t rows) { ROWS_SWITCH(rows, CALL_AVX2, 6) });
  }
  // AVX-512: chunk by chunk, each chunk through every row group (above); pf: this tile's first byte plus
  // F32_AHEAD, pf_end: the end of the thread's range.
  const int64_t groups = f32_groups(M);
  for (int64_t k0 = 0; k0 < K; k0 += F32_CHUNK) {
    const int64_t k1 = std::min(K, k0 + F32_CHUNK);
    const char* chunk_pf = pf + k0 * TILE * 4;
    const int64_t span = std::max<int64_t>(0, std::min<int64_t>((k1 - k0) * TILE * 4, pf_end - chunk_pf));
    for (int64_t row = 0, g = 0; row < M; ++g) {
      const int64_t rows = (M - row + groups - g - 1) / (groups - g);  // balanced: 8 rows 4 + 4, 16 rows 8 + 8
      const char* lo = chunk_pf + span * g / groups;
      const char* hi = chunk_pf + span * (g + 1) / groups;
      const int64_t pstep = groups == 1 ? 128 : 64;
#define CALL_512(R) f32_avx512<R>(wp, x + row * ldx, ldx, k0, k1, k0 == 0, y + row * ldy, ldy, nvalid, lo, hi, pstep)
      ROWS_SWITCH(rows, CALL_512, 12)
      row += rows;
    }
  }
}

// Tiles [begin, end) of y[M, n_out] = x[M, K] @ W^T (float32), each tile prefetching the next of the range.
inline void f32_tiles(int64_t isa, const float* xd, int64_t M, int64_t K, const float* wd, int64_t n_out, float* yd,
               int64_t begin, int64_t end) {
  for (int64_t t = begin; t < end; ++t) {
    const int64_t col = t * TILE;
    const char* next = t + 1 < end ? reinterpret_cast<const char*>(wd + (t + 1) * K * TILE) : nullptr;
    const int64_t distance = M == 1 && amd_one_row_ahead() ? amd_one_row_ahead() : F32_AHEAD;  // AVX-512 only
    const char* ahead = reinterpret_cast<const char*>(wd + t * K * TILE) + distance;
    f32_tile(isa, wd + t * K * TILE, xd, K, K, yd + col, n_out, std::min(TILE, n_out - col), M, next, ahead,
             reinterpret_cast<const char*>(wd + end * K * TILE));
  }
}

}  // namespace specdec_rowgemm
