// Paged attention over the KV pool for the CPU: each query row reads its keys and values
// straight from the pool's slots (no gathered copy of the history), GQA-grouped (the query
// heads that share a KV head are scored against each key row once it is loaded).
//
// Plain C++ with OpenMP and no torch headers, so it compiles in about a second; the Python
// side (paged_attention.py) passes data pointers and shapes. The OpenMP runtime is the one
// torch already loaded (same soname), so torch.set_num_threads governs both.
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
#include <memory>

#include "scalar.h"
#include "amx_prefix.h"
#include "flash_extend.h"
#include <vector>

namespace {

using namespace radixserve_cpu;

struct Shape {
  int64_t nrows, hq, hkv, d;
  int64_t q_stride;     // elements between query rows
  int64_t kv_stride;    // elements between pool slots (Hkv * D for a contiguous pool)
  int64_t slots_stride; // elements between rows of the slot table
  float scale;
};

// A (row, KV head)'s partial result over the shared prefix, for its G query heads:
// maxima m[g] and sums l[g] of the scaled scores, unnormalised p·v in acc[g * D + i].
struct PrefixState {
  const float* m;
  const float* l;
  const float* acc;
};

// The most keys any of the n rows attends (at least 1): the per-thread scratch size.
inline int64_t longest_row(const int64_t* kv_len, int64_t n) {
  int64_t m = 1;
  for (int64_t r = 0; r < n; ++r) m = kv_len[r] > m ? kv_len[r] : m;
  return m;
}

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
    inv[g] = 1.f / exp_shifted(scores + g * len, len);
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
                       T* out, const Shape& s, int64_t h, float* scores,
                       const PrefixState* st) {
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
  float sum[G], mx[G];
  for (int g = 0; g < G; ++g) {
    sum[g] = len > 0 ? exp_shifted(scores + g * len, len, &mx[g]) : 0.f;
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
    T* og = out + (h * G + g) * d;
    if (st == nullptr) {
      const __m512 iv = _mm512_set1_ps(1.f / sum[g]);
      for (int c = 0; c < NC; ++c) store16(og + 16 * c, _mm512_mul_ps(acc[g][c], iv));
      continue;
    }
    // Merge with the shared prefix's partial result by their maxima (online softmax).
    const float m = len > 0 && mx[g] > st->m[g] ? mx[g] : st->m[g];
    const float a = std::exp(st->m[g] - m), b = len > 0 ? std::exp(mx[g] - m) : 0.f;
    const float inv = 1.f / (st->l[g] * a + sum[g] * b);
    const __m512 va = _mm512_set1_ps(a * inv), vb = _mm512_set1_ps(b * inv);
    for (int c = 0; c < NC; ++c) {
      const __m512 pre = _mm512_loadu_ps(st->acc + g * d + 16 * c);
      store16(og + 16 * c, _mm512_fmadd_ps(pre, va, _mm512_mul_ps(acc[g][c], vb)));
    }
  }
}

// The query-head counts per KV head that attend_one_fast has a compiled path for.
constexpr bool fast_groups(int64_t g) { return g == 1 || g == 2 || g == 3 || g == 4 || g == 8; }

template <typename T, int NC>
bool attend_one_fast(int64_t groups, const T* q, const T* k, const T* v, const int64_t* slots,
                     int64_t len, T* out, const Shape& s, int64_t h, float* scores,
                     const PrefixState* st = nullptr) {
#define RS_ONE(G) attend_one_avx512<T, G, NC>(q, k, v, slots, len, out, s, h, scores, st)
  switch (groups) {
    case 1: RS_ONE(1); return true;
    case 2: RS_ONE(2); return true;
    case 3: RS_ONE(3); return true;
    case 4: RS_ONE(4); return true;
    case 8: RS_ONE(8); return true;
    default: return false;
  }
#undef RS_ONE
}
#endif

// Work items per dynamic grab: 4 amortise the grabs at large batches, but at a few items
// (B=1: one per KV head) a chunk of 4 would hand them all to one thread while the rest wait.
inline int64_t decode_chunk(int64_t items, int num_threads) {
  return items >= 8 * static_cast<int64_t>(num_threads) ? 4 : 1;
}

template <typename T, int64_t kD>
void attend(const T* q, const T* k, const T* v, const int64_t* slots, const int64_t* kv_row,
            const int64_t* kv_len, T* out, const Shape& s, int num_threads) {
  const int64_t max_len = longest_row(kv_len, s.nrows);
  const int64_t groups = s.hq / s.hkv;
  const int64_t items = s.nrows * s.hkv, chunk = decode_chunk(items, num_threads);
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<float> scores(groups * max_len);
    std::vector<float> acc(groups * s.d);
#pragma omp for schedule(dynamic, chunk)
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

#if defined(RADIXSERVE_AMX)
// Decode rows where `sp.members` share the prefix `sp.slots`: the members' queries against it
// on AMX tiles (amx_prefix.h), then every row over its own keys with the vector kernel, a
// member's merged with its prefix result.
template <int64_t kD>
void attend_shared(const uint16_t* q, const uint16_t* k, const uint16_t* v, const int64_t* slots,
                   const int64_t* kv_row, const int64_t* kv_len, uint16_t* out, const Shape& s,
                   const SharedPrefix& sp, int num_threads) {
  constexpr int64_t ks_steps = kD / 32;
  const int64_t groups = s.hq / s.hkv, per_head = sp.len * kD;
  // Scratch left uninitialised (every element read is written first): zeroing ~0.5 MB per
  // layer showed up in the profile.
  std::unique_ptr<uint16_t[]> kb(new uint16_t[s.hkv * per_head]), vb(new uint16_t[s.hkv * per_head]);
  std::unique_ptr<float[]> st_m(new float[s.nrows * s.hq]), st_l(new float[s.nrows * s.hq]),
      st_acc(new float[s.nrows * s.hq * kD]);
  std::vector<char> member(s.nrows, 0);
  for (int64_t i = 0; i < sp.n; ++i) member[sp.members[i]] = 1;
  const int64_t max_len = longest_row(kv_len, s.nrows);
  const int64_t tiles = (sp.n * groups + 15) / 16;
  const int64_t chunk = decode_chunk(s.nrows * s.hkv, num_threads);
#pragma omp parallel num_threads(num_threads)
  {
    const int64_t blocks = sp.len / kPrefixBlock;
#pragma omp for schedule(static)
    for (int64_t it = 0; it < s.hkv * blocks; ++it) {
      const int64_t h = it / blocks;
      pack_prefix_block(k, v, sp, s.kv_stride, kD, h, it % blocks, kb.get() + h * per_head,
                        vb.get() + h * per_head);
    }
    std::unique_ptr<float[]> sbuf(new float[16 * sp.len]);
    std::unique_ptr<uint16_t[]> pbuf(new uint16_t[16 * sp.len]);
    configure_tiles();
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < s.hkv * tiles; ++it) {
      const int64_t h = it / tiles, t0 = (it % tiles) * 16;
      prefix_tile<ks_steps>(q, s.q_stride, s.hq, groups, h, t0, sp, kb.get() + h * per_head,
                            vb.get() + h * per_head, s.scale, st_m.get(), st_l.get(),
                            st_acc.get(), sbuf.get(), pbuf.get());
    }
    _tile_release();
    std::vector<float> scores(groups * max_len);
#pragma omp for schedule(dynamic, chunk)
    for (int64_t it = 0; it < s.nrows * s.hkv; ++it) {
      const int64_t r = it / s.hkv, h = it % s.hkv;
      const int64_t* sr = slots + kv_row[r] * s.slots_stride;
      const uint16_t* qr = q + r * s.q_stride;
      uint16_t* orow = out + r * s.hq * kD;
      if (!member[r]) {
        attend_one_fast<uint16_t, kD / 16>(groups, qr, k, v, sr, kv_len[r], orow, s, h,
                                           scores.data());
        continue;
      }
      const int64_t at = r * s.hq + h * groups;
      const PrefixState st{st_m.get() + at, st_l.get() + at, st_acc.get() + at * kD};
      attend_one_fast<uint16_t, kD / 16>(groups, qr, k, v, sr + sp.len, kv_len[r] - sp.len,
                                         orow, s, h, scores.data(), &st);
    }
  }
}
#endif

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

// The entries' return codes (paged_attention.py names them the same). Each entry returns
// PAGED_OK or one of its own codes: store_kv's -1 is its own, not an unsupported dtype.
enum PagedAttentionStatus : int {
  PAGED_OK = 0,
  PAGED_UNSUPPORTED_DTYPE = -1,  // radixserve_paged_attention: dtype neither 0 nor 1
  SHARED_UNSUPPORTED = -2,       // radixserve_paged_attention_shared: the path does not apply
  SHARED_PREFIX_MISMATCH = -3,   // .._shared: a member's keys do not start with the prefix
  STORE_SLOT_OUT_OF_RANGE = -1,  // radixserve_store_kv: a slot of loc outside the pool
  EXTEND_UNSUPPORTED = -4,       // radixserve_extend_attention: the path does not apply
};

// The tiled extend (flash_extend.h) for this dtype: bf16 on VDPBF16PS where the build has
// AVX512-BF16, else on float32 tiles; false where the build or the shape has no path.
template <typename T>
bool extend_dispatch(const void* q, const void* k, const void* v, const int64_t* slots,
                     void* out, const ExtendShape& s, const ExtendReqs& rq, int num_threads) {
#if defined(__AVX512F__)
  if (s.hkv <= 0 || s.hq % s.hkv != 0) return false;
  auto qt = static_cast<const T*>(q);
  auto kt = static_cast<const T*>(k);
  auto vt = static_cast<const T*>(v);
  auto ot = static_cast<T*>(out);
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, uint16_t>)
    return extend_dims<T, Bf16Math>(qt, kt, vt, slots, ot, s, rq, num_threads);
#endif
  return extend_dims<T, F32Math>(qt, kt, vt, slots, ot, s, rq, num_threads);
#else
  (void)q; (void)k; (void)v; (void)slots; (void)out; (void)s; (void)rq; (void)num_threads;
  return false;
#endif
}

// A slot index's size: the prefix check compares slot rows byte for byte.
constexpr int64_t kSlotBytes = sizeof(int64_t);

}  // namespace

extern "C" {

// dtype: 0 = float32, 1 = bfloat16 (q, k, v and out share it). Returns PAGED_OK, or
// PAGED_UNSUPPORTED_DTYPE.
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
    return PAGED_UNSUPPORTED_DTYPE;
  }
  return PAGED_OK;
}

// Stores n tokens' K and V rows (`row` elements each, rows `k_stride` / `v_stride` apart, as
// views into a fused qkv output) at pool slots loc[0..n) (`kv_stride` elements apart): the
// KV write of a forward, one copy per row instead of two indexed assignments. elem_size: 2
// or 4 bytes. Returns PAGED_OK, or STORE_SLOT_OUT_OF_RANGE (writing nothing) when a slot is
// outside [0, num_slots).
int radixserve_store_kv(int64_t elem_size, const void* k, const void* v, int64_t k_stride,
                        int64_t v_stride, void* k_cache, void* v_cache, int64_t kv_stride,
                        int64_t num_slots, const int64_t* loc, int64_t n, int64_t row,
                        int num_threads) {
  for (int64_t t = 0; t < n; ++t)
    if (loc[t] < 0 || loc[t] >= num_slots) return STORE_SLOT_OUT_OF_RANGE;
  auto kb = static_cast<const char*>(k);
  auto vb = static_cast<const char*>(v);
  auto kc = static_cast<char*>(k_cache);
  auto vc = static_cast<char*>(v_cache);
  const int64_t bytes = row * elem_size;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n * bytes >= (1 << 18))
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(kc + loc[t] * kv_stride * elem_size, kb + t * k_stride * elem_size, bytes);
    std::memcpy(vc + loc[t] * kv_stride * elem_size, vb + t * v_stride * elem_size, bytes);
  }
  return PAGED_OK;
}

// The multi-token extends of a batch, tiled (flash_extend.h): request i's query rows
// q_start[i] .. + extend[i] - 1 attend slots[kv_row[i]][0 .. prefix[i] + j] (row j, causal);
// out is [rows, hq, d] contiguous, written at the requests' rows only. dtype as above.
// Returns PAGED_OK, PAGED_UNSUPPORTED_DTYPE, or EXTEND_UNSUPPORTED where the path does not
// apply (no AVX-512 in the build, head dim not 16/32/64/128, hq not a multiple of hkv).
int radixserve_extend_attention(int dtype, const void* q, const void* k, const void* v,
                                const int64_t* slots, const int64_t* kv_row,
                                const int64_t* q_start, const int64_t* prefix,
                                const int64_t* extend, int64_t nreq, void* out, int64_t hq,
                                int64_t hkv, int64_t d, int64_t q_stride, int64_t kv_stride,
                                int64_t slots_stride, float scale, int num_threads) {
  const ExtendShape s{hq, hkv, d, q_stride, kv_stride, slots_stride, scale};
  const ExtendReqs rq{kv_row, q_start, prefix, extend, nreq};
  bool done = false;
  if (dtype == 0) {
    done = extend_dispatch<float>(q, k, v, slots, out, s, rq, num_threads);
  } else if (dtype == 1) {
    done = extend_dispatch<uint16_t>(q, k, v, slots, out, s, rq, num_threads);
  } else {
    return PAGED_UNSUPPORTED_DTYPE;
  }
  return done ? PAGED_OK : EXTEND_UNSUPPORTED;
}

// 1 where this build has the tiled extend (AVX-512), else 0.
int radixserve_extend_attention_available() {
#if defined(__AVX512F__)
  return 1;
#else
  return 0;
#endif
}

// 1 where this build and process can run the shared-prefix path (AMX tiles), else 0.
int radixserve_paged_attention_has_shared() { return amx_available(); }

// As radixserve_paged_attention (bfloat16 only), where the query rows `members` (n of them)
// all start with the `prefix_len` slots `prefix_slots` (a multiple of kPrefixBlock). Returns
// PAGED_OK; SHARED_UNSUPPORTED where the path does not apply (no AMX, dtype, head dim 64/128,
// query heads per KV head 1/2/3/4/8); SHARED_PREFIX_MISMATCH where a member's keys do not
// start with the prefix (or a member is not a row).
int radixserve_paged_attention_shared(int dtype, const void* q, const void* k, const void* v,
                                      const int64_t* slots, const int64_t* kv_row,
                                      const int64_t* kv_len, void* out, int64_t nrows,
                                      int64_t hq, int64_t hkv, int64_t d, int64_t q_stride,
                                      int64_t kv_stride, int64_t slots_stride, float scale,
                                      int num_threads, const int64_t* prefix_slots,
                                      int64_t prefix_len, const int64_t* members, int64_t n) {
#if defined(RADIXSERVE_AMX)
  const bool groups_ok = hkv > 0 && hq % hkv == 0 && fast_groups(hq / hkv);
  if (dtype != 1 || (d != 64 && d != 128) || !groups_ok || prefix_len <= 0 ||
      prefix_len % kPrefixBlock != 0 || !amx_ready())
    return SHARED_UNSUPPORTED;
  // Every member's slot row must start with the prefix: checked once per slot row (the
  // tokens of one extend share theirs).
  int64_t checked_row = -1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = members[i];
    if (r < 0 || r >= nrows || kv_len[r] < prefix_len) return SHARED_PREFIX_MISMATCH;
    const int64_t row = kv_row[r];
    if (row == checked_row) continue;
    if (std::memcmp(slots + row * slots_stride, prefix_slots, prefix_len * kSlotBytes) != 0)
      return SHARED_PREFIX_MISMATCH;
    checked_row = row;
  }
  const Shape s{nrows, hq, hkv, d, q_stride, kv_stride, slots_stride, scale};
  const SharedPrefix sp{prefix_slots, prefix_len, members, n};
  auto qt = static_cast<const uint16_t*>(q);
  auto kt = static_cast<const uint16_t*>(k);
  auto vt = static_cast<const uint16_t*>(v);
  auto ot = static_cast<uint16_t*>(out);
  if (d == 64) {
    attend_shared<64>(qt, kt, vt, slots, kv_row, kv_len, ot, s, sp, num_threads);
  } else {
    attend_shared<128>(qt, kt, vt, slots, kv_row, kv_len, ot, s, sp, num_threads);
  }
  return PAGED_OK;
#else
  (void)dtype; (void)q; (void)k; (void)v; (void)slots; (void)kv_row; (void)kv_len; (void)out;
  (void)nrows; (void)hq; (void)hkv; (void)d; (void)q_stride; (void)kv_stride;
  (void)slots_stride; (void)scale; (void)num_threads; (void)prefix_slots; (void)prefix_len;
  (void)members; (void)n;
  return SHARED_UNSUPPORTED;
#endif
}

}  // extern "C"
