// RMSNorm in one pass per row (transformers' LlamaRMSNorm is ~6 tensor ops per call, 61 calls a forward):
// y = weight * to_dtype(x * rsqrt(mean(x^2) + eps)), the mean in float32. Each row alone, in a fixed order
// (8 running lanes over k, then a fixed combine), so a row's result does not depend on the other rows.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>

#include "parts.h"

namespace {

template <typename T>
void norm_range(const T* x, const T* w, T* y, int64_t H, float eps, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const T* xr = x + r * H;
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t k = 0;
    for (; k + 8 <= H; k += 8)
      for (int l = 0; l < 8; ++l) lanes[l] += static_cast<float>(xr[k + l]) * static_cast<float>(xr[k + l]);
    for (; k < H; ++k) lanes[k % 8] += static_cast<float>(xr[k]) * static_cast<float>(xr[k]);
    const float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    const float scale = 1.0f / std::sqrt(sum / static_cast<float>(H) + eps);
    for (int64_t j = 0; j < H; ++j)
      y[r * H + j] = static_cast<T>(static_cast<float>(w[j]) * static_cast<float>(static_cast<T>(static_cast<float>(xr[j]) * scale)));
  }
}

template <typename T>
void norm_rows(const T* x, const T* w, T* y, int64_t rows, int64_t H, float eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) { norm_range<T>(x, w, y, H, eps, begin, end); });
}

}  // namespace

void specdec_parts::rmsnorm_part(bool bf16, const void* x, const void* weight, void* y, int64_t rows, int64_t H,
                                 float eps, int64_t part, int64_t parts) {
  int64_t begin, end;
  share(rows, part, parts, begin, end);
  if (bf16)
    norm_range<at::BFloat16>(static_cast<const at::BFloat16*>(x), static_cast<const at::BFloat16*>(weight),
                             static_cast<at::BFloat16*>(y), H, eps, begin, end);
  else
    norm_range<float>(static_cast<const float*>(x), static_cast<const float*>(weight), static_cast<float*>(y), H,
                      eps, begin, end);
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
