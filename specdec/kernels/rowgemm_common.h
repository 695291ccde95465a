// rowgemm.cpp's shared pieces: the tile width, the ISA levels, L2 prefetch of the next tile, AVX2
// masked stores and the row-group switch, for the float32 (rowgemm_f32.h) and bf16 (rowgemm_bf16.h) kernels.
#pragma once
#include <immintrin.h>
#include <algorithm>
#include <cstdint>

namespace specdec_rowgemm {

constexpr int64_t TILE = 32;
enum Isa : int64_t { SCALAR = 0, AVX2 = 1, AVX512 = 2, AVX512_BF16 = 3, AMX_BF16 = 4 };  // AMX: bf16 only

// The next tile's 128 bytes for step k into L2 while this tile computes: a tile's row groups after
// the first run from cache, so without this the stream stalls while they compute.
inline void prefetch_step(const char* pf, int64_t k) {
  if (pf == nullptr) return;
  _mm_prefetch(pf + k * 128, _MM_HINT_T1);
  _mm_prefetch(pf + k * 128 + 64, _MM_HINT_T1);
}

// Whether this is an AMD CPU, where a one-row call prefetches its weights a short distance ahead
// (AMD_ONE_ROW_AHEAD) and calls of more rows let the hardware stream them (the float32 and bf16 paths say for which
// row counts). Elsewhere each path keeps its own distance (72 KB for float32, the next tile for bf16); on an Intel
// Xeon float32 without prefetching measured 13-51% slower (rowgemm_f32.h). On an AMD EPYC (Zen 4, 2 cores) one row
// streamed faster 4 KB ahead, builds alternating (benchmarks/stream_vs_forward.py): a one-row SmolLM2 forward's
// weights came at 34-35.5 GB/s against 32 in float32 while a 1 GB sum read ~60 (28-29 against 26-28 when it read
// ~34), and in bf16 at 25-27 against 23-24 (~34) and 31 against 28-29 (~60); a C loop over float32 tiles, 46-47
// GB/s against 37-39.
inline bool amd_cpu() {
  static const bool amd = __builtin_cpu_is("amd");
  return amd;
}
constexpr int64_t AMD_ONE_ROW_AHEAD = 4096;

// AVX2 stores of an accumulator's first `count` lanes (count may be <= 0 or > 8). Masked stores, not a
// buffer and memcpy: with those GCC kept every accumulator in memory through the k loop (a store per FMA;
// the 6-row kernel ran at 33 GFLOP/s on one core instead of 79).
__attribute__((target("avx2,fma"))) inline void store_f32x8(float* y, __m256 v, int64_t count) {
  const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(count, 8))),
                                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  _mm256_maskstore_ps(y, lanes, v);
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

}  // namespace specdec_rowgemm
