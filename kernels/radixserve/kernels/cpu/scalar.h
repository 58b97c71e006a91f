// Scalar element access shared by the CPU kernels: float32 and bfloat16 (stored as uint16_t)
// read and written as float, with torch's rounding (nearest even; NaN stays a quiet NaN).
// build.py hashes this header with every source beside it, so a change rebuilds both.
#pragma once

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

}  // namespace radixserve_cpu
