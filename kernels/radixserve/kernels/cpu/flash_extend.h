// Tiled (flash-style) causal attention for the multi-token extends of a batch (included by
// paged_attention.cpp): prefills, chunks over the earlier chunks, extends over a cached prefix.
//
// The per-row kernel scores each query row against its keys alone: for a long extend, O(L²)
// dot products with a horizontal sum each. Here a work item is (request, KV head, 16
// consecutive query rows): the G query heads that share the KV head make G vectors of 16
// lanes (lane = query row), all scored against each key at once, and the keys are walked in
// tiles of kTileKeys with an online softmax (running max, sum and unnormalised p·v per lane).
// No L×L scores: per-thread scratch of one tile.
//
//   S[key][lane] = Σ_d q[lane][d]·k[key][d]      bf16: VDPBF16PS on dim pairs, k broadcast
//   O[lane][d]  += Σ_key p[lane][key]·v[key][d]  bf16: VDPBF16PS on key pairs, p broadcast
//
// K/V rows are read from the pool in place (by slot, any page size) into the thread's tile;
// sums in float32; p rounded to bf16 for p·v in bf16. Without AVX512-BF16 a bf16 extend runs
// on float32 tiles; without AVX-512 the entry reports the path unsupported and the caller
// keeps its PyTorch one.
//
// Key tiles start at absolute key 0, kTileKeys, ...: a query row's arithmetic depends only on
// its own inputs, not on the other rows of its item or where its extend began, so a row gets
// the same bits whether its prefix came from the cache or an earlier chunk (masked keys add
// exact zeros, a tile masked whole for a lane leaves its max, sum and p·v as they were).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "flash_tiles.h"
#include "scalar.h"

namespace radixserve_cpu {

// The extends of a batch: request i's query (and output) rows are q_start[i] .. + extend[i]
// - 1; its keys slots[kv_row[i]][0 .. prefix[i] + extend[i]), row j seeing the first
// prefix[i] + j + 1 (causal).
struct ExtendReqs {
  const int64_t* kv_row;
  const int64_t* q_start;
  const int64_t* prefix;
  const int64_t* extend;
  int64_t n;
};

#if defined(__AVX512F__)

// The tile's p·v, its V rows staged (float32) or paired (bf16) into `kv`, K being spent.
template <typename T, typename M, int ND>
void tile_pv(const T* v, const int64_t* slots, int64_t kv_off, int64_t kv_stride, int64_t n,
             int64_t m, TileScratch& ts) {
  constexpr int64_t d = 16 * ND;
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<M, Bf16Math>) {
    uint32_t* vp = reinterpret_cast<uint32_t*>(ts.kv);
    const int64_t pairs = (n + 1) / 2;
    for (int64_t i = 0; i < pairs; ++i) {
      const T* b = 2 * i + 1 < n ? v + slots[2 * i + 1] * kv_stride + kv_off : nullptr;
      pair_rows<ND>(v + slots[2 * i] * kv_stride + kv_off, b, vp + i * d);
    }
    const uint32_t* pp = reinterpret_cast<const uint32_t*>(ts.s);
    pv_rows<ND>(m, [&](auto rows, int64_t m0) {
      pv_bf16_block<ND, decltype(rows)::value>(pp, vp, pairs, m, m0, ts.alpha, ts.o);
    });
    return;
  } else
#endif
  {
    for (int64_t j = 0; j < n; ++j)
      row_to_f32<ND>(v + slots[j] * kv_stride + kv_off, ts.kv + j * d);
    pv_rows<ND>(m, [&](auto rows, int64_t m0) {
      pv_f32_block<ND, decltype(rows)::value>(ts.s, ts.kv, n, m, m0, ts.alpha, ts.o);
    });
  }
}

inline void store16(float* dst, __m512 x) { _mm512_storeu_ps(dst, x); }
inline void store16(uint16_t* dst, __m512 x) {
#if defined(__AVX512BF16__)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), (__m256i)_mm512_cvtneps_pbh(x));
#else
  alignas(64) float tmp[16];
  _mm512_store_ps(tmp, x);
  for (int i = 0; i < 16; ++i) dst[i] = f32_to_bf16(tmp[i]);
#endif
}

// o / sum into the item's output rows, `row_stride` apart: o in natural order on the float32
// path; on the bf16 one in pairing order, put back 32 dims (two vectors) at a time.
template <typename T, typename M, int ND>
void store_item(const TileScratch& ts, int64_t rows, int64_t groups, T* out,
                int64_t row_stride) {
  constexpr int64_t d = 16 * ND;
  constexpr bool paired = !std::is_same_v<M, F32Math>;
  // Output dims 16·c + i of a 32-dim block come from position idx[c][i] of its two vectors
  // (0-15 the first, 16-31 the second): the inverse of pair_rows's order (d = 16: one vector,
  // halves of 8).
  constexpr int halves = ND == 1 ? 8 : 16;
  alignas(64) int32_t idx[2][16];
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < 16; ++i) {
      const int dim = 16 * c + i, lane = dim / 8, half = dim % 8 / 4, k = dim % 4;
      idx[c][i] = halves * half + 4 * lane + k;
    }
  const __m512i lo_idx = _mm512_load_si512(idx[0]), hi_idx = _mm512_load_si512(idx[1]);
  for (int64_t lane = 0; lane < rows; ++lane)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t vec = g * kLanes + lane;
      const __m512 inv = _mm512_set1_ps(1.f / ts.sum[vec]);
      const float* src = ts.o + vec * d;
      T* dst = out + lane * row_stride + g * d;
      if constexpr (paired && ND == 1) {  // d = 16: one vector, the same order in 16 words
        const __m512 x = _mm512_load_ps(src);
        store16(dst, _mm512_mul_ps(_mm512_permutexvar_ps(lo_idx, x), inv));
      } else if constexpr (paired) {
        for (int64_t b = 0; b < d; b += 32) {
          const __m512 x = _mm512_load_ps(src + b), y = _mm512_load_ps(src + b + 16);
          store16(dst + b, _mm512_mul_ps(_mm512_permutex2var_ps(x, lo_idx, y), inv));
          store16(dst + b + 16, _mm512_mul_ps(_mm512_permutex2var_ps(x, hi_idx, y), inv));
        }
      } else {
        for (int64_t b = 0; b < d; b += 16)
          store16(dst + b, _mm512_mul_ps(_mm512_load_ps(src + b), inv));
      }
    }
}

// One work item: request r, KV head h, query rows [t0, t0 + 16) of its extend (fewer at its
// end), with all G query heads of h.
template <typename T, typename M, int ND>
void extend_item(const T* q, const T* k, const T* v, const int64_t* slots, T* out,
                 const ExtendShape& s, const ExtendReqs& rq, int64_t r, int64_t h, int64_t t0,
                 TileScratch& ts) {
  constexpr int64_t d = 16 * ND;
  const int64_t groups = s.hq / s.hkv, m = groups * kLanes;
  const int64_t rows = std::min(kLanes, rq.extend[r] - t0);
  const int64_t row0 = rq.q_start[r] + t0;
  const int64_t diag = rq.prefix[r] + t0;  // the last key lane 0 sees
  const int64_t keys = diag + rows;        // the keys the item's last row sees
  const int64_t* sr = slots + rq.kv_row[r] * s.slots_stride;
  const int64_t off = h * d;
  M::stage_q(q, s, row0, rows, h, groups, ts.q);
  std::fill(ts.o, ts.o + m * d, 0.f);
  std::fill(ts.mx, ts.mx + m, kMasked);
  std::fill(ts.sum, ts.sum + m, 0.f);
  for (int64_t k0 = 0; k0 < keys; k0 += kTileKeys) {
    const int64_t n = std::min(kTileKeys, keys - k0);
    for (int64_t j = 0; j < n; ++j)
      M::template stage_k<ND>(k + sr[k0 + j] * s.kv_stride + off, ts.kv, j);
    if (n < kTileKeys) {  // a short last tile is scored whole: zero keys, scores never read
      char* pad = reinterpret_cast<char*>(ts.kv) + n * M::staged_bytes(d);
      std::memset(pad, 0, (kTileKeys - n) * M::staged_bytes(d));
    }
    all_scores<M>(ts.q, ts.kv, d, groups, kTileKeys, ts.s);
    constexpr bool pairs = !std::is_same_v<M, F32Math>;
    tile_softmax<pairs>(ts.s, n, m, k0, diag, s.scale, ts.mx, ts.sum, ts.alpha);
    tile_pv<T, M, ND>(v, sr + k0, off, s.kv_stride, n, m, ts);
  }
  store_item<T, M, ND>(ts, rows, groups, out + row0 * s.hq * d + off * groups, s.hq * d);
}

// Every item of the batch, the longest (most keys) first so that the short ones fill in at
// the end of the dynamic schedule.
template <typename T, typename M, int ND>
void extend_all(const T* q, const T* k, const T* v, const int64_t* slots, T* out,
                const ExtendShape& s, const ExtendReqs& rq, int num_threads) {
  struct Item {
    int64_t r, h, t0, keys;
  };
  std::vector<Item> items;
  for (int64_t r = 0; r < rq.n; ++r)
    for (int64_t t0 = 0; t0 < rq.extend[r]; t0 += kLanes)
      for (int64_t h = 0; h < s.hkv; ++h)
        items.push_back({r, h, t0, rq.prefix[r] + std::min(rq.extend[r], t0 + kLanes)});
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.keys > b.keys; });
  const int64_t count = static_cast<int64_t>(items.size());
#pragma omp parallel num_threads(num_threads)
  {
    TileScratch ts(s.hq / s.hkv * kLanes, s.d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < count; ++i)
      extend_item<T, M, ND>(q, k, v, slots, out, s, rq, items[i].r, items[i].h, items[i].t0, ts);
  }
}

// Dispatch on the head dim (16, 32, 64 or 128); false where it is none of them.
template <typename T, typename M>
bool extend_dims(const T* q, const T* k, const T* v, const int64_t* slots, T* out,
                 const ExtendShape& s, const ExtendReqs& rq, int num_threads) {
  switch (s.d) {
    case 16: extend_all<T, M, 1>(q, k, v, slots, out, s, rq, num_threads); return true;
    case 32: extend_all<T, M, 2>(q, k, v, slots, out, s, rq, num_threads); return true;
    case 64: extend_all<T, M, 4>(q, k, v, slots, out, s, rq, num_threads); return true;
    case 128: extend_all<T, M, 8>(q, k, v, slots, out, s, rq, num_threads); return true;
    default: return false;
  }
}

#endif  // __AVX512F__

}  // namespace radixserve_cpu
