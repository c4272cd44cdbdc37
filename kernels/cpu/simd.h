/* simd.h: include first in a CPU kernel file. Loops with float compares
 * only if-convert (and so vectorise) without -ftrapping-math: loom never
 * reads the FP exception flags. LM_CLONES compiles a hot loop for AVX-512,
 * AVX2+FMA and the baseline, picked at load (ifunc), when the build does
 * not already target AVX2 (LOOM_NATIVE=OFF). Clone only leaf loops: no
 * OpenMP regions inside. */
#ifndef LOOM_CPU_SIMD_H
#define LOOM_CPU_SIMD_H
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__AVX2__) && \
    __GNUC__ >= 12
#define LM_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define LM_CLONES
#endif
#endif
