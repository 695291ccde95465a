// Tensor entry points to layer_rows.h's element-wise steps, for tests: each path (scalar, AVX2, AVX-512)
// is asked for by name, so a test can hold every one the CPU runs to torch's own ops bit for bit.
#include <torch/extension.h>

#include "act_rows.h"
#include "layer_rows.h"
#include "norm_rows.h"

namespace {

specdec_rows::Isa checked(int64_t isa) {
  TORCH_CHECK(isa >= 0 && isa <= specdec_rows::best_isa(), "rows: isa ", isa, " is not run by this CPU");
  return static_cast<specdec_rows::Isa>(isa);
}

}  // namespace

// The widest path layer.cpp runs here: 0 scalar, 1 AVX2, 2 AVX-512.
int64_t rows_isa() { return specdec_rows::best_isa(); }

// x [R, heads, d] (d even), cos / sin [R, d], contiguous, float32 or bfloat16 -> x rotated (a new tensor):
// x * cos + rotate_half(x) * sin per head, as layer.cpp rotates q and k.
torch::Tensor rotary(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, int64_t isa) {
  TORCH_CHECK(x.dim() == 3 && cos.dim() == 2 && x.size(0) == cos.size(0) && x.size(2) == cos.size(1) &&
                  cos.sizes() == sin.sizes() && x.size(2) % 2 == 0 && x.scalar_type() == cos.scalar_type() &&
                  x.scalar_type() == sin.scalar_type(),
              "rotary: x [R, heads, d] with d even, cos / sin [R, d] of x's dtype");
  const specdec_rows::Isa path = checked(isa);
  auto out = x.contiguous().clone();
  auto c = cos.contiguous(), s = sin.contiguous();
  const int64_t R = x.size(0), heads = x.size(1), d = x.size(2);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      if (x.scalar_type() == at::kBFloat16)
        specdec_rows::rotate<at::BFloat16>(out.data_ptr<at::BFloat16>() + (r * heads + h) * d,
                                           c.data_ptr<at::BFloat16>() + r * d, s.data_ptr<at::BFloat16>() + r * d, d,
                                           path);
      else
        specdec_rows::rotate<float>(out.data_ptr<float>() + (r * heads + h) * d, c.data_ptr<float>() + r * d,
                                    s.data_ptr<float>() + r * d, d, path);
    }
  return out;
}

// x + y (same shape and dtype, float32 or bfloat16) as layer.cpp adds a residual.
torch::Tensor residual_add(torch::Tensor x, torch::Tensor y, int64_t isa) {
  TORCH_CHECK(x.sizes() == y.sizes() && x.scalar_type() == y.scalar_type() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "residual_add: x, y of one shape and dtype, float32 or bfloat16");
  const specdec_rows::Isa path = checked(isa);
  auto xc = x.contiguous();
  auto out = y.contiguous().clone();
  if (x.scalar_type() == at::kBFloat16)
    specdec_rows::add_into(xc.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(), out.numel(), path);
  else
    specdec_rows::add_into(xc.data_ptr<float>(), out.data_ptr<float>(), out.numel(), path);
  return out;
}

// x [R, H] contiguous, weight [H] of x's dtype (float32 or bfloat16) -> RMSNorm of each row, as layer.cpp norms.
torch::Tensor rms_norm_rows(torch::Tensor x, torch::Tensor weight, double eps, int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 1 && x.size(1) == weight.size(0) &&
                  x.scalar_type() == weight.scalar_type() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "rms_norm_rows: x [R, H], weight [H] of x's dtype, float32 or bfloat16");
  const specdec_rows::Isa path = checked(isa);
  auto xc = x.contiguous(), wc = weight.contiguous();
  auto out = torch::empty_like(xc);
  if (x.scalar_type() == at::kBFloat16)
    specdec_rows::rms_norm(xc.data_ptr<at::BFloat16>(), wc.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(),
                           x.size(1), static_cast<float>(eps), 0, x.size(0), path);
  else
    specdec_rows::rms_norm(xc.data_ptr<float>(), wc.data_ptr<float>(), out.data_ptr<float>(), x.size(1),
                           static_cast<float>(eps), 0, x.size(0), path);
  return out;
}

// gate, up [R, n] (any row strides, unit column stride), float32 or bfloat16 -> silu(gate) * up [R, n], as
// layer.cpp computes a row's run of the MLP's activation (by ATen's capability's path, act_rows.h).
torch::Tensor silu_mul_rows(torch::Tensor gate, torch::Tensor up) {
  TORCH_CHECK(gate.dim() == 2 && gate.sizes() == up.sizes() && gate.stride(1) == 1 && up.stride(1) == 1 &&
                  gate.scalar_type() == up.scalar_type() &&
                  (gate.scalar_type() == at::kFloat || gate.scalar_type() == at::kBFloat16),
              "silu_mul_rows: gate, up [R, n] of one dtype, float32 or bfloat16, columns contiguous");
  auto out = torch::empty(gate.sizes(), gate.options());
  const int64_t n = gate.size(1);
  for (int64_t r = 0; r < gate.size(0); ++r) {
    if (gate.scalar_type() == at::kBFloat16)
      specdec_rows::silu_mul(gate.data_ptr<at::BFloat16>() + r * gate.stride(0),
                             up.data_ptr<at::BFloat16>() + r * up.stride(0), out.data_ptr<at::BFloat16>() + r * n, n);
    else
      specdec_rows::silu_mul(gate.data_ptr<float>() + r * gate.stride(0), up.data_ptr<float>() + r * up.stride(0),
                             out.data_ptr<float>() + r * n, n);
  }
  return out;
}

// The path act_rows.h takes in this process: ATen's CPU capability (0 DEFAULT, 1 AVX2, 2 AVX-512).
int64_t act_isa() { return specdec_rows::aten_isa(); }
