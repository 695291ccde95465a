// A drafting head's few best candidates per row and their softmax probabilities, in one call.
//
// Medusa's heads end in logits [heads, V'] (V' = 8,192 for SmolLM2's reduced vocabulary) of which a draft
// reads the top R (~8) per head and each one's probability. Through torch that is topk, a float copy, a
// softmax over the whole row and a gather: ~10 tensor ops and ~0.2 ms a step at one user, against the
// ~20 us the arithmetic takes. Here a row is one pass for its maximum, one for the softmax's normaliser and
// one that keeps the R largest.
//
// Order: larger logits first, ties by the lower index (a stable descending sort's first R). Probabilities:
// exp(x - max) / sum exp(x - max) in float32, the sum's exponentials from attention's polynomial (attention_simd.h,
// ~1 ulp of expf; they only rank and weigh draft nodes, never decide what is accepted).
#include <immintrin.h>
#include <torch/extension.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention_simd.h"
#include "layer_rows.h"

namespace {

using specdec_attention::exp16;

// Candidates so far, best first: R slots, filled up to `count`.
struct Best {
  std::vector<float> value;
  std::vector<int64_t> index;
  int64_t count = 0;

  explicit Best(int64_t r) : value(r), index(r) {}
  float threshold() const {  // a newcomer must beat this (strictly: on a tie the earlier index stays ahead)
    return count < static_cast<int64_t>(value.size()) ? -std::numeric_limits<float>::infinity()
                                                      : value[value.size() - 1];
  }
  bool full() const { return count == static_cast<int64_t>(value.size()); }
  void offer(float v, int64_t i) {
    if (full() && !(v > value[count - 1])) return;
    int64_t at = full() ? count - 1 : count++;
    while (at > 0 && v > value[at - 1]) {  // after every equal value: ties keep index order
      value[at] = value[at - 1], index[at] = index[at - 1];
      --at;
    }
    value[at] = v, index[at] = i;
  }
};

template <typename T>
void row_scalar(const T* x, int64_t n, Best& best, float& top, float& total) {
  top = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) top = std::max(top, static_cast<float>(x[i]));
  total = 0.0f;
  for (int64_t i = 0; i < n; ++i) total += std::exp(static_cast<float>(x[i]) - top);
  for (int64_t i = 0; i < n; ++i) best.offer(static_cast<float>(x[i]), i);
}

// Up to 16 values as float lanes (layer_rows.h's masked load), the lanes outside mask m -inf: nothing past a
// row's end is a candidate or adds to the softmax's sum.
template <typename T>
SPECDEC_AVX512 inline __m512 load_tail(const T* x, __mmask16 m) {
  const __m512 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  return _mm512_mask_blend_ps(m, lowest, specdec_rows::load16<T>(x, m));
}

template <typename T>
SPECDEC_AVX512 void row_avx512(const T* x, int64_t n, Best& best, float& top, float& total) {
  const int64_t blocks = (n + 15) / 16;
  auto mask = [n](int64_t b) { return n - b * 16 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - b * 16)) - 1); };
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t b = 0; b < blocks; ++b) m = _mm512_max_ps(m, load_tail(x + b * 16, mask(b)));
  top = _mm512_reduce_max_ps(m);
  const __m512 shift = _mm512_set1_ps(top);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const __mmask16 k = mask(b);
    sum = _mm512_add_ps(sum, exp16(_mm512_sub_ps(load_tail(x + b * 16, k), shift)));  // lanes past n: e^-inf = 0
  }
  total = _mm512_reduce_add_ps(sum);
  for (int64_t b = 0; b < blocks; ++b) {
    const __mmask16 k = mask(b);
    const __m512 v = load_tail(x + b * 16, k);
    // still filling: every element is a candidate; then only those above the R-th best so far
    __mmask16 hit = best.full() ? _mm512_mask_cmp_ps_mask(k, v, _mm512_set1_ps(best.threshold()), _CMP_GT_OQ) : k;
    while (hit) {
      const int lane = __builtin_ctz(hit);
      hit &= hit - 1;
      best.offer(static_cast<float>(x[b * 16 + lane]), b * 16 + lane);
      if (best.full()) hit &= _mm512_mask_cmp_ps_mask(k, v, _mm512_set1_ps(best.threshold()), _CMP_GT_OQ);
    }
  }
}

template <typename T>
void all_rows(const T* x, int64_t rows, int64_t n, int64_t r, bool simd, bool log, int64_t* top_out,
              float* prob_out) {
  for (int64_t row = 0; row < rows; ++row) {
    Best best(r);
    float top, total;
    if (simd)
      row_avx512<T>(x + row * n, n, best, top, total);
    else
      row_scalar<T>(x + row * n, n, best, top, total);
    const float log_total = std::log(total);
    for (int64_t j = 0; j < r; ++j) {
      top_out[row * r + j] = best.index[j];
      prob_out[row * r + j] = log ? (best.value[j] - top) - log_total : std::exp(best.value[j] - top) / total;
    }
  }
}

}  // namespace

// logits [M, V] float32 or bfloat16, r in [1, V] -> (indices int64 [M, r], probabilities float32 [M, r]): each
// row's r largest logits, best first (ties: lower index first), and their softmax probabilities over the row
// (log: their log-probabilities, x - max - log(sum), which do not underflow where a path's product would).
// isa 2: AVX-512 where the CPU has it; 0: the scalar reference (tests ask for each by name).
std::vector<torch::Tensor> top_probs(torch::Tensor logits, int64_t r, int64_t isa, bool log) {
  TORCH_CHECK(logits.dim() == 2 && (logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16),
              "top_probs: logits [M, V] float32 or bfloat16");
  TORCH_CHECK(r >= 1 && r <= logits.size(1), "top_probs: r must be in [1, V], got ", r);
  TORCH_CHECK(isa >= 0 && isa <= specdec_rows::best_isa(), "top_probs: isa ", isa, " is not run by this CPU");
  const auto x = logits.contiguous();
  const int64_t rows = x.size(0), n = x.size(1);
  auto top = torch::empty({rows, r}, torch::kLong);
  auto probs = torch::empty({rows, r}, torch::kFloat);
  const bool simd = isa == specdec_rows::AVX512;
  if (x.scalar_type() == at::kFloat)
    all_rows<float>(x.data_ptr<float>(), rows, n, r, simd, log, top.data_ptr<int64_t>(), probs.data_ptr<float>());
  else
    all_rows<at::BFloat16>(x.data_ptr<at::BFloat16>(), rows, n, r, simd, log, top.data_ptr<int64_t>(),
                           probs.data_ptr<float>());
  return {top, probs};
}
