// rowgemm's bfloat16 products on AMX tiles (Sapphire Rapids and later): y[M, N] = x[M, K] @ W[N, K]^T.
//
// The packed bfloat16 weights [tiles, K/2, 32, 2] (specdec/kernels/packing.py) are already what a tile
// multiply takes as its right operand: 16 consecutive pairs of k of one packed tile, outputs 0-15, are 16
// rows of 64 bytes 128 bytes apart (outputs 16-31 are the other 64 bytes). So a packed tile streams from
// memory once per call, as on the vector paths, and each 16-pair step is two TDPBF16PS per group of up to
// 16 rows: the arithmetic of 16 rows costs about what one row's does, and the cost stays the weights'.
// With 17-32 rows (k with no tail) one packed tile goes through the steps once for both row groups
// (AMX_STEP_GROUPS). Up to 16 rows, one packed tile at a time: two tiles a step (four accumulator chains)
// measured 0.6-3% slower forward by forward on a 2-core Xeon VM, and 23-26% slower in the minutes when its
// tile products ran slow (a neighbour on the core's tile unit, likely), which one tile at a time rode out.
//
// Exactness. AMX sums a step's products in its own order and precision, not VDPBF16PS's: its float32
// results differ from the vector paths' in the last bits (checked on a Xeon: 236 of 256 outputs over
// K = 1152). What greedy speculation needs still holds: output (m, n) of a step depends only on row m of x,
// column n of the tile and the accumulator, never on how many rows share the tile, so a row's result is
// bitwise the same alone or in any group (tests/kernels/test_rowgemm.py). A process runs one bf16 path for
// every call; SPECDEC_NO_AMX=1 keeps the AVX512-BF16 one.
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "parts.h"

namespace {

constexpr int64_t TILE = 32;   // outputs per packed tile
constexpr int64_t STEP = 16;   // pairs of k per tile multiply (a 64-byte tile row of x)
constexpr int64_t MOST = 16;   // rows per tile multiply

// Linux hands a process AMX's 8 KB of tile state only when asked (arch_prctl, kernel 5.16+).
constexpr int ARCH_REQ_XCOMP_PERM = 0x1023;
constexpr int XFEATURE_XTILEDATA = 18;

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of tile i
  uint8_t rows[16] = {};
};

// Tiles 0, 1: the accumulators (rows x 16 float32; outputs 0-15 and 16-31 of the packed tile).
// Tile 2: x (rows x 16 pairs). Tiles 3, 4: the weights (16 pairs x 16 outputs x 2).
// Tiles 5, 6, 7: the same as 2, 3, 4 for the last `tail` pairs when K/2 is not a multiple of 16.
TileConfig config_for(int64_t rows, int64_t tail) {
  TileConfig c;
  for (int t : {0, 1, 2}) c.rows[t] = rows, c.colsb[t] = 64;
  for (int t : {3, 4}) c.rows[t] = STEP, c.colsb[t] = 64;
  if (tail) {
    c.rows[5] = rows, c.colsb[5] = tail * 4;
    for (int t : {6, 7}) c.rows[t] = tail, c.colsb[t] = 64;
  }
  return c;
}

// Two row groups a step (17-32 rows, no tail): tiles 0, 1 and 4, 5 the accumulators of groups a and b,
// tiles 2 and 3 their x, tiles 6 and 7 the weights, loaded once for both groups.
TileConfig config_for_groups(int64_t rows_a, int64_t rows_b) {
  TileConfig c;
  for (int t : {0, 1, 2}) c.rows[t] = rows_a, c.colsb[t] = 64;
  for (int t : {3, 4, 5}) c.rows[t] = rows_b, c.colsb[t] = 64;
  for (int t : {6, 7}) c.rows[t] = STEP, c.colsb[t] = 64;
  return c;
}

// Rows per group: balanced (20 rows -> 10 + 10), so most calls configure the tiles once.
inline int64_t group_rows(int64_t remaining) {
  const int64_t groups = (remaining + MOST - 1) / MOST;
  return (remaining + groups - 1) / groups;
}

inline void prefetch_pairs(const char* pf, int64_t lo, int64_t hi) {
  for (int64_t k = lo; k < hi; ++k) {
    _mm_prefetch(pf + k * 128, _MM_HINT_T1);
    _mm_prefetch(pf + k * 128 + 64, _MM_HINT_T1);
  }
}

__attribute__((target("avx512f,avx512vl,avx512bw,avx512bf16"))) void store_rows(
    const float (*acc)[TILE], int64_t rows, char* y, int64_t ldy_bytes, int64_t nvalid, bool out_fp32) {
  const __mmask16 m0 = nvalid >= 16 ? 0xFFFF : (__mmask16)((1u << nvalid) - 1);
  const __mmask16 m1 = nvalid >= 32 ? 0xFFFF : nvalid <= 16 ? 0 : (__mmask16)((1u << (nvalid - 16)) - 1);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 a0 = _mm512_load_ps(acc[r]), a1 = _mm512_load_ps(acc[r] + 16);
    if (out_fp32) {
      float* out = reinterpret_cast<float*>(y + r * ldy_bytes);
      _mm512_mask_storeu_ps(out, m0, a0);
      _mm512_mask_storeu_ps(out + 16, m1, a1);
    } else {  // rounded once, to nearest even (as torch rounds float32 to bfloat16)
      uint16_t* out = reinterpret_cast<uint16_t*>(y + r * ldy_bytes);
      _mm256_mask_storeu_epi16(out, m0, (__m256i)_mm512_cvtneps_pbh(a0));
      _mm256_mask_storeu_epi16(out + 16, m1, (__m256i)_mm512_cvtneps_pbh(a1));
    }
  }
}

}  // namespace

bool specdec_parts::amx_bf16_ready() {
  static const bool ready = [] {
    const char* off = std::getenv("SPECDEC_NO_AMX");
    if (off != nullptr && off[0] != '\0' && off[0] != '0') return false;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24);
    return amx_bf16 && amx_tile && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return ready;
}

// Step s (16 pairs of k, or the tail's fewer): x's pairs into tile X, the packed tile's halves (outputs 0-15,
// 16-31) into W0 and W1, both products into accumulators 0 and 1. A macro: tile numbers must be literals.
#define AMX_STEP(X, W0, W1, s)                                   \
  do {                                                           \
    const uint16_t* ws = wp + (s) * STEP * 2 * TILE;             \
    _tile_loadd(X, xr + (s) * STEP, K2 * 4);                     \
    _tile_loadd(W0, ws, 2 * TILE * 2);                           \
    _tile_loadd(W1, ws + TILE, 2 * TILE * 2);                    \
    _tile_dpbf16ps(0, X, W0);                                    \
    _tile_dpbf16ps(1, X, W1);                                    \
  } while (0)

// Accumulators A0, A1 (outputs 0-15, 16-31 of packed tile t) of `rows` rows from `row` on, into y.
#define AMX_STORE(A0, A1, t, row, rows)                                                                \
  do {                                                                                                 \
    _tile_stored(A0, &acc[0][0], TILE * 4);                                                            \
    _tile_stored(A1, &acc[0][16], TILE * 4);                                                           \
    store_rows(acc, rows, y + ((row) * n_out + (t) * TILE) * elem, n_out * elem,                       \
               std::min(TILE, n_out - (t) * TILE), out_fp32);                                          \
  } while (0)

// Step s of one packed tile for two row groups (xa, xb): the weights' two halves loaded once, four products.
// Each accumulator runs the chain its group runs alone, so the bits are those of two passes.
#define AMX_STEP_GROUPS(s)                                       \
  do {                                                           \
    const uint16_t* ws = wp + (s) * STEP * 2 * TILE;             \
    _tile_loadd(2, xa + (s) * STEP, K2 * 4);                     \
    _tile_loadd(6, ws, 2 * TILE * 2);                            \
    _tile_loadd(7, ws + TILE, 2 * TILE * 2);                     \
    _tile_dpbf16ps(0, 2, 6);                                     \
    _tile_dpbf16ps(1, 2, 7);                                     \
    _tile_loadd(3, xb + (s) * STEP, K2 * 4);                     \
    _tile_dpbf16ps(4, 3, 6);                                     \
    _tile_dpbf16ps(5, 3, 7);                                     \
  } while (0)

// 17-32 rows where k has no tail: packed tiles [begin, end) each through the steps once for both of the
// row groups the one-group loop below would make (ceil(M / 2) rows, then the rest).
__attribute__((target("amx-tile,amx-bf16,avx512f"))) static void amx_two_groups(
    const uint32_t* xp, int64_t M, int64_t K2, const uint16_t* wd, int64_t n_out, char* y, bool out_fp32,
    int64_t begin, int64_t end) {
  const int64_t steps = K2 / STEP, elem = out_fp32 ? 4 : 2, rows_a = group_rows(M), rows_b = M - rows_a;
  const int64_t tile_elems = K2 * 2 * TILE;
  const uint32_t* xa = xp;
  const uint32_t* xb = xp + rows_a * K2;
  alignas(64) float acc[MOST][TILE];
  const TileConfig config = config_for_groups(rows_a, rows_b);
  asm volatile("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
  for (int64_t t = begin; t < end; ++t) {
    const uint16_t* wp = wd + t * tile_elems;
    const char* pf = t + 1 < end ? reinterpret_cast<const char*>(wp + tile_elems) : nullptr;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(4);
    _tile_zero(5);
    for (int64_t s = 0; s < steps; ++s) {
      if (pf != nullptr) prefetch_pairs(pf, s * STEP, (s + 1) * STEP);
      AMX_STEP_GROUPS(s);
    }
    AMX_STORE(0, 1, t, 0, rows_a);
    AMX_STORE(4, 5, t, rows_a, rows_b);
  }
  _tile_release();
}

// Packed tiles [begin, end): x as K2 bf16 pairs per row (uint32 [M, K2]), y [M, n_out] (bf16 or float32).
__attribute__((target("amx-tile,amx-bf16,avx512f"))) void specdec_parts::bf16_amx_tiles(
    const uint32_t* xp, int64_t M, int64_t K2, const uint16_t* wd, int64_t n_out, char* y, bool out_fp32,
    int64_t begin, int64_t end) {
  const int64_t steps = K2 / STEP, tail = K2 % STEP, elem = out_fp32 ? 4 : 2, groups = (M + MOST - 1) / MOST;
  if (tail == 0 && M > MOST && M <= 2 * MOST) return amx_two_groups(xp, M, K2, wd, n_out, y, out_fp32, begin, end);
  const int64_t tile_elems = K2 * 2 * TILE;  // uint16 per packed tile
  alignas(64) float acc[MOST][TILE];
  int64_t configured = 0;
  for (int64_t t = begin; t < end; ++t) {
    const uint16_t* wp = wd + t * tile_elems;
    const char* pf = t + 1 < end ? reinterpret_cast<const char*>(wp + tile_elems) : nullptr;  // the next tile
    for (int64_t row = 0, g = 0; row < M; ++g) {
      const int64_t rows = group_rows(M - row);
      if (rows != configured) {
        const TileConfig config = config_for(rows, tail);
        asm volatile("" : : "r"(&config) : "memory");  // GCC 12 may drop the stores ldtilecfg reads otherwise
        _tile_loadconfig(&config);
        configured = rows;
      }
      const int64_t pf_lo = K2 * g / groups, pf_hi = K2 * (g + 1) / groups;  // the next tile, spread
      const uint32_t* xr = xp + row * K2;
      _tile_zero(0);
      _tile_zero(1);
      for (int64_t s = 0; s < steps + (tail ? 1 : 0); ++s) {
        if (pf != nullptr) prefetch_pairs(pf, std::max(pf_lo, s * STEP), std::min(pf_hi, (s + 1) * STEP));
        if (s < steps)
          AMX_STEP(2, 3, 4, s);
        else
          AMX_STEP(5, 6, 7, s);  // the last `tail` pairs, on tiles shaped for them
      }
      AMX_STORE(0, 1, t, row, rows);
      row += rows;
    }
  }
  if (configured) _tile_release();
}
