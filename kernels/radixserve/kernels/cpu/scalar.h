// Scalar element access shared by the CPU kernels: float32 and bfloat16 (stored as uint16_t)
// read and written as float, with torch's rounding (nearest even; NaN stays a quiet NaN);
// and the softmax numerators of one row of scores.
// build.py hashes this header with every source beside it, so a change rebuilds both.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace radixserve_cpu {

inline float bf16_to_f32(uint16_t x) {
  uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even, as torch does
  return static_cast<uint16_t>(u >> 16);
}

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const uint16_t* p, int64_t i) { return bf16_to_f32(p[i]); }
inline void store(float* p, int64_t i, float x) { p[i] = x; }
inline void store(uint16_t* p, int64_t i, float x) { p[i] = f32_to_bf16(x); }

// One query head's scores in place: exp(x − max), in float32. Returns their sum; the max
// goes to `max_out` (a partial result over the shared prefix merges by it).
inline float exp_shifted(float* sg, int64_t len, float* max_out = nullptr) {
  float m = sg[0];
  for (int64_t j = 1; j < len; ++j) m = sg[j] > m ? sg[j] : m;
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < len; ++j) {
    const float e = std::exp(sg[j] - m);
    sg[j] = e;
    sum += e;
  }
  if (max_out != nullptr) *max_out = m;
  return sum;
}

}  // namespace radixserve_cpu
