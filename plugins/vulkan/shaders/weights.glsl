// Reading one weight of a linear (or convolution) matrix in its resident format. W is the data section as 32-bit
// words, S the per-block scales (Q8_0, Q4_0). `idx` is the element index in the row-major, block-padded matrix.
// FORMAT: 0 F32, 1 F16, 2 BF16, 3 Q8_0, 4 Q4_0 (the ABI's codes). Half floats are unpacked from 32-bit words, so
// no 16-bit storage feature is needed.

layout(constant_id = 0) const uint FORMAT = 0;

float weight_at(uint idx) {
    if (FORMAT == 0) {
        return uintBitsToFloat(W[idx]);
    } else if (FORMAT == 1) {
        vec2 pair = unpackHalf2x16(W[idx >> 1]);
        return (idx & 1u) == 0u ? pair.x : pair.y;
    } else if (FORMAT == 2) {
        uint word = W[idx >> 1];
        return uintBitsToFloat((idx & 1u) == 0u ? (word << 16) : (word & 0xffff0000u));
    } else if (FORMAT == 3) {
        int q = bitfieldExtract(int(W[idx >> 2]), int(8u * (idx & 3u)), 8);
        return float(q) * S[idx >> 5];
    } else {
        // 16 bytes per block of 32: byte j holds element j (low nibble) and element j + 16 (high nibble).
        uint e = idx & 31u;
        uint byte_index = (idx >> 5) * 16u + (e & 15u);
        uint nibble = (W[byte_index >> 2] >> (8u * (byte_index & 3u) + (e >= 16u ? 4u : 0u))) & 15u;
        return float(int(nibble) - 8) * S[idx >> 5];
    }
}

// The 32 weights of block `block` (elements block·32 … block·32+31).
void weight_block(uint block, out float w[32]) {
    uint base = block * 32u;
    if (FORMAT == 0) {
        for (uint e = 0; e < 32u; e++) {
            w[e] = uintBitsToFloat(W[base + e]);
        }
    } else if (FORMAT == 1) {
        for (uint e = 0; e < 16u; e++) {
            vec2 pair = unpackHalf2x16(W[(base >> 1) + e]);
            w[2u * e] = pair.x;
            w[2u * e + 1u] = pair.y;
        }
    } else if (FORMAT == 2) {
        for (uint e = 0; e < 16u; e++) {
            uint word = W[(base >> 1) + e];
            w[2u * e] = uintBitsToFloat(word << 16);
            w[2u * e + 1u] = uintBitsToFloat(word & 0xffff0000u);
        }
    } else if (FORMAT == 3) {
        float scale = S[block];
        for (uint j = 0; j < 8u; j++) {
            int word = int(W[(base >> 2) + j]);
            for (uint b = 0; b < 4u; b++) {
                w[4u * j + b] = float(bitfieldExtract(word, int(8u * b), 8)) * scale;
            }
        }
    } else {
        float scale = S[block];
        for (uint j = 0; j < 4u; j++) {
            uint word = W[block * 4u + j];
            for (uint b = 0; b < 4u; b++) {
                uint byte_value = (word >> (8u * b)) & 255u;
                w[4u * j + b] = float(int(byte_value & 15u) - 8) * scale;
                w[4u * j + b + 16u] = float(int(byte_value >> 4) - 8) * scale;
            }
        }
    }
}
