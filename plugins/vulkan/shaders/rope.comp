#version 450
// In-place split-half rotary embedding of x[rows][heads][head_dim] (binding 4) with the angles' cosines and
// sines computed on the host exactly as the CPU backend does: table = cos[rows][half] then sin[rows][half].

layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer Table { float T[]; };
layout(std430, binding = 4) buffer Data { float X[]; };

layout(push_constant) uniform Params {
    uint rows;
    uint heads;
    uint half_dim;
} p;

void main() {
    uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
    if (i >= p.rows * p.heads * p.half_dim) {
        return;
    }
    uint pair = i % p.half_dim;
    uint head = i / p.half_dim;
    uint row = head / p.heads;
    float c = T[row * p.half_dim + pair];
    float s = T[(p.rows + row) * p.half_dim + pair];
    uint a = head * 2u * p.half_dim + pair;
    uint b = a + p.half_dim;
    float x1 = X[a];
    float x2 = X[b];
    X[a] = x1 * c - x2 * s;
    X[b] = x2 * c + x1 * s;
}
