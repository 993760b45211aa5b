/* HVX kernels (128-byte vectors, HVX v66 integer instructions). */
#ifndef KAZEIA_KERNELS_H
#define KAZEIA_KERNELS_H
#include <stdint.h>

/* y[o] = Σ_b dot_b(o) · (wscale[o][b] · xs[b]), summed in f32 in block order (src/reference.rs `matvec`).
 * quants/wscales in the HVX layout of src/repack.rs, x int8 [padded_in] (128-byte aligned). */
void hvx_matvec(const uint8_t *quants, const float *wscales, const int8_t *x, const float *xs, float *y,
                int out, int padded_in, int q4);

/* Valid dilated conv on int16 → wrapping int32 (reference `conv1d_i16`). */
void hvx_conv1d_i16(const int16_t *w, const int16_t *x, int32_t *y, int cout, int cin, int k, int len,
                    int dilation);

/* Full transposed conv on int16 → int32 (reference `conv_transpose1d_i16`); scratch holds
 * cin · (len + 2·(ceil(k/stride) − 1) + 64) int16. */
void hvx_conv_transpose1d_i16(const int16_t *w, const int16_t *x, int32_t *y, int16_t *scratch, int cin,
                              int cout, int k, int len, int stride);
#endif
