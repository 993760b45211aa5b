// Workgroup-wide sum and max over WG invocations (1-D workgroups), for any subgroup size.
//
// SUBGROUP=1: subgroup arithmetic, then one partial per subgroup through shared memory (gl_NumSubgroups is read
// at run time: lavapipe runs 8-wide subgroups, desktop GPUs 32/64, Adreno 64/128). SUBGROUP=0: a shared-memory
// tree only, for devices without subgroup arithmetic. Every invocation of the workgroup must call these
// (they contain barriers).

#if SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

shared float reduce_buf[WG];

float wg_sum(float v) {
    float s = subgroupAdd(v);
    if (subgroupElect()) {
        reduce_buf[gl_SubgroupID] = s;
    }
    barrier();
    float total = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) {
        total += reduce_buf[i];
    }
    barrier();
    return total;
}

float wg_max(float v) {
    float s = subgroupMax(v);
    if (subgroupElect()) {
        reduce_buf[gl_SubgroupID] = s;
    }
    barrier();
    float m = reduce_buf[0];
    for (uint i = 1; i < gl_NumSubgroups; i++) {
        m = max(m, reduce_buf[i]);
    }
    barrier();
    return m;
}
#else
shared float reduce_buf[WG];

float wg_sum(float v) {
    uint t = gl_LocalInvocationID.x;
    reduce_buf[t] = v;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (t < s) {
            reduce_buf[t] += reduce_buf[t + s];
        }
        barrier();
    }
    float total = reduce_buf[0];
    barrier();
    return total;
}

float wg_max(float v) {
    uint t = gl_LocalInvocationID.x;
    reduce_buf[t] = v;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (t < s) {
            reduce_buf[t] = max(reduce_buf[t], reduce_buf[t + s]);
        }
        barrier();
    }
    float m = reduce_buf[0];
    barrier();
    return m;
}
#endif
