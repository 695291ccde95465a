// What attention.cpp (AVX-512) and attention_avx2.cpp share: a call's typed view, and its split into work
// units. A unit is a block of (query row, head) pairs of one kv group; the split never changes a pair's
// result (each pair's arithmetic is the one it runs alone), only which thread computes it and how often
// the keys and values stream.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "parts.h"

namespace specdec_attention_units {

constexpr int64_t MOST_PAIRS = 24;  // (query row, head) pairs per unit: each key block is applied to all
// Up to this many keys, rows_share's units hold up to 2 x MOST_PAIRS pairs (16 rows of SmolLM2's 3 heads a
// kv group): their probabilities [pairs, keys] still sit in L2 beside the group's keys and values.
constexpr int64_t LONG_KEYS = 2048;
inline int64_t row_unit_pairs(int64_t keys) { return keys <= LONG_KEYS ? 2 * MOST_PAIRS : MOST_PAIRS; }
constexpr int64_t TRANSPOSE_PAIRS = 4;  // transposing a block of keys costs about what scoring 4 pairs does

// A call (parts.h's AttendArgs: pointers and element strides) with its pointers typed and what follows
// from its shape.
template <typename T>
struct Call : specdec_parts::AttendArgs {
  int64_t group, chunks;  // GQA heads per kv head; 16-float chunks per head
  explicit Call(const AttendArgs& a) : AttendArgs(a), group(a.H / a.kv_heads), chunks(a.d / 16) {}
  const T* queries() const { return static_cast<const T*>(q); }
  const T* keys() const { return static_cast<const T*>(k); }
  const T* values() const { return static_cast<const T*>(v); }
  T* output() const { return static_cast<T*>(out); }
  int64_t visible(int64_t i) const { return mask != nullptr ? L : L - n + i + 1; }  // no mask: causal
};

// Query rows [row0, row0 + rows) x heads [head0, head0 + heads) of kv group g (head indices within the
// group) of sequence b; pair p is (row0 + p / heads, head0 + p % heads).
struct Unit {
  int64_t b, g, row0, rows, head0, heads;
};

// Rows and heads per unit, by a cost model: a unit pays for transposing the keys once (about as much as
// scoring 4 pairs) plus its pairs; the threads take equal counts of units, so the split that minimizes
// one thread's share wins (more pairs per unit on ties: fewer passes over the keys and values).
struct Split {
  int64_t rows, heads, row_blocks, head_blocks;
};

inline Split split_work(int64_t B, int64_t kv_heads, int64_t n, int64_t group, int64_t threads,
                        int64_t most_pairs = MOST_PAIRS) {
  const auto blocks = [](int64_t total, int64_t each) { return (total + each - 1) / each; };
  Split best{1, 1, n, group};
  int64_t best_cost = -1;
  for (int64_t heads = group;; heads = blocks(heads, 2)) {
    for (int64_t rows = std::min<int64_t>(n, std::max<int64_t>(1, most_pairs / heads)); rows >= 1; --rows) {
      const int64_t even_rows = blocks(n, blocks(n, rows)), even_heads = blocks(group, blocks(group, heads));
      const int64_t units = B * kv_heads * blocks(n, even_rows) * blocks(group, even_heads);
      const int64_t cost = blocks(units, threads) * (TRANSPOSE_PAIRS + even_rows * even_heads);
      if (best_cost < 0 || cost < best_cost) {
        best_cost = cost;
        best = {even_rows, even_heads, blocks(n, even_rows), blocks(group, even_heads)};
      }
    }
    if (heads == 1) break;
  }
  return best;
}

// Part `part` of `parts` of split_work's units, as shared by count (a (b, g)'s units one after another,
// so its keys stay in L2). rows_of(b): sequence b's query rows (ragged calls: fewer than n); a unit is cut
// to them and dropped where none are left, before the units are shared out, so the parts' counts stay even.
template <typename RowsOf>
std::vector<Unit> split_units(const Split& split, int64_t B, int64_t kv_heads, int64_t n, int64_t group, int64_t part,
                              int64_t parts, RowsOf rows_of) {
  const int64_t per_group = split.row_blocks * split.head_blocks;
  std::vector<Unit> all;
  for (int64_t item = 0; item < B * kv_heads * per_group; ++item) {
    const int64_t b = item / (kv_heads * per_group), g = (item / per_group) % kv_heads;
    const int64_t r = (item % per_group) / split.head_blocks, hb = item % split.head_blocks;
    const int64_t rows = std::min(split.rows, std::min(n, rows_of(b)) - r * split.rows);
    if (rows > 0)
      all.push_back(Unit{b, g, r * split.rows, rows, hb * split.heads, std::min(split.heads, group - hb * split.heads)});
  }
  int64_t begin, end;
  specdec_parts::share(static_cast<int64_t>(all.size()), part, parts, begin, end);
  return std::vector<Unit>(all.begin() + begin, all.begin() + end);
}

// Part `part` of `parts` of a call's units on the vector path, sharing out rows rather than uniform blocks:
// the (sequence, kv group) pairs' query rows laid end to end (kv_heads * rows_of(b) for each sequence b:
// a ragged call's sequences differ), each part takes an even contiguous run, and its run within one group
// is one unit with every head of the group (cut evenly where it would pass most_pairs, which must be >=
// group). A group whose rows all fall to one part has its keys read and transposed once, not once per
// uniform block (16 rows of SmolLM2 on 2 threads: 2 units a thread instead of 3), and the parts' pair
// counts differ by at most one row's heads.
template <typename RowsOf>
std::vector<Unit> rows_share(int64_t B, int64_t kv_heads, int64_t group, int64_t part, int64_t parts,
                             int64_t most_pairs, RowsOf rows_of) {
  int64_t slots = 0;
  for (int64_t b = 0; b < B; ++b) slots += kv_heads * rows_of(b);
  const int64_t first = slots * part / parts, last = slots * (part + 1) / parts;
  std::vector<Unit> units;
  int64_t group_start = 0;  // slot of (b, g)'s row 0
  for (int64_t bg = 0; bg < B * kv_heads && group_start < last; ++bg) {
    const int64_t n = rows_of(bg / kv_heads), lo = std::max(first, group_start), hi = std::min(last, group_start + n);
    if (lo < hi) {
      const int64_t row0 = lo - group_start, rows = hi - lo;
      const int64_t pieces = (rows * group + most_pairs - 1) / most_pairs;
      for (int64_t k = 0; k < pieces; ++k) {
        const int64_t r0 = row0 + rows * k / pieces, r1 = row0 + rows * (k + 1) / pieces;
        if (r1 > r0) units.push_back(Unit{bg / kv_heads, bg % kv_heads, r0, r1 - r0, 0, group});
      }
    }
    group_start += n;
  }
  return units;
}

}  // namespace specdec_attention_units
