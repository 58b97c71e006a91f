// Absorbed MLA decode over the latent KV pool for the CPU: every query head of a row attends
// the same latent rows (one KV head of width d = kv_lora_rank + qk_rope_head_dim, 576 at
// DeepSeek's shapes), whose first dv = kv_lora_rank values are the values. Each key row is
// read from its pool slot once per block of heads, widened to float32 once, and scored against
// every head of the block; the value pass reads the same rows' first dv columns.
//
// Plain C++ with OpenMP and no torch headers, as paged_attention.cpp (whose one-width entries
// this does not touch); the Python side is mla_decode.py. Row r of the `nrows` query rows:
// q[r] is [heads, d]; it attends keys 0 .. kv_len[r]-1 of request kv_row[r], whose slots are
// slots[kv_row[r] * slots_stride + j]; out[r] is [heads, dv]. Each (row, head) is computed
// alone, in a fixed order, whatever else is in the call (batch-invariant).

#include <omp.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "scalar.h"

namespace {

using namespace radixserve_cpu;

struct MlaShape {
  int64_t nrows, heads, d, dv;
  int64_t q_stride;      // elements between query rows (heads * d when contiguous)
  int64_t kv_stride;     // elements between pool slots (d for the latent pool)
  int64_t slots_stride;  // elements between rows of the slot table
  float scale;
};

constexpr int64_t kMaxBlock = 16;  // heads per work item: q and acc of a block stay in L1/L2

// Per-thread scratch: the block's scaled queries, one widened key row, scores, accumulators.
struct Scratch {
  std::vector<float> qf, kf, scores, acc;
  Scratch(const MlaShape& s, int64_t max_len)
      : qf(kMaxBlock * s.d), kf(s.d), scores(kMaxBlock * max_len), acc(kMaxBlock * s.dv) {}
};

template <typename T>
inline void widen(const T* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = load(src, i);
}

// Heads [h0, h0 + nh) of one row over its `len` keys.
template <typename T>
void attend_block(const T* q, const T* kv, const int64_t* slots, int64_t len, T* out,
                  const MlaShape& s, int64_t h0, int64_t nh, Scratch& w) {
  const int64_t d = s.d, dv = s.dv;
  float* qf = w.qf.data();
  float* kf = w.kf.data();
  float* scores = w.scores.data();
  float* acc = w.acc.data();
  for (int64_t g = 0; g < nh; ++g) {
    const T* qg = q + (h0 + g) * d;
    float* qd = qf + g * d;
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) qd[i] = load(qg, i) * s.scale;
  }
  for (int64_t j = 0; j < len; ++j) {
    widen(kv + slots[j] * s.kv_stride, kf, d);
    for (int64_t g = 0; g < nh; ++g) {
      const float* qd = qf + g * d;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < d; ++i) dot += qd[i] * kf[i];
      scores[g * len + j] = dot;
    }
  }
  float inv[kMaxBlock];
  for (int64_t g = 0; g < nh; ++g) inv[g] = 1.f / exp_shifted(scores + g * len, len);
  std::memset(acc, 0, sizeof(float) * nh * dv);
  for (int64_t j = 0; j < len; ++j) {
    widen(kv + slots[j] * s.kv_stride, kf, dv);
    for (int64_t g = 0; g < nh; ++g) {
      const float p = scores[g * len + j];
      float* ag = acc + g * dv;
#pragma omp simd
      for (int64_t i = 0; i < dv; ++i) ag[i] += p * kf[i];
    }
  }
  for (int64_t g = 0; g < nh; ++g) {
    T* og = out + (h0 + g) * dv;
    const float* ag = acc + g * dv;
    for (int64_t i = 0; i < dv; ++i) store(og, i, ag[i] * inv[g]);
  }
}

// Heads per work item: small enough that the rows × blocks items keep every thread busy
// (a decode of one request with 16 heads on 2 threads: 2 blocks of 8), at most kMaxBlock.
// The block size changes only which thread computes a head, never its arithmetic.
inline int64_t head_block(const MlaShape& s, int num_threads) {
  const int64_t per_row = (num_threads + s.nrows - 1) / s.nrows;
  int64_t block = (s.heads + per_row - 1) / per_row;
  if (block > kMaxBlock) block = kMaxBlock;
  return block < 1 ? 1 : block;
}

template <typename T>
void attend(const void* q, const void* kv, const int64_t* slots, const int64_t* kv_row,
            const int64_t* kv_len, void* out, const MlaShape& s, int num_threads) {
  auto qt = static_cast<const T*>(q);
  auto kt = static_cast<const T*>(kv);
  auto ot = static_cast<T*>(out);
  int64_t max_len = 1;
  for (int64_t r = 0; r < s.nrows; ++r) max_len = kv_len[r] > max_len ? kv_len[r] : max_len;
  const int64_t block = head_block(s, num_threads);
  const int64_t blocks = (s.heads + block - 1) / block;
#pragma omp parallel num_threads(num_threads)
  {
    Scratch w(s, max_len);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < s.nrows * blocks; ++it) {
      const int64_t r = it / blocks, h0 = (it % blocks) * block;
      const int64_t nh = s.heads - h0 < block ? s.heads - h0 : block;
      attend_block<T>(qt + r * s.q_stride, kt, slots + kv_row[r] * s.slots_stride, kv_len[r],
                      ot + r * s.heads * s.dv, s, h0, nh, w);
    }
  }
}

// The entry's return codes (mla_decode.py names them the same).
enum MlaDecodeStatus : int {
  MLA_OK = 0,
  MLA_UNSUPPORTED_DTYPE = -1,  // dtype neither 0 (float32) nor 1 (bfloat16)
  MLA_BAD_SHAPE = -2,          // dv not in [1, d], or a row with no keys
};

}  // namespace

extern "C" {

// dtype: 0 = float32, 1 = bfloat16 (q, the pool and out share it). Returns MLA_OK,
// MLA_UNSUPPORTED_DTYPE or MLA_BAD_SHAPE (writing nothing).
int radixserve_mla_decode(int dtype, const void* q, const void* kv, const int64_t* slots,
                          const int64_t* kv_row, const int64_t* kv_len, void* out,
                          int64_t nrows, int64_t heads, int64_t d, int64_t dv, int64_t q_stride,
                          int64_t kv_stride, int64_t slots_stride, float scale,
                          int num_threads) {
  if (dv < 1 || dv > d) return MLA_BAD_SHAPE;
  for (int64_t r = 0; r < nrows; ++r)
    if (kv_len[r] < 1) return MLA_BAD_SHAPE;
  const MlaShape s{nrows, heads, d, dv, q_stride, kv_stride, slots_stride, scale};
  if (dtype == 0) {
    attend<float>(q, kv, slots, kv_row, kv_len, out, s, num_threads);
  } else if (dtype == 1) {
    attend<uint16_t>(q, kv, slots, kv_row, kv_len, out, s, num_threads);
  } else {
    return MLA_UNSUPPORTED_DTYPE;
  }
  return MLA_OK;
}

}  // extern "C"
