// RMSNorm in one pass per row (transformers' LlamaRMSNorm is ~6 tensor ops per call, 61 calls a forward):
// y = weight * to_dtype(x * rsqrt(mean(x^2) + eps)), the mean in float32. Each row alone, in a fixed order
// (8 running lanes over k, then a fixed combine), so a row's result does not depend on the other rows;
// norm_rows.h's vector paths give its scalar reference's bits.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include "norm_rows.h"
#include "parts.h"

namespace {

template <typename T>
void norm_rows(const T* x, const T* w, T* y, int64_t rows, int64_t H, float eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    specdec_rows::rms_norm<T>(x, w, y, H, eps, begin, end, specdec_rows::best_isa());
  });
}

}  // namespace

void specdec_parts::rmsnorm_part(bool bf16, const void* x, const void* weight, void* y, int64_t rows, int64_t H,
                                 float eps, int64_t part, int64_t parts) {
  int64_t begin, end;
  share(rows, part, parts, begin, end);
  if (bf16)
    specdec_rows::rms_norm<at::BFloat16>(static_cast<const at::BFloat16*>(x), static_cast<const at::BFloat16*>(weight),
                                         static_cast<at::BFloat16*>(y), H, eps, begin, end, specdec_rows::best_isa());
  else
    specdec_rows::rms_norm<float>(static_cast<const float*>(x), static_cast<const float*>(weight),
                                  static_cast<float*>(y), H, eps, begin, end, specdec_rows::best_isa());
}

// x [..., H] contiguous, weight [H] of x's dtype (float32 or bfloat16) -> y like x.
torch::Tensor rmsnorm(torch::Tensor x, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous() && x.scalar_type() == weight.scalar_type() &&
                  x.size(-1) == weight.size(0), "rmsnorm: x [..., H] contiguous, weight [H] of x's dtype");
  auto y = torch::empty_like(x);
  const int64_t H = x.size(-1), rows = H ? x.numel() / H : 0;
  if (x.scalar_type() == at::kFloat) {
    norm_rows<float>(x.data_ptr<float>(), weight.data_ptr<float>(), y.data_ptr<float>(), rows, H, eps);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kBFloat16, "rmsnorm: float32 or bfloat16");
    norm_rows<at::BFloat16>(x.data_ptr<at::BFloat16>(), weight.data_ptr<at::BFloat16>(),
                            y.data_ptr<at::BFloat16>(), rows, H, eps);
  }
  return y;
}
