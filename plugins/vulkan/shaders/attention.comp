#version 450
#extension GL_GOOGLE_include_directive : require
// Causal softmax attention, optionally with a sliding window, one workgroup per (query, query head), keys in
// blocks of WG with a running max and sum (no score matrix in memory, any number of keys). Key j (absolute
// position key_start + j) is visible to the query at q_pos when it is not in the future and q_pos − pos < window.
// q in binding 0, k and v in 1 and 2 ([keys][kv_heads][head_dim]), out in binding 4.

#define WG 64
#define MAX_DIM_PER_INVOCATION 4
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer Q { float QV[]; };
layout(std430, binding = 1) readonly buffer K { float KV[]; };
layout(std430, binding = 2) readonly buffer V { float VV[]; };
layout(std430, binding = 4) writeonly buffer Out { float O[]; };

layout(push_constant) uniform Params {
    uint q_heads;
    uint kv_heads;
    uint head_dim; // at most WG · MAX_DIM_PER_INVOCATION
    uint queries;
    uint query_start;
    uint keys;
    uint key_start;
    uint window; // 0: none
    float scale;
} p;

#include "reduce.glsl"

shared float q_sh[WG * MAX_DIM_PER_INVOCATION];
shared float prob[WG];

void main() {
    uint h = gl_WorkGroupID.x;
    uint qi = gl_WorkGroupID.y;
    uint tid = gl_LocalInvocationID.x;
    uint d = p.head_dim;
    uint kvh = h / (p.q_heads / p.kv_heads);
    uint q_pos = p.query_start + qi;
    uint visible_end = q_pos + 1u;
    uint lo = 0u;
    if (p.window > 0u && visible_end > p.window + p.key_start) {
        lo = visible_end - p.window - p.key_start;
    }
    uint hi = visible_end > p.key_start ? min(visible_end - p.key_start, p.keys) : 0u;
    uint q_base = (qi * p.q_heads + h) * d;

    for (uint i = tid; i < d; i += WG) {
        q_sh[i] = QV[q_base + i];
    }
    barrier();

    float acc[MAX_DIM_PER_INVOCATION];
    for (uint i = 0; i < MAX_DIM_PER_INVOCATION; i++) {
        acc[i] = 0.0;
    }
    float running_max = uintBitsToFloat(0xff800000u);
    float running_sum = 0.0;
    for (uint start = lo; start < hi; start += WG) {
        uint j = start + tid;
        float score = uintBitsToFloat(0xff800000u);
        if (j < hi) {
            uint k_base = (j * p.kv_heads + kvh) * d;
            float s = 0.0;
            for (uint i = 0; i < d; i++) {
                s += q_sh[i] * KV[k_base + i];
            }
            score = s * p.scale;
        }
        float new_max = max(running_max, wg_max(score));
        float e = j < hi ? exp(score - new_max) : 0.0;
        prob[tid] = e;
        float block_sum = wg_sum(e); // its barriers also publish prob[]
        float correction = exp(running_max - new_max);
        running_sum = running_sum * correction + block_sum;
        uint count = min(WG, hi - start);
        for (uint i = 0; i < MAX_DIM_PER_INVOCATION; i++) {
            uint dim = tid + i * WG;
            if (dim < d) {
                float a = acc[i] * correction;
                for (uint jj = 0; jj < count; jj++) {
                    a += prob[jj] * VV[((start + jj) * p.kv_heads + kvh) * d + dim];
                }
                acc[i] = a;
            }
        }
        running_max = new_max;
        barrier(); // prob[] is rewritten by the next block
    }
    for (uint i = 0; i < MAX_DIM_PER_INVOCATION; i++) {
        uint dim = tid + i * WG;
        if (dim < d) {
            O[q_base + dim] = hi > lo ? acc[i] / running_sum : 0.0;
        }
    }
}
