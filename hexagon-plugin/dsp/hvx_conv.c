/* HVX conv1d and transposed conv1d on int16 activations and weights with int32 accumulators: 64 outputs per
 * step, each weight broadcast as a halfword pair and multiplied into 64 consecutive inputs (`vmpy` even/odd
 * halves into a vector pair, re-interleaved by `vshuff` at the end). The fixed-point path of the decoder
 * convolutions; the fp16 path is HMX (hmx_matmul.c, SDK builds). */
#include <hexagon_types.h>
#include <hexagon_protos.h>
#include "kernels.h"

/* y[0..64] = Σ_taps w_tap · src_tap[0..64] for the taps given as (pointer, weight) pairs. */
static void store64(HVX_VectorPair acc, int32_t *y)
{
    HVX_VectorPair ordered = Q6_W_vshuff_VVR(Q6_V_hi_W(acc), Q6_V_lo_W(acc), -4);
    *(HVX_UVector *)y = Q6_V_lo_W(ordered);
    *(HVX_UVector *)(y + 32) = Q6_V_hi_W(ordered);
}

static inline int32_t pair(int16_t w)
{
    return (int32_t)(((uint32_t)(uint16_t)w << 16) | (uint16_t)w);
}

void hvx_conv1d_i16(const int16_t *w, const int16_t *x, int32_t *y, int cout, int cin, int k, int len,
                    int dilation)
{
    const int lout = len - (k - 1) * dilation;
    for (int co = 0; co < cout; co++) {
        int t = 0;
        for (; t + 64 <= lout; t += 64) {
            HVX_VectorPair acc = Q6_W_vzero();
            for (int ci = 0; ci < cin; ci++)
                for (int j = 0; j < k; j++) {
                    HVX_Vector xv = *(const HVX_UVector *)(x + ci * len + t + j * dilation);
                    acc = Q6_Ww_vmpyacc_WwVhRh(acc, xv, pair(w[(co * cin + ci) * k + j]));
                }
            store64(acc, y + co * lout + t);
        }
        for (; t < lout; t++) {
            uint32_t s = 0;
            for (int ci = 0; ci < cin; ci++)
                for (int j = 0; j < k; j++)
                    s += (uint32_t)((int32_t)w[(co * cin + ci) * k + j] * x[ci * len + t + j * dilation]);
            y[co * lout + t] = (int32_t)s;
        }
    }
}

/* Polyphase: output p = u·stride + r takes taps j = r + m·stride on input u − m, a plain conv over a
 * zero-padded copy of x per phase r. */
void hvx_conv_transpose1d_i16(const int16_t *w, const int16_t *x, int32_t *y, int16_t *scratch, int cin,
                              int cout, int k, int len, int stride)
{
    const int lout = (len - 1) * stride + k, pad = (k + stride - 1) / stride - 1;
    const int plen = len + 2 * pad + 64;
    for (int ci = 0; ci < cin; ci++)
        for (int i = 0; i < plen; i++) {
            int src = i - pad;
            scratch[ci * plen + i] = (src >= 0 && src < len) ? x[ci * len + src] : 0;
        }
    HVX_Vector chunk[2];
    const int32_t *z = (const int32_t *)chunk;
    for (int co = 0; co < cout; co++)
        for (int r = 0; r < stride && r < lout; r++) {
            const int taps = (k - r + stride - 1) / stride;   /* m with r + m·stride < k */
            const int outs = (lout - r + stride - 1) / stride; /* u with u·stride + r < lout */
            for (int u = 0; u < outs; u += 64) {
                HVX_VectorPair acc = Q6_W_vzero();
                for (int ci = 0; ci < cin; ci++)
                    for (int m = 0; m < taps; m++) {
                        /* u − m + pad ≥ 0 since m ≤ pad; the copy has 64 zeros of slack past the end. */
                        HVX_Vector xv = *(const HVX_UVector *)(scratch + ci * plen + u - m + pad);
                        acc = Q6_Ww_vmpyacc_WwVhRh(acc, xv, pair(w[(ci * cout + co) * k + r + m * stride]));
                    }
                store64(acc, (int32_t *)chunk);
                for (int i = 0; i < 64 && u + i < outs; i++)
                    y[co * lout + (u + i) * stride + r] = z[i];
            }
        }
}
