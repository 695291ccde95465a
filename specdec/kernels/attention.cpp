// Row-invariant attention for small query counts (decode and verify steps), AVX-512.
//
// Every (batch, head, query row) is computed alone, in a fixed order that does not depend on how many
// other rows share the call: scores key by key (16-lane dot products, one fixed horizontal sum), the
// max, exp (a lane-wise polynomial) summed in 16-key chunks from key 0, then the value rows weighted
// in key order. Keys a mask hides get probability exactly 0 and add nothing, so a row that sees the
// first m keys of a longer cache gets bitwise what it gets when the cache holds exactly m keys: a
// verify forward's rows equal one-token decode steps, which is what greedy equality needs. (torch's
// CPU flash attention blocks queries and keys by the call's shape, so its rows are not invariant.)
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

#define AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,fma")))

template <typename T> AVX512 inline __m512 load16(const T* p);
template <> AVX512 inline __m512 load16<float>(const float* p) { return _mm512_loadu_ps(p); }
template <> AVX512 inline __m512 load16<at::BFloat16>(const at::BFloat16* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

template <typename T> AVX512 inline void store16(T* p, __m512 v);
template <> AVX512 inline void store16<float>(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
template <> AVX512 inline void store16<at::BFloat16>(at::BFloat16* p, __m512 v) {  // round to nearest even
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
}

// e^x lane by lane (Cephes-style polynomial, ~1 ulp); exactly 0 below -87 (hidden keys, far tails).
AVX512 inline __m512 exp16(__m512 x) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~tiny), _mm512_scalef_ps(p, n));
}

constexpr int MAX_CHUNKS = 16;  // head_dim up to 256

// q . k for 16 keys at once, each key's 16 lanes summed by exactly the additions _mm512_reduce_add_ps
// makes (upper half + lower half, then quarters, then lanes 0+2 and 1+3, then the last pair), done
// lane-wise across keys: bitwise the one-key loop's sums, at a fraction of its horizontal work.
template <typename T>
AVX512 inline __m512 dots16(const __m512* qv, int64_t chunks, const T* k, int64_t k_row) {
  __m512 acc[16];
  for (int key = 0; key < 16; ++key) {
    const T* kj = k + key * k_row;
    acc[key] = _mm512_mul_ps(qv[0], load16(kj));
    for (int64_t c = 1; c < chunks; ++c) acc[key] = _mm512_fmadd_ps(qv[c], load16(kj + 16 * c), acc[key]);
  }
  __m512 half[8], quarter[4], eighth[2];
  for (int p = 0; p < 8; ++p)  // keys 2p, 2p+1: 8 lanes each, lane i = x[i] + x[i + 8]
    half[p] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * p], acc[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)),
                            _mm512_shuffle_f32x4(acc[2 * p], acc[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)));
  for (int p = 0; p < 4; ++p)  // keys 4p..4p+3, one per 128-bit lane: lane i = h[i] + h[i + 4]
    quarter[p] = _mm512_add_ps(_mm512_shuffle_f32x4(half[2 * p], half[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)),
                               _mm512_shuffle_f32x4(half[2 * p], half[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)));
  for (int p = 0; p < 2; ++p)  // per 128-bit lane: [r0+r2, r1+r3] of two keys
    eighth[p] = _mm512_add_ps(_mm512_shuffle_ps(quarter[2 * p], quarter[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(quarter[2 * p], quarter[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(eighth[0], eighth[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_ps(eighth[0], eighth[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // lane 4j + e holds key 4e + j: back to key order
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), sums);
}

constexpr int MAX_HEADS = 8;  // heads scored together per pass over the keys

// One query row of `count` heads sharing keys (a GQA group) against keys [0, visible):
// scores[h * stride + j] = exp(q_h . k_j * scale + mask_j - max_h), unnormalized. Key blocks are the outer
// loop so a block of 16 keys is read from L2 once and scored, from L1, for every head of the group.
template <typename T>
AVX512 void group_probs(const T* q, int64_t q_head, int64_t count, const T* k, int64_t k_row, const float* mask,
                        int64_t mask_col, int64_t visible, int64_t chunks, float scale, float* scores, int64_t stride) {
  __m512 qv[MAX_HEADS][MAX_CHUNKS];
  float top[MAX_HEADS];
  __m512 top16[MAX_HEADS];
  for (int64_t h = 0; h < count; ++h) {
    for (int64_t c = 0; c < chunks; ++c) qv[h][c] = load16(q + h * q_head + 16 * c);
    top[h] = -std::numeric_limits<float>::infinity();
    top16[h] = _mm512_set1_ps(top[h]);
  }
  int64_t j = 0;
  const __m512 scale16 = _mm512_set1_ps(scale);
  alignas(64) float masked[16];
  for (; j + 16 <= visible; j += 16) {
    if (mask != nullptr)
      for (int e = 0; e < 16; ++e) masked[e] = mask[(j + e) * mask_col];
    for (int64_t h = 0; h < count; ++h) {
      __m512 s = _mm512_mul_ps(dots16(qv[h], chunks, k + j * k_row, k_row), scale16);
      if (mask != nullptr) s = _mm512_add_ps(s, _mm512_load_ps(masked));
      _mm512_storeu_ps(scores + h * stride + j, s);
      top16[h] = _mm512_max_ps(top16[h], s);
    }
  }
  for (int64_t h = 0; h < count; ++h) {
    float* sh = scores + h * stride;
    if (j > 0) top[h] = _mm512_reduce_max_ps(top16[h]);
    for (int64_t t = j; t < visible; ++t) {
      const T* kj = k + t * k_row;
      __m512 acc = _mm512_mul_ps(qv[h][0], load16(kj));
      for (int64_t c = 1; c < chunks; ++c) acc = _mm512_fmadd_ps(qv[h][c], load16(kj + 16 * c), acc);
      float s = _mm512_reduce_add_ps(acc) * scale;
      if (mask != nullptr) s += mask[t * mask_col];
      sh[t] = s;
      top[h] = s > top[h] ? s : top[h];
    }
    if (top[h] == -std::numeric_limits<float>::infinity()) top[h] = 0.0f;  // every key hidden: a row of zeros
    const __m512 topv = _mm512_set1_ps(top[h]);
    for (int64_t t = 0; t < visible; t += 16) {  // exp lane by lane: a key's p depends on its score alone
      const __mmask16 lanes = visible - t >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (visible - t)) - 1);
      const __m512 sc = _mm512_mask_loadu_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), lanes, sh + t);
      _mm512_mask_storeu_ps(sh + t, lanes, exp16(_mm512_sub_ps(sc, topv)));
    }
  }
}

// The sum and the weighted values run over the seen keys in key order, hidden ones skipped (they add
// exactly 0): a row that sees keys with hidden ones between them (a tree's siblings) gets the bits it
// gets over those keys alone, contiguous (the accepted path in plain decoding's cache).
// out[d] = sum_j p_j v_j / sum_j p_j for GB heads sharing v (a GQA group), CH chunks of 16: each head's
// accumulators run the same chain as alone (a masked FMA skips p = 0; adding p = +0 to the sum changes
// nothing), interleaved so the heads' chains overlap and each value row is loaded once for all of them.
template <typename T, int CH, int GB>
AVX512 void weigh_values(const float* probs, int64_t probs_stride, const T* v, int64_t v_row, int64_t visible,
                         T* out, int64_t out_stride) {
  __m512 acc[GB][CH];
  float sum[GB];
  for (int g = 0; g < GB; ++g) {
    sum[g] = 0.0f;
    for (int c = 0; c < CH; ++c) acc[g][c] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < visible; ++j) {
    __m512 vv[CH];
    const T* vj = v + j * v_row;
    for (int c = 0; c < CH; ++c) vv[c] = load16(vj + 16 * c);
    for (int g = 0; g < GB; ++g) {
      const float p = probs[g * probs_stride + j];
      sum[g] += p;
      const __mmask16 seen = p != 0.0f ? 0xFFFF : 0;
      const __m512 pv = _mm512_set1_ps(p);
      for (int c = 0; c < CH; ++c) acc[g][c] = _mm512_mask3_fmadd_ps(pv, vv[c], acc[g][c], seen);
    }
  }
  for (int g = 0; g < GB; ++g) {
    const __m512 norm = _mm512_set1_ps(sum[g] > 0.0f ? sum[g] : 1.0f);
    for (int c = 0; c < CH; ++c) store16(out + g * out_stride + 16 * c, _mm512_div_ps(acc[g][c], norm));
  }
}

// Any head size (chunks of 16 at run time), one head: the same chain as weigh_values.
template <typename T>
AVX512 void weigh_one(const float* scores, const T* v, int64_t v_row, int64_t visible, int64_t chunks, T* out) {
  float sum = 0.0f;
  __m512 acc[MAX_CHUNKS];
  for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < visible; ++j) {
    const float p = scores[j];
    if (p == 0.0f) continue;
    sum += p;
    const __m512 pv = _mm512_set1_ps(p);
    const T* vj = v + j * v_row;
    for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm512_fmadd_ps(pv, load16(vj + 16 * c), acc[c]);
  }
  const __m512 norm = _mm512_set1_ps(sum > 0.0f ? sum : 1.0f);
  for (int64_t c = 0; c < chunks; ++c) store16(out + 16 * c, _mm512_div_ps(acc[c], norm));
}

// Heads [h, h + count) of one kv group, one query row: blocks of heads through weigh_values where the
// head size has an instantiation (d 32, 64, 128), else one by one.
template <typename T>
void weigh_heads(const float* probs, int64_t probs_stride, const T* v, int64_t v_row, int64_t visible,
                 int64_t chunks, int64_t count, T* out, int64_t d) {
  for (int64_t done = 0; done < count;) {
    const int64_t left = count - done;
    const float* p = probs + done * probs_stride;
    T* o = out + done * d;
#define WEIGH(CH, GB) weigh_values<T, CH, GB>(p, probs_stride, v, v_row, visible, o, d); done += GB; continue
    if (chunks == 4 && left >= 4) { WEIGH(4, 4); }
    if (chunks == 4 && left == 3) { WEIGH(4, 3); }
    if (chunks == 4 && left == 2) { WEIGH(4, 2); }
    if (chunks == 2 && left >= 4) { WEIGH(2, 4); }
    if (chunks == 8 && left >= 2) { WEIGH(8, 2); }
#undef WEIGH
    weigh_one<T>(p, v, v_row, visible, chunks, o);
    ++done;
  }
}

template <typename T>
void attend_all(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask,
                torch::Tensor& out, double scale) {
  const int64_t B = q.size(0), H = q.size(1), n = q.size(2), d = q.size(3), kv_heads = k.size(1), L = k.size(2);
  const int64_t group = H / kv_heads, chunks = d / 16;
  const T* qd = q.data_ptr<T>();
  const T* kd = k.data_ptr<T>();
  const T* vd = v.data_ptr<T>();
  T* od = out.data_ptr<T>();
  const bool masked = mask.defined();
  const float* md = masked ? mask.data_ptr<float>() : nullptr;
  at::parallel_for(0, B * kv_heads * n, 1, [&](int64_t begin, int64_t end) {
    const int64_t stride = L + 16;
    std::vector<float> scores(group * stride);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / (kv_heads * n), g = (item / n) % kv_heads, i = item % n;
      const float* mrow = masked ? md + b * mask.stride(0) + i * mask.stride(2) : nullptr;
      const int64_t visible = masked ? L : L - n + i + 1;  // no mask: causal, the last n keys are the rows
      const T* keys = kd + b * k.stride(0) + g * k.stride(1);
      for (int64_t h = g * group; h < (g + 1) * group; h += MAX_HEADS)
        group_probs<T>(qd + b * q.stride(0) + h * q.stride(1) + i * q.stride(2), q.stride(1),
                       std::min<int64_t>(MAX_HEADS, (g + 1) * group - h), keys, k.stride(2), mrow,
                       masked ? mask.stride(3) : 0, visible, chunks, static_cast<float>(scale),
                       scores.data() + (h - g * group) * stride, stride);
      weigh_heads<T>(scores.data(), stride, vd + b * v.stride(0) + g * v.stride(1), v.stride(2), visible, chunks,
                     group, od + ((b * n + i) * H + g * group) * d, d);
    }
  });
}

}  // namespace

// q [B, H, n, d], k / v [B, kv_heads, L, d] (any strides, unit stride along d), mask: undefined or float32
// additive [B|1, 1, n, L] (any strides); float32 or bfloat16 -> out [B, n, H, d] in q's dtype.
torch::Tensor attend(torch::Tensor q, torch::Tensor k, torch::Tensor v, c10::optional<torch::Tensor> mask,
                     double scale) {
  TORCH_CHECK(__builtin_cpu_supports("avx512f"), "attend: needs AVX-512");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(3) % 16 == 0 && q.size(3) <= 256 &&
                  q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1 && q.size(1) % k.size(1) == 0 &&
                  q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "attend: q [B, H, n, d], k / v [B, kv_heads, L, d] of one dtype, d a multiple of 16 up to 256");
  torch::Tensor m;
  if (mask.has_value() && mask->defined()) {
    m = mask->to(at::kFloat);
    TORCH_CHECK(m.dim() == 4 && m.size(2) == q.size(2) && m.size(3) == k.size(2), "attend: mask [B, 1, n, L]");
  }
  auto out = torch::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options());
  if (q.scalar_type() == at::kFloat) {
    attend_all<float>(q, k, v, m, out, scale);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kBFloat16, "attend: float32 or bfloat16");
    attend_all<at::BFloat16>(q, k, v, m, out, scale);
  }
  return out;
}
