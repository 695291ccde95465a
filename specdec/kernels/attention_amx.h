// attention.cpp's bf16 scores and probabilities x values on AMX tiles, where the CPU has them: the scores
// here, probabilities x values in attention_amx_pv.h.
#pragma once
#include <torch/extension.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "attention_simd.h"
#include "attention_units.h"

namespace specdec_attention_amx {

using specdec_attention_units::Call;
using specdec_attention_units::Unit;

// S^T = K Q^T for a block of 16 keys: the keys are the left operand as they lie in the cache (16 rows of 32
// dims a step), the unit's queries, transposed once per unit into pairs of dims, the right one. A score is
// one tile element: its value depends on its key's and its query's dims alone, not on the other keys or
// pairs of the tile, so rows stay invariant and a hidden key changes nothing (the probabilities stay
// attention.cpp's vector code; the values are weighed below).
#define SPECDEC_AMX __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512bf16,fma,amx-tile,amx-bf16")))

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: the scores [16 keys, pairs] (float32) of up to four blocks of 16 keys; 4 and 5: 16 keys x 32
// dims; 6 and 7: 16 dim pairs x pairs, the queries' even and odd 32-dim steps (resident for a unit when
// d <= 64: loaded once by amx_load_queries, not once per block).
SPECDEC_AMX inline void amx_configure(int64_t pairs) {
  TileConfig t;
  for (int i = 0; i < 4; ++i) t.rows[i] = 16, t.colsb[i] = static_cast<uint16_t>(pairs * 4);
  t.rows[4] = t.rows[5] = 16, t.colsb[4] = t.colsb[5] = 64;
  t.rows[6] = t.rows[7] = 16, t.colsb[6] = t.colsb[7] = static_cast<uint16_t>(pairs * 4);
  asm volatile("" : : "r"(&t) : "memory");  // GCC 12 drops the stores ldtilecfg reads without this
  _tile_loadconfig(&t);
}

SPECDEC_AMX inline void amx_release() { _tile_release(); }

// The unit's queries as qt[e, p] = pair p's dims (2e, 2e + 1).
inline void amx_queries(const Call<at::BFloat16>& c, const Unit& u, uint32_t* qt) {
  const int64_t pairs = u.rows * u.heads;
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t i = u.row0 + p / u.heads, h = u.g * c.group + u.head0 + p % u.heads;
    const at::BFloat16* qp = c.queries() + c.q_at(u.b, h, i);
    for (int64_t e = 0; e < c.d / 2; ++e) std::memcpy(qt + e * pairs + p, qp + 2 * e, 4);
  }
}

// Floats a stored row of scores takes: packed (`pairs`) up to PACKED_PAIRS pairs (amx_block_scores picks the
// columns out), else 16 (transposed).
constexpr int64_t PACKED_PAIRS = 4;
inline int64_t amx_score_row(int64_t pairs) { return pairs <= PACKED_PAIRS ? pairs : 16; }

// Whether a unit's queries stay in tiles 6 and 7 (d <= 64: at most two 32-dim steps).
inline bool amx_resident(int64_t d) { return d <= 64; }

// After amx_configure: the queries' steps into tiles 6 and 7 where they stay for the unit.
SPECDEC_AMX inline void amx_load_queries(const uint32_t* qt, int64_t d, int64_t pairs) {
  if (!amx_resident(d)) return;
  _tile_loadd(6, qt, pairs * 4);
  if (d > 32) _tile_loadd(7, qt + 16 * pairs, pairs * 4);
}

// One 32-dim step of block B (keys at kb[B], rows stride[B] bytes apart, through key tile KT) into scores
// tile B (tile numbers are literal tokens: the intrinsics paste them into their asm).
#define SPECDEC_AMX_STEP(B, KT, QT)                                              \
  if (B < blocks) {                                                              \
    _tile_loadd(KT, static_cast<const char*>(kb[B]) + 64 * step, stride[B]);     \
    _tile_dpbf16ps(B, KT, QT);                                                   \
  }

// st[256 b + (row_floats e) + p] = pair p's score of key e of block b (row_floats: amx_score_row's), for blocks
// b < ceil(count / 16) <= 4 of 16 keys from `keys` (count keys in all; a last block's lanes past them score 0).
// Each score is one tile element from zero over the steps in dim order, whatever the block count: the same
// bits a block alone gets.
SPECDEC_AMX inline void amx_scores64(const at::BFloat16* keys, int64_t k_row, int64_t count, int64_t d,
                                     int64_t pairs, const uint32_t* qt, uint16_t* kpad, float* st) {
  const int blocks = static_cast<int>(std::min<int64_t>(4, (count + 15) / 16));
  const void* kb[4];
  int64_t stride[4];
  for (int b = 0; b < blocks; ++b) {
    const int64_t left = count - 16 * b;
    kb[b] = keys + 16 * b * k_row, stride[b] = k_row * 2;
    if (left < 16) {  // the cache may end with the block: read no row past it
      for (int64_t e = 0; e < 16; ++e) {
        if (e < left) std::memcpy(kpad + e * d, keys + (16 * b + e) * k_row, d * 2);
        else std::memset(kpad + e * d, 0, d * 2);
      }
      kb[b] = kpad, stride[b] = d * 2;
    }
  }
  const bool resident = amx_resident(d);
  _tile_zero(0);
  if (blocks > 1) _tile_zero(1);
  if (blocks > 2) _tile_zero(2);
  if (blocks > 3) _tile_zero(3);
  for (int64_t step = 0; step < d / 32; ++step) {
    if (step % 2 == 0) {
      if (!resident) _tile_loadd(6, qt + step * 16 * pairs, pairs * 4);
      SPECDEC_AMX_STEP(0, 4, 6) SPECDEC_AMX_STEP(1, 5, 6) SPECDEC_AMX_STEP(2, 4, 6) SPECDEC_AMX_STEP(3, 5, 6)
    } else {
      if (!resident) _tile_loadd(7, qt + step * 16 * pairs, pairs * 4);
      SPECDEC_AMX_STEP(0, 4, 7) SPECDEC_AMX_STEP(1, 5, 7) SPECDEC_AMX_STEP(2, 4, 7) SPECDEC_AMX_STEP(3, 5, 7)
    }
  }
  const int64_t row_bytes = 4 * amx_score_row(pairs);
  _tile_stored(0, st, row_bytes);
  if (blocks > 1) _tile_stored(1, st + 256, row_bytes);
  if (blocks > 2) _tile_stored(2, st + 512, row_bytes);
  if (blocks > 3) _tile_stored(3, st + 768, row_bytes);
}
#undef SPECDEC_AMX_STEP

// s[p] lane e = pair p's score of key e of the block stored at st by amx_scores64. Up to 4 pairs (a one-row
// call of SmolLM2's 3 heads a kv group) the block is stored packed, [16 keys, pairs], and each pair's column
// is picked out of its `pairs` vectors by two permutes and a blend: a 16 x 16 transpose for 3 columns took
// 64 shuffles a block, a fifth of a one-row unit's time. More pairs: 16 floats a row, transposed.
SPECDEC_AMX inline void amx_block_scores(const float* st, int64_t pairs, __m512* s) {
  if (pairs <= PACKED_PAIRS) {
    __m512 v[PACKED_PAIRS];
    for (int64_t i = 0; i < PACKED_PAIRS; ++i) v[i] = i < pairs ? _mm512_load_ps(st + 16 * i) : _mm512_setzero_ps();
    const __m512i keys = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(static_cast<int>(pairs)));
    for (int64_t p = 0; p < pairs; ++p) {
      const __m512i from = _mm512_add_epi32(keys, _mm512_set1_epi32(static_cast<int>(p)));  // e pairs + p
      const __m512 low = _mm512_permutex2var_ps(v[0], from, v[1]);  // from < 32 (the index's low 5 bits)
      const __m512 high = _mm512_permutex2var_ps(v[2], from, v[3]);  // from - 32 (the same bits)
      s[p] = _mm512_mask_blend_ps(_mm512_cmpge_epi32_mask(from, _mm512_set1_epi32(32)), low, high);
    }
    return;
  }
  __m512 r[16];
  for (int e = 0; e < 16; ++e) r[e] = _mm512_load_ps(st + 16 * e);
  specdec_attention::transpose16(r);
  for (int64_t p = 0; p < pairs; ++p) s[p] = r[p];
}

}  // namespace specdec_attention_amx
