// Multi-row matrix products that read each weight once for all rows: y[M, N] = x[M, K] @ W[N, K]^T.
//
// Weights are packed once at load into tiles of 32 output features (specdec/kernels/packing.py):
//   float32   [num_tiles, K, 32]            one 128-byte line pair per k
//   bfloat16  [num_tiles, K/2, 32, 2]       pairs of k per output, the layout VDPBF16PS multiplies
// A tile streams from memory once and is applied, from L1/L2, to every row group of the call (float32 on
// AVX-512: chunk by chunk of k, so every group takes a chunk from L1 while the stream runs ahead).
// Outputs sit in vector lanes and every (row, output) accumulator runs over k in order 0..K-1 with one
// fused multiply-add per step (bf16: one dot-pair per two steps), starting from zero, with no horizontal
// sum. So a row's result does not depend on which other rows share the call, on the row-group size, on
// the thread split, nor on the ISA path (AVX-512, AVX2, scalar give bitwise the same float32 results):
// the row invariance that keeps greedy speculative decoding equal to plain decoding. Where the CPU has
// AMX, bfloat16 runs on tiles instead (rowgemm_amx.cpp): row-invariant too, but its own bits.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "avx2_bf16.h"
#include "parts.h"

namespace {

constexpr int64_t TILE = 32;
// One row (plain decoding) runs on the calling thread: its products are bound by memory, and waking the
// pool's other thread for each of a forward's ~150 calls cost more than it gained (plain decoding,
// 2 threads: 52.6 -> 43.1 tok/s float32, 87.3 -> 61.0 bfloat16, when every call was split).
// A one-row call whose weights take much longer to stream than a wake-up (the LM head: 113 MB in float32)
// is split all the same. (The decoder's own calls run inside layer.cpp's team and never come here.)
// A few rows over a small weight (a drafting head's layers: 0.2-2 MB) also run alone: the pool's other thread
// sleeps between forwards (OMP_WAIT_POLICY=PASSIVE), and waking it for each of a head's ~10 calls a level cost
// more than half the call saved (EAGLE-3 drafting over four answers: 2.0 s split, 1.0 s alone, 2 threads).
constexpr int64_t MIN_PARALLEL_ROWS = 2;
constexpr int64_t MIN_SPLIT_BYTES = int64_t{16} << 20;
constexpr int64_t MIN_SPLIT_ROW_BYTES = int64_t{4} << 20;   // weights worth splitting for 2+ rows
constexpr int64_t MIN_SPLIT_MACS = int64_t{32} << 20;       // or arithmetic worth it (prefill chunks)
enum Isa : int64_t { SCALAR = 0, AVX2 = 1, AVX512 = 2, AVX512_BF16 = 3, AMX_BF16 = 4 };  // AMX: bf16 only

int64_t best_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl")) {
    if (!__builtin_cpu_supports("avx512bf16")) return AVX512;
    return specdec_parts::amx_bf16_ready() ? AMX_BF16 : AVX512_BF16;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return AVX2;
  return SCALAR;
}

// The next tile's 128 bytes for step k into L2 while this tile computes: a tile's row groups after
// the first run from cache, so without this the stream stalls while they compute.
inline void prefetch_step(const char* pf, int64_t k) {
  if (pf == nullptr) return;
  _mm_prefetch(pf + k * 128, _MM_HINT_T1);
  _mm_prefetch(pf + k * 128 + 64, _MM_HINT_T1);
}

// ---- float32 -------------------------------------------------------------------------------------
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

// AVX2 stores of an accumulator's first `count` lanes (count may be <= 0 or > 8). Masked stores, not a
// buffer and memcpy: with those GCC kept every accumulator in memory through the k loop (a store per FMA;
// the 6-row kernel ran at 33 GFLOP/s on one core instead of 79).
__attribute__((target("avx2,fma"))) inline void store_f32x8(float* y, __m256 v, int64_t count) {
  const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(count, 8))),
                                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  _mm256_maskstore_ps(y, lanes, v);
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

void f32_scalar(const float* wp, const float* x, int64_t ldx, int64_t K, float* y, int64_t ldy,
                int64_t nvalid, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t n = 0; n < nvalid; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc = std::fma(x[r * ldx + k], wp[k * TILE + n], acc);
      y[r * ldy + n] = acc;
    }
}

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
__attribute__((noinline)) void store_u16_tail(uint16_t* y, __m128i v, int64_t count) {  // the rare ragged tile
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

// Rows per register block: up to `most`, balanced (16 rows with at most 12 -> 8 + 8, never 12 + 4).
inline int64_t group_rows(int64_t remaining, int64_t most) {
  const int64_t groups = (remaining + most - 1) / most;
  return (remaining + groups - 1) / groups;
}

#define ROWS_SWITCH(R_EXPR, CALL, MOST)                                              \
  switch (R_EXPR) {                                                                  \
    case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break;          \
    case 4: CALL(4); break; case 5: CALL(5); break; case 6: CALL(6); break;          \
    default: if (MOST > 6) { switch (R_EXPR) {                                       \
      case 7: CALL(7); break; case 8: CALL(8); break; case 9: CALL(9); break;        \
      case 10: CALL(10); break; case 11: CALL(11); break; default: CALL(12); break; } } \
  }

// AVX2's rows of one tile: the first one or two take the whole tile at each k (one sequential stream from
// memory, the next tile prefetched); the others read it from L2 in halves of 16 outputs, in balanced groups
// of at most `most` (streamed in halves, every other line at a time, it came at half the bandwidth).
template <typename Whole, typename Halves>
inline void avx2_rows(int64_t M, int64_t most, Whole whole, Halves halves) {
  const int64_t lead = std::min<int64_t>(M, 2);
  whole(lead);
  for (int64_t row = lead; row < M;) {
    const int64_t rows = group_rows(M - row, most);
    halves(row, rows);
    row += rows;
  }
}

// pf: the next tile (nullptr: none), AVX2 prefetches its K steps of 128 bytes; AVX-512 prefetches from
// pf_ahead up to pf_end.
void f32_tile(int64_t isa, const float* wp, const float* x, int64_t ldx, int64_t K, float* y, int64_t ldy,
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

void bf16_tile(int64_t isa, const uint16_t* wp, const uint32_t* xp, int64_t ldx, int64_t K2, char* y, int64_t ldy,
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

// Tiles [begin, end) of y[M, n_out] = x[M, K] @ W^T (float32), each tile prefetching the next of the range.
void f32_tiles(int64_t isa, const float* xd, int64_t M, int64_t K, const float* wd, int64_t n_out, float* yd,
               int64_t begin, int64_t end) {
  for (int64_t t = begin; t < end; ++t) {
    const int64_t col = t * TILE;
    const char* next = t + 1 < end ? reinterpret_cast<const char*>(wd + (t + 1) * K * TILE) : nullptr;
    const char* ahead = reinterpret_cast<const char*>(wd + t * K * TILE) + F32_AHEAD;
    f32_tile(isa, wd + t * K * TILE, xd, K, K, yd + col, n_out, std::min(TILE, n_out - col), M, next, ahead,
             reinterpret_cast<const char*>(wd + end * K * TILE));
  }
}

// The same for bfloat16 weights [tiles, K2, 32, 2] and x as K2 bf16 pairs per row.
void bf16_tiles(int64_t isa, const void* x, int64_t M, int64_t K2, const void* packed, int64_t n_out, void* y,
                bool out_fp32, int64_t begin, int64_t end) {
  const auto* xp = static_cast<const uint32_t*>(x);
  const auto* wd = static_cast<const uint16_t*>(packed);
  char* yd = static_cast<char*>(y);
  if (isa == AMX_BF16) return specdec_parts::bf16_amx_tiles(xp, M, K2, wd, n_out, yd, out_fp32, begin, end);
  const int64_t elem = out_fp32 ? 4 : 2;
  for (int64_t t = begin; t < end; ++t) {
    const int64_t col = t * TILE;
    const char* pf = t + 1 < end ? reinterpret_cast<const char*>(wd + (t + 1) * K2 * 2 * TILE) : nullptr;
    bf16_tile(isa, wd + t * K2 * 2 * TILE, xp, K2, K2, yd + col * elem, n_out, elem, std::min(TILE, n_out - col), M,
              out_fp32, pf);
  }
}

}  // namespace

// x [M, K] (float32 with float32 weights, bfloat16 with bfloat16 weights), packed weights as above;
// n_out: the real output count (tiles are zero-padded); isa: < 0 = the best this CPU runs.
torch::Tensor rowgemm(torch::Tensor x, torch::Tensor packed, int64_t n_out, int64_t isa, bool out_fp32) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && packed.is_contiguous() && x.device().is_cpu(),
              "rowgemm: x must be a contiguous 2-D CPU tensor");
  const int64_t best = best_isa();
  if (isa < 0 || isa > best) isa = best;
  const int64_t M = x.size(0), K = x.size(1), num_tiles = packed.size(0);
  TORCH_CHECK(n_out > 0 && (n_out + TILE - 1) / TILE == num_tiles, "rowgemm: n_out does not match the packed tiles");
  const bool bf16 = packed.scalar_type() == at::kBFloat16;
  auto out_dtype = bf16 && !out_fp32 ? at::kBFloat16 : at::kFloat;
  auto y = torch::empty({M, n_out}, x.options().dtype(out_dtype));
  if (M == 0) return y;
  const int64_t bytes = packed.nbytes(), macs = M * K * num_tiles * TILE;
  const bool split = bytes >= MIN_SPLIT_BYTES || macs >= MIN_SPLIT_MACS ||
                     (M >= MIN_PARALLEL_ROWS && bytes >= MIN_SPLIT_ROW_BYTES);
  const int64_t grain = split ? 1 : num_tiles;
  if (!bf16) {
    TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat && packed.size(1) == K,
                "rowgemm: float32 weights [tiles, K, 32] need float32 x [M, K]");
    at::parallel_for(0, num_tiles, grain, [&](int64_t b, int64_t e) {
      f32_tiles(isa, x.data_ptr<float>(), M, K, packed.data_ptr<float>(), n_out, y.data_ptr<float>(), b, e);
    });
    return y;
  }
  TORCH_CHECK(isa >= AVX2, "rowgemm: bfloat16 weights need AVX2 (AVX512-BF16 natively)");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.size(1) * 2 == K + (K & 1),
              "rowgemm: bfloat16 weights [tiles, K/2, 32, 2] need bfloat16 x [M, K]");
  torch::Tensor xe = K & 1 ? torch::constant_pad_nd(x, {0, 1}).contiguous() : x;
  at::parallel_for(0, num_tiles, grain, [&](int64_t b, int64_t e) {
    bf16_tiles(isa, xe.data_ptr(), M, packed.size(1), packed.data_ptr(), n_out, y.data_ptr(), out_fp32, b, e);
  });
  return y;
}

void specdec_parts::rowgemm_part(bool bf16, const void* x, int64_t M, int64_t K, const void* packed,
                                 int64_t num_tiles, int64_t n_out, void* y, bool out_fp32, int64_t part,
                                 int64_t parts) {
  static const int64_t ISA = best_isa();
  int64_t begin, end;
  specdec_parts::share(num_tiles, part, parts, begin, end);
  if (bf16)
    bf16_tiles(ISA, x, M, K / 2, packed, n_out, y, out_fp32, begin, end);
  else
    f32_tiles(ISA, static_cast<const float*>(x), M, K, static_cast<const float*>(packed), n_out,
              static_cast<float*>(y), begin, end);
}

// What F32_AHEAD prefetches within a call, for the head of the next call: without it a call's first
// F32_AHEAD bytes came in on demand misses alone, after the barrier.
void specdec_parts::rowgemm_prefetch_part(bool bf16, const void* packed, int64_t K, int64_t num_tiles,
                                          int64_t part, int64_t parts) {
  if (bf16) return;
  int64_t begin, end;
  specdec_parts::share(num_tiles, part, parts, begin, end);
  const char* head = static_cast<const char*>(packed) + begin * K * TILE * 4;
  const int64_t bytes = std::min(F32_AHEAD, (end - begin) * K * TILE * 4);
  for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(head + i, _MM_HINT_T1);
}

int64_t cpu_isa() { return best_isa(); }
