#version 450
// Valid depthwise convolution, dilation 1: y[c][t] = bias[c] + Σ_j w[c][j] · x[c][t + j].

layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer Weights { float W[]; };
layout(std430, binding = 2) readonly buffer Bias { float BIAS[]; };
layout(std430, binding = 3) readonly buffer Input { float X[]; };
layout(std430, binding = 4) writeonly buffer Output { float Y[]; };

layout(push_constant) uniform Params {
    uint channels;
    uint taps;
    uint len;  // input columns
    uint lout; // len − taps + 1
} p;

void main() {
    uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
    if (i >= p.channels * p.lout) {
        return;
    }
    uint c = i / p.lout;
    uint t = i - c * p.lout;
    float s = 0.0;
    for (uint j = 0; j < p.taps; j++) {
        s += W[c * p.taps + j] * X[c * p.len + t + j];
    }
    Y[i] = s + BIAS[c];
}
