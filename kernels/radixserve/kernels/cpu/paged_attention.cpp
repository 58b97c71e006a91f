// Paged attention over the KV pool for the CPU: each query row reads its keys and values
// straight from the pool's slots (no gathered copy of the history), GQA-grouped (the query
// heads that share a KV head are scored against each key row once it is loaded).
//
// Plain C++ with OpenMP and no torch headers, so it compiles in about a second; the Python
// side (paged_cpu.py) passes data pointers and shapes. The OpenMP runtime is the one torch
// already loaded (same soname), so torch.set_num_threads governs both.
//
// Row r of the `nrows` query rows: q[r] is [Hq, D]; it attends keys 0 .. kv_len[r]-1 of
// request kv_row[r], whose slots are slots[kv_row[r] * slots_stride + j]. A decode is one row
// per request; an extend row j of a request with prefix p has kv_len p + j + 1 (causal).

#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

#include "scalar.h"
#include <vector>

namespace {

using namespace radixserve_cpu;

// One query head's scores in place: exp(x − max), in float32. Returns 1 / their sum.
inline float exp_shifted(float* sg, int64_t len) {
  float m = sg[0];
  for (int64_t j = 1; j < len; ++j) m = sg[j] > m ? sg[j] : m;
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < len; ++j) {
    const float e = std::exp(sg[j] - m);
    sg[j] = e;
    sum += e;
  }
  return 1.f / sum;
}

struct Shape {
  int64_t nrows, hq, hkv, d;
  int64_t q_stride;     // elements between query rows
  int64_t kv_stride;    // elements between pool slots (Hkv * D for a contiguous pool)
  int64_t slots_stride; // elements between rows of the slot table
  float scale;
};

// One (query row, KV head) item: G = Hq / Hkv query heads, keys 0 .. len-1.
// `scores` holds G * len floats, `acc` G * D floats (per-thread scratch).
template <typename T, int64_t kD>
void attend_one(const T* q, const T* k, const T* v, const int64_t* slots, int64_t len,
                T* out, const Shape& s, int64_t h, float* scores, float* acc) {
  const int64_t d = kD > 0 ? kD : s.d;
  const int64_t groups = s.hq / s.hkv;
  std::vector<float> qf_storage;  // only for runtime D; compile-time D keeps q on the stack
  float qf_stack[kD > 0 ? 16 * kD : 1];
  float* qf = qf_stack;
  if (kD <= 0 || groups > 16) {
    qf_storage.resize(groups * d);
    qf = qf_storage.data();
  }
  for (int64_t g = 0; g < groups; ++g) {
    const T* qg = q + (h * groups + g) * d;
    for (int64_t i = 0; i < d; ++i) qf[g * d + i] = load(qg, i) * s.scale;
  }
  // Scores: every query head of the group against each key row, read once from its slot.
  for (int64_t j = 0; j < len; ++j) {
    const T* kr = k + slots[j] * s.kv_stride + h * d;
    for (int64_t g = 0; g < groups; ++g) {
      const float* qg = qf + g * d;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < d; ++i) dot += qg[i] * load(kr, i);
      scores[g * len + j] = dot;
    }
  }
  // Softmax per query head, in float32.
  float inv_sum[16];
  std::vector<float> inv_storage;
  float* inv = inv_sum;
  if (groups > 16) {
    inv_storage.resize(groups);
    inv = inv_storage.data();
  }
  for (int64_t g = 0; g < groups; ++g) {
    inv[g] = exp_shifted(scores + g * len, len);
  }
  // Weighted sum of the value rows.
  std::memset(acc, 0, sizeof(float) * groups * d);
  for (int64_t j = 0; j < len; ++j) {
    const T* vr = v + slots[j] * s.kv_stride + h * d;
    for (int64_t g = 0; g < groups; ++g) {
      const float p = scores[g * len + j];
      float* ag = acc + g * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) ag[i] += p * load(vr, i);
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    T* og = out + (h * groups + g) * d;
    for (int64_t i = 0; i < d; ++i) store(og, i, acc[g * d + i] * inv[g]);
  }
}


#if defined(__AVX512F__)
// AVX-512 path for D = 16 * NC and G query heads per KV head, both known at compile time so
// q and the output accumulators stay in registers.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline void store16(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
inline void store16(uint16_t* p, __m512 x) {
  alignas(64) float tmp[16];
  _mm512_store_ps(tmp, x);
  for (int i = 0; i < 16; ++i) p[i] = f32_to_bf16(tmp[i]);
}

constexpr int64_t kPrefetch = 8;  // key rows ahead: slots are scattered, so hint them early

// The 16 horizontal sums of v[0..15] as one vector (lane i = sum of v[i]'s lanes): pairwise
// unpacks and 128-bit lane shuffles, ~3 instructions per sum instead of a full reduction each.
inline __m512 hsum16(const __m512* v) {
  __m512 t[8];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  __m512 u[4];
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: the lane's sums of 4 consecutive v
    const __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  __m512 x[2];
  for (int i = 0; i < 2; ++i)  // sum the 128-bit lanes pairwise
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], 0x88),
                       _mm512_shuffle_f32x4(x[0], x[1], 0xDD));
}

template <typename T, int G, int NC>
void attend_one_avx512(const T* q, const T* k, const T* v, const int64_t* slots, int64_t len,
                       T* out, const Shape& s, int64_t h, float* scores) {
  constexpr int64_t d = 16 * NC;
  const __m512 scale = _mm512_set1_ps(s.scale);
  __m512 qv[G][NC];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < NC; ++c)
      qv[g][c] = _mm512_mul_ps(load16(q + (h * G + g) * d + 16 * c), scale);
  const int64_t off = h * d;
  // Scores of key row j for every head of the group: the lane-wise products of q and k,
  // summed across lanes 16 keys at a time (hsum16), one by one for the tail.
  auto partial = [&](int64_t j, __m512* part, int64_t stride) {
    if (j + kPrefetch < len) {
      const char* nk = reinterpret_cast<const char*>(k + slots[j + kPrefetch] * s.kv_stride + off);
      for (int64_t b = 0; b < d * int64_t(sizeof(T)); b += 64) _mm_prefetch(nk + b, _MM_HINT_T0);
    }
    const T* kr = k + slots[j] * s.kv_stride + off;
    __m512 kv[NC];
    for (int c = 0; c < NC; ++c) kv[c] = load16(kr + 16 * c);
    for (int g = 0; g < G; ++g) {
      __m512 acc = _mm512_mul_ps(qv[g][0], kv[0]);
      for (int c = 1; c < NC; ++c) acc = _mm512_fmadd_ps(qv[g][c], kv[c], acc);
      part[g * stride] = acc;
    }
  };
  int64_t j = 0;
  for (; j + 16 <= len; j += 16) {
    __m512 part[G][16];
    for (int jj = 0; jj < 16; ++jj) partial(j + jj, &part[0][jj], 16);
    for (int g = 0; g < G; ++g) _mm512_storeu_ps(scores + g * len + j, hsum16(part[g]));
  }
  for (; j < len; ++j) {
    __m512 part[G];
    partial(j, part, 1);
    for (int g = 0; g < G; ++g) scores[g * len + j] = _mm512_reduce_add_ps(part[g]);
  }
  float inv[G];
  for (int g = 0; g < G; ++g) {
    inv[g] = exp_shifted(scores + g * len, len);
  }
  __m512 acc[G][NC];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < NC; ++c) acc[g][c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < len; ++j) {
    if (j + kPrefetch < len) {
      const char* nv = reinterpret_cast<const char*>(v + slots[j + kPrefetch] * s.kv_stride + off);
      for (int64_t b = 0; b < d * int64_t(sizeof(T)); b += 64) _mm_prefetch(nv + b, _MM_HINT_T0);
    }
    const T* vr = v + slots[j] * s.kv_stride + off;
    __m512 vv[NC];
    for (int c = 0; c < NC; ++c) vv[c] = load16(vr + 16 * c);
    for (int g = 0; g < G; ++g) {
      const __m512 p = _mm512_set1_ps(scores[g * len + j]);
      for (int c = 0; c < NC; ++c) acc[g][c] = _mm512_fmadd_ps(p, vv[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g) {
    const __m512 iv = _mm512_set1_ps(inv[g]);
    for (int c = 0; c < NC; ++c)
      store16(out + (h * G + g) * d + 16 * c, _mm512_mul_ps(acc[g][c], iv));
  }
}

template <typename T, int NC>
bool attend_one_fast(int64_t groups, const T* q, const T* k, const T* v, const int64_t* slots,
                     int64_t len, T* out, const Shape& s, int64_t h, float* scores) {
  switch (groups) {
    case 1: attend_one_avx512<T, 1, NC>(q, k, v, slots, len, out, s, h, scores); return true;
    case 2: attend_one_avx512<T, 2, NC>(q, k, v, slots, len, out, s, h, scores); return true;
    case 3: attend_one_avx512<T, 3, NC>(q, k, v, slots, len, out, s, h, scores); return true;
    case 4: attend_one_avx512<T, 4, NC>(q, k, v, slots, len, out, s, h, scores); return true;
    case 8: attend_one_avx512<T, 8, NC>(q, k, v, slots, len, out, s, h, scores); return true;
    default: return false;
  }
}
#endif

template <typename T, int64_t kD>
void attend(const T* q, const T* k, const T* v, const int64_t* slots, const int64_t* kv_row,
            const int64_t* kv_len, T* out, const Shape& s, int num_threads) {
  int64_t max_len = 1;
  for (int64_t r = 0; r < s.nrows; ++r) max_len = kv_len[r] > max_len ? kv_len[r] : max_len;
  const int64_t groups = s.hq / s.hkv;
  const int64_t items = s.nrows * s.hkv;
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<float> scores(groups * max_len);
    std::vector<float> acc(groups * s.d);
#pragma omp for schedule(dynamic, 4)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t r = it / s.hkv, h = it % s.hkv;
      const T* qr = q + r * s.q_stride;
      const int64_t* sr = slots + kv_row[r] * s.slots_stride;
      T* orow = out + r * s.hq * s.d;
#if defined(__AVX512F__)
      if constexpr (kD == 64 || kD == 128) {
        if (attend_one_fast<T, kD / 16>(groups, qr, k, v, sr, kv_len[r], orow, s, h,
                                        scores.data()))
          continue;
      }
#endif
      attend_one<T, kD>(qr, k, v, sr, kv_len[r], orow, s, h, scores.data(), acc.data());
    }
  }
}

template <typename T>
void dispatch(const void* q, const void* k, const void* v, const int64_t* slots,
              const int64_t* kv_row, const int64_t* kv_len, void* out, const Shape& s,
              int num_threads) {
  auto qt = static_cast<const T*>(q);
  auto kt = static_cast<const T*>(k);
  auto vt = static_cast<const T*>(v);
  auto ot = static_cast<T*>(out);
  if (s.d == 64) {
    attend<T, 64>(qt, kt, vt, slots, kv_row, kv_len, ot, s, num_threads);
  } else if (s.d == 128) {
    attend<T, 128>(qt, kt, vt, slots, kv_row, kv_len, ot, s, num_threads);
  } else {
    attend<T, 0>(qt, kt, vt, slots, kv_row, kv_len, ot, s, num_threads);
  }
}

}  // namespace

extern "C" {

// dtype: 0 = float32, 1 = bfloat16 (q, k, v and out share it). Returns 0, or -1 for an
// unsupported dtype.
int radixserve_paged_attention(int dtype, const void* q, const void* k, const void* v,
                               const int64_t* slots, const int64_t* kv_row,
                               const int64_t* kv_len, void* out, int64_t nrows, int64_t hq,
                               int64_t hkv, int64_t d, int64_t q_stride, int64_t kv_stride,
                               int64_t slots_stride, float scale, int num_threads) {
  const Shape s{nrows, hq, hkv, d, q_stride, kv_stride, slots_stride, scale};
  if (dtype == 0) {
    dispatch<float>(q, k, v, slots, kv_row, kv_len, out, s, num_threads);
  } else if (dtype == 1) {
    dispatch<uint16_t>(q, k, v, slots, kv_row, kv_len, out, s, num_threads);
  } else {
    return -1;
  }
  return 0;
}

}  // extern "C"
