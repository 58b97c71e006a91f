// Projections y = x · Wᵀ (+ b) in bfloat16 on AMX tiles, with W packed once at load.
//
// Why not oneDNN: its prepacked matmul read SmolLM2's projection weights at 6–7 GB/s for a
// decode batch of 32 rows here, where a copy moves 19–23 GB/s (docs/benchmarks.md). A decode
// step is bound by those reads, so this kernel streams each weight once per call, in the order
// the tiles are multiplied, with the next tiles prefetched: at 1 to 32 rows it reads them at
// 1.7–1.9× oneDNN's rate; from 64 rows on the tile multiplies set the pace and the two are
// within a few percent of each other.
//
// Packed layout (radixserve_amx_pack): tiles of 16 rows × 64 bytes, ordered [N/16][K/32]: tile
// (nb, kb) row i holds, for each of the block's 16 output columns c, W[16nb + c][32kb + 2i] and
// W[16nb + c][32kb + 2i + 1], which is TDPBF16PS's B operand. Column blocks go two by two to
// the threads, and each pair's tiles are contiguous, so a thread reads one forward stream.
//
// x rows go 32 at a time (two A tiles of 16 rows, the last group shorter through the tile
// configuration's row counts); each pair of column blocks accumulates 2 × 2 float32 tiles over
// K and rounds once on the way out, as oneDNN does. Requires K % 32 == 0 and N % 16 == 0.

#include <omp.h>

#include <cstdint>

#include "amx_tiles.h"
#include "gemm_problem.h"

namespace {

using namespace radixserve_cpu;

constexpr int64_t kTile = 512;       // bf16 elements in one 16 × 64-byte tile
constexpr int64_t kPrefetchAhead = 4;  // K steps (tiles per stream) to prefetch ahead

#if defined(RADIXSERVE_AMX)

using Problem = GemmProblem;

// Tiles: C 0, 1 (rows 0..15 of the group; column blocks 0, 1), C 2, 3 (rows 16..31);
// A 4 (rows 0..15), A 5 (rows 16..31); B 6, 7 (column blocks 0, 1).
void configure_rows(int64_t rows) {
  TileConfig cfg;
  const uint8_t top = static_cast<uint8_t>(rows > 16 ? 16 : rows);
  const uint8_t low = static_cast<uint8_t>(rows > 16 ? rows - 16 : 1);
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  cfg.rows[0] = cfg.rows[1] = cfg.rows[4] = top;
  cfg.rows[2] = cfg.rows[3] = cfg.rows[5] = low;
  _tile_loadconfig(&cfg);
}

// Rows [r0, r0 + rows) of the float32 block c (16 × `width` columns, row stride 32) plus the
// bias, rounded to the output's dtype at columns [col, col + width).
void write_rows(const Problem& p, const float* c, int64_t r0, int64_t rows, int64_t col,
                int64_t width) {
  __m512 b[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  if (p.bias != nullptr)
    for (int64_t h = 0; h < width / 16; ++h)
      b[h] = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(p.bias + col + 16 * h))),
          16));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < width / 16; ++h) {
      const __m512 v = _mm512_add_ps(_mm512_load_ps(c + r * 32 + 16 * h), b[h]);
      const int64_t at = (r0 + r) * p.ldo + col + 16 * h;
      if (p.out_f32) {
        _mm512_storeu_ps(static_cast<float*>(p.out) + at, v);
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(p.out) + at),
                            reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
      }
    }
  }
}

inline void prefetch_lines(const uint16_t* tile) {
  const char* c = reinterpret_cast<const char*>(tile);
  for (int l = 0; l < 16; ++l) _mm_prefetch(c + 64 * l, _MM_HINT_T0);
}

// Row group g (32 rows) against column blocks nb (and nb + 1 when TWO), all of K.
template <bool TWO>
void block(const Problem& p, int64_t nb, int64_t g, float* cbuf) {
  const int64_t kbs = p.k / 32, r0 = 32 * g;
  const int64_t rows = p.m - r0 < 32 ? p.m - r0 : 32;
  const bool low = rows > 16;
  const uint16_t* x = p.x + r0 * p.ldx;
  const uint16_t* b0 = p.wp + nb * kbs * kTile;
  const uint16_t* b1 = b0 + kbs * kTile;
  _tile_zero(0);
  if (TWO) _tile_zero(1);
  if (low) {
    _tile_zero(2);
    if (TWO) _tile_zero(3);
  }
  for (int64_t kb = 0; kb < kbs; ++kb) {
    if (kb + kPrefetchAhead < kbs) {  // from memory for the first row group, L2 for the rest
      prefetch_lines(b0 + (kb + kPrefetchAhead) * kTile);
      if (TWO) prefetch_lines(b1 + (kb + kPrefetchAhead) * kTile);
    }
    _tile_loadd(4, x + kb * 32, p.ldx * 2);
    _tile_loadd(6, b0 + kb * kTile, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (TWO) {
      _tile_loadd(7, b1 + kb * kTile, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (low) {
      _tile_loadd(5, x + 16 * p.ldx + kb * 32, p.ldx * 2);
      _tile_dpbf16ps(2, 5, 6);
      if (TWO) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, cbuf, 128);
  if (TWO) _tile_stored(1, cbuf + 16, 128);
  if (low) {
    _tile_stored(2, cbuf + 16 * 32, 128);
    if (TWO) _tile_stored(3, cbuf + 16 * 32 + 16, 128);
  }
  write_rows(p, cbuf, r0, rows, nb * 16, TWO ? 32 : 16);
}

void run(const Problem& p, int num_threads) {
  const int64_t blocks = p.n / 16, pairs = (blocks + 1) / 2, groups = (p.m + 31) / 32;
#pragma omp parallel num_threads(num_threads)
  {
    alignas(64) float cbuf[32 * 32];
    int64_t configured = -1;  // the row count the tiles are configured for
#pragma omp for schedule(static) collapse(2)
    for (int64_t pair = 0; pair < pairs; ++pair) {
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t rows = p.m - 32 * g < 32 ? p.m - 32 * g : 32;
        if (rows != configured) {
          configure_rows(rows);
          configured = rows;
        }
        if (2 * pair + 1 < blocks) {
          block<true>(p, 2 * pair, g, cbuf);
        } else {
          block<false>(p, 2 * pair, g, cbuf);
        }
      }
    }
    if (configured >= 0) _tile_release();
  }
}

#endif  // RADIXSERVE_AMX

}  // namespace

extern "C" {

// 1 where the CPU and the kernel have AMX-BF16 and Linux granted the tile state, else 0.
int radixserve_amx_gemm_available() { return amx_available(); }

// w [n, k] bf16 row-major (row stride ldw) into `out` (n·k bf16) in the packed layout.
// Returns 0, or -2 for a shape the kernel does not take.
int radixserve_amx_pack(const uint16_t* w, int64_t n, int64_t k, int64_t ldw, uint16_t* out,
                        int num_threads) {
  if (n <= 0 || k <= 0 || n % 16 != 0 || k % 32 != 0 || ldw < k) return -2;
  const int64_t kbs = k / 32;
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t nb = 0; nb < n / 16; ++nb) {
    for (int64_t kb = 0; kb < kbs; ++kb) {
      uint32_t* tile = reinterpret_cast<uint32_t*>(out + (nb * kbs + kb) * kTile);
      for (int64_t c = 0; c < 16; ++c) {
        const uint32_t* pairs = reinterpret_cast<const uint32_t*>(w + (nb * 16 + c) * ldw + kb * 32);
        for (int64_t i = 0; i < 16; ++i) tile[i * 16 + c] = pairs[i];
      }
    }
  }
  return 0;
}

// out[m, n] = x[m, :k] · Wᵀ (+ bias), W packed by radixserve_amx_pack. x bf16 (row stride
// ldx), bias bf16 [n] or null, out bf16 (out_f32 = 0) or float32 (1) with row stride ldo.
// Returns 0; -1 without AMX; -2 for a shape the kernel does not take.
int radixserve_amx_linear(const uint16_t* x, int64_t m, int64_t ldx, const uint16_t* wp,
                          int64_t n, int64_t k, const uint16_t* bias, void* out, int64_t ldo,
                          int out_f32, int num_threads) {
#if defined(RADIXSERVE_AMX)
  if (!amx_ready()) return -1;
  if (m < 0 || n <= 0 || n % 16 != 0 || k <= 0 || k % 32 != 0 || ldx < k || ldo < n) return -2;
  if (m == 0) return 0;
  run(Problem{x, m, ldx, wp, n, k, bias, out, ldo, out_f32 != 0}, num_threads);
  return 0;
#else
  (void)x, (void)m, (void)ldx, (void)wp, (void)n, (void)k, (void)bias, (void)out, (void)ldo,
      (void)out_f32, (void)num_threads;
  return -1;
#endif
}

}  // extern "C"
