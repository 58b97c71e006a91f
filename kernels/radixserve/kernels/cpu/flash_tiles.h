// The tile routines of the tiled extend attention (flash_extend.h, which says what they
// compute): the scratch of one work item, the staging of queries and K/V rows, the scores of
// a tile (float32 FMA or bf16 VDPBF16PS), the online-softmax step, and the p·v blocks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "scalar.h"

namespace radixserve_cpu {

struct ExtendShape {
  int64_t hq, hkv, d;
  int64_t q_stride;      // elements between query rows
  int64_t kv_stride;     // elements between pool slots
  int64_t slots_stride;  // elements between rows of the slot table
  float scale;
};

#if defined(__AVX512F__)

constexpr int64_t kLanes = 16;     // query rows per item (one zmm of float32)
constexpr int64_t kTileKeys = 48;  // keys per tile: a multiple of each key block (16/12/8/6)
constexpr float kMasked = -1e30f;  // a masked score (finite: the build assumes no infinities)

// exp(x) for x ≤ 0 (a score minus its running max): 2^n·p(f), n = round(x·log2 e), |f| ≤ 1/2,
// p a degree-6 fit of 2^f (float32 accuracy); exactly 1 at 0 and exactly 0 below -87.
inline __m512 exp_nonpositive(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.f), _CMP_GE_OQ);
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_maskz_scalef_ps(live, p, n);
}

// One thread's scratch, 64-byte aligned, for m = 16·G query vectors (vector g·16 + lane is
// query head g of the item's row `lane`) of head dim d.
class TileScratch {
 public:
  TileScratch(int64_t m, int64_t d)
      : buf_(static_cast<float*>(::operator new(bytes(m, d), std::align_val_t(64)))) {
    float* p = buf_;
    q = p, p += m * d;          // the queries, [d (bf16: d/2 pairs)][G][16]
    s = p, p += kTileKeys * m;  // scores, then p [key][m] (bf16: p pairs [key/2][m])
    o = p, p += m * d;          // unnormalised p·v [m][d] (bf16: d in pairing order)
    mx = p, p += m;             // running max per query vector
    sum = p, p += m;            // running sum
    alpha = p, p += m;          // the tile's rescale of o and sum
    kv = p;                     // the tile's K rows, then its V rows (staged or paired)
  }
  ~TileScratch() { ::operator delete(buf_, std::align_val_t(64)); }
  TileScratch(const TileScratch&) = delete;
  TileScratch& operator=(const TileScratch&) = delete;

  float *q, *s, *o, *mx, *sum, *alpha, *kv;

 private:
  static size_t bytes(int64_t m, int64_t d) {
    return sizeof(float) * (2 * m * d + kTileKeys * m + 3 * m + kTileKeys * d);
  }
  float* buf_;
};

inline __m512 load_bf16x16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// A pool row of 16·ND elements as float32 into the tile (the float32 path's staging).
template <int ND>
inline void row_to_f32(const float* src, float* dst) {
  for (int c = 0; c < ND; ++c) _mm512_store_ps(dst + 16 * c, _mm512_loadu_ps(src + 16 * c));
}
template <int ND>
inline void row_to_f32(const uint16_t* src, float* dst) {
  for (int c = 0; c < ND; ++c) _mm512_store_ps(dst + 16 * c, load_bf16x16(src + 16 * c));
}

// ---- Two ways to score a tile: float32 FMA (F32Math), bf16 pairs on VDPBF16PS (Bf16Math)
// F32Math: q as [d][G][16] floats, K rows as floats, one FMA per dim. Bf16Math: q as
// [d/2][G][16] dim pairs, K rows as they are (a row's dim pairs are consecutive words).

struct F32Math {
  static constexpr int64_t steps(int64_t d) { return d; }  // reduction steps of a score
  template <typename T>
  static void stage_q(const T* q, const ExtendShape& s, int64_t row0, int64_t rows, int64_t h,
                      int64_t groups, float* qs) {
    const int64_t d = s.d;
    std::memset(qs, 0, sizeof(float) * d * groups * kLanes);
    for (int64_t lane = 0; lane < rows; ++lane)
      for (int64_t g = 0; g < groups; ++g) {
        const T* src = q + (row0 + lane) * s.q_stride + (h * groups + g) * d;
        for (int64_t i = 0; i < d; ++i) qs[(i * groups + g) * kLanes + lane] = load(src, i);
      }
  }
  template <int ND, typename T>
  static void stage_k(const T* row, float* kt, int64_t j) {
    row_to_f32<ND>(row, kt + j * 16 * ND);
  }
  static constexpr int64_t staged_bytes(int64_t d) { return d * sizeof(float); }
  static __m512 kb(const float* kt, int64_t d, int64_t j, int64_t i) {
    return _mm512_set1_ps(kt[j * d + i]);
  }
  static __m512 dot(__m512 acc, __m512 a, __m512 b) { return _mm512_fmadd_ps(a, b, acc); }
};

#if defined(__AVX512BF16__)
struct Bf16Math {
  static constexpr int64_t steps(int64_t d) { return d / 2; }
  static void stage_q(const uint16_t* q, const ExtendShape& s, int64_t row0, int64_t rows,
                      int64_t h, int64_t groups, float* qs) {
    const int64_t d = s.d;
    uint32_t* out = reinterpret_cast<uint32_t*>(qs);
    std::memset(out, 0, sizeof(uint32_t) * (d / 2) * groups * kLanes);
    for (int64_t lane = 0; lane < rows; ++lane)
      for (int64_t g = 0; g < groups; ++g) {
        const uint16_t* src = q + (row0 + lane) * s.q_stride + (h * groups + g) * d;
        for (int64_t i = 0; i < d / 2; ++i)  // dims 2i, 2i+1 as one word
          std::memcpy(out + (i * groups + g) * kLanes + lane, src + 2 * i, sizeof(uint32_t));
      }
  }
  template <int ND>
  static void stage_k(const uint16_t* row, float* kt, int64_t j) {
    uint16_t* dst = reinterpret_cast<uint16_t*>(kt) + j * 16 * ND;
    for (int c = 0; c < ND; ++c)
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst + 16 * c),
                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16 * c)));
  }
  static constexpr int64_t staged_bytes(int64_t d) { return d * sizeof(uint16_t); }
  static __m512 kb(const float* kt, int64_t d, int64_t j, int64_t i) {
    const int32_t* pairs = reinterpret_cast<const int32_t*>(kt);
    return _mm512_castsi512_ps(_mm512_set1_epi32(pairs[j * d / 2 + i]));
  }
  static __m512 dot(__m512 acc, __m512 a, __m512 b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
  }
};
#endif

// Scores of keys [0, n_pad) of the tile against query vectors c0·16 .. (c0 + C)·16, R keys at
// a time (R·C accumulators in registers): s[j][m] = q[m]·k[j], unscaled.
template <typename M, int C, int R>
void tile_scores(const float* qs, const float* kt, int64_t d, int64_t groups, int64_t c0,
                 int64_t n_pad, int64_t m, float* s) {
  const int64_t steps = M::steps(d);
  for (int64_t j0 = 0; j0 < n_pad; j0 += R) {
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < steps; ++i) {
      __m512 qv[C];
      for (int c = 0; c < C; ++c) qv[c] = _mm512_load_ps(qs + (i * groups + c0 + c) * kLanes);
      for (int r = 0; r < R; ++r) {
        const __m512 b = M::kb(kt, d, j0 + r, i);
        for (int c = 0; c < C; ++c) acc[r][c] = M::dot(acc[r][c], qv[c], b);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c)
        _mm512_store_ps(s + (j0 + r) * m + (c0 + c) * kLanes, acc[r][c]);
  }
}

// All G query vectors, at most 4 at a time (registers); n_pad: a multiple of 48.
template <typename M>
void all_scores(const float* qs, const float* kt, int64_t d, int64_t groups, int64_t n_pad,
                float* s) {
  const int64_t m = groups * kLanes;
  for (int64_t c0 = 0; c0 < groups;) {
    switch (std::min<int64_t>(groups - c0, 4)) {
      case 4: tile_scores<M, 4, 6>(qs, kt, d, groups, c0, n_pad, m, s); c0 += 4; break;
      case 3: tile_scores<M, 3, 8>(qs, kt, d, groups, c0, n_pad, m, s); c0 += 3; break;
      case 2: tile_scores<M, 2, 12>(qs, kt, d, groups, c0, n_pad, m, s); c0 += 2; break;
      default: tile_scores<M, 1, 16>(qs, kt, d, groups, c0, n_pad, m, s); c0 += 1; break;
    }
  }
}

// The online-softmax step over keys [0, n) of the tile at absolute key k0: mask the keys
// after each lane's row (lane i sees keys ≤ diag + i: only a tile reaching past diag has
// any), update max and sum, and leave p in s (kPairs: keys 2i and 2i+1 rounded to bf16 and
// paired per lane, written over score row i once rows ≤ 2i+1 are read) and the rescale of
// the earlier o in alpha. A lane takes the same arithmetic whatever the other lanes' masks;
// its sum runs in 4 chains by the key's place in the tile.
template <bool kPairs>
void tile_softmax(float* s, int64_t n, int64_t m, int64_t k0, int64_t diag, float scale,
                  float* mx, float* sum, float* alpha) {
  const __m512 vs = _mm512_set1_ps(scale), masked = _mm512_set1_ps(kMasked);
  const bool any_masked = k0 + n - 1 > diag;
  for (int64_t c = 0; c < m; c += kLanes) {
    __m512 t0 = masked, t1 = masked, t2 = masked, t3 = masked;  // unrolled: in registers
    auto score = [&](int64_t j) {
      float* sj = s + j * m + c;
      __m512 x = _mm512_load_ps(sj);
      if (any_masked && k0 + j > diag) {  // lanes below k0 + j - diag do not see key j
        const __mmask16 keep = static_cast<__mmask16>(0xFFFFu << (k0 + j - diag));
        x = _mm512_mask_mov_ps(masked, keep, x);
        _mm512_store_ps(sj, x);
      }
      return x;
    };
    for (int64_t j = 0; j < n; j += 4) {
      t0 = _mm512_max_ps(t0, score(j));
      if (j + 1 < n) t1 = _mm512_max_ps(t1, score(j + 1));
      if (j + 2 < n) t2 = _mm512_max_ps(t2, score(j + 2));
      if (j + 3 < n) t3 = _mm512_max_ps(t3, score(j + 3));
    }
    const __m512 old = _mm512_load_ps(mx + c);
    const __m512 top = _mm512_max_ps(_mm512_max_ps(t0, t1), _mm512_max_ps(t2, t3));
    const __m512 now = _mm512_max_ps(old, _mm512_mul_ps(top, vs));
    const __m512 a = exp_nonpositive(_mm512_sub_ps(old, now));
    auto prob = [&](int64_t j) {
      return j < n ? exp_nonpositive(_mm512_fmsub_ps(_mm512_load_ps(s + j * m + c), vs, now))
                   : _mm512_setzero_ps();
    };
    __m512 u0 = _mm512_setzero_ps(), u1 = u0, u2 = u0, u3 = u0;
    for (int64_t j = 0; j < n; j += 4) {
      const __m512 p0 = prob(j), p1 = prob(j + 1), p2 = prob(j + 2), p3 = prob(j + 3);
      u0 = _mm512_add_ps(u0, p0), u1 = _mm512_add_ps(u1, p1);
      u2 = _mm512_add_ps(u2, p2), u3 = _mm512_add_ps(u3, p3);
#if defined(__AVX512BF16__)
      if constexpr (kPairs) {
        // cvtne2ps: words 0-15 = the first's lanes, 16-31 = the second's; zip pairs them
        alignas(64) static const uint16_t zip_idx[32] = {
            0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
            8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
        const __m512i zip = _mm512_load_si512(zip_idx);
        uint32_t* pp = reinterpret_cast<uint32_t*>(s);
        const __m512i lo = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
        _mm512_store_si512(pp + (j / 2) * m + c, _mm512_permutexvar_epi16(zip, lo));
        if (j + 2 < n) {
          const __m512i hi = (__m512i)_mm512_cvtne2ps_pbh(p3, p2);
          _mm512_store_si512(pp + (j / 2 + 1) * m + c, _mm512_permutexvar_epi16(zip, hi));
        }
        continue;
      }
#endif
      _mm512_store_ps(s + j * m + c, p0);
      if (j + 1 < n) _mm512_store_ps(s + (j + 1) * m + c, p1);
      if (j + 2 < n) _mm512_store_ps(s + (j + 2) * m + c, p2);
      if (j + 3 < n) _mm512_store_ps(s + (j + 3) * m + c, p3);
    }
    const __m512 total = _mm512_add_ps(_mm512_add_ps(u0, u1), _mm512_add_ps(u2, u3));
    _mm512_store_ps(mx + c, now);
    _mm512_store_ps(alpha + c, a);
    _mm512_store_ps(sum + c, _mm512_fmadd_ps(_mm512_load_ps(sum + c), a, total));
  }
}

// The p·v blocks: R query vectors at a time, R·ND accumulators in registers (24 where R
// divides the 16·G vectors, else 16): o[m] = o[m]·alpha[m] + Σ p·v.
template <int ND, typename Block>
void pv_rows(int64_t m, Block block) {
  constexpr int wide = 24 / ND, narrow = 16 / ND;
  if (m % wide == 0) {
    for (int64_t m0 = 0; m0 < m; m0 += wide) block(std::integral_constant<int, wide>{}, m0);
  } else {
    for (int64_t m0 = 0; m0 < m; m0 += narrow) block(std::integral_constant<int, narrow>{}, m0);
  }
}

// The float32 path's block: p from s [key][m], V rows as floats in vt [n][d].
template <int ND, int R>
void pv_f32_block(const float* s, const float* vt, int64_t n, int64_t m, int64_t m0,
                  const float* alpha, float* o) {
  constexpr int64_t d = 16 * ND;
  __m512 acc[R][ND];
  for (int r = 0; r < R; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[m0 + r]);
    for (int c = 0; c < ND; ++c)
      acc[r][c] = _mm512_mul_ps(_mm512_load_ps(o + (m0 + r) * d + 16 * c), a);
  }
  for (int64_t j = 0; j < n; ++j) {
    __m512 v[ND];
    for (int c = 0; c < ND; ++c) v[c] = _mm512_load_ps(vt + j * d + 16 * c);
    for (int r = 0; r < R; ++r) {
      const __m512 p = _mm512_set1_ps(s[j * m + m0 + r]);
      for (int c = 0; c < ND; ++c) acc[r][c] = _mm512_fmadd_ps(p, v[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < ND; ++c) _mm512_store_ps(o + (m0 + r) * d + 16 * c, acc[r][c]);
}

#if defined(__AVX512BF16__)
// The bf16 path's block: p pairs pp [pair][m], V pairs vp [pair][d].
template <int ND, int R>
void pv_bf16_block(const uint32_t* pp, const uint32_t* vp, int64_t pairs, int64_t m,
                   int64_t m0, const float* alpha, float* o) {
  constexpr int64_t d = 16 * ND;
  __m512 acc[R][ND];
  for (int r = 0; r < R; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[m0 + r]);
    for (int c = 0; c < ND; ++c)
      acc[r][c] = _mm512_mul_ps(_mm512_load_ps(o + (m0 + r) * d + 16 * c), a);
  }
  for (int64_t i = 0; i < pairs; ++i) {
    __m512bh vv[ND];
    for (int c = 0; c < ND; ++c) vv[c] = (__m512bh)_mm512_load_si512(vp + i * d + 16 * c);
    for (int r = 0; r < R; ++r) {
      const __m512bh p = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(pp[i * m + m0 + r]));
      for (int c = 0; c < ND; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], vv[c], p);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < ND; ++c) _mm512_store_ps(o + (m0 + r) * d + 16 * c, acc[r][c]);
}

// V rows of keys 2i and 2i+1 interleaved word by word into vp[i] with in-lane unpacks: dim
// pairs land in "pairing order", position 32·b + 16·half + k holding dim
// 32·b + 8·(k/4) + 4·half + k%4 (d = 16: position 8·half + k, the same rule; store_item
// puts o back in order).
template <int ND>
inline void pair_rows(const uint16_t* a, const uint16_t* b, uint32_t* vp) {
  if constexpr (ND % 2 == 0) {
    for (int blk = 0; blk < ND / 2; ++blk) {
      const __m512i x = _mm512_loadu_si512(a + 32 * blk);
      const __m512i y = b ? _mm512_loadu_si512(b + 32 * blk) : _mm512_setzero_si512();
      _mm512_store_si512(vp + 32 * blk, _mm512_unpacklo_epi16(x, y));
      _mm512_store_si512(vp + 32 * blk + 16, _mm512_unpackhi_epi16(x, y));
    }
  } else {  // d = 16
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
    const __m256i y =
        b ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)) : _mm256_setzero_si256();
    _mm256_store_si256(reinterpret_cast<__m256i*>(vp), _mm256_unpacklo_epi16(x, y));
    _mm256_store_si256(reinterpret_cast<__m256i*>(vp + 8), _mm256_unpackhi_epi16(x, y));
  }
}
#endif  // __AVX512BF16__

#endif  // __AVX512F__

}  // namespace radixserve_cpu
