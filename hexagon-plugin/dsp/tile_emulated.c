/* The software model of the HMX fp16 engine (tile_matmul.h): fp16 inputs, products and sums in f32 in the order
 * k-slot by k-slot, column by column, and an fp16 read-back (round to nearest even). The Rust reference
 * (src/repack.rs `tile_matmul_grouped`) follows the same rules, so under qemu-hexagon the two agree bit for bit.
 * On a device the HMX engine is checked against this model at session start (hmx_hexkl.c). */
#include "tile_matmul.h"

static struct {
    float activation[KZ_MAX_GROUP][KZ_TILE_ELEMS];
    float weight[KZ_TILE_ELEMS];
    float acc[KZ_TILE_ELEMS];
} model;

static int load_activation(void *ctx, uint32_t slot, const uint16_t *tile)
{
    (void)ctx;
    if (slot >= KZ_MAX_GROUP)
        return -1;
    for (uint32_t i = 0; i < KZ_TILE_ELEMS; i++)
        model.activation[slot][i] = kz_f16_to_f32(tile[i]);
    return 0;
}

static int load_weight(void *ctx, const uint16_t *tile)
{
    (void)ctx;
    for (uint32_t i = 0; i < KZ_TILE_ELEMS; i++)
        model.weight[i] = kz_f16_to_f32(tile[i]);
    return 0;
}

static int clear(void *ctx)
{
    (void)ctx;
    for (uint32_t i = 0; i < KZ_TILE_ELEMS; i++)
        model.acc[i] = 0.0f;
    return 0;
}

static int multiply(void *ctx, uint32_t slot)
{
    (void)ctx;
    if (slot >= KZ_MAX_GROUP)
        return -1;
    const float *act = model.activation[slot];
    for (uint32_t r = 0; r < KZ_TILE; r++)
        for (uint32_t c = 0; c < KZ_TILE; c++) {
            float sum = model.acc[r * KZ_TILE + c];
            for (uint32_t i = 0; i < KZ_TILE; i++)
                sum += act[r * KZ_TILE + i] * model.weight[c * KZ_TILE + i];
            model.acc[r * KZ_TILE + c] = sum;
        }
    return 0;
}

static int read_back(void *ctx, float *out)
{
    (void)ctx;
    for (uint32_t i = 0; i < KZ_TILE_ELEMS; i++)
        out[i] = kz_f16_to_f32(kz_f32_to_f16(model.acc[i]));
    return 0;
}

static const kz_tile_engine emulated = {0, load_activation, load_weight, clear, multiply, read_back};

const kz_tile_engine *kz_emulated_engine(void)
{
    return &emulated;
}

#if defined(KAZEIA_TILE_EMULATION) && !defined(KAZEIA_HMX)
const kz_tile_engine *kz_active_engine(void)
{
    return &emulated;
}
#endif
