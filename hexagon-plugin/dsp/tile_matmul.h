/* The fp16 tile matrix product of the HMX path. One driver (tile_matmul.c) walks the tiles; a tile engine does the
 * 32×32 work: HMX through Qualcomm's HexKL micro API in SDK builds (hmx_hexkl.c, -DKAZEIA_HMX), or an exact software
 * model of it (tile_emulated.c) that the tests run under qemu-hexagon against src/repack.rs `tile_matmul_grouped`.
 * Only the engine differs between the two, so every index, padding and accumulation rule is tested in CI. */
#ifndef KAZEIA_TILE_MATMUL_H
#define KAZEIA_TILE_MATMUL_H
#include <stdint.h>

#define KZ_TILE 32u
#define KZ_TILE_ELEMS (KZ_TILE * KZ_TILE)
/* Inner-dimension tiles summed in the engine's accumulator before its fp16 read-back is added to the f32 output:
 * HMX's fp16 accumulator bounds how long a sum may run there. */
#define KZ_MAX_GROUP 8u

typedef struct kz_tile_engine {
    void *ctx;
    /* The 32×32 fp16 tile `tile` (row-major [m][k]) becomes the activation in slot `slot` (< KZ_MAX_GROUP). */
    int (*load_activation)(void *ctx, uint32_t slot, const uint16_t *tile);
    /* The 32×32 fp16 tile `tile` (row-major [n][k]: rows of the weight) becomes the weight of the next multiply. */
    int (*load_weight)(void *ctx, const uint16_t *tile);
    int (*clear)(void *ctx);
    /* acc[m][n] += Σ_k activation[slot][m][k] · weight[n][k] */
    int (*multiply)(void *ctx, uint32_t slot);
    /* The accumulator as the engine reads it back (fp16), widened to f32, row-major [m][n]. */
    int (*read)(void *ctx, float *out);
} kz_tile_engine;

/* y[m][n] (f32, row-major, overwritten) = Σ_k a[m][k] · b[n][k] over zero-padded fp16 tiles ([row tile][col tile]
 * [32][32], src/repack.rs `F16Tiles`): per output tile, groups of `group` inner tiles go through the accumulator and
 * each group's read-back is added to y in f32. Returns 0, or -1 on bad arguments, or the engine's error. */
int kz_tile_matmul(const kz_tile_engine *e, const uint16_t *a, const uint16_t *b, float *y, uint32_t m, uint32_t n,
                   uint32_t k, uint32_t group);

/* The input x[cin][len] (f32) of a valid dilated convolution as im2col rows [lout][k·cin] in zero-padded fp16
 * tiles (src/repack.rs `im2col_tiles`): element (t, j·cin + ci) = x[ci][t + j·dilation]. */
void kz_im2col_f16(const float *x, uint16_t *tiles, uint32_t cin, uint32_t len, uint32_t k, uint32_t dilation);

/* IEEE binary16 ↔ binary32, round to nearest even (overflow → infinity). */
float kz_f16_to_f32(uint16_t h);
uint16_t kz_f32_to_f16(float f);

/* The software model of the HMX engine (tile_emulated.c). */
const kz_tile_engine *kz_emulated_engine(void);
/* The engine op KZQ_MATMUL_F16_TILES runs on: HMX when the session set it up, the model in emulation builds
 * (-DKAZEIA_TILE_EMULATION), else none (the op is then unsupported and the host keeps the work). */
const kz_tile_engine *kz_active_engine(void);
#endif
