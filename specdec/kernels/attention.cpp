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

// One query row against keys [0, visible): out[d] = softmax(q . k * scale + mask) @ v.
template <typename T>
AVX512 void attend_row(const T* q, const T* k, int64_t k_row, const T* v, int64_t v_row, const float* mask,
                       int64_t mask_col, int64_t visible, int64_t chunks, float scale, float* scores, T* out) {
  __m512 qv[MAX_CHUNKS];
  for (int64_t c = 0; c < chunks; ++c) qv[c] = load16(q + 16 * c);
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < visible; ++j) {
    const T* kj = k + j * k_row;
    __m512 acc = _mm512_mul_ps(qv[0], load16(kj));
    for (int64_t c = 1; c < chunks; ++c) acc = _mm512_fmadd_ps(qv[c], load16(kj + 16 * c), acc);
    float s = _mm512_reduce_add_ps(acc) * scale;
    if (mask != nullptr) s += mask[j * mask_col];
    scores[j] = s;
    top = s > top ? s : top;
  }
  if (top == -std::numeric_limits<float>::infinity()) top = 0.0f;  // every key hidden: a row of zeros
  const __m512 topv = _mm512_set1_ps(top);
  for (int64_t j = 0; j < visible; j += 16) {  // exp lane by lane: a key's p depends on its score alone
    const __mmask16 lanes = visible - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (visible - j)) - 1);
    const __m512 s = _mm512_mask_loadu_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), lanes, scores + j);
    _mm512_mask_storeu_ps(scores + j, lanes, exp16(_mm512_sub_ps(s, topv)));
  }
  // The sum and the weighted values run over the seen keys in key order, hidden ones skipped (they add
  // exactly 0): a row that sees keys with hidden ones between them (a tree's siblings) gets the bits it
  // gets over those keys alone, contiguous (the accepted path in plain decoding's cache).
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
  at::parallel_for(0, B * H * n, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(L + 16);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / (H * n), h = (item / n) % H, i = item % n, g = h / group;
      const float* mrow = masked ? md + b * mask.stride(0) + i * mask.stride(2) : nullptr;
      const int64_t visible = masked ? L : L - n + i + 1;  // no mask: causal, the last n keys are the rows
      attend_row<T>(qd + b * q.stride(0) + h * q.stride(1) + i * q.stride(2), kd + b * k.stride(0) + g * k.stride(1),
                    k.stride(2), vd + b * v.stride(0) + g * v.stride(1), v.stride(2), mrow,
                    masked ? mask.stride(3) : 0, visible, chunks, static_cast<float>(scale), scores.data(),
                    od + ((b * n + i) * H + h) * d);
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
