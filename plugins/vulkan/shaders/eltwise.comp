#version 450
// In-place elementwise activations on x (binding 4):
// OP 0 exact GELU, 1 SiLU, 2 SiLU(x)·up (up in binding 0), 3 SnakeBeta x + inv_beta[c]·sin²(alpha[c]·x) on
// x[c][len] (alpha in binding 0, inv_beta in binding 1).

layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer A { float IN_A[]; };
layout(std430, binding = 1) readonly buffer B { float IN_B[]; };
layout(std430, binding = 4) buffer Data { float X[]; };

layout(constant_id = 0) const uint OP = 0;

layout(push_constant) uniform Params {
    uint n;
    uint len;
} p;

// erf through erfc(|x|) = t·exp(−x² + P(t)), t = 1/(1 + |x|/2) (Numerical Recipes' Chebyshev fit, fractional
// error below 1.2e-7 everywhere).
float erf_approx(float x) {
    float z = abs(x);
    float t = 1.0 / (1.0 + 0.5 * z);
    float poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
        + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
    float erfc = t * exp(-z * z + poly);
    return x >= 0.0 ? 1.0 - erfc : erfc - 1.0;
}

// sin²(y): y = k·π/2 + r with |r| ≤ π/4 (three-part Cody–Waite reduction), then a Taylor polynomial to r⁹;
// sin² for even k, cos² = 1 − sin² for odd k. `precise` keeps the reduction's rounding as written.
float sin_squared(float y) {
    const float PIO2_HI = 1.5703125;
    const float PIO2_MID = 4.8382676e-4;
    const float PIO2_LO = 6.0771006e-11;
    precise float k = roundEven(y * 0.63661977236758134);
    precise float r = ((y - k * PIO2_HI) - k * PIO2_MID) - k * PIO2_LO;
    float r2 = r * r;
    float s = r * (1.0 + r2 * (-1.0 / 6.0 + r2 * (1.0 / 120.0 + r2 * (-1.0 / 5040.0 + r2 * (1.0 / 362880.0)))));
    float s2 = s * s;
    return (int(k) & 1) == 1 ? 1.0 - s2 : s2;
}

void main() {
    uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
    if (i >= p.n) {
        return;
    }
    float v = X[i];
    if (OP == 0) {
        X[i] = v * 0.5 * (1.0 + erf_approx(v * 0.70710678118654752));
    } else if (OP == 1) {
        X[i] = v / (1.0 + exp(-v));
    } else if (OP == 2) {
        X[i] = v / (1.0 + exp(-v)) * IN_A[i];
    } else {
        uint c = i / p.len;
        X[i] = v + IN_B[c] * sin_squared(v * IN_A[c]);
    }
}
