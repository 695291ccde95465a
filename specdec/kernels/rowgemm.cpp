// Multi-row matrix products that read each weight once for all rows: y[M, N] = x[M, K] @ W[N, K]^T.
//
// Weights are packed once at load into tiles of 32 output features (specdec/kernels/packing.py):
//   float32   [num_tiles, K, 32]            one 128-byte line pair per k
//   bfloat16  [num_tiles, K/2, 32, 2]       pairs of k per output, the layout VDPBF16PS multiplies
// A tile streams from memory once and is applied, from L1/L2, to every row group of the call (float32 on
// AVX-512 on Intel CPUs: 13-18 rows chunk by chunk of k, so the second group takes each chunk from L1).
// Outputs sit in vector lanes and every (row, output) accumulator runs over k in order 0..K-1 with one
// fused multiply-add per step (bf16: one dot-pair per two steps), starting from zero, with no horizontal
// sum. So a row's result does not depend on which other rows share the call, on the row-group size, on
// the thread split, nor on the ISA path (AVX-512, AVX2, scalar give bitwise the same float32 results):
// the row invariance that keeps greedy speculative decoding equal to plain decoding. Where the CPU has
// AMX, bfloat16 runs on tiles instead (rowgemm_amx.cpp): row-invariant too, but its own bits.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "parts.h"
#include "rowgemm_bf16.h"
#include "rowgemm_common.h"
#include "rowgemm_f32.h"

namespace {

using namespace specdec_rowgemm;

// One row (plain decoding) runs on the calling thread: its products are bound by memory, and waking the
// pool's other thread for each of a forward's ~150 calls cost more than it gained (plain decoding,
// 2 threads: 52.6 -> 43.1 tok/s float32, 87.3 -> 61.0 bfloat16, when every call was split).
// A one-row call whose weights take much longer to stream than a wake-up (the LM head: 113 MB in float32)
// is split all the same. (The decoder's own calls run inside layer.cpp's team and never come here.)
// A few rows over a small weight (a drafting head's layers: 0.2-2 MB) also run alone: the pool's other thread
// sleeps between forwards (OMP_WAIT_POLICY=PASSIVE), and waking it for each of a head's ~10 calls a level cost
// more than half the call saved (EAGLE-3 drafting over four answers: 2.0 s split, 1.0 s alone, 2 threads).
constexpr int64_t MIN_PARALLEL_ROWS = 2;
constexpr int64_t MIN_SPLIT_BYTES = int64_t{16} << 20;
constexpr int64_t MIN_SPLIT_ROW_BYTES = int64_t{4} << 20;   // weights worth splitting for 2+ rows
constexpr int64_t MIN_SPLIT_MACS = int64_t{32} << 20;       // or arithmetic worth it (prefill chunks)

int64_t best_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl")) {
    if (!__builtin_cpu_supports("avx512bf16")) return AVX512;
    return specdec_parts::amx_bf16_ready() ? AMX_BF16 : AVX512_BF16;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return AVX2;
  return SCALAR;
}

}  // namespace

// x [M, K] (float32 with float32 weights, bfloat16 with bfloat16 weights), packed weights as above;
// n_out: the real output count (tiles are zero-padded); isa: < 0 = the best this CPU runs.
torch::Tensor rowgemm(torch::Tensor x, torch::Tensor packed, int64_t n_out, int64_t isa, bool out_fp32) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && packed.is_contiguous() && x.device().is_cpu(),
              "rowgemm: x must be a contiguous 2-D CPU tensor");
  const int64_t best = best_isa();
  if (isa < 0 || isa > best) isa = best;
  const int64_t M = x.size(0), K = x.size(1), num_tiles = packed.size(0);
  TORCH_CHECK(n_out > 0 && (n_out + TILE - 1) / TILE == num_tiles, "rowgemm: n_out does not match the packed tiles");
  const bool bf16 = packed.scalar_type() == at::kBFloat16;
  auto out_dtype = bf16 && !out_fp32 ? at::kBFloat16 : at::kFloat;
  auto y = torch::empty({M, n_out}, x.options().dtype(out_dtype));
  if (M == 0) return y;
  const int64_t bytes = packed.nbytes(), macs = M * K * num_tiles * TILE;
  const bool split = bytes >= MIN_SPLIT_BYTES || macs >= MIN_SPLIT_MACS ||
                     (M >= MIN_PARALLEL_ROWS && bytes >= MIN_SPLIT_ROW_BYTES);
  const int64_t grain = split ? 1 : num_tiles;
  if (!bf16) {
    TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat && packed.size(1) == K,
                "rowgemm: float32 weights [tiles, K, 32] need float32 x [M, K]");
    at::parallel_for(0, num_tiles, grain, [&](int64_t b, int64_t e) {
      f32_tiles(isa, x.data_ptr<float>(), M, K, packed.data_ptr<float>(), n_out, y.data_ptr<float>(), b, e);
    });
    return y;
  }
  TORCH_CHECK(isa >= AVX2, "rowgemm: bfloat16 weights need AVX2 (AVX512-BF16 natively)");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.size(1) * 2 == K + (K & 1),
              "rowgemm: bfloat16 weights [tiles, K/2, 32, 2] need bfloat16 x [M, K]");
  torch::Tensor xe = K & 1 ? torch::constant_pad_nd(x, {0, 1}).contiguous() : x;
  at::parallel_for(0, num_tiles, grain, [&](int64_t b, int64_t e) {
    bf16_tiles(isa, xe.data_ptr(), M, packed.size(1), packed.data_ptr(), n_out, y.data_ptr(), out_fp32, b, e);
  });
  return y;
}

void specdec_parts::rowgemm_part(bool bf16, const void* x, int64_t M, int64_t K, const void* packed,
                                 int64_t num_tiles, int64_t n_out, void* y, bool out_fp32, int64_t part,
                                 int64_t parts) {
  static const int64_t ISA = best_isa();
  int64_t begin, end;
  specdec_parts::share(num_tiles, part, parts, begin, end);
  if (bf16)
    bf16_tiles(ISA, x, M, K / 2, packed, n_out, y, out_fp32, begin, end);
  else
    f32_tiles(ISA, static_cast<const float*>(x), M, K, static_cast<const float*>(packed), n_out,
              static_cast<float*>(y), begin, end);
}

// What F32_AHEAD prefetches within a call, for the head of the next call: without it a call's first
// F32_AHEAD bytes came in on demand misses alone, after the barrier.
void specdec_parts::rowgemm_prefetch_part(bool bf16, const void* packed, int64_t K, int64_t num_tiles,
                                          int64_t part, int64_t parts) {
  if (bf16) return;
  int64_t begin, end;
  specdec_parts::share(num_tiles, part, parts, begin, end);
  const char* head = static_cast<const char*>(packed) + begin * K * TILE * 4;
  const int64_t bytes = std::min(F32_AHEAD, (end - begin) * K * TILE * 4);
  for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(head + i, _MM_HINT_T1);
}

int64_t cpu_isa() { return best_isa(); }
