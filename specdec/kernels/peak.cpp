// The arithmetic rate this CPU's vector units reach with nothing to wait for: the instruction rowgemm's
// products run on (AVX512-BF16 dot-pairs for bf16, fused multiply-adds for float32 and for bf16 widened on
// AVX2), in CHAINS independent register accumulators on every torch thread at once, no memory operand.
// benchmarks/forward_cost.py draws a forward's compute floor from it: with the weights' bandwidth floor,
// the least a forward over many rows can cost on this machine (a roofline's two roofs).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <chrono>
#include <cstdint>
#include <vector>

namespace {

constexpr int CHAINS = 12;  // covers a 4-6 cycle latency on two pipes; 24 measured the same here

__attribute__((target("avx512f,avx512bf16"))) float dot_pairs_512(int64_t iters) {  // 64 FLOP an op
  __m512 a[CHAINS];
  for (int i = 0; i < CHAINS; ++i) a[i] = _mm512_setzero_ps();
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), w = (__m512bh)_mm512_set1_epi32(0x3c003c00);
  for (int64_t k = 0; k < iters; ++k)
#pragma GCC unroll 12
    for (int i = 0; i < CHAINS; ++i) a[i] = _mm512_dpbf16_ps(a[i], x, w);
  float sum = 0.0f;
  for (int i = 0; i < CHAINS; ++i) sum += _mm512_reduce_add_ps(a[i]);
  return sum;
}

__attribute__((target("avx512f,fma"))) float fma_512(int64_t iters) {  // 32 FLOP an op
  __m512 a[CHAINS];
  for (int i = 0; i < CHAINS; ++i) a[i] = _mm512_setzero_ps();
  const __m512 x = _mm512_set1_ps(1.0f), w = _mm512_set1_ps(1e-3f);
  for (int64_t k = 0; k < iters; ++k)
#pragma GCC unroll 12
    for (int i = 0; i < CHAINS; ++i) a[i] = _mm512_fmadd_ps(x, w, a[i]);
  float sum = 0.0f;
  for (int i = 0; i < CHAINS; ++i) sum += _mm512_reduce_add_ps(a[i]);
  return sum;
}

__attribute__((target("avx2,fma"))) float fma_256(int64_t iters) {  // 16 FLOP an op
  __m256 a[CHAINS];
  for (int i = 0; i < CHAINS; ++i) a[i] = _mm256_setzero_ps();
  const __m256 x = _mm256_set1_ps(1.0f), w = _mm256_set1_ps(1e-3f);
  for (int64_t k = 0; k < iters; ++k)
#pragma GCC unroll 12
    for (int i = 0; i < CHAINS; ++i) a[i] = _mm256_fmadd_ps(x, w, a[i]);
  alignas(32) float lanes[8];
  float sum = 0.0f;
  for (int i = 0; i < CHAINS; ++i) {
    _mm256_store_ps(lanes, a[i]);
    for (float v : lanes) sum += v;
  }
  return sum;
}

}  // namespace

// GFLOP/s of all torch threads together, each running `iters` rounds of CHAINS ops; bf16: the dot-pair
// rate where the CPU has AVX512-BF16, else float32's (rowgemm widens bf16 pairs into float32 FMAs).
double arith_peak(bool bf16, int64_t iters) {
  TORCH_CHECK(iters > 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"),
              "arith_peak: iters > 0 on a CPU with AVX2 and FMA");
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool dot = bf16 && avx512 && __builtin_cpu_supports("avx512bf16");
  const double flop_per_op = dot ? 64.0 : avx512 ? 32.0 : 16.0;
  const int64_t threads = at::get_num_threads();
  std::vector<float> sinks(threads, 0.0f);
  const auto start = std::chrono::steady_clock::now();
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      sinks[t] = dot ? dot_pairs_512(iters) : avx512 ? fma_512(iters) : fma_256(iters);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  TORCH_CHECK(sinks[0] == sinks[0], "arith_peak: NaN");  // keeps the sums (and so the loops) alive
  return threads * static_cast<double>(iters) * CHAINS * flop_per_op / seconds / 1e9;
}
