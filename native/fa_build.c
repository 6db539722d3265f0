/* fa_build.c: what this build of the library compiled, for the lessons and the timings to name:
 * the backend (real NEON or SIMDe) and the branch of each SIMD helper (q8_simd.h, whose branches
 * name themselves; lesson 00 prints both, lesson 04 marks the dot product's branch). */
#include "q8_simd.h"

const char *fa_backend(void)
{
#if defined(__ARM_FEATURE_DOTPROD)
    return "neon+dotprod";
#elif defined(__aarch64__)
    return "neon";
#elif defined(__x86_64__)
    return "simde-x86_64";
#else
    return "simde-generic";
#endif
}

/* e.g. "dot=avx2 dot4=vnni vkq=avx512 exp=inline addv=ssse3" */
const char *fa_simd_paths(void) { return Q8_SIMD_PATHS; }
