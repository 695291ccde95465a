// Row-invariant attention for small query counts (decode and verify steps), AVX-512 (attention_avx2.cpp
// runs the same algorithm where the CPU has AVX2 only).
//
// Every (batch, head, query row) gets its result in a fixed order that does not depend on how many
// other rows share the call: each key's score by one fixed sum over the head's dims (four chains, dims
// mod 4, combined in one order), the max, exp (a lane-wise polynomial), then the keys' probabilities
// summed and the value rows weighted in key order from key 0. Keys a mask hides get probability exactly
// 0 and add nothing, so a row that sees the first m keys of a longer cache gets bitwise what it gets when
// the cache holds exactly m keys: a verify forward's rows equal one-token decode steps, which is what
// greedy equality needs. (torch's CPU flash attention blocks queries and keys by the call's shape, so its
// rows are not invariant.) bf16 with AMX scores and weighs on tiles instead (attention_amx.h), in an
// order as fixed: by each pair's own ordinals of nonzero probabilities; bf16 with AVX512-BF16 and no AMX
// weighs by dot-pairs (attention_weigh_pairs.h), two keys a step, paired by the same ordinals.
//
// Tiled for many rows: a work unit is a block of (query row, head) pairs of one kv group (the GQA heads
// sharing its keys x a run of rows; the threads share out rows, attention_units.h's rows_share). A block of
// 16 keys is read once, transposed (keys across lanes, so a score needs no horizontal sum) and scored for
// every pair of the unit; then a block of KEY_BLOCK value rows is weighed into every pair's accumulators
// (kept in memory between blocks, each pair's chain still in key order). The keys and values stream once
// per unit instead of once per row, the transpose is shared by the unit's pairs, and each pair's
// arithmetic is exactly what it is alone.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "attention_amx.h"
#include "attention_amx_pv.h"
#include "attention_simd.h"
#include "attention_units.h"
#include "parts.h"

namespace {

using namespace specdec_attention;
using specdec_attention_units::Call;
using specdec_attention_units::Split;
using specdec_attention_units::Unit;
using specdec_attention_units::split_work;
using specdec_attention_units::rows_share;
using specdec_attention_amx::amx_configure;
using specdec_attention_amx::amx_queries;
using specdec_attention_amx::amx_release;
using specdec_attention_amx::amx_block_scores;
using specdec_attention_amx::amx_load_queries;
using specdec_attention_amx::amx_scores64;
using specdec_attention_amx::amx_weigh;
using specdec_attention_amx::PvScratch;
#define AVX512 SPECDEC_AVX512

constexpr int64_t KEY_BLOCK = 64;   // value rows weighed into every pair's accumulators while in L1
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

#include "attention_probs.h"  // Scratch, unit_probs: every pair's probabilities of a unit

// Every pair's output: its accumulators [pairs, d] over its sum of probabilities.
template <typename T>
AVX512 void unit_output(const Call<T>& c, const Unit& u, const float* acc, const float* sums) {
  for (int64_t p = 0; p < u.rows * u.heads; ++p) {
    const int64_t i = u.row0 + p / u.heads, h = u.g * c.group + u.head0 + p % u.heads;
    store_normalized(c.output() + (c.out_row(u.b, i) * c.H + h) * c.d, acc + p * c.d, sums[p], c.chunks);
  }
}

#include "attention_weigh_pairs.h"  // unit_weigh_pairs: bf16 values by dot-pairs (AVX512-BF16 without AMX)

// out = sum_j p_j v_j / sum_j p_j for every pair of the unit, value rows in blocks of KEY_BLOCK (the sums
// of p: unit_probs's).
template <typename T>
AVX512 void unit_weigh(const Call<T>& c, const Unit& u, Scratch& w, int64_t stride, int64_t most) {
  if constexpr (std::is_same<T, at::BFloat16>::value) {
    if (weighs_by_pairs(c.d)) return unit_weigh_pairs(c, u, w, stride, most);
  }
  const int64_t pairs = u.rows * u.heads, d = c.d;
  std::fill(w.acc.begin(), w.acc.begin() + pairs * d, 0.0f);
  const T* values = c.values() + u.b * c.v_b + u.g * c.v_g;
  for (int64_t j0 = 0; j0 < most; j0 += KEY_BLOCK) {
    const int64_t j1 = std::min(j0 + KEY_BLOCK, most);
    for (int64_t p = 0; p < pairs;) {
      const int64_t left = pairs - p;
      const float* probs = w.probs.data() + p * stride;
#define WEIGH(CH, GB)                                                                                          \
  if (none_zero(probs, stride, GB, j0, j1))                                                                    \
    weigh_block<T, CH, GB, true>(probs, stride, values, c.v_row, j0, j1, w.acc.data() + p * d, d, p ? 0 : most); \
  else                                                                                                         \
    weigh_block<T, CH, GB, false>(probs, stride, values, c.v_row, j0, j1, w.acc.data() + p * d, d, p ? 0 : most); \
  p += GB;                                                                                                     \
  continue
      if (c.chunks == 4 && left >= 6) { WEIGH(4, 6); }
      if (c.chunks == 4 && left == 5) { WEIGH(4, 5); }
      if (c.chunks == 4 && left == 4) { WEIGH(4, 4); }
      if (c.chunks == 4 && left == 3) { WEIGH(4, 3); }
      if (c.chunks == 4 && left == 2) { WEIGH(4, 2); }
      if (c.chunks == 4) { WEIGH(4, 1); }
      if (c.chunks == 2 && left >= 8) { WEIGH(2, 8); }
      if (c.chunks == 2 && left >= 4) { WEIGH(2, 4); }
      if (c.chunks == 2) { WEIGH(2, 1); }
      if (c.chunks == 8 && left >= 3) { WEIGH(8, 3); }
      if (c.chunks == 8) { WEIGH(8, 1); }
#undef WEIGH
      weigh_any<T>(probs, values, c.v_row, j0, j1, c.chunks, w.acc.data() + p * d);
      ++p;
    }
  }
  unit_output<T>(c, u, w.acc.data(), w.sums.data());
}

// A part's units in order (a (b, g)'s one after another, so its keys stay in L2). pairs: the most any of
// them holds; shared_groups: some group's units are split between parts (AMX then re-lays values per unit).
template <typename T>
void attend_items(const Call<T>& c, const std::vector<Unit>& units, int64_t pairs, bool shared_groups, bool amx) {
  // This thread's scratch, kept from call to call while the shape allows (the keys rounded up to 256, so a
  // decode's growing cache reuses it): fresh buffers each call cost a zero fill, and page faults where the
  // allocator had handed their pages back. Any stride >= the keys + 16 does: it places rows, not values.
  const int64_t keys = (c.L + 255) / 256 * 256, stride = keys + 16;
  thread_local std::unique_ptr<Scratch> w_kept;
  thread_local std::unique_ptr<PvScratch> pv_kept;
  thread_local int64_t kept[4] = {-1, -1, -1, -1};  // pairs, keys, d, AMX with kept values
  const int64_t shape[4] = {pairs, keys, c.d, amx ? 1 + shared_groups : 0};
  if (!std::equal(shape, shape + 4, kept)) {
    w_kept.reset(new Scratch(pairs, stride, c.d));
    pv_kept.reset(amx ? new PvScratch(pairs, keys, c.d, shared_groups) : nullptr);
    std::copy(shape, shape + 4, kept);
  }
  Scratch& w = *w_kept;
  PvScratch* const pv = pv_kept.get();
  if (pv != nullptr) pv->relay_b = -1;  // values re-laid in an earlier call may have changed since
  for (const Unit& u : units) {
    const int64_t most = unit_probs<T>(c, u, w, stride, amx);
    if constexpr (std::is_same<T, at::BFloat16>::value) {
      if (amx) {  // p x values on tiles too (attention_amx.h), by ordinal
        amx_weigh(c, u, *pv, w.probs.data(), stride, w.visible.data(), w.top16.data(), w.acc.data());
        unit_output<T>(c, u, w.acc.data(), pv->sums.data());
        continue;
      }
    }
    unit_weigh<T>(c, u, w, stride, most);
  }
  if (amx) amx_release();
}

// Part `part` of `parts` of the call's units: rows_share's on the vector path; on AMX tiles (16 pairs a
// tile) split_work's uniform blocks of at most 16 pairs, which attention_amx_pv.h's kept values assume.
template <typename T>
void attend_share(const specdec_parts::AttendArgs& a, int64_t part, int64_t parts) {
  const Call<T> c(a);
  const bool amx = std::is_same<T, at::BFloat16>::value && a.d % 32 == 0 && c.group <= 16 &&
                   __builtin_cpu_supports("avx512bf16") && specdec_parts::amx_bf16_ready();
  const int64_t most_pairs = specdec_attention_units::row_unit_pairs(a.L);
  const auto rows_of = [&a](int64_t b) { return a.rows_of(b); };
  std::vector<Unit> units;
  int64_t pairs = 0;
  bool shared_groups = false;
  if (!amx && c.group <= most_pairs) {
    units = rows_share(a.B, a.kv_heads, c.group, part, parts, most_pairs, rows_of);
    for (const Unit& u : units) pairs = std::max(pairs, u.rows * u.heads);
  } else {
    const Split split = split_work(a.B, a.kv_heads, a.n, c.group, parts,
                                   amx ? 16 : specdec_attention_units::MOST_PAIRS);
    units = specdec_attention_units::split_units(split, a.B, a.kv_heads, a.n, c.group, part, parts, rows_of);
    pairs = split.rows * split.heads;
    shared_groups = split.row_blocks * split.head_blocks > 1;
  }
  if (!units.empty()) attend_items<T>(c, units, pairs, shared_groups, amx);
}

}  // namespace

void specdec_parts::attend_part(bool bf16, const AttendArgs& a, int64_t part, int64_t parts) {
  static const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (!avx512)
    attend_part_avx2(bf16, a, part, parts);
  else if (bf16)
    attend_share<at::BFloat16>(a, part, parts);
  else
    attend_share<float>(a, part, parts);
}

// q [B, H, n, d], k / v [B, kv_heads, L, d] (any strides, unit stride along d), mask: undefined or float32
// additive [B|1, 1, n, L] (any strides); float32 or bfloat16 -> out [B, n, H, d] in q's dtype.
torch::Tensor attend(torch::Tensor q, torch::Tensor k, torch::Tensor v, c10::optional<torch::Tensor> mask,
                     double scale) {
  TORCH_CHECK(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), "attend: needs AVX2 and FMA");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(3) % 16 == 0 && q.size(3) <= 256 &&
                  q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1 && q.size(1) % k.size(1) == 0 &&
                  q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "attend: q [B, H, n, d], k / v [B, kv_heads, L, d] of one dtype, d a multiple of 16 up to 256");
  torch::Tensor m;
  if (mask.has_value() && mask->defined()) {
    m = mask->to(at::kFloat);
    TORCH_CHECK(m.dim() == 4 && m.size(2) == q.size(2) && m.size(3) == k.size(2), "attend: mask [B, 1, n, L]");
  }
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16, "attend: float32 or bfloat16");
  auto out = torch::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options());
  const bool masked = m.defined();
  const specdec_parts::AttendArgs args{
      q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), masked ? m.data_ptr<float>() : nullptr,
      q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
      v.stride(2), masked && m.size(0) > 1 ? m.stride(0) : 0, masked ? m.stride(2) : 0, masked ? m.stride(3) : 0,
      q.size(0), q.size(1), q.size(2), q.size(3), k.size(1), k.size(2), static_cast<float>(scale)};
  // One query row in all (plain decoding) runs on this thread, as one unit per kv group: waking the
  // pool for it cost more than it gained (see rowgemm's MIN_PARALLEL_ROWS).
  const int64_t parts = q.size(0) * q.size(2) >= 2 ? at::get_num_threads() : 1;
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t part = begin; part < end; ++part) specdec_parts::attend_part(bf16, args, part, parts);
  });
  return out;
}
