// A Llama-family decoder stack in one C++ call per forward: the specdec kernels called back to back,
// with no Python between them (transformers' walk costs ~25 tensor ops and module calls per layer).
//
// Per layer, over M = batch * n rows of hidden [M, H]:
//   RMSNorm -> q|k|v (one packed weight) -> rotary on q, k (k and v written into the static cache's
//   store by index) -> attention (attention.cpp) -> o -> + residual -> RMSNorm -> gate|up (one packed
//   weight) -> silu(gate) * up -> down -> + residual.
// Every step is the operation transformers runs, with the same roundings in the same order (products
// and sums of rotary rounded one by one, silu and its product by ATen's own kernels), so the hidden
// states are bitwise those of the transformers walk over the same kernels, and row-invariant as they are.
#include <torch/extension.h>
#include <cstdint>
#include <vector>

torch::Tensor rowgemm(torch::Tensor x, torch::Tensor packed, int64_t n_out, int64_t isa, bool out_fp32);
torch::Tensor attend(torch::Tensor q, torch::Tensor k, torch::Tensor v, c10::optional<torch::Tensor> mask,
                     double scale);
torch::Tensor rmsnorm(torch::Tensor x, torch::Tensor weight, double eps);

namespace {

// transformers' apply_rotary_pos_emb on one head's vector, in place: x * cos + rotate_half(x) * sin,
// each product and the sum rounded to T (as the three tensor ops round them).
template <typename T>
inline void rotate(T* x, const T* cos, const T* sin, int64_t d, T* tmp) {
  const int64_t half = d / 2;
  for (int64_t j = 0; j < d; ++j) tmp[j] = x[j];
  for (int64_t j = 0; j < d; ++j) {
    const T turned = j < half ? static_cast<T>(-tmp[j + half]) : tmp[j - half];
    const T a = static_cast<T>(tmp[j] * cos[j]);
    const T b = static_cast<T>(turned * sin[j]);
    x[j] = static_cast<T>(a + b);
  }
}

// qkv [B*n, width]: q heads from column 0 rotated in place; k heads (from k_col) rotated and, with the
// v heads (from v_col), written to keys / values [B, kv_heads, capacity, d] at columns start..start+n.
template <typename T>
void rotate_and_store(torch::Tensor& qkv, int64_t B, int64_t n, int64_t heads, int64_t kv_heads, int64_t d,
                      int64_t k_col, int64_t v_col, const torch::Tensor& cos, const torch::Tensor& sin,
                      torch::Tensor keys, torch::Tensor values, int64_t start) {
  T* base = qkv.data_ptr<T>();
  const int64_t width = qkv.size(1);
  const T* cd = cos.data_ptr<T>();
  const T* sd = sin.data_ptr<T>();
  T* kd = keys.data_ptr<T>();
  T* vd = values.data_ptr<T>();
  std::vector<T> tmp(d);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      T* row = base + (b * n + i) * width;
      const T* c = cd + (b * n + i) * d;
      const T* s = sd + (b * n + i) * d;
      for (int64_t h = 0; h < heads; ++h) rotate<T>(row + h * d, c, s, d, tmp.data());
      for (int64_t g = 0; g < kv_heads; ++g) {
        T* k = row + k_col + g * d;
        rotate<T>(k, c, s, d, tmp.data());
        const int64_t slot = ((b * kv_heads + g) * keys.size(2) + start + i) * d;
        std::copy(k, k + d, kd + slot);
        std::copy(row + v_col + g * d, row + v_col + (g + 1) * d, vd + slot);
      }
    }
  }
}

// x + y into y (transformers' residual add: one rounding per element, either order gives the same bits).
template <typename T>
void add_into(const torch::Tensor& x, torch::Tensor& y) {
  const T* xd = x.data_ptr<T>();
  T* yd = y.data_ptr<T>();
  const int64_t count = y.numel();
  for (int64_t j = 0; j < count; ++j) yd[j] = static_cast<T>(xd[j] + yd[j]);
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
    TORCH_CHECK(weights.size() % 6 == 0, "LeanStack: 6 weights per layer");
    for (size_t i = 0; i < weights.size(); i += 6)
      layers_.push_back({weights[i], weights[i + 1], weights[i + 2], weights[i + 3], weights[i + 4], weights[i + 5]});
  }

  // hidden [B, n, H] (the embeddings); store [layers, 2, B, kv_heads, capacity, d]; the new entries go to
  // columns [start, start + n); cos / sin [B, n, d]; mask: float32 additive [B, 1, n, start + n] or None
  // (causal). Returns [final-normed hidden [B, n, H], the hidden states after each layer in `keep`
  // (hidden_states indices: k = after k layers)].
  std::vector<torch::Tensor> forward(torch::Tensor hidden, torch::Tensor store, int64_t start, torch::Tensor cos,
                                     torch::Tensor sin, c10::optional<torch::Tensor> mask, std::vector<int64_t> keep) {
    TORCH_CHECK(hidden.dim() == 3 && hidden.is_contiguous() && cos.is_contiguous() && sin.is_contiguous() &&
                    store.is_contiguous() && store.dim() == 6 && store.size(0) == (int64_t)layers_.size() &&
                    store.size(2) == hidden.size(0) && start + hidden.size(1) <= store.size(4),
                "LeanStack.forward: hidden [B, n, H], store [layers, 2, B, kv_heads, capacity, d] with room");
    const int64_t B = hidden.size(0), n = hidden.size(1), M = B * n, end = start + n;
    const bool bf16 = hidden.scalar_type() == at::kBFloat16;
    std::vector<torch::Tensor> out(1 + keep.size());
    torch::Tensor x = hidden.reshape({M, hidden_});
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& w = layers_[l];
      torch::Tensor qkv = rowgemm(rmsnorm(x, w.input_norm, eps_), w.qkv, w.qkv.size(0) * 32, -1, false);
      torch::Tensor keys = store.select(0, l).select(0, 0), values = store.select(0, l).select(0, 1);
      if (bf16)
        rotate_and_store<at::BFloat16>(qkv, B, n, heads_, kv_heads_, d_, k_col_, v_col_, cos, sin, keys, values, start);
      else
        rotate_and_store<float>(qkv, B, n, heads_, kv_heads_, d_, k_col_, v_col_, cos, sin, keys, values, start);
      torch::Tensor q = qkv.view({B, n, qkv.size(1)}).narrow(2, 0, heads_ * d_).view({B, n, heads_, d_}).transpose(1, 2);
      torch::Tensor attn = attend(q, keys.narrow(2, 0, end), values.narrow(2, 0, end), mask, scale_);
      torch::Tensor h = rowgemm(attn.view({M, heads_ * d_}), w.o, hidden_, -1, false);
      bf16 ? add_into<at::BFloat16>(x, h) : add_into<float>(x, h);
      torch::Tensor gate_up = rowgemm(rmsnorm(h, w.post_norm, eps_), w.gate_up, w.gate_up.size(0) * 32, -1, false);
      torch::Tensor act = at::silu(gate_up.narrow(1, 0, inter_));
      act.mul_(gate_up.narrow(1, up_col_, inter_));
      x = rowgemm(act, w.down, hidden_, -1, false);
      bf16 ? add_into<at::BFloat16>(h, x) : add_into<float>(h, x);
      for (size_t j = 0; j < keep.size(); ++j)
        if (keep[j] == (int64_t)l + 1) out[1 + j] = x.view({B, n, hidden_});
    }
    out[0] = rmsnorm(x, final_norm_, eps_).view({B, n, hidden_});
    return out;
  }

 private:
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
