// The problem both packed-GEMM kernels (amx_gemm.cpp, rowwise_gemm.cpp) solve:
// y [m, n] (row stride ldo; bf16, or float32 where out_f32) = x [m, k] (row stride ldx) · Wᵀ
// (+ bias), W packed in the kernel's own order at wp.
#pragma once

#include <cstdint>

namespace radixserve_cpu {

struct GemmProblem {
  const uint16_t* x;
  int64_t m, ldx;
  const uint16_t* wp;
  int64_t n, k;
  const uint16_t* bias;  // [n] bf16 or null
  void* out;
  int64_t ldo;
  bool out_f32;
};

}  // namespace radixserve_cpu
