// Batch-invariant projections y = x · Wᵀ (+ b) for CPUs without the AMX kernel: every output
// element is one fixed sequence of float32 operations over K, whatever the number of rows in
// the call, the row's place among them, or the thread that computes it.
//
// Why: oneDNN and MKL pick their blocking (and so their summation order) by the batch's shape,
// so the same token's projection differed in its last bf16 bit between a prefill of 34 rows
// and a decode of one (measured in docs/determinism.md). Through 30 layers those bits moved
// SmolLM2's logits by up to 0.1, enough to flip a greedy near-tie: a cache hit, a batch or a
// chunk boundary changed the answer. This kernel is what --enable-deterministic-inference
// uses where the AMX kernel (also row-invariant) does not run, and what computes the LM head's
// float32 logits there.
//
// Packed layout (radixserve_rowwise_pack): [ceil(N/16)][ceil(K/2)][16][2] bf16, zero-padded:
// for each block of 16 output columns and each pair of K positions, the 16 columns' two
// weights. That is VDPBF16PS's operand: one instruction adds x[2p]·w[2p] and x[2p+1]·w[2p+1]
// to 16 column sums. Each thread takes whole column blocks (one forward stream of weights);
// rows go 8 at a time against each block, so a weight is read from memory once per call.
// Without AVX512-BF16 the same pairs go through two float32 FMAs; without AVX-512, AVX2 FMAs
// 8 columns wide, or scalar code, in that order. Each build is invariant on its own; different builds differ in the last
// bits (one binary is built per CPU, build.py).

#include <omp.h>

#include <cmath>
#include <cstdint>

#include "scalar.h"
#include "gemm_problem.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace {

using namespace radixserve_cpu;

constexpr int64_t kCols = 16;  // output columns per packed block
constexpr int64_t kRows = 8;   // x rows multiplied against a block at once

using Problem = GemmProblem;

inline int64_t pairs(int64_t k) { return (k + 1) / 2; }

// x[r][2p], x[r][2p + 1] as one 32-bit word; `last_odd`: the pair past an odd K's end,
// whose second element is 0 (as in the packed weight).
inline uint32_t x_pair(const Problem& p, int64_t r, int64_t kp, bool last_odd = false) {
  const uint16_t* xr = p.x + r * p.ldx + 2 * kp;
  if (last_odd) return xr[0];
  uint32_t v;
  std::memcpy(&v, xr, sizeof v);
  return v;
}

// Row r's 16 sums of block nb (cols [16nb, 16nb + 16) ∩ [0, n)) plus bias, to the output.
void write_row(const Problem& p, int64_t r, int64_t nb, const float* sums) {
  const int64_t c0 = nb * kCols;
  const int64_t cols = p.n - c0 < kCols ? p.n - c0 : kCols;
  for (int64_t c = 0; c < cols; ++c) {
    const float y = sums[c] + (p.bias != nullptr ? bf16_to_f32(p.bias[c0 + c]) : 0.f);
    if (p.out_f32)
      static_cast<float*>(p.out)[r * p.ldo + c0 + c] = y;
    else
      static_cast<uint16_t*>(p.out)[r * p.ldo + c0 + c] = f32_to_bf16(y);
  }
}

#if defined(__AVX512F__)

inline __m512 pair_step(__m512 acc, uint32_t xp, __m512i w) {
#if defined(__AVX512BF16__)
  return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(static_cast<int>(xp)), (__m512bh)w);
#else
  // Same pair order as VDPBF16PS (odd element first), each product exact in float32.
  const __m512 w_even = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  const __m512 w_odd = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(-65536)));
  acc = _mm512_fmadd_ps(_mm512_set1_ps(bf16_to_f32(static_cast<uint16_t>(xp >> 16))), w_odd, acc);
  return _mm512_fmadd_ps(_mm512_set1_ps(bf16_to_f32(static_cast<uint16_t>(xp))), w_even, acc);
#endif
}

// Rows [r0, r0 + R) against blocks nb .. nb + B - 1 (B = 1 or 2: two blocks share each x
// broadcast): each row's accumulator of each block sees the pairs in K order.
template <int R, int B = 1>
void rows_block(const Problem& p, int64_t r0, int64_t nb) {
  const int64_t kp_n = pairs(p.k), full = p.k / 2, block = kp_n * 2 * kCols;
  const uint16_t* wb = p.wp + nb * block;
  __m512 acc[B][R];
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < R; ++i) acc[b][i] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < kp_n; ++kp) {
    __m512i w[B];
    for (int b = 0; b < B; ++b) w[b] = _mm512_loadu_si512(wb + b * block + kp * 2 * kCols);
    for (int i = 0; i < R; ++i) {
      const uint32_t xp = x_pair(p, r0 + i, kp, kp == full);
      for (int b = 0; b < B; ++b) acc[b][i] = pair_step(acc[b][i], xp, w[b]);
    }
  }
  alignas(64) float sums[kCols];
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < R; ++i) {
      _mm512_store_ps(sums, acc[b][i]);
      write_row(p, r0 + i, nb + b, sums);
    }
}

#elif defined(__AVX2__) && defined(__FMA__)

// One half (8 columns) of a block: the pairs' odd elements, then their even ones, each a
// float32 FMA, the scalar code's order.
inline __m256 half_step(__m256 acc, __m256 xo, __m256 xe, __m256i w) {
  const __m256 w_even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  const __m256 w_odd = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(-65536)));
  return _mm256_fmadd_ps(xe, w_even, _mm256_fmadd_ps(xo, w_odd, acc));
}

// AVX2: a block's 16 columns as two 8-wide halves; each row's accumulators see the pairs in K
// order, as in the other builds.
template <int R, int B = 1>
void rows_block(const Problem& p, int64_t r0, int64_t nb) {
  for (int b = 1; b < B; ++b) rows_block<R>(p, r0, nb + b);
  const int64_t kp_n = pairs(p.k), full = p.k / 2;
  const uint16_t* wb = p.wp + nb * kp_n * 2 * kCols;
  __m256 lo[R], hi[R];
  for (int i = 0; i < R; ++i) lo[i] = hi[i] = _mm256_setzero_ps();
  for (int64_t kp = 0; kp < kp_n; ++kp) {
    const uint16_t* w = wb + kp * 2 * kCols;
    const __m256i w_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    const __m256i w_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + kCols));
    for (int i = 0; i < R; ++i) {
      const uint32_t xp = x_pair(p, r0 + i, kp, kp == full);
      const __m256 xo = _mm256_set1_ps(bf16_to_f32(static_cast<uint16_t>(xp >> 16)));
      const __m256 xe = _mm256_set1_ps(bf16_to_f32(static_cast<uint16_t>(xp)));
      lo[i] = half_step(lo[i], xo, xe, w_lo);
      hi[i] = half_step(hi[i], xo, xe, w_hi);
    }
  }
  alignas(32) float sums[kCols];
  for (int i = 0; i < R; ++i) {
    _mm256_store_ps(sums, lo[i]);
    _mm256_store_ps(sums + 8, hi[i]);
    write_row(p, r0 + i, nb, sums);
  }
}

#else

template <int R, int B = 1>
void rows_block(const Problem& p, int64_t r0, int64_t nb) {
  for (int b = 1; b < B; ++b) rows_block<R>(p, r0, nb + b);
  const int64_t kp_n = pairs(p.k);
  const uint16_t* wb = p.wp + nb * kp_n * 2 * kCols;
  float acc[R][kCols] = {};
  for (int64_t kp = 0; kp < kp_n; ++kp) {
    const uint16_t* w = wb + kp * 2 * kCols;
    for (int i = 0; i < R; ++i) {
      const uint32_t xp = x_pair(p, r0 + i, kp, 2 * kp + 1 == p.k);
      const float xo = bf16_to_f32(static_cast<uint16_t>(xp >> 16));
      const float xe = bf16_to_f32(static_cast<uint16_t>(xp));
      // std::fma, not `+=` of a product: under -ffast-math the compiler may contract or
      // reorder the latter differently per instantiation (per row count), which broke the
      // rows' invariance; a fused multiply-add is one correctly rounded step either way.
      for (int64_t c = 0; c < kCols; ++c) {
        acc[i][c] = std::fma(xo, bf16_to_f32(w[2 * c + 1]), acc[i][c]);
        acc[i][c] = std::fma(xe, bf16_to_f32(w[2 * c]), acc[i][c]);
      }
    }
  }
  for (int i = 0; i < R; ++i) write_row(p, r0 + i, nb, acc[i]);
}

#endif

template <int B>
void tail_block(const Problem& p, int64_t r0, int64_t rows, int64_t nb) {
  switch (rows) {
    case 1: rows_block<1, B>(p, r0, nb); break;
    case 2: rows_block<2, B>(p, r0, nb); break;
    case 3: rows_block<3, B>(p, r0, nb); break;
    case 4: rows_block<4, B>(p, r0, nb); break;
    case 5: rows_block<5, B>(p, r0, nb); break;
    case 6: rows_block<6, B>(p, r0, nb); break;
    case 7: rows_block<7, B>(p, r0, nb); break;
    default: break;
  }
}

// Column blocks go two by two to the threads (the last alone where their count is odd).
template <int B>
void blocks_at(const Problem& p, int64_t nb) {
  int64_t r0 = 0;
  for (; r0 + kRows <= p.m; r0 += kRows) rows_block<kRows, B>(p, r0, nb);
  tail_block<B>(p, r0, p.m - r0, nb);
}

void run(const Problem& p, int num_threads) {
  const int64_t blocks = (p.n + kCols - 1) / kCols, twos = (blocks + 1) / 2;
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t t = 0; t < twos; ++t) {
    if (2 * t + 1 < blocks)
      blocks_at<2>(p, 2 * t);
    else
      blocks_at<1>(p, 2 * t);
  }
}

}  // namespace

extern "C" {

// W [n, k] bf16 (row stride ldw) → out, ceil(n/16) · ceil(k/2) · 32 bf16 values.
int radixserve_rowwise_pack(const uint16_t* w, int64_t n, int64_t k, int64_t ldw, uint16_t* out,
                            int num_threads) {
  if (n <= 0 || k <= 0 || ldw < k) return -1;
  const int64_t blocks = (n + kCols - 1) / kCols, kp_n = pairs(k);
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t nb = 0; nb < blocks; ++nb) {
    uint16_t* ob = out + nb * kp_n * 2 * kCols;
    for (int64_t kp = 0; kp < kp_n; ++kp)
      for (int64_t c = 0; c < kCols; ++c)
        for (int64_t e = 0; e < 2; ++e) {
          const int64_t row = nb * kCols + c, col = 2 * kp + e;
          ob[(kp * kCols + c) * 2 + e] = row < n && col < k ? w[row * ldw + col] : 0;
        }
  }
  return 0;
}

// y [m, n] (row stride ldo; bf16, or float32 where out_f32) = x [m, k] · Wᵀ (+ bias).
int radixserve_rowwise_linear(const uint16_t* x, int64_t m, int64_t ldx, const uint16_t* wp,
                              int64_t n, int64_t k, const uint16_t* bias, void* out, int64_t ldo,
                              int out_f32, int num_threads) {
  if (m < 0 || n <= 0 || k <= 0 || ldx < k || ldo < n) return -1;
  const Problem p{x, m, ldx, wp, n, k, bias, out, ldo, out_f32 != 0};
  if (m > 0) run(p, num_threads);
  return 0;
}

}  // extern "C"
