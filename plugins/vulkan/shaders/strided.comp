#version 450
// Strided element-by-element ops between two buffers (the ABI's Copy, Add and Mul): element (r, c) of a
// rows × cols view lies at offset + r·row_stride + c·col_stride. MODE 0 dst = src, 1 dst += src, 2 dst *= src.
// The destination view never names an element twice (the plugin checks), so invocations never race.

layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer Src { float S[]; };
layout(std430, binding = 4) buffer Dst { float D[]; };

layout(constant_id = 0) const uint MODE = 0;

layout(push_constant) uniform Params {
    uint rows;
    uint cols;
    uint src_offset;
    uint src_row_stride;
    uint src_col_stride;
    uint dst_offset;
    uint dst_row_stride;
    uint dst_col_stride;
} p;

void main() {
    uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
    if (i >= p.rows * p.cols) {
        return;
    }
    uint r = i / p.cols;
    uint c = i - r * p.cols;
    float v = S[p.src_offset + r * p.src_row_stride + c * p.src_col_stride];
    uint j = p.dst_offset + r * p.dst_row_stride + c * p.dst_col_stride;
    if (MODE == 0u) {
        D[j] = v;
    } else if (MODE == 1u) {
        D[j] = D[j] + v;
    } else {
        D[j] = D[j] * v;
    }
}
