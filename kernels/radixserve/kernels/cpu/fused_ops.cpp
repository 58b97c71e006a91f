// Fused element-wise ops of the decoder layer for the CPU: residual add + RMSNorm, SiLU-and-mul,
// and the rotary embedding (rotate-half form) applied in place to q and k.
//
// Each replaces a chain of 5-10 PyTorch ops (each a pass over the tensor, a temporary and a
// dispatch) with one pass per row. The roundings are PyTorch's: in bfloat16 every
// intermediate the PyTorch path rounds to bfloat16 (the residual sum, the normalised row before
// the weight, silu(gate), each rotary product) is rounded here at the same point, so results
// differ from the PyTorch path only by float32 reduction order and exp/rsqrt approximations.
//
// Plain C++ with OpenMP and no torch headers (built by build.py); dtype 0 = float32,
// 1 = bfloat16. Rows may be strided (views into a fused projection's output); the last
// dimension is contiguous. Every function returns 0, or -1 for an unsupported dtype.

#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

#include "scalar.h"

namespace {

using namespace radixserve_cpu;
// The value `x` takes once stored in T (PyTorch rounds every bfloat16 op's result).
inline float round_to(const float*, float x) { return x; }
inline float round_to(const uint16_t*, float x) { return bf16_to_f32(f32_to_bf16(x)); }

#if defined(__AVX512F__)
// 16 lanes at a time where the CPU has AVX-512; a scalar loop takes each row's tail. Stores
// round to nearest even, as the scalar store (and torch) does.
constexpr int64_t kLanes = 16;
extern "C" __m512 _ZGVeN16v_expf(__m512);  // glibc's libmvec (linked with -lmvec)
inline __m512 vload(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 vload(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline void vstore(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
inline __m256i to_bf16(__m512 x) {
#if defined(__AVX512BF16__)
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
#else
  // Round to nearest even by integer arithmetic; NaN lanes become a quiet NaN.
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
#endif
}
inline void vstore(uint16_t* p, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(x));
}
inline __m512 vround(const float*, __m512 x) { return x; }
inline __m512 vround(const uint16_t*, __m512 x) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16(x)), 16));
}
inline __m512 vexp(__m512 x) { return _ZGVeN16v_expf(x); }
#else
constexpr int64_t kLanes = 0;
#endif

// Below this many elements a single thread is faster than waking the team.
constexpr int64_t kParallelMin = 1 << 15;

// Row r: sum_out[r] = round(x[r] + res[r]) and the sum of its squares (or x[r]'s own, without
// a residual). Returns the sum of squares; `src` is set to the row the norm reads.
template <typename T>
inline float add_rows(const T* xr, const T* rr, T* srow, int64_t h, const T** src) {
  float sq = 0.f;
  int64_t i = 0;
  *src = rr != nullptr ? srow : xr;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; i + kLanes <= h; i += kLanes) {
    __m512 v = vload(xr + i);
    if (rr != nullptr) {
      v = vround(srow, _mm512_add_ps(v, vload(rr + i)));
      vstore(srow + i, v);
    }
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  sq = _mm512_reduce_add_ps(acc);
#endif
  for (; i < h; ++i) {
    float v = load(xr, i);
    if (rr != nullptr) {
      v = round_to(srow, v + load(rr, i));
      store(srow, i, v);
    }
    sq += v * v;
  }
  return sq;
}

template <typename T>
void rmsnorm(const T* x, const T* res, const T* w, T* out, T* sum_out, int64_t rows, int64_t h,
             int64_t x_stride, int64_t r_stride, float eps, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static) if (rows * h >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = nullptr;
    const T* rr = res != nullptr ? res + r * r_stride : nullptr;
    const float sq = add_rows(x + r * x_stride, rr, sum_out + r * h, h, &src);
    const float inv = 1.f / std::sqrt(sq / static_cast<float>(h) + eps);
    T* orow = out + r * h;
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 vinv = _mm512_set1_ps(inv);
    for (; i + kLanes <= h; i += kLanes) {
      const __m512 normed = vround(orow, _mm512_mul_ps(vload(src + i), vinv));
      vstore(orow + i, _mm512_mul_ps(vload(w + i), normed));
    }
#endif
    for (; i < h; ++i) store(orow, i, load(w, i) * round_to(orow, load(src, i) * inv));
  }
}

template <typename T>
void silu_and_mul(const T* x, T* out, int64_t rows, int64_t d, int64_t x_stride, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static) if (rows * d >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = x + r * x_stride;
    const T* up = gate + d;
    T* orow = out + r * d;
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.f);
    for (; i + kLanes <= d; i += kLanes) {
      const __m512 g = vload(gate + i);
      const __m512 e = vexp(_mm512_sub_ps(_mm512_setzero_ps(), g));
      const __m512 act = vround(orow, _mm512_div_ps(g, _mm512_add_ps(one, e)));
      vstore(orow + i, _mm512_mul_ps(act, vload(up + i)));
    }
#endif
    for (; i < d; ++i) {
      const float g = load(gate, i);
      store(orow, i, round_to(orow, g / (1.f + std::exp(-g))) * load(up, i));
    }
  }
}

// One head's rotate-half rotary in place: x[i] = x[i]·cos[i] + rot(x)[i]·sin[i] with
// rot(x) = (−x[half:], x[:half]); each product and the sum rounded as PyTorch rounds them.
template <typename T>
inline void rotate_head(T* x, const T* cos, const T* sin, int64_t half) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + kLanes <= half; i += kLanes) {
    const __m512 a = vload(x + i), b = vload(x + i + half);
    const __m512 nb = _mm512_sub_ps(_mm512_setzero_ps(), b);
    const __m512 lo = _mm512_add_ps(vround(x, _mm512_mul_ps(a, vload(cos + i))),
                                    vround(x, _mm512_mul_ps(nb, vload(sin + i))));
    const __m512 hi = _mm512_add_ps(vround(x, _mm512_mul_ps(b, vload(cos + i + half))),
                                    vround(x, _mm512_mul_ps(a, vload(sin + i + half))));
    vstore(x + i, lo);
    vstore(x + i + half, hi);
  }
#endif
  for (; i < half; ++i) {
    const float a = load(x, i), b = load(x, i + half);
    const float lo = round_to(x, a * load(cos, i)) + round_to(x, -b * load(sin, i));
    const float hi = round_to(x, b * load(cos, i + half)) + round_to(x, a * load(sin, i + half));
    store(x, i, lo);
    store(x, i + half, hi);
  }
}

template <typename T>
void rotary(T* q, T* k, const T* cos, const T* sin, int64_t tokens, int64_t hq, int64_t hkv,
            int64_t d, int64_t q_stride, int64_t k_stride, int64_t cs_stride, int nt) {
  const int64_t half = d / 2;
#pragma omp parallel for num_threads(nt) schedule(static) \
    if (tokens * (hq + hkv) * d >= kParallelMin)
  for (int64_t t = 0; t < tokens; ++t) {
    const T* c = cos + t * cs_stride;
    const T* s = sin + t * cs_stride;
    for (int64_t h = 0; h < hq; ++h) rotate_head(q + t * q_stride + h * d, c, s, half);
    for (int64_t h = 0; h < hkv; ++h) rotate_head(k + t * k_stride + h * d, c, s, half);
  }
}

// Row r of float32 logits: the first maximum's index and −log Σ exp(x − max) (its log-prob).
void greedy(const float* logits, int64_t rows, int64_t vocab, int64_t stride, int64_t* ids,
            float* logprobs, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static) if (rows * vocab >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * stride;
    float best = x[0];
    int64_t arg = 0;
    int64_t i = 1;
#if defined(__AVX512F__)
    if (vocab >= 2 * kLanes) {
      // per-lane maxima with their first index, then the lowest index among equal maxima
      __m512 vbest = _mm512_loadu_ps(x);
      __m512i varg = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      __m512i vidx = varg;
      const __m512i step = _mm512_set1_epi32(kLanes);
      for (i = kLanes; i + kLanes <= vocab; i += kLanes) {
        vidx = _mm512_add_epi32(vidx, step);
        const __m512 v = _mm512_loadu_ps(x + i);
        const __mmask16 better = _mm512_cmp_ps_mask(v, vbest, _CMP_GT_OQ);
        vbest = _mm512_mask_blend_ps(better, vbest, v);
        varg = _mm512_mask_blend_epi32(better, varg, vidx);
      }
      alignas(64) float lane_best[kLanes];
      alignas(64) int32_t lane_arg[kLanes];
      _mm512_store_ps(lane_best, vbest);
      _mm512_store_si512(lane_arg, varg);
      best = lane_best[0];
      arg = lane_arg[0];
      for (int l = 1; l < kLanes; ++l) {
        if (lane_best[l] > best || (lane_best[l] == best && lane_arg[l] < arg)) {
          best = lane_best[l];
          arg = lane_arg[l];
        }
      }
    }
#endif
    for (; i < vocab; ++i) {
      if (x[i] > best) {
        best = x[i];
        arg = i;
      }
    }
    float sum = 0.f;
    int64_t j = 0;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    const __m512 vmax = _mm512_set1_ps(best);
    for (; j + kLanes <= vocab; j += kLanes)
      acc = _mm512_add_ps(acc, vexp(_mm512_sub_ps(_mm512_loadu_ps(x + j), vmax)));
    sum = _mm512_reduce_add_ps(acc);
#endif
    for (; j < vocab; ++j) sum += std::exp(x[j] - best);
    ids[r] = arg;
    logprobs[r] = -std::log(sum);
  }
}

}  // namespace

extern "C" {

// Greedy choice of every row of float32 logits [rows, vocab] (rows `stride` apart): ids[r]
// the first maximum (as torch's argmax), logprobs[r] its log-softmax value.
int radixserve_greedy(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
                      int64_t* ids, float* logprobs, int num_threads) {
  greedy(logits, rows, vocab, stride, ids, logprobs, num_threads);
  return 0;
}


// out[r] = weight · norm(x[r] + residual[r]) and sum_out[r] = x[r] + residual[r]; without a
// residual (null), out[r] = weight · norm(x[r]) and sum_out is unused. out and sum_out are
// contiguous [rows, h].
int radixserve_rmsnorm(int dtype, const void* x, const void* residual, const void* weight,
                       void* out, void* sum_out, int64_t rows, int64_t h, int64_t x_stride,
                       int64_t r_stride, float eps, int num_threads) {
  if (dtype == 0) {
    rmsnorm(static_cast<const float*>(x), static_cast<const float*>(residual),
            static_cast<const float*>(weight), static_cast<float*>(out),
            static_cast<float*>(sum_out), rows, h, x_stride, r_stride, eps, num_threads);
  } else if (dtype == 1) {
    rmsnorm(static_cast<const uint16_t*>(x), static_cast<const uint16_t*>(residual),
            static_cast<const uint16_t*>(weight), static_cast<uint16_t*>(out),
            static_cast<uint16_t*>(sum_out), rows, h, x_stride, r_stride, eps, num_threads);
  } else {
    return -1;
  }
  return 0;
}

// out[r] = silu(x[r, :d]) · x[r, d:2d]; out is contiguous [rows, d].
int radixserve_silu_and_mul(int dtype, const void* x, void* out, int64_t rows, int64_t d,
                            int64_t x_stride, int num_threads) {
  if (dtype == 0) {
    silu_and_mul(static_cast<const float*>(x), static_cast<float*>(out), rows, d, x_stride,
                 num_threads);
  } else if (dtype == 1) {
    silu_and_mul(static_cast<const uint16_t*>(x), static_cast<uint16_t*>(out), rows, d,
                 x_stride, num_threads);
  } else {
    return -1;
  }
  return 0;
}

// In place: q [tokens, hq, d] and k [tokens, hkv, d] (heads contiguous within a token, tokens
// strided) rotated by the cos/sin rows [tokens, d] of their positions.
int radixserve_rotary(int dtype, void* q, void* k, const void* cos, const void* sin,
                      int64_t tokens, int64_t hq, int64_t hkv, int64_t d, int64_t q_stride,
                      int64_t k_stride, int64_t cs_stride, int num_threads) {
  if (dtype == 0) {
    rotary(static_cast<float*>(q), static_cast<float*>(k), static_cast<const float*>(cos),
           static_cast<const float*>(sin), tokens, hq, hkv, d, q_stride, k_stride, cs_stride,
           num_threads);
  } else if (dtype == 1) {
    rotary(static_cast<uint16_t*>(q), static_cast<uint16_t*>(k),
           static_cast<const uint16_t*>(cos), static_cast<const uint16_t*>(sin), tokens, hq,
           hkv, d, q_stride, k_stride, cs_stride, num_threads);
  } else {
    return -1;
  }
  return 0;
}

}  // extern "C"
