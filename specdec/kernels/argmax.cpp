// Greedy picks over a verify step's logits on the calling thread, in AVX-512.
//
// torch's max(dim=-1).indices is right but slow for the few rows of a verify step: its reduction is
// not vectorised for indices (~16 us a row of SmolLM2's 49,152 logits), and its parallel_for wakes the
// OpenMP pool that sleeps between forwards (OMP_WAIT_POLICY=PASSIVE). Here a row is two vector passes,
// its maximum, then the first index holding it, ~3 us from cache.
//
// Exactness. The answer is torch's: the first index of the row's maximum, and a NaN counts as the
// maximum (the first NaN's index). Maxima compare by value, so -0.0 and +0.0 tie and the first of them
// wins, as torch's `>` scan keeps the first (tests/kernels/test_argmax.py checks ties, zeros, infinities
// and NaNs against torch).
#include <immintrin.h>
#include <torch/extension.h>

#include <cmath>
#include <limits>

#include "layer_rows.h"

namespace {

int64_t first_max_scalar(const float* x, int64_t n) {
  int64_t best = 0;
  float top = x[0];
  if (std::isnan(top)) return 0;
  for (int64_t i = 1; i < n; ++i) {
    if (std::isnan(x[i])) return i;
    if (x[i] > top) top = x[i], best = i;
  }
  return best;
}

__attribute__((target("avx512f"))) int64_t first_max_avx512(const float* x, int64_t n) {
  const __m512 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 top = lowest;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) return first_max_scalar(x, n);  // a NaN: its index
    top = _mm512_max_ps(top, v);
  }
  const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1);
  if (tail) {
    const __m512 v = _mm512_mask_loadu_ps(lowest, tail, x + i);
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) return first_max_scalar(x, n);
    top = _mm512_max_ps(top, v);
  }
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(top));
  for (i = 0; i + 16 <= n; i += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), m, _CMP_EQ_OQ);
    if (hit) return i + __builtin_ctz(hit);
  }
  const __mmask16 hit = _mm512_mask_cmp_ps_mask(tail, _mm512_mask_loadu_ps(lowest, tail, x + i), m, _CMP_EQ_OQ);
  return hit ? i + __builtin_ctz(hit) : 0;  // (no hit: unreachable, the maximum is some element)
}

}  // namespace

// logits [R, V] float32 -> int64 [R]: each row's first maximum (a NaN counting as the maximum), on the calling
// thread; the AVX-512 path where the CPU has it (isa 2), else a scalar scan (tests ask for each by name).
torch::Tensor argmax_rows(torch::Tensor logits, int64_t isa) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0 && logits.scalar_type() == at::kFloat,
              "argmax_rows: logits [R, V > 0] float32");
  TORCH_CHECK(isa >= 0 && isa <= specdec_rows::best_isa(), "argmax_rows: isa ", isa, " is not run by this CPU");
  const auto x = logits.contiguous();
  const int64_t rows = x.size(0), n = x.size(1);
  auto out = torch::empty({rows}, torch::kLong);
  const float* p = x.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r)
    o[r] = isa == specdec_rows::AVX512 ? first_max_avx512(p + r * n, n) : first_max_scalar(p + r * n, n);
  return out;
}
