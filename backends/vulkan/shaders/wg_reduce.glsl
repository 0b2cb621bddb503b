// Workgroup-wide reductions. DEFINE_WG_REDUCE(name, T, combine) defines
// `T name(T v)`: every invocation of the workgroup calls it (uniform control
// flow) and gets the combination of all their `v`. With USE_SUBGROUPS the
// subgroup reduces by a shuffle butterfly (exact for any `combine`, NaN-aware
// ones included) and only the per-subgroup partials go through shared
// memory; otherwise a shared-memory tree (the workgroup size must be a power
// of two). `combine` must be associative and commutative.
#ifndef KILN_WG_REDUCE_GLSL
#define KILN_WG_REDUCE_GLSL

#ifdef USE_SUBGROUPS
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require

#define DEFINE_WG_REDUCE(name, T, combine)                                \
  shared T name##_partials[gl_WorkGroupSize.x];                           \
  T name(T v) {                                                           \
    for (uint off = gl_SubgroupSize / 2u; off > 0u; off >>= 1u) {         \
      v = combine(v, subgroupShuffleXor(v, off));                         \
    }                                                                     \
    if (subgroupElect()) name##_partials[gl_SubgroupID] = v;              \
    barrier();                                                            \
    T r = name##_partials[0];                                             \
    for (uint k = 1u; k < gl_NumSubgroups; ++k) r = combine(r, name##_partials[k]); \
    barrier();                                                            \
    return r;                                                             \
  }
#else
#define DEFINE_WG_REDUCE(name, T, combine)                                \
  shared T name##_partials[gl_WorkGroupSize.x];                           \
  T name(T v) {                                                           \
    const uint lid = gl_LocalInvocationID.x;                              \
    name##_partials[lid] = v;                                             \
    barrier();                                                            \
    for (uint s = gl_WorkGroupSize.x / 2u; s > 0u; s >>= 1u) {            \
      if (lid < s) name##_partials[lid] = combine(name##_partials[lid], name##_partials[lid + s]); \
      barrier();                                                          \
    }                                                                     \
    const T r = name##_partials[0];                                       \
    barrier();                                                            \
    return r;                                                             \
  }
#endif

float wg_add_f(float a, float b) { return a + b; }
float wg_max_f(float a, float b) { return (isnan(a) || isnan(b)) ? K_NAN : max(a, b); }

#endif  // KILN_WG_REDUCE_GLSL
