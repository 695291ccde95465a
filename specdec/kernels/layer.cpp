// A Llama-family decoder stack in one C++ call per forward: the specdec kernels called back to back,
// with no Python between them (transformers' walk costs ~25 tensor ops and module calls per layer).
//
// Per layer, over M = batch * n rows of hidden [M, H] (ragged calls: each sequence's own rows, packed):
//   RMSNorm -> q|k|v (one packed weight) -> rotary on q, k (k and v written into the static cache's
//   store by index) -> attention (attention.cpp) -> o -> + residual -> RMSNorm -> gate|up (one packed
//   weight) -> silu(gate) * up -> down -> + residual.
// Every step is the operation transformers runs, with the same roundings in the same order (products
// and sums of rotary rounded one by one, silu and its product as ATen's own kernels round them), so the
// hidden states are bitwise those of the transformers walk over the same kernels, and row-invariant as they are.
#include <torch/extension.h>
#include <omp.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "act_rows.h"
#include "layer_rows.h"
#include "parts.h"
#include "team_barrier.h"

namespace {

constexpr int64_t MAX_HEAD_DIM = 256;  // attention.cpp's limit too

// Rows [begin, end) of qkv [M, width]: q heads from column 0 rotated in place; k heads (from k_col)
// rotated and, with the v heads (from v_col), written to keys / values [B, kv_heads, capacity, d] at column
// start + i for row m = (b, i) = (row_seq[m], row_col[m]). cos / sin [M, d].
template <typename T>
void rotate_rows(T* qkv, int64_t width, const int64_t* row_seq, const int64_t* row_col, int64_t heads,
                 int64_t kv_heads, int64_t d, int64_t k_col, int64_t v_col, const T* cd, const T* sd, T* kd, T* vd,
                 int64_t capacity, int64_t start, int64_t begin, int64_t end) {
  const specdec_rows::Isa isa = specdec_rows::best_isa();
  for (int64_t m = begin; m < end; ++m) {
    const int64_t b = row_seq[m], i = row_col[m];
    T* row = qkv + m * width;
    const T* c = cd + m * d;
    const T* s = sd + m * d;
    for (int64_t h = 0; h < heads; ++h) specdec_rows::rotate<T>(row + h * d, c, s, d, isa);
    for (int64_t g = 0; g < kv_heads; ++g) {
      T* k = row + k_col + g * d;
      specdec_rows::rotate<T>(k, c, s, d, isa);
      const int64_t slot = ((b * kv_heads + g) * capacity + start + i) * d;
      std::copy(k, k + d, kd + slot);
      std::copy(row + v_col + g * d, row + v_col + (g + 1) * d, vd + slot);
    }
  }
}

// x + y into y over rows [begin, end) of [rows, H] (transformers' residual add: one rounding per element,
// either order gives the same bits).
void add_rows(bool bf16, const void* x, void* y, int64_t H, int64_t begin, int64_t end) {
  const specdec_rows::Isa isa = specdec_rows::best_isa();
  if (bf16)
    specdec_rows::add_into(static_cast<const at::BFloat16*>(x) + begin * H, static_cast<at::BFloat16*>(y) + begin * H,
                           (end - begin) * H, isa);
  else
    specdec_rows::add_into(static_cast<const float*>(x) + begin * H, static_cast<float*>(y) + begin * H,
                           (end - begin) * H, isa);
}

// Weights of one decoder layer, packed for rowgemm (specdec/kernels/packing.py).
struct Layer {
  torch::Tensor input_norm, qkv, o, post_norm, gate_up, down;
};

class LeanStack {
 public:
  // weights: 6 per layer in Layer's order; cols: where k and v start in q|k|v's output and up in
  // gate|up's (a part's outputs start at a whole tile).
  LeanStack(std::vector<torch::Tensor> weights, torch::Tensor final_norm, int64_t heads, int64_t kv_heads,
            int64_t head_dim, int64_t hidden, int64_t intermediate, int64_t k_col, int64_t v_col, int64_t up_col,
            double eps, double scale)
      : final_norm_(final_norm), heads_(heads), kv_heads_(kv_heads), d_(head_dim), hidden_(hidden),
        inter_(intermediate), k_col_(k_col), v_col_(v_col), up_col_(up_col), eps_(eps), scale_(scale) {
    TORCH_CHECK(weights.size() % 6 == 0 && !weights.empty(), "LeanStack: 6 weights per layer");
    TORCH_CHECK(head_dim % 16 == 0 && head_dim <= MAX_HEAD_DIM && heads % kv_heads == 0,
                "LeanStack: head_dim a multiple of 16 up to 256, heads a multiple of kv_heads");
    TORCH_CHECK(final_norm.scalar_type() != at::kBFloat16 || (hidden % 2 == 0 && intermediate % 2 == 0),
                "LeanStack: bfloat16 products take pairs: hidden and intermediate sizes must be even");
    for (size_t i = 0; i < weights.size(); i += 6)
      layers_.push_back({weights[i], weights[i + 1], weights[i + 2], weights[i + 3], weights[i + 4], weights[i + 5]});
  }

  // A store's rows [B, kv_heads, capacity, d] laid out densely within each layer's keys and values (the
  // layers and keys / values may sit further apart: a batch's rows are a view of a store with more rows).
  static bool inner_dense(const torch::Tensor& store) {
    return store.stride(5) == 1 && store.stride(4) == store.size(5) && store.stride(3) == store.size(4) * store.size(5) &&
           store.stride(2) == store.size(3) * store.stride(3);
  }

  // hidden [B, n, H] (the embeddings); store [layers, 2, B, kv_heads, capacity, d]; the new entries go to
  // columns [start, start + n); cos / sin [B, n, d]; mask: float32 additive [B|1, 1, n, start + n] or None
  // (causal). Returns [final-normed hidden [B, n, H], the hidden states after each layer in `keep`
  // (hidden_states indices: k = after k layers)]. threads: the team's size (1: this thread alone; 0: torch's).
  // seq_rows (ragged; empty: n each): sequence b has seq_rows[b] <= n new rows, and hidden, cos / sin and
  // the results hold only those, packed one sequence after another ([M, H], M their sum): a verify step
  // whose trees differ in size computes no padding rows. Sequence b's row i is its column start + i, as
  // when padded, so its results are bitwise the padded ones (the mask [B|1, 1, n, start + n], needed here,
  // hides the columns of rows a sequence lacks).
  std::vector<torch::Tensor> forward(torch::Tensor hidden, torch::Tensor store, int64_t start, torch::Tensor cos,
                                     torch::Tensor sin, c10::optional<torch::Tensor> mask, std::vector<int64_t> keep,
                                     int64_t threads, std::vector<int64_t> seq_rows) {
    const bool ragged = !seq_rows.empty();
    TORCH_CHECK(hidden.dim() == (ragged ? 2 : 3) && hidden.is_contiguous() && cos.is_contiguous() &&
                    sin.is_contiguous() && store.dim() == 6 && inner_dense(store) &&
                    store.size(0) == (int64_t)layers_.size() && store.scalar_type() == hidden.scalar_type() &&
                    cos.scalar_type() == hidden.scalar_type(),
                "LeanStack.forward: hidden [B, n, H] (ragged: [M, H]), store [layers, 2, B, kv_heads, capacity, d]");
    const int64_t B = ragged ? static_cast<int64_t>(seq_rows.size()) : hidden.size(0);
    int64_t n = ragged ? 0 : hidden.size(1), M = ragged ? 0 : B * n;
    for (int64_t rows : seq_rows) {
      TORCH_CHECK(rows >= 1, "LeanStack.forward: every sequence has at least one row");
      n = std::max(n, rows), M += rows;
    }
    TORCH_CHECK(store.size(2) == B && start + n <= store.size(4) && hidden.size(ragged ? 0 : 1) == (ragged ? M : n) &&
                    cos.numel() == M * d_,
                "LeanStack.forward: the store holds B sequences with room for n more columns; cos / sin a row each");
    TORCH_CHECK(!ragged || (mask.has_value() && mask->defined()), "LeanStack.forward: ragged rows need a mask");
    const int64_t end = start + n, num_layers = layers_.size();
    const auto opts = hidden.options();
    Plan p{hidden.scalar_type() == at::kBFloat16, B, n, start, store.size(4)};
    for (int64_t b = 0, m = 0; b < B; ++b) {
      const int64_t rows = ragged ? seq_rows[b] : n;
      p.seq_start.push_back(m);
      for (int64_t i = 0; i < rows; ++i, ++m) p.row_seq.push_back(b), p.row_col.push_back(i);
    }
    p.seq_rows = ragged ? seq_rows : std::vector<int64_t>(B, n);
    p.xs = torch::empty({num_layers, M, hidden_}, opts);  // the residual stream after each layer
    p.h = torch::empty({M, hidden_}, opts);
    p.normed = torch::empty({M, hidden_}, opts);
    p.qkv = torch::empty({M, layers_[0].qkv.size(0) * 32}, opts);
    p.attn = torch::empty({M, heads_, d_}, opts);
    p.gate_up = torch::empty({M, layers_[0].gate_up.size(0) * 32}, opts);
    p.act = torch::empty({M, inter_}, opts);
    p.out = ragged ? torch::empty({M, hidden_}, opts) : torch::empty({B, n, hidden_}, opts);
    p.hidden = hidden;
    p.store = store;
    p.cos = cos;
    p.sin = sin;
    const int64_t width = p.qkv.size(1);
    p.args = {p.qkv.data_ptr(), store.data_ptr(), store.data_ptr(), p.attn.data_ptr(), nullptr,
              n * width, d_, width, store.stride(2), store.stride(3), store.stride(4), store.stride(2), store.stride(3),
              store.stride(4),
              0, 0, 0, B, heads_, n, d_, kv_heads_, end, static_cast<float>(scale_)};
    if (ragged) p.args.seq_rows = p.seq_rows.data(), p.args.seq_start = p.seq_start.data();
    torch::Tensor m;
    if (mask.has_value() && mask->defined()) {
      m = *mask;
      TORCH_CHECK(m.scalar_type() == at::kFloat && m.dim() == 4 && m.size(2) == n && m.size(3) == end,
                  "LeanStack.forward: mask float32 [B|1, 1, n, start + n]");
      p.args.mask = m.data_ptr<float>();
      p.args.m_b = m.size(0) > 1 ? m.stride(0) : 0;
      p.args.m_i = m.stride(2);
      p.args.m_j = m.stride(3);
    }
    if (threads <= 0) threads = at::get_num_threads();
    if (threads > 1 && !omp_in_parallel()) {
      // One team for the whole forward: the pool wakes once, not once per product (~150 times).
#pragma omp parallel num_threads(threads)
      run(p, omp_get_thread_num(), omp_get_num_threads());
    } else {
      run(p, 0, 1);
    }
    std::vector<torch::Tensor> out{p.out};
    for (int64_t k : keep)
      out.push_back(k < 1 || k > num_layers ? torch::Tensor()
                    : ragged ? p.xs.select(0, k - 1) : p.xs.select(0, k - 1).view({B, n, hidden_}));
    return out;
  }

 private:
  // One forward's buffers (allocated before the team starts; the team only reads and writes them).
  struct Plan {
    bool bf16;
    int64_t B, n, start, capacity;
    std::vector<int64_t> seq_rows, seq_start, row_seq, row_col;  // per sequence; per row: (b, i)
    torch::Tensor hidden, store, cos, sin, xs, h, normed, qkv, attn, gate_up, act, out;
    specdec_parts::AttendArgs args;
    specdec_team::Barrier barrier;
  };

  // act = silu(gate) * up over rows [begin, end) and columns [c0, c1): each row's run of columns as ATen's
  // silu_out and mul_ over those views compute it (act_rows.h), so a row's elements take the same path
  // whichever rows share the call, and whichever columns do, where c0 is a multiple of ACT_ALIGN: the
  // runs then split into vector steps and a tail at the same elements.
  static constexpr int64_t ACT_ALIGN = 64;  // a multiple of any step ATen takes (bf16 silu, AVX-512: 2 x 32)
  void silu_times_up(Plan& p, int64_t begin, int64_t end, int64_t c0, int64_t c1) const {
    const int64_t wgu = p.gate_up.size(1);
    for (int64_t r = begin; r < end && c0 < c1; ++r) {
      if (p.bf16) {
        const at::BFloat16* gate = p.gate_up.data_ptr<at::BFloat16>() + r * wgu;
        at::BFloat16* act = p.act.data_ptr<at::BFloat16>() + r * inter_;
        specdec_rows::silu_mul(gate + c0, gate + up_col_ + c0, act + c0, c1 - c0);
      } else {
        const float* gate = p.gate_up.data_ptr<float>() + r * wgu;
        float* act = p.act.data_ptr<float>() + r * inter_;
        specdec_rows::silu_mul(gate + c0, gate + up_col_ + c0, act + c0, c1 - c0);
      }
    }
  }

  // Each part's share of silu(gate) * up: its own rows, or with fewer rows than parts (a one-row forward)
  // its own columns of every row, in blocks of ACT_ALIGN, so that no part waits while another runs it alone
  // (a one-row bf16 forward of SmolLM2 spent ~0.2 ms a forward there).
  void act_part(Plan& p, int64_t M, int64_t row0, int64_t row1, int64_t part, int64_t parts) const {
    if (M >= parts) return silu_times_up(p, row0, row1, 0, inter_);
    int64_t b0, b1;
    specdec_parts::share((inter_ + ACT_ALIGN - 1) / ACT_ALIGN, part, parts, b0, b1);
    silu_times_up(p, 0, M, std::min(b0 * ACT_ALIGN, inter_), std::min(b1 * ACT_ALIGN, inter_));
  }

  // Zeros in the store's columns start + i of a ragged call's rows i that sequence b lacks: its mask hides
  // them, but a hidden key still enters the products as a value times 0, and a batch's restacked store
  // leaves its columns past the longest sequence unwritten (specdec/batch_cache.py: a padded call writes them
  // from its padding rows before anything reads them), so they may hold a NaN's bits.
  void clear_missing(const Plan& p, char* keys, char* values, int64_t elem) const {
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t g = 0; g < kv_heads_; ++g) {
        const int64_t slot = ((b * kv_heads_ + g) * p.capacity + p.start + p.seq_rows[b]) * d_ * elem;
        const int64_t bytes = (p.n - p.seq_rows[b]) * d_ * elem;
        std::memset(keys + slot, 0, bytes);
        std::memset(values + slot, 0, bytes);
      }
  }

  // Part `part` of `parts` of every layer. Products and attention are split between the parts, norms,
  // residual adds, rotary and silu * up by rows. A barrier wherever a step reads what other parts wrote.
  void run(Plan& p, int64_t part, int64_t parts) {
    using namespace specdec_parts;
    const int64_t M = static_cast<int64_t>(p.row_seq.size()), elem = p.bf16 ? 2 : 4;
    const int64_t width = p.qkv.size(1), wgu = p.gate_up.size(1);
    int64_t row0, row1;
    share(M, part, parts, row0, row1);
    const void* x = p.hidden.data_ptr();
    char* const xs = static_cast<char*>(p.xs.data_ptr());
    char* const store = static_cast<char*>(p.store.data_ptr());
    specdec_parts::AttendArgs args = p.args;
    p.barrier.set_parts(parts);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& w = layers_[l];
      void* const y = xs + l * M * hidden_ * elem;
      char* const keys = store + l * p.store.stride(0) * elem;
      char* const values = keys + p.store.stride(1) * elem;
      rmsnorm_part(p.bf16, x, w.input_norm.data_ptr(), p.normed.data_ptr(), M, hidden_, eps_, part, parts);
      p.barrier.wait();
      rowgemm_part(p.bf16, p.normed.data_ptr(), M, hidden_, w.qkv.data_ptr(), w.qkv.size(0), width,
                   p.qkv.data_ptr(), false, part, parts);
      rowgemm_prefetch_part(p.bf16, w.o.data_ptr(), heads_ * d_, w.o.size(0), part, parts);  // warm the next product
      p.barrier.wait();
      if (p.bf16)
        rotate_rows<at::BFloat16>(p.qkv.data_ptr<at::BFloat16>(), width, p.row_seq.data(), p.row_col.data(), heads_,
                                  kv_heads_, d_, k_col_, v_col_, p.cos.data_ptr<at::BFloat16>(),
                                  p.sin.data_ptr<at::BFloat16>(), reinterpret_cast<at::BFloat16*>(keys),
                                  reinterpret_cast<at::BFloat16*>(values), p.capacity, p.start, row0, row1);
      else
        rotate_rows<float>(p.qkv.data_ptr<float>(), width, p.row_seq.data(), p.row_col.data(), heads_, kv_heads_,
                           d_, k_col_, v_col_, p.cos.data_ptr<float>(), p.sin.data_ptr<float>(),
                           reinterpret_cast<float*>(keys), reinterpret_cast<float*>(values), p.capacity, p.start, row0,
                           row1);
      if (part == parts - 1) clear_missing(p, keys, values, elem);
      args.k = keys;
      args.v = values;
      p.barrier.wait();
      attend_part(p.bf16, args, part, parts);
      p.barrier.wait();
      rowgemm_part(p.bf16, p.attn.data_ptr(), M, heads_ * d_, w.o.data_ptr(), w.o.size(0), hidden_, p.h.data_ptr(),
                   false, part, parts);
      rowgemm_prefetch_part(p.bf16, w.gate_up.data_ptr(), hidden_, w.gate_up.size(0), part, parts);
      p.barrier.wait();
      add_rows(p.bf16, x, p.h.data_ptr(), hidden_, row0, row1);  // h = attention + residual, by this part's rows,
      rmsnorm_part(p.bf16, p.h.data_ptr(), w.post_norm.data_ptr(), p.normed.data_ptr(), M, hidden_, eps_, part,
                   parts);                                          // then normed by the same rows
      p.barrier.wait();
      rowgemm_part(p.bf16, p.normed.data_ptr(), M, hidden_, w.gate_up.data_ptr(), w.gate_up.size(0), wgu,
                   p.gate_up.data_ptr(), false, part, parts);
      rowgemm_prefetch_part(p.bf16, w.down.data_ptr(), inter_, w.down.size(0), part, parts);
      p.barrier.wait();
      act_part(p, M, row0, row1, part, parts);
      p.barrier.wait();
      rowgemm_part(p.bf16, p.act.data_ptr(), M, inter_, w.down.data_ptr(), w.down.size(0), hidden_, y, false, part,
                   parts);
      if (l + 1 < layers_.size())
        rowgemm_prefetch_part(p.bf16, layers_[l + 1].qkv.data_ptr(), hidden_, layers_[l + 1].qkv.size(0), part, parts);
      p.barrier.wait();
      add_rows(p.bf16, p.h.data_ptr(), y, hidden_, row0, row1);  // the next norm reads only these rows
      x = y;
    }
    rmsnorm_part(p.bf16, x, final_norm_.data_ptr(), p.out.data_ptr(), M, hidden_, eps_, part, parts);
    p.barrier.wait();  // arrive together at OpenMP's own barrier, which sleeps at once under PASSIVE
  }

  std::vector<Layer> layers_;
  torch::Tensor final_norm_;
  int64_t heads_, kv_heads_, d_, hidden_, inter_, k_col_, v_col_, up_col_;
  double eps_, scale_;
};

}  // namespace

void bind_lean(pybind11::module& m) {
  pybind11::class_<LeanStack>(m, "LeanStack")
      .def(pybind11::init<std::vector<torch::Tensor>, torch::Tensor, int64_t, int64_t, int64_t, int64_t, int64_t,
                          int64_t, int64_t, int64_t, double, double>())
      .def("forward", &LeanStack::forward, pybind11::call_guard<pybind11::gil_scoped_release>());
}
