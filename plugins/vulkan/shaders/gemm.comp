#version 450
#extension GL_GOOGLE_include_directive : require
// Tiled matrix product C[M][N] = A[M][K] · B[K][N] for linear layers and convolutions (implicit GEMM: B is
// gathered from the input, never materialised). 16×16 invocations compute a 64×64 tile, 4×4 each, through 8 KB
// of shared memory.
//
// MODE 0, linear:  A = w[out][padded_in] (any FORMAT), B[k][n] = x[n][k], y[n][m] = C + bias[m].
// MODE 1, conv1d:  A = w[cout][cin·k], B[(ci,t)][n] = x[ci][n + t·dilation], y[m][n] = C + bias[m].
// MODE 2, transposed conv1d, one output phase φ per workgroup z: A = w_φ[cout][cin·J] (repacked at upload so
//   that tap j of phase φ is kernel tap φ + j·stride, zero past k), B[(ci,j)][q] = x[ci][q − j] (0 outside),
//   y[m][q·stride + φ] = C.

#define WG 256
#define BM 64
#define BN 64
#define BK 16
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer Weights { uint W[]; };
layout(std430, binding = 1) readonly buffer Scales { float S[]; };
layout(std430, binding = 2) readonly buffer Bias { float BIAS[]; };
layout(std430, binding = 3) readonly buffer Input { float X[]; };
layout(std430, binding = 4) writeonly buffer Output { float Y[]; };

layout(constant_id = 1) const uint MODE = 0;

layout(push_constant) uniform Params {
    uint m;        // output features / channels
    uint n;        // rows (linear) or output columns (conv); per phase for MODE 2 (computed)
    uint k;        // reduction length
    uint a_stride; // elements between rows of A
    uint has_bias;
    uint taps;     // kernel taps per input channel (k for conv, J for transposed conv)
    uint dilation;
    uint len;      // input columns (conv modes)
    uint stride;   // MODE 2
    uint full;     // MODE 2: output columns, (len − 1)·stride + kernel
} p;

#include "weights.glsl"

shared float As[BK][BM];
shared float Bs[BK][BN];

float b_at(uint kk, uint col) {
    if (MODE == 0) {
        return X[col * p.k + kk];
    } else if (MODE == 1) {
        uint ci = kk / p.taps;
        uint t = kk - ci * p.taps;
        return X[ci * p.len + col + t * p.dilation];
    } else {
        uint ci = kk / p.taps;
        uint j = kk - ci * p.taps;
        int src = int(col) - int(j);
        return (src >= 0 && src < int(p.len)) ? X[ci * p.len + uint(src)] : 0.0;
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint tx = tid % 16u;
    uint ty = tid / 16u;
    uint m0 = gl_WorkGroupID.y * BM;
    uint n0 = gl_WorkGroupID.x * BN;
    uint phase = gl_WorkGroupID.z;
    uint cols = p.n;
    uint a_base = 0u;
    if (MODE == 2) {
        cols = (p.full - phase + p.stride - 1u) / p.stride;
        a_base = phase * p.m * p.a_stride;
    }

    float acc[4][4];
    for (uint i = 0; i < 4u; i++) {
        for (uint j = 0; j < 4u; j++) {
            acc[i][j] = 0.0;
        }
    }

    for (uint k0 = 0; k0 < p.k; k0 += BK) {
        // A tile: k fastest, so neighbouring invocations read neighbouring weights of a row.
        for (uint e = tid; e < BK * BM; e += WG) {
            uint kk = e % BK;
            uint mm = e / BK;
            uint gm = m0 + mm;
            uint gk = k0 + kk;
            As[kk][mm] = (gm < p.m && gk < p.k) ? weight_at(a_base + gm * p.a_stride + gk) : 0.0;
        }
        // B tile: along the input's contiguous axis (k for linear rows, time for convolutions).
        for (uint e = tid; e < BK * BN; e += WG) {
            uint kk = MODE == 0 ? e % BK : e / BN;
            uint nn = MODE == 0 ? e / BK : e % BN;
            uint gn = n0 + nn;
            uint gk = k0 + kk;
            Bs[kk][nn] = (gn < cols && gk < p.k) ? b_at(gk, gn) : 0.0;
        }
        barrier();
        for (uint kk = 0; kk < BK; kk++) {
            float a[4];
            float b[4];
            for (uint i = 0; i < 4u; i++) {
                a[i] = As[kk][ty * 4u + i];
                b[i] = Bs[kk][tx * 4u + i];
            }
            for (uint i = 0; i < 4u; i++) {
                for (uint j = 0; j < 4u; j++) {
                    acc[i][j] += a[i] * b[j];
                }
            }
        }
        barrier();
    }

    for (uint i = 0; i < 4u; i++) {
        uint gm = m0 + ty * 4u + i;
        if (gm >= p.m) {
            continue;
        }
        float bias = (MODE != 2 && p.has_bias != 0u) ? BIAS[gm] : 0.0;
        for (uint j = 0; j < 4u; j++) {
            uint gn = n0 + tx * 4u + j;
            if (gn >= cols) {
                continue;
            }
            if (MODE == 0) {
                Y[gn * p.m + gm] = acc[i][j] + bias;
            } else if (MODE == 1) {
                Y[gm * cols + gn] = acc[i][j] + bias;
            } else {
                Y[gm * p.full + gn * p.stride + phase] = acc[i][j];
            }
        }
    }
}
