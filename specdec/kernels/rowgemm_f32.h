// rowgemm.cpp's float32 kernels (AVX-512, AVX2, scalar): one FMA chain over k in order for every (row,
// output), so every path and row grouping gives the same bits.
#pragma once
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "rowgemm_common.h"

namespace specdec_rowgemm {

// AVX-512 runs a tile (32 outputs) one row group after another, each group over the whole tile (the first from
// memory, the others from L2; on Intel CPUs 13-18 rows go in chunks of k instead: f32_chunk below). A tile used to
// run in chunks of 128 steps of k (16 KB, in L1) through every group, accumulators carried from chunk to chunk
// through y, with the weights 72 KB ahead prefetched into L2 spread over the groups. On an AMD EPYC (Zen 4,
// avx512_bf16, 2 threads), in a C++ harness of SmolLM2's products with two variants alternating forward by forward
// in one process, whole tiles measured faster than chunks (both 72 KB ahead): 12 / 20 / 32 rows 5 / 5 / 10% while
// the weights stream, 5-8% with them in cache, 16 rows within 2%.
constexpr int64_t F32_AHEAD = 73728;

// How far ahead of its tile an AVX-512 call of M rows prefetches the weights into L2 (0: not at all). On AMD
// CPUs one row goes 4 KB ahead, and from 2 rows on the hardware prefetchers stream a thread's contiguous tiles
// alone. Whole SmolLM2 forwards (the lean forward, one process, the distance switched forward by forward; runs
// at 256 and 1,024 cached while the memory ran slow and fast), none against 72 KB ahead: 4 rows 9-30% faster,
// 6-10 rows 2-10% (8 rows 1-2% slower in a fast run), 16 rows 1-7%, 20 rows alike, 12 and 24 rows 1-3% slower;
// 8 or 16 KB ahead was no better overall. At 2-3 rows none against 4 KB ahead: faster in 7 of 8 cases (by up
// to 12%), 0.5% slower in one; 4 KB was 2-12% faster than 72 KB. On an Intel Xeon (family 6 model 207,
// avx512_bf16 amx_bf16, 2 threads), the distance switched forward by forward (float32, 256 cached, 414 rounds):
// none was 13% / 39% / 51% slower than 72 KB at 1 / 4 / 8 rows, 16 KB within 1% of 72 KB, 144 KB 2% slower.
inline int64_t f32_prefetch_distance(int64_t M) {
  if (!amd_cpu()) return F32_AHEAD;
  return M == 1 ? AMD_ONE_ROW_AHEAD : 0;
}

// On Intel CPUs the loop also prefetches into L1 the tile's own weights F32_L1_AHEAD bytes (32 steps of k) ahead of
// the step it loads, on top of the L2 prefetch above. On the Xeon above, switched forward by forward (float32, 256
// cached, 314-421 rounds a run): 1 / 2 / 4 / 8 rows 0.93-0.94 / 0.93 / 0.91-0.92 / 0.94-0.97x the time without it,
// 16 / 24 / 32 rows 0.97-0.99 / 0.97 / 0.97x; 1 KB or 2 KB ahead gave less, 8 or 16 KB no more. Not measured on AMD
// CPUs, which go without it.
constexpr int64_t F32_L1_AHEAD = 4096;
inline int64_t f32_l1_distance() { return amd_cpu() ? 0 : F32_L1_AHEAD; }

// Rows of the next row group of a tile, `remaining` rows left: up to 12 rows one group; 13-18 all but 6, then
// those 6 (16 rows: 10 + 6); more, balanced groups of at most 12 (20 rows: 10 + 10, faster than 12 + 8). A
// group of r rows keeps 2r accumulators in registers (at most 24 of AVX-512's 32), and fewer than 6 rows (12
// FMA chains) wait on the FMAs' latency. Measured on an AMD EPYC (avx512_bf16, 2 threads, a C++ harness of
// SmolLM2's products, variants alternating): 8 rows as one group 14.4-15.2 ms against 16.5-18.6 as 4 + 4
// while the weights stream (one row 11.4-13.7), 8.6-9.2 against 10.9-11.1 with them in cache; 16 rows as
// 10 + 6 16.5-17.0 against 17.5-18.1 in cache (12 + 4: 27 ms streaming, a 4-row group is latency-bound).
inline int64_t f32_group_rows(int64_t remaining) {
  return remaining <= 12 ? remaining : remaining <= 18 ? remaining - 6 : group_rows(remaining, 12);
}

// Steps of k an AVX-512 tile runs through every row group before its next steps (K: each group over the whole
// tile, as above). On Intel CPUs 13-18 rows (two groups, the second of 6) take the tile in chunks of 64 steps
// (8 KB, in L1): the second group then reads each chunk from L1, not the whole tile (72 KB for k = 576) from
// L2, where a 6-row group's products ran at ~60% of the FMA peak against ~85% on a tile that fits L1 (one
// thread, in cache). Whole SmolLM2 forwards, float32, on a Xeon (family 6 model 207, avx512_bf16 amx_bf16),
// chunks of 0 / 64 / 128 steps taking turns forward by forward in one process: 13 rows 0.93-0.94x of whole
// tiles at 64 (0.94-0.96x at 128), 16 rows 0.96x (256 and 1,024 cached, memory slow and fast); 24 rows
// 1.00-1.02x and 32 rows 0.98x, so above 18 rows tiles stay whole. AMD CPUs measured whole tiles as fast or
// faster (above), so they keep them.
constexpr int64_t F32_CHUNK = 64;
inline int64_t f32_chunk(int64_t M, int64_t K) {
  return M <= 12 || M > 18 || amd_cpu() ? K : F32_CHUNK;
}

// Row groups of an AVX-512 call of M rows (f32_group_rows).
inline int64_t f32_num_groups(int64_t M) {
  int64_t groups = 0;
  for (int64_t row = 0; row < M; ++groups) row += f32_group_rows(M - row);
  return groups;
}

// Steps [k0, k1) of one tile for R rows. x: first row, ldx floats between rows; y: the rows' 32 outputs of
// this tile, ldy between rows (stored masked to nvalid), holding the accumulators when !first (the chain over k
// is unbroken: float32 stored and reloaded exactly). pf .. pf_end: bytes to prefetch into L2, pf_rate / 256 bytes
// a step (a line whenever they add up to 64); l1_ahead: bytes ahead of each step to prefetch into L1 (0: none).
template <int R>
__attribute__((target("avx512f,avx512vl,avx512bw,fma"))) void f32_avx512(
    const float* __restrict wp, const float* __restrict x, int64_t ldx, int64_t k0, int64_t k1, bool first,
    float* __restrict y, int64_t ldy, int64_t nvalid, const char* pf, const char* pf_end, int64_t pf_rate,
    int64_t l1_ahead) {
  constexpr int64_t LINE = 64 * 256;  // a cache line in pf_rate's units
  int64_t owed = 0;                   // prefetch bytes x 256 due and not yet issued
  const __mmask16 m0 = nvalid >= 16 ? 0xFFFF : (__mmask16)((1u << nvalid) - 1);
  const __mmask16 m1 = nvalid >= 32 ? 0xFFFF : nvalid <= 16 ? 0 : (__mmask16)((1u << (nvalid - 16)) - 1);
  __m512 a0[R], a1[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    if (first) {
      a0[r] = a1[r] = _mm512_setzero_ps();
    } else {  // the chain so far, stored exactly in y's float32 slots by the chunk before
      a0[r] = _mm512_maskz_loadu_ps(m0, y + r * ldy);
      a1[r] = _mm512_maskz_loadu_ps(m1, y + r * ldy + 16);
    }
  }
  for (int64_t k = k0; k < k1; ++k) {
    owed += pf_rate;
    for (int line = 0; line < 2 && owed >= LINE && pf < pf_end; ++line) {  // pf_rate <= 128 x 256: two at most
      _mm_prefetch(pf, _MM_HINT_T1);
      pf += 64;
      owed -= LINE;
    }
    if (l1_ahead > 0) {  // past the last tile's end only prefetches (which never fault)
      const char* near = reinterpret_cast<const char*>(wp + k * TILE) + l1_ahead;
      _mm_prefetch(near, _MM_HINT_T0);
      _mm_prefetch(near + 64, _MM_HINT_T0);
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
  // AVX-512: group after group (above); pf: this tile's first byte plus the prefetch distance (nullptr: none),
  // pf_end: the end of the thread's range. From there each group of a chunk prefetches an equal share of its
  // bytes, spread evenly over its steps, so requests leave at a steady pace through the whole tile. Each group
  // used to take its rows' share at two lines a step: a burst at its start, then none. With 16 rows (10 + 6) on
  // a Xeon (family 6 model 207), `perf` put a quarter of the 6-row group's time on a prefetch waiting for a
  // free line-fill buffer. Whole SmolLM2 forwards, float32, the two spreads switched forward by forward in one
  // process (256 cached, 728 rounds): 1-12 rows (one group, no change) 1.00x the old time, 16 rows 0.97x, 20 /
  // 24 / 32 rows 0.90 / 0.89 / 0.84x; 1,024 cached: 16 / 32 rows 0.97 / 0.87x; batch 8 at 2 / 4 rows each:
  // 0.97 / 0.85x. Equal shares did a little better than shares by rows at 16 rows (0.96 against 0.975x the old);
  // once spread, chunks for 19-32 rows and distances of 36 or 144 KB measured no better. AMD CPUs prefetch no
  // further than one row's 4 KB (f32_prefetch_distance), so none of this runs there.
  const int64_t chunk = f32_chunk(M, K), l1_ahead = f32_l1_distance(), num_groups = f32_num_groups(M);
  for (int64_t k0 = 0; k0 < K; k0 += chunk) {
    const int64_t k1 = std::min(K, k0 + chunk);
    const char* chunk_pf = pf == nullptr ? nullptr : pf + k0 * TILE * 4;
    const int64_t span =
        pf == nullptr ? 0 : std::max<int64_t>(0, std::min<int64_t>((k1 - k0) * TILE * 4, pf_end - chunk_pf));
    for (int64_t row = 0, group = 0; row < M; ++group) {
      const int64_t rows = f32_group_rows(M - row);
      const char* lo = chunk_pf + span * group / num_groups;
      const char* hi = chunk_pf + span * (group + 1) / num_groups;
      const int64_t rate = (hi - lo) * 256 / (k1 - k0);
#define CALL_512(R) \
  f32_avx512<R>(wp, x + row * ldx, ldx, k0, k1, k0 == 0, y + row * ldy, ldy, nvalid, lo, hi, rate, l1_ahead)
      ROWS_SWITCH(rows, CALL_512, 12)
      row += rows;
    }
  }
}

// Tiles [begin, end) of y[M, n_out] = x[M, K] @ W^T (float32).
inline void f32_tiles(int64_t isa, const float* xd, int64_t M, int64_t K, const float* wd, int64_t n_out, float* yd,
               int64_t begin, int64_t end) {
  for (int64_t t = begin; t < end; ++t) {
    const int64_t col = t * TILE;
    const char* next = t + 1 < end ? reinterpret_cast<const char*>(wd + (t + 1) * K * TILE) : nullptr;
    const int64_t distance = f32_prefetch_distance(M);  // AVX-512 only
    const char* ahead = distance == 0 ? nullptr : reinterpret_cast<const char*>(wd + t * K * TILE) + distance;
    f32_tile(isa, wd + t * K * TILE, xd, K, K, yd + col, n_out, std::min(TILE, n_out - col), M, next, ahead,
             reinterpret_cast<const char*>(wd + end * K * TILE));
  }
}

}  // namespace specdec_rowgemm
