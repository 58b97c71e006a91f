// AMX basics shared by the kernels that use tiles (amx_prefix.h, amx_gemm.cpp).
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define RADIXSERVE_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <cstdint>

namespace radixserve_cpu {

#if defined(RADIXSERVE_AMX)
// Linux (5.16+) enables a process's AMX tile state only on request: arch_prctl's
// ARCH_REQ_XCOMP_PERM (asm/prctl.h) for the XSAVE state component XFEATURE_XTILEDATA (the
// tiles' 8 KiB of data; kernel-internal, so not in the uapi headers). Spelled out here
// because older headers lack them. oneDNN asks too, and asking twice is harmless.
constexpr int kArchReqXcompPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM
constexpr int kXfeatureXtiledata = 18;     // XFEATURE_XTILEDATA

inline bool amx_ready() {
  static const bool ok = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return ok;
}

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Every tile 16 rows × 64 bytes. The config is per thread; the caller releases it after.
inline void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}
#endif

// 1 where this build and process can use the tiles, else 0 (the libraries' *_available).
inline int amx_available() {
#if defined(RADIXSERVE_AMX)
  return amx_ready() ? 1 : 0;
#else
  return 0;
#endif
}

}  // namespace radixserve_cpu
