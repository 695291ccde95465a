// The extension's Python module: the kernels' tensor entry points and the lean forward's class.
#include <torch/extension.h>

torch::Tensor rowgemm(torch::Tensor x, torch::Tensor packed, int64_t n_out, int64_t isa, bool out_fp32);  // rowgemm.cpp
int64_t cpu_isa();                                                                                        // rowgemm.cpp
torch::Tensor attend(torch::Tensor q, torch::Tensor k, torch::Tensor v, c10::optional<torch::Tensor> mask,
                     double scale);                                       // attention.cpp
torch::Tensor rmsnorm(torch::Tensor x, torch::Tensor weight, double eps);  // norm.cpp
int64_t rows_isa();                                                       // rows.cpp
torch::Tensor rotary(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, int64_t isa);  // rows.cpp
torch::Tensor residual_add(torch::Tensor x, torch::Tensor y, int64_t isa);                 // rows.cpp
torch::Tensor rms_norm_rows(torch::Tensor x, torch::Tensor weight, double eps, int64_t isa);  // rows.cpp
torch::Tensor silu_mul_rows(torch::Tensor gate, torch::Tensor up);                         // rows.cpp
int64_t act_isa();                                                                        // rows.cpp
torch::Tensor argmax_rows(torch::Tensor logits, int64_t isa);                             // argmax.cpp
std::vector<torch::Tensor> top_probs(torch::Tensor logits, int64_t r, int64_t isa, bool log);  // top_probs.cpp
double arith_peak(bool bf16, int64_t iters);                              // peak.cpp
void bind_lean(pybind11::module& m);                                      // layer.cpp: LeanStack

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rowgemm", &rowgemm, "y[M, N] = x[M, K] @ W[N, K]^T over packed weights, row-invariant");
  m.def("attend", &attend, "row-invariant attention: q [B, H, n, d], k / v [B, kv_heads, L, d] -> [B, n, H, d]");
  m.def("rmsnorm", &rmsnorm, "RMSNorm row by row: x [..., H], weight [H] -> like x");
  m.def("cpu_isa", &cpu_isa, "0 scalar, 1 AVX2, 2 AVX-512, 3 AVX-512 with BF16, 4 that and AMX-BF16 tiles");
  m.def("rows_isa", &rows_isa, "the lean forward's element-wise path: 0 scalar, 1 AVX2, 2 AVX-512");
  m.def("rotary", &rotary, "x [R, heads, d] * cos + rotate_half(x) * sin, cos / sin [R, d], by the named path");
  m.def("residual_add", &residual_add, "x + y as the lean forward adds a residual, by the named path");
  m.def("rms_norm_rows", &rms_norm_rows, "RMSNorm of x [R, H] as the lean forward norms a row, by the named path");
  m.def("silu_mul_rows", &silu_mul_rows, "silu(gate) * up over [R, n] as the lean forward's MLP computes it");
  m.def("act_isa", &act_isa, "the MLP activation's path here, ATen's capability: 0 DEFAULT, 1 AVX2, 2 AVX-512");
  m.def("argmax_rows", &argmax_rows, "logits [R, V] float32 -> each row's first maximum (a NaN counts as one)");
  m.def("top_probs", &top_probs, "logits [M, V] -> each row's r best (index, softmax probability or its log)",
        pybind11::arg("logits"), pybind11::arg("r"), pybind11::arg("isa"), pybind11::arg("log") = false);
  m.def("arith_peak", &arith_peak, "GFLOP/s of rowgemm's instruction (bf16 dot-pairs or float32 FMAs) on every "
        "torch thread, register-only: the compute roof", pybind11::arg("bf16"), pybind11::arg("iters"));
  bind_lean(m);
}
