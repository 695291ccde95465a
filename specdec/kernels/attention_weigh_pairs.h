// Row-invariant attention, bf16 on AVX512-BF16 without AMX (head size 32, 64 or 128): the values weighed by
// dot-pairs. Included by attention.cpp inside its unnamed namespace, after attention_probs.h (Scratch, Call,
// Unit, KEY_BLOCK and unit_output in scope); not a header for anyone else.
//
// A pair's nonzero probabilities pair up in key order, by their ordinals: the o-th and (o + 1)-th keys it gives
// weight to, for even o (a last odd one with a zero). Their value rows are interleaved 16 bits at a time, so
// a 32-bit lane holds one dim of both, and VDPBF16PS adds p_a v_a + p_b v_b to that dim's float32
// accumulator: half the multiply instructions of widening the values, and no widening. The probabilities
// are rounded to bf16 for it (the float32 sums that normalize them are not); "nonzero" is the bf16's. A
// key with p = 0 takes no ordinal, so a row's pairs, and its bits, are the same whichever keys of the
// cache its mask hides (a tree row equals its path alone) and whatever rows share the call. Where every
// pair of a row group gives weight to every key of a block and all carry a key over from the last block or
// none does, the group shares each value pair's loads and interleave (the usual case: the cached prefix);
// elsewhere each pair walks its own keys.
#pragma once

// [pairs, stride] bf16: each pair's probabilities of keys [0, most), 0 from `most` on to a multiple of 32.
SPECDEC_AVX512_BF16 inline void bf16_probabilities(const float* probs, int64_t stride, int64_t pairs, int64_t most,
                                                   uint16_t* p16) {
  const auto lanes = [](int64_t n) {
    return n >= 16 ? static_cast<__mmask16>(0xFFFF) : n <= 0 ? static_cast<__mmask16>(0) : static_cast<__mmask16>((1u << n) - 1);
  };
  for (int64_t p = 0; p < pairs; ++p)
    for (int64_t j = 0; j < most; j += 32) {
      const float* sp = probs + p * stride + j;
      const __m512 lo = _mm512_maskz_loadu_ps(lanes(most - j), sp), hi = _mm512_maskz_loadu_ps(lanes(most - j - 16), sp + 16);
      _mm512_storeu_si512(p16 + p * stride + j, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));  // keys j.. in order
    }
}

// Whether every one of G pairs' bf16 probabilities of keys [j0, j1) (at most 64) is nonzero.
SPECDEC_AVX512_BF16 inline bool all_weighed(const uint16_t* p16, int64_t stride, int64_t G, int64_t j0, int64_t j1) {
  const int64_t n = j1 - j0;
  const __mmask32 first = n >= 32 ? 0xFFFFFFFFu : static_cast<__mmask32>((1ull << n) - 1);
  const __mmask32 second = n >= 64 ? 0xFFFFFFFFu : n <= 32 ? 0u : static_cast<__mmask32>((1ull << (n - 32)) - 1);
  for (int64_t g = 0; g < G; ++g) {
    const uint16_t* row = p16 + g * stride + j0;
    const __m512i a = _mm512_maskz_loadu_epi16(first, row), b = _mm512_maskz_loadu_epi16(second, row + 32);
    if (_mm512_mask_test_epi16_mask(first, a, a) != first || _mm512_mask_test_epi16_mask(second, b, b) != second)
      return false;
  }
  return true;
}

// Value rows a and b (b < 0: zeros) interleaved, chunk c of 32 dims into lo / hi: lo's 128-bit lane L holds
// dims 8L..8L+3 of the chunk, hi's 8L+4..8L+7 (unpacklo / unpackhi work within 128-bit lanes).
SPECDEC_AVX512_BF16 inline void interleave(const at::BFloat16* v, int64_t v_row, int64_t a, int64_t b, int64_t c,
                                           __m512i& lo, __m512i& hi) {
  const __m512i x = _mm512_loadu_si512(v + a * v_row + 32 * c);
  const __m512i y = b >= 0 ? _mm512_loadu_si512(v + b * v_row + 32 * c) : _mm512_setzero_si512();
  lo = _mm512_unpacklo_epi16(x, y);
  hi = _mm512_unpackhi_epi16(x, y);
}

// One pair's accumulators [d] (interleaved order) += p_a v_a + p_b v_b (b < 0: p_a v_a alone).
SPECDEC_AVX512_BF16 inline void weigh_two(const uint16_t* p16, const at::BFloat16* v, int64_t v_row, int64_t a,
                                          int64_t b, float* acc, int64_t d) {
  const uint32_t word = p16[a] | (b >= 0 ? static_cast<uint32_t>(p16[b]) << 16 : 0u);
  const __m512bh pv = (__m512bh)_mm512_set1_epi32(static_cast<int>(word));
  for (int64_t c = 0; c < d / 32; ++c) {
    __m512i lo, hi;
    interleave(v, v_row, a, b, c, lo, hi);
    _mm512_storeu_ps(acc + 32 * c, _mm512_dpbf16_ps(_mm512_loadu_ps(acc + 32 * c), (__m512bh)lo, pv));
    _mm512_storeu_ps(acc + 32 * c + 16, _mm512_dpbf16_ps(_mm512_loadu_ps(acc + 32 * c + 16), (__m512bh)hi, pv));
  }
}

// GB pairs that give weight to every key of [j, j + 2 * count): key pairs (j, j + 1), (j + 2, j + 3), ...
// into their accumulators (acc: GB rows of acc_stride floats, 2 * CH2 vectors each, interleaved order), each
// value pair loaded and interleaved once for all GB. ahead: prefetch rows KV_AHEAD_BYTES on, up to `ahead`.
template <int CH2, int GB>
SPECDEC_AVX512_BF16 void weigh_pairs_run(const uint16_t* p16, int64_t stride, const at::BFloat16* v, int64_t v_row,
                                         int64_t j, int64_t count, float* acc, int64_t acc_stride, int64_t ahead) {
  constexpr int64_t ROW_AHEAD = KV_AHEAD_BYTES / (CH2 * 64);
  __m512 a[GB][2 * CH2];
  for (int g = 0; g < GB; ++g)
    for (int c = 0; c < 2 * CH2; ++c) a[g][c] = _mm512_loadu_ps(acc + g * acc_stride + 16 * c);
  for (int64_t m = 0; m < count; ++m, j += 2) {
    if (j + 1 + ROW_AHEAD < ahead) {
      prefetch_row(v + (j + ROW_AHEAD) * v_row, CH2 * 64);
      prefetch_row(v + (j + 1 + ROW_AHEAD) * v_row, CH2 * 64);
    }
    __m512i lo[CH2], hi[CH2];
    for (int c = 0; c < CH2; ++c) interleave(v, v_row, j, j + 1, c, lo[c], hi[c]);
    for (int g = 0; g < GB; ++g) {
      uint32_t word;
      std::memcpy(&word, p16 + g * stride + j, 4);  // keys j, j + 1: low, high
      const __m512bh pv = (__m512bh)_mm512_set1_epi32(static_cast<int>(word));
      for (int c = 0; c < CH2; ++c) {
        a[g][2 * c] = _mm512_dpbf16_ps(a[g][2 * c], (__m512bh)lo[c], pv);
        a[g][2 * c + 1] = _mm512_dpbf16_ps(a[g][2 * c + 1], (__m512bh)hi[c], pv);
      }
    }
  }
  for (int g = 0; g < GB; ++g)
    for (int c = 0; c < 2 * CH2; ++c) _mm512_storeu_ps(acc + g * acc_stride + 16 * c, a[g][c]);
}

// A pair's accumulators [d] from the interleaved order back to dims in order (a fixed permutation: the
// same bits).
SPECDEC_AVX512_BF16 inline void natural_dims(float* acc, int64_t d) {
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int64_t c = 0; c < d; c += 32) {
    const __m512 lo = _mm512_loadu_ps(acc + c), hi = _mm512_loadu_ps(acc + c + 16);
    _mm512_storeu_ps(acc + c, _mm512_permutex2var_ps(lo, first, hi));
    _mm512_storeu_ps(acc + c + 16, _mm512_permutex2var_ps(lo, second, hi));
  }
}

inline bool weighs_by_pairs(int64_t d) { return (d == 32 || d == 64 || d == 128) && cpu_dot_pairs(); }

// GB pairs [p, p + GB) over keys [j0, j1): shared runs where all give weight to every key and carry alike,
// else each pair on its own. carried[g]: a key waiting for its partner (-1: none), in and out.
template <int CH2, int GB>
SPECDEC_AVX512_BF16 void weigh_pairs_block(const uint16_t* p16, int64_t stride, const at::BFloat16* v, int64_t v_row,
                                           int64_t j0, int64_t j1, float* acc, int64_t d, int64_t* carried,
                                           int64_t ahead) {
  bool shared = all_weighed(p16, stride, GB, j0, j1);
  for (int g = 1; g < GB && shared; ++g) shared = (carried[g] >= 0) == (carried[0] >= 0);
  if (shared) {
    int64_t j = j0;
    if (carried[0] >= 0) {  // each its own key from before with key j0, then the run from j0 + 1
      for (int g = 0; g < GB; ++g) weigh_two(p16 + g * stride, v, v_row, carried[g], j0, acc + g * d, d);
      ++j;
    }
    const int64_t count = (j1 - j) / 2;
    weigh_pairs_run<CH2, GB>(p16, stride, v, v_row, j, count, acc, d, ahead);
    for (int g = 0; g < GB; ++g) carried[g] = j + 2 * count < j1 ? j1 - 1 : -1;
    return;
  }
  for (int g = 0; g < GB; ++g) {
    const uint16_t* row = p16 + g * stride;
    for (int64_t j = j0; j < j1; ++j) {
      if (row[j] == 0) continue;
      if (carried[g] < 0) {
        carried[g] = j;
      } else {
        weigh_two(row, v, v_row, carried[g], j, acc + g * d, d);
        carried[g] = -1;
      }
    }
  }
}

// out = sum_j p_j v_j / sum_j p_j for every pair of the unit by dot-pairs, keys in blocks of KEY_BLOCK.
SPECDEC_AVX512_BF16 void unit_weigh_pairs(const Call<at::BFloat16>& c, const Unit& u, Scratch& w, int64_t stride,
                                          int64_t most) {
  const int64_t pairs = u.rows * u.heads, d = c.d;
  uint16_t* const p16 = w.p16.data();
  int64_t* const carried = w.carried.data();
  bf16_probabilities(w.probs.data(), stride, pairs, most, p16);
  std::fill(w.acc.begin(), w.acc.begin() + pairs * d, 0.0f);
  std::fill(carried, carried + pairs, int64_t{-1});
  const at::BFloat16* values = c.values() + u.b * c.v_b + u.g * c.v_g;
  for (int64_t j0 = 0; j0 < most; j0 += KEY_BLOCK) {
    const int64_t j1 = std::min(j0 + KEY_BLOCK, most);
    for (int64_t p = 0; p < pairs;) {
      const int64_t left = pairs - p;
#define WEIGH_PAIRS(CH2, GB)                                                                                     \
  weigh_pairs_block<CH2, GB>(p16 + p * stride, stride, values, c.v_row, j0, j1, w.acc.data() + p * d, d, carried + p, \
                             p ? 0 : most);                                                                      \
  p += GB;                                                                                                       \
  continue
      if (d == 64 && left >= 6) { WEIGH_PAIRS(2, 6); }
      if (d == 64 && left >= 3) { WEIGH_PAIRS(2, 3); }
      if (d == 64) { WEIGH_PAIRS(2, 1); }
      if (d == 32 && left >= 8) { WEIGH_PAIRS(1, 8); }
      if (d == 32 && left >= 4) { WEIGH_PAIRS(1, 4); }
      if (d == 32) { WEIGH_PAIRS(1, 1); }
      if (left >= 2) { WEIGH_PAIRS(4, 2); }
      WEIGH_PAIRS(4, 1);
#undef WEIGH_PAIRS
    }
  }
  for (int64_t p = 0; p < pairs; ++p) {
    if (carried[p] >= 0) weigh_two(p16 + p * stride, values, c.v_row, carried[p], -1, w.acc.data() + p * d, d);
    natural_dims(w.acc.data() + p * d, d);
  }
  unit_output<at::BFloat16>(c, u, w.acc.data(), w.sums.data());
}
