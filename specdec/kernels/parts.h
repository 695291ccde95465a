// The kernels' work split in parts, for a caller that already runs a team of threads (layer.cpp's one
// OpenMP region per forward): part p of `parts` computes its own share and nothing else, with no
// allocation, no torch call and no threads of its own. Shares never change a result: an output tile, an
// attention unit or a norm row is computed exactly as when one thread does all of them.
#pragma once
#include <cstdint>

namespace specdec_parts {

// [begin, end) of `count` items for part p of `parts`: contiguous, sizes differing by at most one.
inline void share(int64_t count, int64_t part, int64_t parts, int64_t& begin, int64_t& end) {
  begin = count * part / parts;
  end = count * (part + 1) / parts;
}

// rowgemm.cpp: y[M, n_out] = x[M, K] @ W^T over packed tiles [begin, end) of part p's share.
// float32: x, y float32; bfloat16: x bf16 with K even, y bf16 (or float32 when out_fp32).
void rowgemm_part(bool bf16, const void* x, int64_t M, int64_t K, const void* packed, int64_t num_tiles,
                  int64_t n_out, void* y, bool out_fp32, int64_t part, int64_t parts);

// rowgemm.cpp: float32 weights only (bfloat16 does nothing): the first bytes of part p's share of a packed weight
// into L2, for a part to ask while it waits at a barrier before the product (its stream then starts warm).
void rowgemm_prefetch_part(bool bf16, const void* packed, int64_t K, int64_t num_tiles, int64_t part, int64_t parts);

// rowgemm_amx.cpp: whether this CPU and OS run AMX-BF16 tiles (asked once; SPECDEC_NO_AMX=1 says no), and
// packed bfloat16 tiles [begin, end) on them (x as K2 bf16 pairs per row, y [M, n_out] bf16 or float32).
bool amx_bf16_ready();
void bf16_amx_tiles(const uint32_t* xp, int64_t M, int64_t K2, const uint16_t* wd, int64_t n_out, char* y,
                    bool out_fp32, int64_t begin, int64_t end);

// attention.cpp: one call's pointers and element strides (q [B, H, n, d], k / v [B, kv_heads, L, d],
// mask float32 [B|1, 1, n, L] or null (causal), out [B, n, H, d]).
struct AttendArgs {
  const void *q, *k, *v;
  void* out;
  const float* mask;
  int64_t q_b, q_h, q_i, k_b, k_g, k_row, v_b, v_g, v_row, m_b, m_i, m_j;
  int64_t B, H, n, d, kv_heads, L;
  float scale;
  // Ragged rows (null: every sequence has n): sequence b has seq_rows[b] <= n query rows, packed one
  // sequence after another from row seq_start[b] of q (q_b unused) and of out ([rows, H, d]); the mask
  // stays [B|1, 1, n, L] and must be given. Rows past a sequence's count are not computed at all.
  const int64_t* seq_rows = nullptr;
  const int64_t* seq_start = nullptr;

  int64_t rows_of(int64_t b) const { return seq_rows != nullptr ? seq_rows[b] : n; }
  int64_t q_at(int64_t b, int64_t h, int64_t i) const {  // element offset of query row i of head h of sequence b
    return (seq_start != nullptr ? seq_start[b] * q_i : b * q_b) + h * q_h + i * q_i;
  }
  int64_t out_row(int64_t b, int64_t i) const { return seq_start != nullptr ? seq_start[b] + i : b * n + i; }
};
void attend_part(bool bf16, const AttendArgs& a, int64_t part, int64_t parts);  // AVX-512 where the CPU has it
void attend_part_avx2(bool bf16, const AttendArgs& a, int64_t part, int64_t parts);  // attention_avx2.cpp

// norm.cpp: RMSNorm of rows [begin, end) of part p's share of x [rows, H] into y.
void rmsnorm_part(bool bf16, const void* x, const void* weight, void* y, int64_t rows, int64_t H, float eps,
                  int64_t part, int64_t parts);

}  // namespace specdec_parts
