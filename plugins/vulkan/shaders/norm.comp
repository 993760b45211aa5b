#version 450
#extension GL_GOOGLE_include_directive : require
// In-place row normalisation of x[rows][dim] (binding 4), one workgroup per row.
// MODE 0 RMSNorm: x · 1/sqrt(mean(x²) + eps) · g; MODE 1 LayerNorm (biased variance): (x − mean) · 1/sqrt(var +
// eps) · g + b. g in binding 0, b in binding 1.

#define WG 64
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer Gain { float G[]; };
layout(std430, binding = 1) readonly buffer Shift { float B[]; };
layout(std430, binding = 4) buffer Data { float X[]; };

layout(constant_id = 0) const uint MODE = 0;

layout(push_constant) uniform Params {
    uint dim;
    float eps;
    uint rows;
} p;

#include "reduce.glsl"

void main() {
    uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (row >= p.rows) {
        return; // the whole workgroup leaves together
    }
    uint tid = gl_LocalInvocationID.x;
    uint base = row * p.dim;
    if (MODE == 0) {
        float s = 0.0;
        for (uint i = tid; i < p.dim; i += WG) {
            float v = X[base + i];
            s += v * v;
        }
        float inv = 1.0 / sqrt(wg_sum(s) / float(p.dim) + p.eps);
        for (uint i = tid; i < p.dim; i += WG) {
            X[base + i] = G[i] * (X[base + i] * inv);
        }
    } else {
        float s = 0.0;
        for (uint i = tid; i < p.dim; i += WG) {
            s += X[base + i];
        }
        float mean = wg_sum(s) / float(p.dim);
        float q = 0.0;
        for (uint i = tid; i < p.dim; i += WG) {
            float d = X[base + i] - mean;
            q += d * d;
        }
        float inv = 1.0 / sqrt(wg_sum(q) / float(p.dim) + p.eps);
        for (uint i = tid; i < p.dim; i += WG) {
            X[base + i] = (X[base + i] - mean) * inv * G[i] + B[i];
        }
    }
}
