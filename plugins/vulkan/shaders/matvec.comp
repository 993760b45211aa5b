#version 450
#extension GL_GOOGLE_include_directive : require
// y[r][o] = x[r][·] · w[o][·] + bias[o] for a few rows (token steps): one workgroup per output feature, each
// invocation decoding whole 32-weight blocks once and using them for every row, then a workgroup reduction.

#define WG 64
#define MAX_ROWS 8
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer Weights { uint W[]; };
layout(std430, binding = 1) readonly buffer Scales { float S[]; };
layout(std430, binding = 2) readonly buffer Bias { float BIAS[]; };
layout(std430, binding = 3) readonly buffer Input { float X[]; };
layout(std430, binding = 4) writeonly buffer Output { float Y[]; };

layout(push_constant) uniform Params {
    uint out_features;
    uint in_features;
    uint padded_in;
    uint rows;
    uint has_bias;
} p;

#include "weights.glsl"
#include "reduce.glsl"

void main() {
    uint o = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (o >= p.out_features) {
        return; // the whole workgroup leaves together
    }
    uint tid = gl_LocalInvocationID.x;
    uint blocks = p.padded_in / 32u;
    float acc[MAX_ROWS];
    for (uint r = 0; r < MAX_ROWS; r++) {
        acc[r] = 0.0;
    }
    for (uint b = tid; b < blocks; b += WG) {
        float w[32];
        weight_block(o * blocks + b, w);
        uint start = b * 32u;
        uint n = min(32u, p.in_features - start);
        for (uint r = 0; r < p.rows; r++) {
            uint x0 = r * p.in_features + start;
            float s = 0.0;
            if (n == 32u) {
                for (uint e = 0; e < 32u; e++) {
                    s += w[e] * X[x0 + e];
                }
            } else {
                for (uint e = 0; e < n; e++) {
                    s += w[e] * X[x0 + e];
                }
            }
            acc[r] += s;
        }
    }
    for (uint r = 0; r < p.rows; r++) {
        float total = wg_sum(acc[r]);
        if (tid == 0u) {
            Y[r * p.out_features + o] = total + (p.has_bias != 0u ? BIAS[o] : 0.0);
        }
    }
}
