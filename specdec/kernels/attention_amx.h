// attention.cpp's bf16 scores on AMX tiles, where the CPU has them.
#pragma once
#include <torch/extension.h>
#include <immintrin.h>
#include <cstdint>
#include <cstring>

#include "attention_simd.h"
#include "attention_units.h"

namespace specdec_attention_amx {

using specdec_attention_units::Call;
using specdec_attention_units::Unit;

// S^T = K Q^T for a block of 16 keys: the keys are the left operand as they lie in the cache (16 rows of 32
// dims a step), the unit's queries, transposed once per unit into pairs of dims, the right one. A score is
// one tile element: its value depends on its key's and its query's dims alone, not on the other keys or
// pairs of the tile, so rows stay invariant and a hidden key changes nothing (the probabilities and the
// weighing of values stay attention.cpp's vector code, in key order).
#define SPECDEC_AMX __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,fma,amx-tile,amx-bf16")))

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tile 0: the scores [16 keys, pairs] (float32); 1: 16 keys x 32 dims; 2: 16 dim pairs x pairs.
SPECDEC_AMX inline void amx_configure(int64_t pairs) {
  TileConfig t;
  t.rows[0] = 16, t.colsb[0] = static_cast<uint16_t>(pairs * 4);
  t.rows[1] = 16, t.colsb[1] = 64;
  t.rows[2] = 16, t.colsb[2] = static_cast<uint16_t>(pairs * 4);
  asm volatile("" : : "r"(&t) : "memory");  // GCC 12 drops the stores ldtilecfg reads without this
  _tile_loadconfig(&t);
}

SPECDEC_AMX inline void amx_release() { _tile_release(); }

// The unit's queries as qt[e, p] = pair p's dims (2e, 2e + 1).
inline void amx_queries(const Call<at::BFloat16>& c, const Unit& u, uint32_t* qt) {
  const int64_t pairs = u.rows * u.heads;
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t i = u.row0 + p / u.heads, h = u.g * c.group + u.head0 + p % u.heads;
    const at::BFloat16* qp = c.queries() + u.b * c.q_b + h * c.q_h + i * c.q_i;
    for (int64_t e = 0; e < c.d / 2; ++e) std::memcpy(qt + e * pairs + p, qp + 2 * e, 4);
  }
}

// s[p] lane e = pair p's score of key e of the block (count keys from `keys`; lanes past them 0).
SPECDEC_AMX inline void amx_scores16(const at::BFloat16* keys, int64_t k_row, int64_t count, int64_t d, int64_t pairs,
                              const uint32_t* qt, uint16_t* kpad, float* st, __m512* s) {
  const void* kb = keys;
  int64_t stride = k_row * 2;
  if (count < 16) {  // the cache may end with the block: read no row past it
    for (int64_t e = 0; e < 16; ++e) {
      if (e < count) std::memcpy(kpad + e * d, keys + e * k_row, d * 2);
      else std::memset(kpad + e * d, 0, d * 2);
    }
    kb = kpad, stride = d * 2;
  }
  _tile_zero(0);
  for (int64_t step = 0; step < d / 32; ++step) {
    _tile_loadd(1, static_cast<const char*>(kb) + 64 * step, stride);
    _tile_loadd(2, qt + step * 16 * pairs, pairs * 4);
    _tile_dpbf16ps(0, 1, 2);
  }
  _tile_stored(0, st, 64);
  __m512 r[16];
  for (int e = 0; e < 16; ++e) r[e] = _mm512_load_ps(st + 16 * e);
  specdec_attention::transpose16(r);
  for (int64_t p = 0; p < pairs; ++p) s[p] = r[p];
}

}  // namespace specdec_attention_amx
