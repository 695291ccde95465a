// bf16 attention on AMX tiles, second half: O = P V (attention_amx.h scores the keys).
#pragma once
#include "attention_amx.h"

namespace specdec_attention_amx {

// ---- O = P V on tiles ----------------------------------------------------------------------------
// TDPBF16PS sums a block's 32 products in an order of its own, not key by key (measured here: the same
// nonzero products at other slots of a block give other bits), so a key's slot must not depend on the
// call. A pair's keys are therefore counted by ordinal: its probabilities that are not 0 (a hidden key, or
// an exp below -87, has p = 0 and adds nothing in attention.cpp's vector path too), packed in key order
// and rounded to bf16. Ordinals [32b, 32b + 32) make block b, zero-padded after the last; its result then
// depends on the pair's own (p, value) sequence alone: the same in a many-row call, a one-row call, and
// one over exactly the keys the mask leaves. Blocks where ordinal = key (before the pair's first p = 0, or
// every block, the last partial one too, where no p != 0 follows it: a decode row, a causal chain) share one
// value tile among the unit's pairs (values re-laid into key pairs once per kv group); a pair's blocks
// from its first p = 0 on (a tree's hidden siblings) gather their value rows by ordinal.
// A thread's buffer of at least `elems` (kept from call to call: a fresh one of this size is mmapped and
// page-faulted each time; what it holds is valid only within one call, see PvScratch::relay_g).
inline uint16_t* relay_buffer(int64_t elems) {
  thread_local std::vector<uint16_t> buf;
  if (static_cast<int64_t>(buf.size()) < elems) buf.resize(elems);
  return buf.data();
}

struct PvScratch {
  int64_t ostride;                                   // ordinals per pair row: the keys rounded up to 32, + 32
  std::unique_ptr<uint16_t[]> pb, gather, atile;     // [pairs, ostride] packed p; [16, 2d] a gathered block's
                                                     // values; [16, 32] shared p
  // keep (a kv group has several units): relay [blocks of 32 keys][passes][16, 2 x 64] holds the values of
  // (relay_b, relay_g) in key pairs, a pass's dims a block (pv_relay), blocks [0, relaid) filled, and the
  // group's next unit on this thread reuses them instead of re-laying them. Else (one unit a group) two
  // blocks alternate in vp, which stays in L1.
  bool keep;
  uint16_t* relay;
  std::unique_ptr<uint16_t[]> vp;  // 2 x [16, 2 x 64]
  int64_t relay_b = -1, relay_g = -1, relaid = 0;
  std::unique_ptr<int32_t[]> idx;                    // [pairs, ostride] the key of each ordinal
  std::vector<int64_t> count, shared;                // [pairs] ordinals; those in blocks where ordinal = key
  std::vector<float> sums;                           // [pairs] the sum of the packed p
  PvScratch(int64_t pairs, int64_t L, int64_t d, bool keep_values)
      : ostride((L + 31) / 32 * 32 + 32), pb(new uint16_t[pairs * ostride]), gather(new uint16_t[32 * d]),
        atile(new uint16_t[16 * 32]), keep(keep_values), relay(keep ? relay_buffer((L + 31) / 32 * 32 * d) : nullptr),
        vp(new uint16_t[2 * 32 * 64]), idx(new int32_t[pairs * ostride]), count(pairs), shared(pairs), sums(pairs) {}

  // Where block o's (keys [o, o + 32)) values for the pass from chunk c0 lie in key pairs.
  uint16_t* block(int64_t o, int64_t c0, int64_t d) const {
    return keep ? relay + (o / 32) * 32 * d + 512 * c0 : vp.get() + (o / 32 % 2) * 2048;
  }
};

// e^x for x <= 0 to within 3e-6 (relative), for probabilities that are rounded to bf16 (2^-9) next: 2^t with
// t = x log2(e) split into n + f, |f| <= 1/2, and 2^f by a degree-4 polynomial (fit here to the relative
// error). Nine vector operations where exp16's float32-grade e^x takes fourteen. `tiny` gets the lanes below
// -87 (p = 0, as exp16 has them); their values (NaN for -inf) are left to the caller.
SPECDEC_AMX inline __m512 exp16_bf16(__m512 x, __mmask16& tiny) {
  tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(9.570101276e-3f), f, _mm512_set1_ps(5.591786280e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402474433e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931217909e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.999992847e-1f));
  return _mm512_scalef_ps(p, n);
}

// Pair p's probabilities exp(score - top) of its visible keys (exp16_bf16, lane by lane), packed
// (p != 0 only, bf16, zero to a whole block) with their keys; its count of ordinals, of leading ones in
// blocks where ordinal = key, and their sum (four chains of 16 by ordinal). Keys are kept only from the
// last whole block before the first p = 0 on (w.shared[p]): before it an ordinal is its key. A pair with
// no p != 0 after its first p = 0 (a decode row; a causal row, mask or not) has ordinal = key for every
// p != 0 and shares every block, its last partial one too (its ordinals past `count` hold p = 0, so the
// values there add exactly nothing).
SPECDEC_AMX inline void pv_pack(const float* scores, int64_t visible, __m512 top, PvScratch& w, int64_t p) {
  uint16_t* pb = w.pb.get() + p * w.ostride;
  int32_t* idx = w.idx.get() + p * w.ostride;
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int64_t j = 0;
  for (; j + 16 <= visible; j += 16) {  // whole blocks while every p is nonzero (p = 0 iff below e^-87)
    __mmask16 tiny;
    const __m512 v = exp16_bf16(_mm512_sub_ps(_mm512_loadu_ps(scores + j), top), tiny);
    if (tiny != 0) break;  // taken again below
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb + j), (__m256i)_mm512_cvtneps_pbh(v));  // to nearest even
  }
  int64_t count = j, run = visible;  // ordinal = key so far; no keys kept
  for (; j < visible; j += 16) {
    const __mmask16 lanes = visible - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (visible - j)) - 1);
    __mmask16 tiny;
    const __m512 sc = _mm512_mask_loadu_ps(neg_inf, lanes, scores + j);
    const __m512 v = exp16_bf16(_mm512_sub_ps(sc, top), tiny);
    const __mmask16 nz = lanes & static_cast<__mmask16>(~tiny);
    const __m512i keys = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(j)), iota);
    if (run == visible && nz != lanes) {  // the first p = 0: the keys of ordinals [run / 32 * 32, j) are theirs
      run = j + __builtin_ctz(~nz & lanes);
      for (int64_t o = run / 32 * 32; o < j; ++o) idx[o] = static_cast<int32_t>(o);
    }
    // bf16 to nearest even (p is 0 or a normal float, >= e^-87)
    const __m256i rounded = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_compress_ps(nz, v));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb + count), rounded);
    if (run < visible) _mm512_storeu_si512(idx + count, _mm512_maskz_compress_epi32(nz, keys));
    count += __builtin_popcount(nz);
  }
  const int64_t padded = (count + 63) / 64 * 64;  // ostride holds it: the keys rounded up to 32, + 32
  std::memset(pb + count, 0, (padded - count) * 2);
  __m512 sum[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t o = 0; o < padded; o += 64)  // four chains (ordinal / 16 mod 4), combined in one order
    for (int k = 0; k < 4; ++k)
      sum[k] = _mm512_add_ps(sum[k], specdec_attention::load16(reinterpret_cast<const at::BFloat16*>(pb + o + 16 * k)));
  const __m512 total = _mm512_add_ps(_mm512_add_ps(sum[0], sum[1]), _mm512_add_ps(sum[2], sum[3]));
  w.count[p] = count, w.sums[p] = _mm512_reduce_add_ps(total);
  w.shared[p] = count == run ? (count + 31) / 32 * 32 : run / 32 * 32;  // no p != 0 after a p = 0: all blocks
}

// Value rows r0 and r1 (null: zeros) of d dims into key pairs, 32 dims a step, in the order VPUNPCK{L,H}WD
// interleave two rows within 128-bit lanes (one shuffle each, where an interleave in dim order took three):
// out[64s + 32h + 2c + r] = row r's dim 32s + 4h + DIM(c), DIM(c) = 8 (c / 4) + c % 4. A right-hand tile's 16
// columns (64 bytes) are thus 16 dims of one step in that order, and the products' columns with them: every
// column is summed alone, so the order moves results, never changes them; pv_dims_in_order puts them back.
SPECDEC_AMX inline __attribute__((always_inline)) void pv_pair_rows(const at::BFloat16* r0, const at::BFloat16* r1,
                                                                   int64_t d, uint16_t* out) {
  for (int64_t x = 0; x < d; x += 32) {
    const __m512i a = r0 != nullptr ? _mm512_loadu_si512(r0 + x) : _mm512_setzero_si512();
    const __m512i b = r1 != nullptr ? _mm512_loadu_si512(r1 + x) : _mm512_setzero_si512();
    _mm512_storeu_si512(out + 2 * x, _mm512_unpacklo_epi16(a, b));
    _mm512_storeu_si512(out + 2 * x + 32, _mm512_unpackhi_epi16(a, b));
  }
}

// A pair's accumulators [d] from pv_pair_rows's column order back into dim order, 32 dims a step: the low
// tile's 128-bit lanes hold dims 8L..8L+3, the high one's 8L+4..8L+7.
SPECDEC_AMX inline void pv_dims_in_order(float* acc, int64_t d) {
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
  for (int64_t x = 0; x < d; x += 32) {
    const __m512 lo = _mm512_loadu_ps(acc + x), hi = _mm512_loadu_ps(acc + x + 16);
    _mm512_storeu_ps(acc + x, _mm512_permutex2var_ps(lo, first, hi));
    _mm512_storeu_ps(acc + x + 16, _mm512_permutex2var_ps(lo, second, hi));
  }
}

// Value rows [o, o + 32) (those at or past `rows`, the cache's end: zeros), dims [16 c0, 16 (c0 + nc)),
// into key pairs at vb ([16, 32 nc]).
SPECDEC_AMX inline void pv_relay(const at::BFloat16* values, int64_t v_row, int64_t rows, int64_t o, int64_t c0,
                                 int64_t nc, uint16_t* vb) {
  const auto row = [&](int64_t k) { return k < rows ? values + k * v_row + 16 * c0 : nullptr; };
  for (int64_t e = 0; e < 32; e += 2) pv_pair_rows(row(o + e), row(o + e + 1), 16 * nc, vb + e * 16 * nc);
}

// Tiles for the shared blocks: 0-3 outputs [pairs, 16 dims] each, 4 probabilities [pairs, 32 ordinals],
// 5 and 6 values [16 key pairs, 16 dims] (alternating, so a load need not wait for the last product).
SPECDEC_AMX inline void pv_configure(int64_t rows) {
  TileConfig t;
  for (int i = 0; i < 5; ++i) t.rows[i] = static_cast<uint8_t>(rows), t.colsb[i] = 64;
  t.rows[5] = t.rows[6] = 16, t.colsb[5] = t.colsb[6] = 64;
  asm volatile("" : : "r"(&t) : "memory");
  _tile_loadconfig(&t);
}

// acc [pairs, d] (float32) = every pair's sum over its ordinals of p x value, blocks in ordinal order, from
// its scaled scores [pairs, stride] (attention.cpp's unit_probs), visible key counts and maxima; and its
// sum of p into w.sums.
SPECDEC_AMX inline void amx_weigh(const Call<at::BFloat16>& c, const Unit& u, PvScratch& w, const float* scores,
                                  int64_t stride, const int64_t* visible, const __m512* tops, float* acc) {
  const int64_t pairs = u.rows * u.heads, d = c.d, chunks = d / 16;
  int64_t shared = 0;
  for (int64_t p = 0; p < pairs; ++p) {
    pv_pack(scores + p * stride, visible[p], tops[p], w, p);
    shared = std::max(shared, w.shared[p]);
  }
  const at::BFloat16* values = c.values() + u.b * c.v_b + u.g * c.v_g;
  // a kv group's blocks re-laid by this thread's last unit (of this call) are already in w.relay
  const int64_t ready = w.keep && w.relay_b == u.b && w.relay_g == u.g ? w.relaid : 0;
  int64_t all_share = shared;  // blocks before it: every pair's
  for (int64_t p = 0; p < pairs; ++p) all_share = std::min(all_share, w.shared[p]);
  const auto block = [&](int64_t o, int64_t c0) { return w.block(o, c0, d); };
  pv_configure(pairs);
  for (int64_t c0 = 0; c0 < chunks; c0 += 4) {  // 64 dims a pass: four output tiles
    const int64_t nc = std::min<int64_t>(4, chunks - c0);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    // A block's 32 value rows (this pass's dims, in key pairs) are re-laid one block ahead: a tile load of
    // just-stored bytes waits for the stores, the products do not.
    if (shared > 0 && ready == 0) pv_relay(values, c.v_row, c.L, 0, c0, nc, block(0, c0));
    for (int64_t o = 0; o < shared; o += 32) {
      const uint16_t* a = w.pb.get() + o;
      int64_t a_stride = w.ostride * 2;
      if (o + 32 > all_share) {  // pairs whose shared blocks ended add zeros here (their own blocks come below)
        for (int64_t p = 0; p < pairs; ++p)
          if (w.shared[p] >= o + 32) std::memcpy(w.atile.get() + 32 * p, a + p * w.ostride, 64);
          else std::memset(w.atile.get() + 32 * p, 0, 64);
        a = w.atile.get(), a_stride = 64;
      }
      _tile_loadd(4, a, a_stride);
      const uint16_t* vb = block(o, c0);
      _tile_loadd(5, vb, 64 * nc);
      _tile_dpbf16ps(0, 4, 5);
      if (nc > 1) { _tile_loadd(6, vb + 32, 64 * nc); _tile_dpbf16ps(1, 4, 6); }
      if (nc > 2) { _tile_loadd(5, vb + 64, 64 * nc); _tile_dpbf16ps(2, 4, 5); }
      if (nc > 3) { _tile_loadd(6, vb + 96, 64 * nc); _tile_dpbf16ps(3, 4, 6); }
      if (o + 32 < shared && o + 32 >= ready) pv_relay(values, c.v_row, c.L, o + 32, c0, nc, block(o + 32, c0));
    }
    float* out = acc + 16 * c0;
    _tile_stored(0, out, 4 * d);
    if (nc > 1) _tile_stored(1, out + 16, 4 * d);
    if (nc > 2) _tile_stored(2, out + 32, 4 * d);
    if (nc > 3) _tile_stored(3, out + 48, 4 * d);
  }
  w.relay_b = u.b, w.relay_g = u.g, w.relaid = std::max(ready, shared);
  pv_configure(1);  // each pair's own blocks: one row of outputs, probabilities and tile 5's gathered values
  int64_t last = -1, last_o = -1;
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t* idx = w.idx.get() + p * w.ostride;
    for (int64_t o = w.shared[p]; o < w.count[p]; o += 32) {
      const int64_t n = std::min<int64_t>(32, w.count[p] - o);
      const bool same = last >= 0 && last_o == o && std::min<int64_t>(32, w.count[last] - o) == n &&
                        std::memcmp(w.idx.get() + last * w.ostride + o, idx + o, n * 4) == 0;
      if (!same)  // the heads of one row usually share a gathered block
        for (int64_t e = 0; e < 32; e += 2)
          pv_pair_rows(e < n ? values + idx[o + e] * c.v_row : nullptr,
                       e + 1 < n ? values + idx[o + e + 1] * c.v_row : nullptr, d, w.gather.get() + e * d);
      last = p, last_o = o;
      _tile_loadd(4, w.pb.get() + p * w.ostride + o, 64);
      for (int64_t ch = 0; ch < chunks; ++ch) {
        _tile_loadd(0, acc + p * d + 16 * ch, 64);
        _tile_loadd(5, w.gather.get() + 32 * ch, 4 * d);
        _tile_dpbf16ps(0, 4, 5);
        _tile_stored(0, acc + p * d + 16 * ch, 64);
      }
    }
  }
  for (int64_t p = 0; p < pairs; ++p) pv_dims_in_order(acc + p * d, d);
}


}  // namespace specdec_attention_amx
