/* HVX matvec over Q8_0/Q4_0 weights in the row-tile layout of src/repack.rs: each 32-bit lane is one output
 * row, `vrmpy` multiplies its 4 weight bytes by 4 activation bytes broadcast to every lane and sums them. The
 * block dot products are exact int32; the scaling and the sum over blocks are scalar f32 in block order, as
 * the reference computes (HVX v66 has no float lanes; qfloat builds for v68+ can vectorise them). */
#include <hexagon_types.h>
#include <hexagon_protos.h>
#include "kernels.h"

void hvx_matvec(const uint8_t *quants, const float *wscales, const int8_t *x, const float *xs, float *y,
                int out, int padded_in, int q4)
{
    const int nb = padded_in / 32, tiles = (out + 31) / 32, nv = q4 ? 4 : 8;
    const HVX_Vector low_nibbles = Q6_V_vsplat_R(0x0f0f0f0f);
    HVX_Vector dots;
    const int32_t *lanes = (const int32_t *)&dots;
    for (int tile = 0; tile < tiles; tile++) {
        float acc[32];
        for (int i = 0; i < 32; i++)
            acc[i] = 0.0f;
        for (int b = 0; b < nb; b++) {
            const HVX_Vector *v = (const HVX_Vector *)(quants + (tile * nb + b) * nv * 128);
            const int32_t *xw = (const int32_t *)(x + b * 32);
            HVX_Vector dot = Q6_V_vzero();
            if (!q4) {
                for (int g = 0; g < 8; g++)
                    dot = Q6_Vw_vrmpyacc_VwVbVb(dot, v[g], Q6_V_vsplat_R(xw[g]));
            } else {
                /* Unsigned nibbles q: Σ (q − 8)·x = Σ q·x − 8·Σ x. */
                int xsum = 0;
                for (int j = 0; j < 32; j++)
                    xsum += x[b * 32 + j];
                for (int g = 0; g < 4; g++) {
                    HVX_Vector lo = Q6_V_vand_VV(v[g], low_nibbles);
                    HVX_Vector hi = Q6_V_vand_VV(Q6_Vuh_vlsr_VuhR(v[g], 4), low_nibbles);
                    dot = Q6_Vw_vrmpyacc_VwVubRb(dot, lo, xw[g]);
                    dot = Q6_Vw_vrmpyacc_VwVubRb(dot, hi, xw[g + 4]);
                }
                dot = Q6_Vw_vsub_VwVw(dot, Q6_V_vsplat_R(8 * xsum));
            }
            dots = dot;
            const float *ws = wscales + (tile * nb + b) * 32;
            for (int i = 0; i < 32; i++)
                acc[i] = acc[i] + (float)lanes[i] * (ws[i] * xs[b]);
        }
        for (int i = 0; i < 32 && tile * 32 + i < out; i++)
            y[tile * 32 + i] = acc[i];
    }
}
