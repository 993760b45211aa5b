/* The tile walk of the fp16 matrix product (tile_matmul.h), and the fp16 conversions. */
#include "tile_matmul.h"

#if defined(KAZEIA_HMX) && defined(__HVX_ARCH__) && __HVX_ARCH__ >= 68
#include <hexagon_types.h>
#include <hvx_hexagon_protos.h>
#define KZ_QFLOAT 1
#endif

/* out[0..cols) += part[0..cols): a full, aligned 32-float row is one HVX vector, added in qf32 on v68+ HMX builds
 * (qfloat: the sum converted back to IEEE f32); elsewhere, and for edge tiles, element by element. */
static void add_row(float *out, const float *part, uint32_t cols)
{
#ifdef KZ_QFLOAT
    if (cols == KZ_TILE && ((uintptr_t)out & 127u) == 0 && ((uintptr_t)part & 127u) == 0) {
        HVX_Vector *o = (HVX_Vector *)out;
        *o = Q6_Vsf_equals_Vqf32(Q6_Vqf32_vadd_VsfVsf(*o, *(const HVX_Vector *)part));
        return;
    }
#endif
    for (uint32_t c = 0; c < cols; c++)
        out[c] += part[c];
}

float kz_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0x1fu) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        /* Subnormal: normalise. */
        exp = 113u;
        while (!(man & 0x400u)) {
            man <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
    union { uint32_t u; float f; } v = {bits};
    return v.f;
}

uint16_t kz_f32_to_f16(float f)
{
    union { float f; uint32_t u; } v = {f};
    const uint32_t sign = (v.u >> 16) & 0x8000u;
    const uint32_t exp = (v.u >> 23) & 0xffu;
    uint32_t man = v.u & 0x7fffffu;
    if (exp == 0xffu) /* infinity, or NaN kept quiet */
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0));
    const int e = (int)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    uint32_t shift, half_bits;
    if (e <= 0) {
        /* Subnormal (or zero) in fp16: the implicit bit joins the mantissa. */
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        shift = (uint32_t)(14 - e);
        half_bits = man >> shift;
    } else {
        shift = 13;
        half_bits = ((uint32_t)e << 10) | (man >> 13);
    }
    const uint32_t rest = man & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half_bits & 1u)))
        half_bits++; /* may carry into the exponent, up to infinity: still correct */
    return (uint16_t)(sign | half_bits);
}

void kz_im2col_f16(const float *x, uint16_t *tiles, uint32_t cin, uint32_t len, uint32_t k, uint32_t dilation)
{
    const uint32_t lout = len - (k - 1) * dilation, cols = k * cin;
    const uint32_t rts = (lout + KZ_TILE - 1) / KZ_TILE, cts = (cols + KZ_TILE - 1) / KZ_TILE;
    for (uint32_t i = 0; i < rts * cts * KZ_TILE_ELEMS; i++)
        tiles[i] = 0;
    for (uint32_t t = 0; t < lout; t++)
        for (uint32_t j = 0; j < k; j++)
            for (uint32_t ci = 0; ci < cin; ci++) {
                const uint32_t col = j * cin + ci;
                const uint32_t at = ((t / KZ_TILE * cts + col / KZ_TILE) * KZ_TILE + t % KZ_TILE) * KZ_TILE +
                                    col % KZ_TILE;
                tiles[at] = kz_f32_to_f16(x[ci * len + t + j * dilation]);
            }
}

int kz_tile_matmul(const kz_tile_engine *e, const uint16_t *a, const uint16_t *b, float *y, uint32_t m, uint32_t n,
                   uint32_t k, uint32_t group)
{
    if (!e || group == 0 || group > KZ_MAX_GROUP || m == 0 || n == 0 || k == 0)
        return -1;
    const uint32_t mts = (m + KZ_TILE - 1) / KZ_TILE, nts = (n + KZ_TILE - 1) / KZ_TILE,
                   kts = (k + KZ_TILE - 1) / KZ_TILE;
    static float part[KZ_TILE_ELEMS] __attribute__((aligned(128)));
    for (uint32_t i = 0; i < m * n; i++)
        y[i] = 0.0f;
    int rc;
    for (uint32_t mt = 0; mt < mts; mt++) {
        const uint32_t rows = m - mt * KZ_TILE < KZ_TILE ? m - mt * KZ_TILE : KZ_TILE;
        for (uint32_t g0 = 0; g0 < kts; g0 += group) {
            const uint32_t gl = kts - g0 < group ? kts - g0 : group;
            for (uint32_t s = 0; s < gl; s++)
                if ((rc = e->load_activation(e->ctx, s, a + (mt * kts + g0 + s) * KZ_TILE_ELEMS)))
                    return rc;
            for (uint32_t nt = 0; nt < nts; nt++) {
                const uint32_t cols = n - nt * KZ_TILE < KZ_TILE ? n - nt * KZ_TILE : KZ_TILE;
                if ((rc = e->clear(e->ctx)))
                    return rc;
                for (uint32_t s = 0; s < gl; s++) {
                    if ((rc = e->load_weight(e->ctx, b + (nt * kts + g0 + s) * KZ_TILE_ELEMS)) ||
                        (rc = e->multiply(e->ctx, s)))
                        return rc;
                }
                if ((rc = e->read(e->ctx, part)))
                    return rc;
                for (uint32_t r = 0; r < rows; r++)
                    add_row(y + (mt * KZ_TILE + r) * n + nt * KZ_TILE, part + r * KZ_TILE, cols);
            }
        }
    }
    return 0;
}

#if !defined(KAZEIA_HMX) && !defined(KAZEIA_TILE_EMULATION)
/* A DSP build without HMX: the host keeps this work (the op reports itself unsupported). */
const kz_tile_engine *kz_active_engine(void)
{
    return 0;
}
#endif
