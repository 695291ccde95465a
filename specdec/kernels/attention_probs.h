// Row-invariant attention (AVX-512), first half: a unit's scores and probabilities, with the per-thread
// scratch they live in. Included by attention.cpp inside its unnamed namespace (its using-declarations,
// KEY_BLOCK, NEG_INF and the AVX512 attribute macro are in scope); not a header for anyone else.
#pragma once

// Floats on a 64-byte boundary (std::vector<__m512> does not promise it here), viewed as vectors.
class Vectors {
 public:
  explicit Vectors(int64_t count) : raw_(16 * count + 16) {}
  __m512* data() {
    const auto at = reinterpret_cast<uintptr_t>(raw_.data());
    return reinterpret_cast<__m512*>((at + 63) & ~uintptr_t{63});
  }

 private:
  std::vector<float> raw_;
};

// One thread's working memory, reused unit after unit.
struct Scratch {
  Vectors kt, top16, st;  // [d] a block of 16 keys across lanes; [pairs] running maxima; [4 x 16] AMX's scores
  std::vector<float> qf, probs, acc, sums;  // [pairs, d] queries; [pairs, stride] scores, then probabilities;
                                            // [pairs, d] value accumulators; [pairs] their sums
  std::vector<int64_t> visible;  // [pairs] keys each pair sees
  std::vector<int64_t> mask_from;  // [pairs] where its row's mask may first be nonzero (keys before: all 0)
  std::vector<uint32_t> qt;      // AMX: [d / 2, pairs] the queries' dims in pairs, transposed
  std::vector<uint16_t> kpad;    // AMX: [16, d] a last block of fewer than 16 keys, zero-padded
  std::vector<uint16_t> p16;     // dot-pair weighing: [pairs, stride] probabilities in bf16
  std::vector<int64_t> carried;  // [pairs] a key waiting for its partner (-1: none)
  Scratch(int64_t pairs, int64_t stride, int64_t d)
      : kt(d), top16(pairs), st(64), qf(pairs * d), probs(pairs * stride), acc(pairs * d), sums(pairs),
        visible(pairs), mask_from(pairs), qt(d / 2 * pairs), kpad(16 * d), p16(pairs * stride), carried(pairs) {
    std::fill(reinterpret_cast<float*>(st.data()), reinterpret_cast<float*>(st.data()) + 1024, 0.0f);
  }
};

// Pair p's raw scores of keys [j, j + 16): scaled, masked, stored into w.probs, and into its running max.
template <typename T>
AVX512 inline void take_scores(const Call<T>& c, const Unit& u, Scratch& w, int64_t stride, int64_t j, int64_t p,
                               __m512 raw) {
  const int64_t seen = std::min<int64_t>(16, w.visible[p] - j);
  if (seen <= 0) return;
  const __mmask16 lanes = seen == 16 ? 0xFFFF : static_cast<__mmask16>((1u << seen) - 1);
  __m512 sc = _mm512_mul_ps(raw, _mm512_set1_ps(c.scale));
  if (c.mask != nullptr && j + 16 > w.mask_from[p]) {  // before mask_from the mask adds 0: the same bits
    alignas(64) float masked[16];
    const float* m = c.mask + u.b * c.m_b + (u.row0 + p / u.heads) * c.m_i + j * c.m_j;
    if (c.m_j != 1)
      for (int64_t e = 0; e < seen; ++e) masked[e] = m[e * c.m_j];
    sc = _mm512_add_ps(sc, c.m_j == 1 ? _mm512_maskz_loadu_ps(lanes, m) : _mm512_load_ps(masked));
  }
  _mm512_mask_storeu_ps(w.probs.data() + p * stride + j, lanes, sc);
  __m512* const top16 = w.top16.data();
  top16[p] = _mm512_mask_max_ps(top16[p], lanes, top16[p], sc);
}

// Pairs [p0, p0 + n)'s raw scores s[0..n) of keys [j, j + 16), taken as take_scores takes them. A block before
// `plain` (unit_probs's: every pair of the unit sees all its keys and no mask reaches it, most of a verify's
// blocks) is scaled, stored and maxed without take_scores's per-pair tests, to the same bits.
template <typename T>
AVX512 inline void take_block_scores(const Call<T>& c, const Unit& u, Scratch& w, int64_t stride, int64_t j,
                                     int64_t p0, int64_t n, const __m512* s, int64_t plain) {
  if (j + 16 > plain) {
    for (int64_t g = 0; g < n; ++g) take_scores<T>(c, u, w, stride, j, p0 + g, s[g]);
    return;
  }
  const __m512 scale = _mm512_set1_ps(c.scale);
  __m512* const top16 = w.top16.data();
  for (int64_t g = 0; g < n; ++g) {
    const __m512 sc = _mm512_mul_ps(s[g], scale);
    _mm512_storeu_ps(w.probs.data() + (p0 + g) * stride + j, sc);
    top16[p0 + g] = _mm512_max_ps(top16[p0 + g], sc);
  }
}

// AMX, more than PACKED_PAIRS pairs, a block before `plain`: the block's scores as amx_scores64 stored them
// (st: 16 keys' rows, lane p = pair p) scaled and maxed row by row (lane p's running max over the unit's plain
// blocks into `rows_max`, key rows in lanes: no per-pair load and store of top16), then transposed to pairs and
// stored. The same bits as take_block_scores: each product is the one it takes, and a max is exact whatever
// the order it meets its values in (unit_probs folds rows_max into top16 before reducing it).
template <typename T>
AVX512 inline void take_plain_rows(const Call<T>& c, Scratch& w, int64_t stride, int64_t j, int64_t pairs,
                                   const float* st, __m512& rows_max) {
  const __m512 scale = _mm512_set1_ps(c.scale);
  __m512 r[16];
  for (int e = 0; e < 16; ++e) {
    r[e] = _mm512_mul_ps(_mm512_load_ps(st + 16 * e), scale);
    rows_max = _mm512_max_ps(rows_max, r[e]);
  }
  transpose16(r);
  float* const probs = w.probs.data() + j;
  for (int64_t p = 0; p < pairs; ++p) _mm512_storeu_ps(probs + p * stride, r[p]);
}

// How many of a mask row's L entries (m_j apart) lead with 0 (+0 or -0): where the row's mask may first
// matter. A verify's rows see all their cached keys, so for them this is most of the row.
AVX512 inline int64_t zeros_from_start(const float* m, int64_t m_j, int64_t L) {
  int64_t j = 0;
  if (m_j == 1)
    for (; j + 16 <= L; j += 16) {
      const __mmask16 set = _mm512_cmp_ps_mask(_mm512_loadu_ps(m + j), _mm512_setzero_ps(), _CMP_NEQ_UQ);
      if (set != 0) return j + __builtin_ctz(set);
    }
  for (; j < L; ++j)
    if (!(m[j * m_j] == 0.0f)) return j;
  return L;
}

// total's lanes plus the nonzero lanes `nz` of e, as ordinals count, count + 1, ... (lane = ordinal mod 16);
// count advances by their number.
AVX512 inline __m512 add_by_ordinal(__m512 total, __m512 e, __mmask16 nz, int64_t& count) {
  const int64_t r = count & 15, m = __builtin_popcount(nz);
  count += m;
  if (r == 0 && nz == 0xFFFF) return _mm512_add_ps(total, e);  // a whole block in place: the usual case
  if (m == 0) return total;
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i from = _mm512_and_si512(_mm512_sub_epi32(iota, _mm512_set1_epi32(static_cast<int>(r))),
                                        _mm512_set1_epi32(15));  // lane l takes compressed lane (l - r) mod 16
  const uint32_t first = (1u << m) - 1;  // m <= 16
  const __mmask16 into = static_cast<__mmask16>(((first << r) | (first >> (16 - r))) & 0xFFFF);
  return _mm512_mask_add_ps(total, into, total, _mm512_permutexvar_ps(from, _mm512_maskz_compress_ps(nz, e)));
}

// bf16 with AVX512-BF16 and d a multiple of 32: every pair's raw scores of keys [0, most) by dot-pairs
// (attention_simd.h), taken as the widened path takes its own; w.qf holds each pair's query as bf16 pairs.
SPECDEC_AVX512_BF16 void unit_pair_scores(const Call<at::BFloat16>& c, const Unit& u, Scratch& w, int64_t stride,
                                          int64_t most, int64_t plain, const at::BFloat16* keys) {
  const int64_t pairs = u.rows * u.heads, d = c.d;
  __m512* const kt = w.kt.data();
  for (int64_t j = 0; j < most; j += 16) {  // 16 keys read (and transposed) once, scored for every pair
    key_pairs_across_lanes(keys + j * c.k_row, c.k_row, std::min<int64_t>(16, most - j), d, kt, most - j);
    __m512 s[6];
    for (int64_t p = 0; p < pairs;) {
      const int64_t group = std::min<int64_t>(6, pairs - p);
      const auto* q = reinterpret_cast<const uint32_t*>(w.qf.data() + p * d);  // a pair's row: d floats of room
      switch (group) {
        case 1: scores16_pairs<1>(q, d, kt, d / 2, s); break;
        case 2: scores16_pairs<2>(q, d, kt, d / 2, s); break;
        case 3: scores16_pairs<3>(q, d, kt, d / 2, s); break;
        case 4: scores16_pairs<4>(q, d, kt, d / 2, s); break;
        case 5: scores16_pairs<5>(q, d, kt, d / 2, s); break;
        default: scores16_pairs<6>(q, d, kt, d / 2, s); break;
      }
      take_block_scores<at::BFloat16>(c, u, w, stride, j, p, group, s, plain);
      p += group;
    }
  }
}

inline bool cpu_dot_pairs() {
  static const bool ok = __builtin_cpu_supports("avx512bf16");
  return ok;
}

// Every pair's unnormalized probabilities exp(q . k_j * scale + mask_j - max) into w.probs, zero from its
// own visible count up to the unit's largest, which is returned (AMX: the scaled scores, and the max).
template <typename T>
AVX512 int64_t unit_probs(const Call<T>& c, const Unit& u, Scratch& w, int64_t stride, bool amx) {
  const int64_t pairs = u.rows * u.heads, d = c.d;
  const T* keys = c.keys() + u.b * c.k_b + u.g * c.k_g;
  __m512* const top16 = w.top16.data();
  __m512* const kt = w.kt.data();
  const bool dot_pairs = std::is_same<T, at::BFloat16>::value && !amx && d % 32 == 0 && cpu_dot_pairs();
  int64_t most = 0;
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t i = u.row0 + p / u.heads, h = u.g * c.group + u.head0 + p % u.heads;
    const T* qp = c.queries() + c.q_at(u.b, h, i);
    if (dot_pairs)
      std::memcpy(w.qf.data() + p * d, qp, d * sizeof(T));  // as bf16 pairs, half of its row
    else if (!amx)
      for (int64_t ch = 0; ch < c.chunks; ++ch) _mm512_storeu_ps(w.qf.data() + p * d + 16 * ch, load16(qp + 16 * ch));
    w.visible[p] = c.visible(i);
    if (c.mask != nullptr)
      w.mask_from[p] = p % u.heads ? w.mask_from[p - 1]
                                   : zeros_from_start(c.mask + u.b * c.m_b + i * c.m_i, c.m_j, c.L);
    top16[p] = _mm512_set1_ps(NEG_INF);
    most = std::max(most, w.visible[p]);
  }
  int64_t plain = most;  // keys before it: seen by every pair, reached by no mask (take_block_scores)
  for (int64_t p = 0; p < pairs; ++p)
    plain = std::min(plain, c.mask != nullptr ? std::min(w.visible[p], w.mask_from[p]) : w.visible[p]);
  if constexpr (std::is_same<T, at::BFloat16>::value) {
    if (amx) {
      amx_queries(c, u, w.qt.data());
      amx_configure(pairs);
      amx_load_queries(w.qt.data(), d, pairs);
    }
  }
  if constexpr (std::is_same<T, at::BFloat16>::value) {
    // AMX: up to four blocks of 16 keys on tiles at once (independent products in flight), then each
    // block's scores transposed to pairs and taken
    const bool by_rows = pairs > specdec_attention_amx::PACKED_PAIRS;  // scores stored 16 floats a key
    __m512 rows_max = _mm512_set1_ps(NEG_INF);
    for (int64_t j = 0; amx && j < most; j += 64) {
      float* const st = reinterpret_cast<float*>(w.st.data());
      amx_scores64(keys + j * c.k_row, c.k_row, most - j, d, pairs, w.qt.data(), w.kpad.data(), st);
      for (int64_t b = 0; b < 4 && j + 16 * b < most; ++b) {
        if (by_rows && j + 16 * b + 16 <= plain) {
          take_plain_rows<T>(c, w, stride, j + 16 * b, pairs, st + 256 * b, rows_max);
          continue;
        }
        __m512 s[16];
        amx_block_scores(st + 256 * b, pairs, s);
        take_block_scores<T>(c, u, w, stride, j + 16 * b, 0, pairs, s, plain);
      }
    }
    if (amx && by_rows) {
      alignas(64) float lane_max[16];
      _mm512_store_ps(lane_max, rows_max);
      for (int64_t p = 0; p < pairs; ++p) top16[p] = _mm512_max_ps(top16[p], _mm512_set1_ps(lane_max[p]));
    }
  }
  if constexpr (std::is_same<T, at::BFloat16>::value) {
    if (dot_pairs) unit_pair_scores(c, u, w, stride, most, plain, keys);
  }
  for (int64_t j = 0; !amx && !dot_pairs && j < most; j += 16) {  // 16 keys read (and transposed) once, scored for every pair
    const int64_t count = std::min<int64_t>(16, most - j);
    keys_across_lanes<T>(keys + j * c.k_row, c.k_row, count, c.chunks, kt, most - j);
    __m512 s[6];
    for (int64_t p = 0; p < pairs;) {
      const int64_t group = std::min<int64_t>(6, pairs - p);
      const float* q = w.qf.data() + p * d;
      switch (group) {
        case 1: scores16<1>(q, d, kt, d, s); break;
        case 2: scores16<2>(q, d, kt, d, s); break;
        case 3: scores16<3>(q, d, kt, d, s); break;
        case 4: scores16<4>(q, d, kt, d, s); break;
        case 5: scores16<5>(q, d, kt, d, s); break;
        default: scores16<6>(q, d, kt, d, s); break;
      }
      take_block_scores<T>(c, u, w, stride, j, p, group, s, plain);
      p += group;
    }
  }
  for (int64_t p = 0; p < pairs; ++p) {
    float* sp = w.probs.data() + p * stride;
    const int64_t visible = w.visible[p];
    float top = _mm512_reduce_max_ps(top16[p]);
    if (top == NEG_INF) top = 0.0f;  // every key hidden: a row of zeros
    const __m512 topv = top16[p] = _mm512_set1_ps(top);
    if (amx) continue;  // AMX: amx_weigh takes the exp as it packs the probabilities
    // exp lane by lane (a key's p depends on its score alone), and the sum of p by ordinal: the pair's p
    // that are not 0, in key order, the o-th into lane o mod 16 (a block's nonzero p compressed, then
    // rotated to the lane after the last one filled), the lanes reduced at the end in one fixed order. A
    // key a mask hides (p = 0) takes no ordinal, so the sum is bitwise the one over the keys left: a tree
    // row equals its path alone, and the row any other row of the call.
    __m512 total = _mm512_setzero_ps();
    int64_t count = 0;
    for (int64_t t = 0; t < visible; t += 16) {
      const __mmask16 lanes = visible - t >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (visible - t)) - 1);
      const __m512 sc = _mm512_mask_loadu_ps(_mm512_set1_ps(NEG_INF), lanes, sp + t);
      const __m512 e = exp16(_mm512_sub_ps(sc, topv));
      _mm512_mask_storeu_ps(sp + t, lanes, e);
      total = add_by_ordinal(total, e, _mm512_mask_cmp_ps_mask(lanes, e, _mm512_setzero_ps(), _CMP_NEQ_OQ), count);
    }
    w.sums[p] = _mm512_reduce_add_ps(total);
    std::fill(sp + visible, sp + most, 0.0f);  // keys past its own: p = 0, which adds exactly nothing below
  }
  return most;
}

