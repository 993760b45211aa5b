/* The HMX tile engine (tile_matmul.h) on Qualcomm's HexKL micro API (`hexkl_micro.h`, `libhexkl_micro.a` of the
 * Hexagon SDK's HexKL addon), v73 and later. SDK builds only: -DKAZEIA_HMX, see the README's device runbook.
 *
 * VTCM holds KZ_MAX_GROUP activation tiles in HMX activation layout, one staging tile (row-major, in and out), the
 * accumulator read-back, the current weight tile in HMX weight layout and the HMX configuration. At session start
 * kz_hmx_init() powers HMX up, locks it, and checks the engine against the software model (tile_emulated.c) on a
 * small product: an engine that disagrees is not used, and KZQ_MATMUL_F16_TILES reports itself unsupported. */
#ifdef KAZEIA_HMX
#include "AEEStdErr.h"
#include "hexkl_micro.h"
#include "tile_matmul.h"

enum {
    TILE_BYTES = KZ_TILE_ELEMS * 2,
    ACTIVATIONS = 0,                                       /* 2048-aligned, KZ_MAX_GROUP tiles */
    STAGING = ACTIVATIONS + KZ_MAX_GROUP * TILE_BYTES,     /* 2048-aligned */
    ACC_OUT = STAGING + TILE_BYTES,                        /* 2048-aligned */
    WEIGHT = ACC_OUT + TILE_BYTES,                         /* 128-aligned */
    CONFIG = WEIGHT + TILE_BYTES,                          /* 256-aligned */
};

static struct {
    uint8_t *vtcm;
    uint32_t vtcm_size;
    int ready;
} hmx;

/* The weight tile transposed to [k][n]: HexKL reads weights as a row-major [inner][out] matrix. */
static uint16_t weight_kn[KZ_TILE_ELEMS] __attribute__((aligned(128)));

static int load_activation(void *ctx, uint32_t slot, const uint16_t *tile)
{
    (void)ctx;
    if (slot >= KZ_MAX_GROUP)
        return AEE_EBADPARM;
    __builtin_memcpy(hmx.vtcm + STAGING, tile, TILE_BYTES);
    return hexkl_micro_hmx_rm_to_ah_f16(hmx.vtcm, ACTIVATIONS + slot * TILE_BYTES, STAGING);
}

static int load_weight(void *ctx, const uint16_t *tile)
{
    (void)ctx;
    for (uint32_t n = 0; n < KZ_TILE; n++)
        for (uint32_t k = 0; k < KZ_TILE; k++)
            weight_kn[k * KZ_TILE + n] = tile[n * KZ_TILE + k];
    return hexkl_micro_hmx_rm_to_wh_f16(hmx.vtcm, WEIGHT, (const _Float16 *)weight_kn, 0, 0, KZ_TILE);
}

static int clear(void *ctx)
{
    (void)ctx;
    hexkl_micro_hmx_acc_clear_f16();
    return AEE_SUCCESS;
}

static int multiply(void *ctx, uint32_t slot)
{
    (void)ctx;
    return hexkl_micro_hmx_mm_f16(hmx.vtcm, ACTIVATIONS + slot * TILE_BYTES, WEIGHT);
}

static int read_back(void *ctx, float *out)
{
    (void)ctx;
    int rc = hexkl_micro_hmx_acc_read_f16(hmx.vtcm, CONFIG, ACC_OUT);
    if (rc == AEE_SUCCESS)
        rc = hexkl_micro_hmx_ah_to_rm_f16(hmx.vtcm, STAGING, ACC_OUT);
    if (rc == AEE_SUCCESS)
        rc = hexkl_micro_hmx_copy_f16_to_f32_submatrix(hmx.vtcm, STAGING, out, 0, 0, KZ_TILE, KZ_TILE);
    return rc;
}

static const kz_tile_engine engine = {0, load_activation, load_weight, clear, multiply, read_back};

/* A 40×45×100 product on HMX and on the model: within 1 % of the peak (fp16 accumulators; a wrong layout is off
 * by the whole value). */
static int self_test(void)
{
    enum { M = 40, N = 45, K = 100, MT = 2, NT = 2, KT = 4 };
    static uint16_t a[MT * KT * KZ_TILE_ELEMS], b[NT * KT * KZ_TILE_ELEMS];
    static float on_hmx[M * N], on_model[M * N];
    uint32_t seed = 12345;
    __builtin_memset(a, 0, sizeof a);
    __builtin_memset(b, 0, sizeof b);
    for (uint32_t r = 0; r < M; r++)
        for (uint32_t c = 0; c < K; c++) {
            seed = seed * 1664525u + 1013904223u;
            a[((r / KZ_TILE) * KT + c / KZ_TILE) * KZ_TILE_ELEMS + (r % KZ_TILE) * KZ_TILE + c % KZ_TILE] =
                kz_f32_to_f16((float)(seed >> 8) / 16777216.0f * 2.0f - 1.0f);
        }
    for (uint32_t r = 0; r < N; r++)
        for (uint32_t c = 0; c < K; c++) {
            seed = seed * 1664525u + 1013904223u;
            b[((r / KZ_TILE) * KT + c / KZ_TILE) * KZ_TILE_ELEMS + (r % KZ_TILE) * KZ_TILE + c % KZ_TILE] =
                kz_f32_to_f16((float)(seed >> 8) / 16777216.0f * 2.0f - 1.0f);
        }
    if (kz_tile_matmul(&engine, a, b, on_hmx, M, N, K, 2) || kz_tile_matmul(kz_emulated_engine(), a, b, on_model, M, N, K, 2))
        return -1;
    float peak = 1.0f, worst = 0.0f;
    for (uint32_t i = 0; i < M * N; i++) {
        const float d = on_hmx[i] - on_model[i], m = on_model[i] < 0 ? -on_model[i] : on_model[i];
        peak = m > peak ? m : peak;
        worst = (d < 0 ? -d : d) > worst ? (d < 0 ? -d : d) : worst;
    }
    return worst <= 0.01f * peak ? 0 : -1;
}

/* Powers HMX up and checks it; 0 when KZQ_MATMUL_F16_TILES will run on it. */
int kz_hmx_init(void)
{
    if (hmx.ready)
        return 0;
    if (hexkl_micro_hw_init(&hmx.vtcm, &hmx.vtcm_size) != AEE_SUCCESS || !hmx.vtcm ||
        hmx.vtcm_size < CONFIG + hexkl_micro_hmx_config_size())
        return -1;
    if (hexkl_micro_hmx_lock() != AEE_SUCCESS)
        return -2;
    if (hexkl_micro_hmx_setup_acc_read_f16(hmx.vtcm, CONFIG) != AEE_SUCCESS || self_test() != 0) {
        hexkl_micro_hmx_unlock();
        return -3;
    }
    hmx.ready = 1;
    return 0;
}

void kz_hmx_release(void)
{
    if (hmx.ready) {
        hexkl_micro_hmx_unlock();
        hmx.ready = 0;
    }
}

const kz_tile_engine *kz_active_engine(void)
{
    return hmx.ready ? &engine : 0;
}
#endif
