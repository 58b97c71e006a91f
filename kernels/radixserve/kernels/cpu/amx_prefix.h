// The shared prefix of a decode batch on AMX tiles (included by paged_attention.cpp).
//
// When many requests of a batch share a cached prefix (a system prompt: the same KV slots),
// their decode queries are scored against it together: for each KV head, the G query heads of
// every member are stacked into rows of 16 and multiplied with the prefix's keys and values as
// bf16 matrix products on AMX (TDPBF16PS), where the per-row kernel would read and score the
// prefix once per request with vector instructions. Each (row, query head) keeps its partial
// result (max, sum, unnormalised p·v) and the per-row kernel adds its own keys to it.
//
// Layouts for the tiles (16 rows of 64 bytes each):
//   K, per head, per 16-key block and 32-dim step: row i = the dim pair (2i, 2i+1) of the 16
//   keys (B operand of q·kᵀ);
//   V, per head, per 32-key block and 16-dim block: row i = keys (2i, 2i+1) of each of the 16
//   dims (B operand of p·v).
// Only whole 32-key blocks go on tiles; the remainder is attended with each row's own keys.
#pragma once

#include "amx_tiles.h"

#include <cstdint>
#include <cstring>
#include <vector>

namespace radixserve_cpu {

constexpr int64_t kPrefixBlock = 32;  // keys per AMX block of the prefix (two K tiles, one V)

struct SharedPrefix {
  const int64_t* slots;    // [len] the shared prefix's KV slots
  int64_t len;             // whole kPrefixBlock blocks only
  const int64_t* members;  // [n] query rows whose keys start with the prefix
  int64_t n;
};

#if defined(RADIXSERVE_AMX)
// Packs keys [32b, 32b + 32) of head h of the prefix's K and V into the tile layouts (kb, vb:
// the head's packed K and V, len * d elements each).
inline void pack_prefix_block(const uint16_t* k, const uint16_t* v, const SharedPrefix& sp,
                              int64_t kv_stride, int64_t d, int64_t h, int64_t b, uint16_t* kb,
                              uint16_t* vb) {
  const int64_t ks_steps = d / 32, d_blocks = d / 16;
  // K: per 16 keys and 32-dim step, a 16 x 16 transpose of dim pairs (dwords).
  for (int64_t kb16 = 2 * b; kb16 < 2 * b + 2; ++kb16) {
    for (int64_t ks = 0; ks < ks_steps; ++ks) {
      uint32_t* tile = reinterpret_cast<uint32_t*>(kb + (kb16 * ks_steps + ks) * 512);
      for (int64_t n = 0; n < 16; ++n) {
        const uint32_t* key = reinterpret_cast<const uint32_t*>(
            k + sp.slots[kb16 * 16 + n] * kv_stride + h * d + ks * 32);
        for (int64_t i = 0; i < 16; ++i) tile[i * 16 + n] = key[i];
      }
    }
  }
  // V: keys 2i and 2i+1 interleaved element by element, 16 dims per tile row.
  alignas(64) static const uint16_t lo_idx[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                  37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                  11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i lo = _mm512_load_si512(lo_idx);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int64_t i = 0; i < 16; ++i) {
    const uint16_t* ra = v + sp.slots[b * 32 + 2 * i] * kv_stride + h * d;
    const uint16_t* rb = v + sp.slots[b * 32 + 2 * i + 1] * kv_stride + h * d;
    for (int64_t c = 0; c < d / 32; ++c) {
      const __m512i x = _mm512_loadu_si512(ra + 32 * c), y = _mm512_loadu_si512(rb + 32 * c);
      uint16_t* t0 = vb + (b * d_blocks + 2 * c) * 512 + i * 32;
      _mm512_storeu_si512(t0, _mm512_permutex2var_epi16(x, lo, y));
      _mm512_storeu_si512(t0 + 512, _mm512_permutex2var_epi16(x, hi, y));
    }
  }
}

extern "C" __m512 _ZGVeN16v_expf(__m512);

// Tile loads from L2 wait on their 16 lines one by one; hinting the next tile's lines early
// keeps the loads at L1 speed (measured: 21 -> 16 ns per load + multiply).
inline void prefetch_tile(const void* p) {
  const char* c = static_cast<const char*>(p);
  for (int l = 0; l < 16; ++l) _mm_prefetch(c + 64 * l, _MM_HINT_T0);
}  // glibc's libmvec (linked with -lmvec)

// One row of raw scores (len a multiple of 32) → the bf16 numerators exp(scale·x − max) in
// `pr`; returns their float32 sum, the max (of the scaled scores) in `max_out`.
inline float softmax_row_bf16(const float* sr, int64_t len, float scale, uint16_t* pr,
                              float* max_out) {
  __m512 mv = _mm512_loadu_ps(sr);
  for (int64_t j = 16; j < len; j += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(sr + j));
  const float m = _mm512_reduce_max_ps(mv) * scale;  // scale > 0: the max of the scaled
  const __m512 vs = _mm512_set1_ps(scale), vm = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < len; j += 32) {
    const __m512 e0 = _ZGVeN16v_expf(_mm512_fmsub_ps(_mm512_loadu_ps(sr + j), vs, vm));
    const __m512 e1 = _ZGVeN16v_expf(_mm512_fmsub_ps(_mm512_loadu_ps(sr + j + 16), vs, vm));
    _mm512_storeu_si512(pr + j, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(e1, e0)));
    sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
  }
  *max_out = m;
  return _mm512_reduce_add_ps(sum);
}

// One tile of 16 stacked query rows (t0 .. t0+15 of the M·G rows of head h) against the
// packed prefix: their maxima, sums and unnormalised p·v into the per-(row, head) state.
template <int KS>  // 32-dim steps: D = 32 * KS
void prefix_tile(const uint16_t* q, int64_t q_stride, int64_t hq, int64_t groups, int64_t h,
                 int64_t t0, const SharedPrefix& sp, const uint16_t* kb, const uint16_t* vb,
                 float scale, float* st_m, float* st_l, float* st_acc, float* sbuf,
                 uint16_t* pbuf) {
  constexpr int64_t d = 32 * KS, d_blocks = d / 16;
  const int64_t rows = sp.n * groups, len = sp.len;
  const int64_t valid = rows - t0 < 16 ? rows - t0 : 16;
  alignas(64) uint16_t qb[16 * d];
  for (int64_t i = 0; i < 16; ++i) {
    if (i < valid) {
      const int64_t t = t0 + i, r = sp.members[t / groups], g = t % groups;
      std::memcpy(qb + i * d, q + r * q_stride + (h * groups + g) * d, d * 2);
    } else {
      std::memset(qb + i * d, 0, d * 2);
    }
  }
  // Scores: q tiles stay loaded (tmm4..), one K tile at a time (tmm1), into tmm0.
  _tile_loadd(4, qb, d * 2);
  if constexpr (KS > 1) _tile_loadd(5, qb + 32, d * 2);
  if constexpr (KS > 2) _tile_loadd(6, qb + 64, d * 2);
  if constexpr (KS > 3) _tile_loadd(7, qb + 96, d * 2);
  for (int64_t b = 0; b < len / 16; ++b) {
    const uint16_t* kt = kb + b * KS * 512;
    if (b + 1 < len / 16)
      for (int ks = 0; ks < KS; ++ks) prefetch_tile(kt + (KS + ks) * 512);
    _tile_zero(0);
    _tile_loadd(1, kt, 64);
    _tile_dpbf16ps(0, 4, 1);
    if constexpr (KS > 1) { _tile_loadd(1, kt + 512, 64); _tile_dpbf16ps(0, 5, 1); }
    if constexpr (KS > 2) { _tile_loadd(1, kt + 1024, 64); _tile_dpbf16ps(0, 6, 1); }
    if constexpr (KS > 3) { _tile_loadd(1, kt + 1536, 64); _tile_dpbf16ps(0, 7, 1); }
    _tile_stored(0, sbuf + b * 16, len * 4);
  }
  // Softmax numerators per row in float32, rounded to bf16 for p·v (as flash attention does).
  for (int64_t i = 0; i < 16; ++i) {
    uint16_t* pr = pbuf + i * len;
    if (i >= valid) {
      std::memset(pr, 0, len * 2);
      continue;
    }
    const int64_t t = t0 + i, r = sp.members[t / groups], hg = h * groups + t % groups;
    st_l[r * hq + hg] = softmax_row_bf16(sbuf + i * len, len, scale, pr, &st_m[r * hq + hg]);
  }
  // p·v: four output tiles of 16 dims at a time (tmm0..3), p in tmm4, V in tmm5.
  alignas(64) float ob[16 * d];
  for (int64_t nb0 = 0; nb0 < d_blocks; nb0 += 4) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t b = 0; b < len / kPrefixBlock; ++b) {
      const uint16_t* vt = vb + (b * d_blocks + nb0) * 512;
      if (b + 1 < len / kPrefixBlock)
        for (int t = 0; t < 4; ++t) prefetch_tile(vt + (d_blocks + t) * 512);
      _tile_loadd(4, pbuf + b * 32, len * 2);
      _tile_loadd(5, vt, 64);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(5, vt + 512, 64);
      _tile_dpbf16ps(1, 4, 5);
      _tile_loadd(5, vt + 1024, 64);
      _tile_dpbf16ps(2, 4, 5);
      _tile_loadd(5, vt + 1536, 64);
      _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, ob + nb0 * 16, d * 4);
    _tile_stored(1, ob + nb0 * 16 + 16, d * 4);
    _tile_stored(2, ob + nb0 * 16 + 32, d * 4);
    _tile_stored(3, ob + nb0 * 16 + 48, d * 4);
  }
  for (int64_t i = 0; i < valid; ++i) {
    const int64_t t = t0 + i, r = sp.members[t / groups], hg = h * groups + t % groups;
    std::memcpy(st_acc + (r * hq + hg) * d, ob + i * d, d * 4);
  }
}
#endif

}  // namespace radixserve_cpu
