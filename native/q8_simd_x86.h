/* q8_simd_x86.h: the x86 forms (AVX2, AVX-512, VNNI, SSSE3) of the few helpers of q8_simd.h where
 * SIMDe's portable emulation of NEON would time the emulation instead of the algorithm (SIMDe's
 * vdotq_s32, for one, is a plain C loop, slower than scalar code). q8_simd.h includes this header
 * off ARM only, after SIMDe, and its helpers call these from their x86 branches; each function
 * here computes exactly the lanes of the NEON code it stands in for, for every int8 value.
 * Nothing here is compiled without its instruction set's macro (__AVX2__, __AVX512F__, ...). */
#ifndef Q8_SIMD_X86_H
#define Q8_SIMD_X86_H
#include <string.h> /* memcpy */
/* The x86 intrinsics come through SIMDe, which includes the compiler's own x86 headers when the
 * build's flags enable them (a second #include <immintrin.h> here would clash with its aliases). */

#if defined(__SSSE3__)
/* SIMDe's vaddvq_s32 (add the four lanes) is a plain loop on x86, seven instructions for what
 * two horizontal adds do: replaced here, under its NEON name. On aarch64 it is one addv. */
#define Q8_ADDV_PATH "ssse3"
static inline int32_t q8_vaddvq_s32(int32x4_t v)
{
    __m128i x = simde_int32x4_to_m128i(v);
    x = _mm_hadd_epi32(x, x);
    return _mm_cvtsi128_si32(_mm_hadd_epi32(x, x));
}
#undef vaddvq_s32
#define vaddvq_s32(v) q8_vaddvq_s32(v)
#endif

#if defined(__AVX2__)
/* i8x16_dot_s32: sign-extend both to sixteen int16, multiply and add neighbours (vpmaddwd: eight
 * int32), then add neighbouring pairs again (vphaddd): lane j = a[4j..4j+3] . b[4j..4j+3]. */
static inline int32x4_t q8_avx2_dot_s32(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    __m256i prod = _mm256_madd_epi16(_mm256_cvtepi8_epi16(simde_int8x16_to_m128i(a)),
                                     _mm256_cvtepi8_epi16(simde_int8x16_to_m128i(b)));
    __m128i quads = _mm_hadd_epi32(_mm256_castsi256_si128(prod), _mm256_extracti128_si256(prod, 1));
    return vaddq_s32(acc, simde_int32x4_from_m128i(quads));
}

/* vkq_add_i8x16 with AVX2: int8 straight to eight int32 (vpmovsxbd), eight multiply-adds at a
 * time, where SIMDe widens int8 -> int16 -> int32 in many shuffles. */
static inline void q8_avx2_vkq_add(float *vkq, const int8_t *v, float w)
{
    __m256 w8 = _mm256_set1_ps(w);
    __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)v)));
    __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(v + 8))));
    _mm256_storeu_ps(vkq + 0, _mm256_fmadd_ps(f0, w8, _mm256_loadu_ps(vkq + 0)));
    _mm256_storeu_ps(vkq + 8, _mm256_fmadd_ps(f1, w8, _mm256_loadu_ps(vkq + 8)));
}

/* vkq_cols_rows with AVX2, as q8_avx512_vkq_cols_rows below in four ymm registers of eight columns. Through
 * SIMDe the NEON form widened int8 -> int16 -> int32 with two vpmovsx, a shift and an unpack for every
 * vmovl, about 24 integer instructions per 16 columns before the 4 conversions and 4 multiply-adds (no
 * spill: its 8 accumulators stayed in registers); here one vpmovsxbd per 8 columns. Per column the same
 * fused multiply-adds in the same order as the NEON form, and both conversions are exact for int8, so the
 * same sums. magic: the magic-number add (vpaddd, then vsubps) instead of vcvtdq2ps. */
#if defined(__FMA__)
static inline void q8_avx2_vkq_cols_rows(float *vkq, const int8_t *const *vr, int c, const float *w, int n,
    int magic)
{
    __m256 a[4];
    const __m256i mb = _mm256_set1_epi32(Q8_MAGIC_BITS);
    const __m256 mf = _mm256_set1_ps(Q8_MAGIC_F);
    for (int i = 0; i < 4; i++) a[i] = _mm256_loadu_ps(vkq + 8 * i);
    for (int j = 0; j < n; j++) {
        const int8_t *v = vr[j] + c;
        const __m256 wj = _mm256_set1_ps(w[j]);
        for (int i = 0; i < 4; i++) {
            __m256i vi = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(v + 8 * i)));
            __m256 f = magic ? _mm256_sub_ps(_mm256_castsi256_ps(_mm256_add_epi32(vi, mb)), mf)
                             : _mm256_cvtepi32_ps(vi);
            a[i] = _mm256_fmadd_ps(f, wj, a[i]);
        }
    }
    for (int i = 0; i < 4; i++) _mm256_storeu_ps(vkq + 8 * i, a[i]);
}
#endif

/* vkq_cols_rows_group (q8_simd.h) with AVX2: 16 columns per head in two ymm accumulators, V's 16 int8
 * widened to int32 and converted once per row for all G heads (vpmovsxbd, vcvtdq2ps). With G = 4: 8
 * accumulators, 2 converted V vectors and a broadcast weight, 11 of x86's 16 vector registers; the NEON
 * form through SIMDe keeps 16 xmm accumulators, all 16, and spilled them to the stack. Per head the
 * same fused multiply-adds in the same order as vkq_cols_rows (the fast version's), so the same sums. */
static inline __attribute__((always_inline)) void q8_avx2_vkq_group(float *const *vkq, const int8_t *const *vr,
    int c, const float *w, int wstride, int n, const int G)
{
    __m256 a[GQA_MAX][2];
    for (int g = 0; g < G; g++) {
        a[g][0] = _mm256_loadu_ps(vkq[g] + c);
        a[g][1] = _mm256_loadu_ps(vkq[g] + c + 8);
    }
    for (int j = 0; j < n; j++) {
        const int8_t *v = vr[j] + c;
        __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)v)));
        __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(v + 8))));
        for (int g = 0; g < G; g++) {
            __m256 wj = _mm256_broadcast_ss(w + g * wstride + j);
            a[g][0] = _mm256_fmadd_ps(f0, wj, a[g][0]);
            a[g][1] = _mm256_fmadd_ps(f1, wj, a[g][1]);
        }
    }
    for (int g = 0; g < G; g++) {
        _mm256_storeu_ps(vkq[g] + c, a[g][0]);
        _mm256_storeu_ps(vkq[g] + c + 8, a[g][1]);
    }
}

/* i8x32_dot4_s32 with AVX2: Q widened to int16 once per block, each K half widened and
 * multiply-added (vpmaddwd), then three horizontal adds leave each row's sum in its own lane of
 * each 128-bit half. */
static inline int32x4_t q8_avx2_dot4(const int8_t *q, const int8_t *k0, const int8_t *k1,
    const int8_t *k2, const int8_t *k3)
{
    __m256i q0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)q));
    __m256i q1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 16)));
#define Q8_DOT32(k) _mm256_add_epi32( \
        _mm256_madd_epi16(q0, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(k)))), \
        _mm256_madd_epi16(q1, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)((k) + 16)))))
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(Q8_DOT32(k0), Q8_DOT32(k1)),
                                  _mm256_hadd_epi32(Q8_DOT32(k2), Q8_DOT32(k3)));
#undef Q8_DOT32
    return simde_int32x4_from_m128i(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
}
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
/* i8x32_dot4_s32 with AVX-512 VNNI: vpdpbusd multiplies unsigned bytes by signed bytes and adds
 * each group of four products into an int32 lane, one instruction for the AVX2 form's five (two
 * widenings, two vpmaddwd, one add). K's codes become unsigned by flipping their sign bit
 * (k ^ 0x80 = k + 128 as a u8), which adds 128 * (sum of Q's four codes) to every lane; the
 * accumulator starts at minus that (one vpdpbusd of 128s against Q), so each lane holds exactly
 * a[4j..4j+3] . b[4j..4j+3] (no product or sum overflows int32: |sum| <= 4 * 255 * 128). */
static inline int32x4_t q8_vnni_dot4(const int8_t *q, const int8_t *k0, const int8_t *k1,
    const int8_t *k2, const int8_t *k3)
{
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    const __m256i qv = _mm256_loadu_si256((const __m256i *)q);
    const __m256i zero = _mm256_setzero_si256();
    const __m256i base = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, flip, qv));
#define Q8_DOT32(k) _mm256_dpbusd_epi32(base, _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(k)), flip), qv)
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(Q8_DOT32(k0), Q8_DOT32(k1)),
                                  _mm256_hadd_epi32(Q8_DOT32(k2), Q8_DOT32(k3)));
#undef Q8_DOT32
    return simde_int32x4_from_m128i(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
}
#endif

#if defined(__AVX512F__)
/* vkq_add_i8x16 with AVX-512: all sixteen at once, int8 straight to int32 (vpmovsxbd), one FMA. */
static inline void q8_avx512_vkq_add(float *vkq, const int8_t *v, float w)
{
    __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)v)));
    _mm512_storeu_ps(vkq, _mm512_fmadd_ps(f, _mm512_set1_ps(w), _mm512_loadu_ps(vkq)));
}

/* vkq_cols_rows with AVX-512: the 32 columns in two zmm registers over the n rows. magic: V's
 * int32 added to the bits of 1.5 * 2^23 and 1.5 * 2^23 subtracted, instead of vcvtdq2ps (one
 * instruction against two here, which is why x86's fast version converts). */
static inline void q8_avx512_vkq_cols_rows(float *vkq, const int8_t *const *vr, int c, const float *w, int n,
    int magic)
{
    __m512 a0 = _mm512_loadu_ps(vkq), a1 = _mm512_loadu_ps(vkq + 16);
    const __m512i mb = _mm512_set1_epi32(Q8_MAGIC_BITS);
    const __m512 mf = _mm512_set1_ps(Q8_MAGIC_F);
    for (int j = 0; j < n; j++) {
        const int8_t *v = vr[j] + c;
        __m512 wj = _mm512_set1_ps(w[j]);
        __m512i i0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)v));
        __m512i i1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(v + 16)));
        __m512 f0, f1;
        if (magic) {
            f0 = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_add_epi32(i0, mb)), mf);
            f1 = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_add_epi32(i1, mb)), mf);
        } else {
            f0 = _mm512_cvtepi32_ps(i0);
            f1 = _mm512_cvtepi32_ps(i1);
        }
        a0 = _mm512_fmadd_ps(f0, wj, a0);
        a1 = _mm512_fmadd_ps(f1, wj, a1);
    }
    _mm512_storeu_ps(vkq, a0);
    _mm512_storeu_ps(vkq + 16, a1);
}

/* vkq_cols_rows_group with AVX-512: 32 columns per head (2 zmm each), V's columns converted once
 * per row for all G heads. */
static inline void q8_avx512_vkq_group(float *const *vkq, const int8_t *const *vr, int c, const float *w,
    int wstride, int n, int G)
{
    __m512 a[GQA_MAX][2];
    for (int g = 0; g < G; g++) { a[g][0] = _mm512_loadu_ps(vkq[g] + c); a[g][1] = _mm512_loadu_ps(vkq[g] + c + 16); }
    for (int j = 0; j < n; j++) {
        const int8_t *v = vr[j] + c;
        __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)v)));
        __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(v + 16))));
        for (int g = 0; g < G; g++) {
            __m512 wj = _mm512_set1_ps(w[g * wstride + j]);
            a[g][0] = _mm512_fmadd_ps(f0, wj, a[g][0]);
            a[g][1] = _mm512_fmadd_ps(f1, wj, a[g][1]);
        }
    }
    for (int g = 0; g < G; g++) { _mm512_storeu_ps(vkq[g] + c, a[g][0]); _mm512_storeu_ps(vkq[g] + c + 16, a[g][1]); }
}
#endif


#if defined(__AVX512F__)
/* q8_lowp_codes16 (q8_simd.h) with AVX-512: the sixteen codes in one register, where SIMDe's NEON
 * conversions check every lane for the cases NEON saturates. The same integers: a fused multiply-add,
 * truncation (vcvttps2dq, as vcvtq_s32_f32), the same shift and mask; the narrowing is exact. */
static inline void q8_avx512_lowp_codes16(fa_lowp_codes *lc, const float *u, float r)
{
    __m512 x = _mm512_fmadd_ps(_mm512_loadu_ps(u), _mm512_set1_ps(r), _mm512_set1_ps(0.5f));
    __m512i c = _mm512_min_epi32(_mm512_cvttps_epi32(x), _mm512_set1_epi32(FA_LOWP_CMAX));
    _mm_storeu_si128((__m128i *)lc->hi, _mm512_cvtepi32_epi8(_mm512_srai_epi32(c, 7)));
    _mm_storeu_si128((__m128i *)lc->lo, _mm512_cvtepi32_epi8(_mm512_and_si512(c, _mm512_set1_epi32(127))));
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* q8_lowp_codes16 (q8_simd.h) with AVX2, as q8_avx512_lowp_codes16 below in two halves of eight: SIMDe's
 * NEON conversions check every lane for the cases NEON saturates. The same integers: a fused multiply-add,
 * truncation, the same minimum, shift and mask; the packs saturate where vmovn truncates, the same for
 * codes of 0 .. 127. vpackssdw and vpacksswb pack within 128-bit halves: one vpermq puts them in order. */
static inline void q8_avx2_lowp_codes16(fa_lowp_codes *lc, const float *u, float r)
{
    const __m256 rv = _mm256_set1_ps(r), half = _mm256_set1_ps(0.5f);
    const __m256i cmax = _mm256_set1_epi32(FA_LOWP_CMAX), low7 = _mm256_set1_epi32(127);
    __m256i c0 = _mm256_min_epi32(_mm256_cvttps_epi32(_mm256_fmadd_ps(_mm256_loadu_ps(u), rv, half)), cmax);
    __m256i c1 = _mm256_min_epi32(_mm256_cvttps_epi32(_mm256_fmadd_ps(_mm256_loadu_ps(u + 8), rv, half)), cmax);
    __m256i hi = _mm256_permute4x64_epi64(_mm256_packs_epi32(_mm256_srai_epi32(c0, 7), _mm256_srai_epi32(c1, 7)), 0xD8);
    __m256i lo = _mm256_permute4x64_epi64(_mm256_packs_epi32(_mm256_and_si256(c0, low7), _mm256_and_si256(c1, low7)),
                                          0xD8);
    _mm_storeu_si128((__m128i *)lc->hi, _mm_packs_epi16(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1)));
    _mm_storeu_si128((__m128i *)lc->lo, _mm_packs_epi16(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1)));
}
#endif

#if defined(__AVX2__)
/* vkq_lowp_rows (q8_simd.h) with VNNI (and with AVX2, below, where three instructions stand in for
 * vpdpbusd, DP of the macro): vpdpbusd multiplies UNSIGNED bytes by signed ones, four
 * neighbours into an int32 lane; the codes' halves (0 .. 127) are the unsigned operand, V's codes the
 * signed one, as they are. The unpacks interleave four rows within each 128-bit lane: accumulator i
 * holds columns 4i .. 4i+3 of each lane's 16, put back in order once per group (a 4 x 4 transpose of
 * lanes). W = 64 columns per step on 512-bit registers, 32 (a last chunk when hd % 64 is 32) on
 * 256-bit ones; both written once, as macros over the register width. */
#define Q8_LOWP_VNNI(NAME, VEC, WIDTH, LOAD, UNLO8, UNHI8, UNLO16, UNHI16, SET1, DP, SLLI, ADD, CVT, FMA, \
                     LDPS, STPS, SET1PS, ZERO, VECPS, UNPERMUTE)                                                        \
static inline __attribute__((always_inline)) void NAME(float *const *vkq, const int8_t *const *vr, int c,         \
    const fa_lowp_codes *lc, int ng, const int H)                                                                  \
{                                                                                                                  \
    VEC ah[2][4], al[2][4];                                                                                        \
    int32_t wh[2][FA_LOWP_GROUP / 4], wl[2][FA_LOWP_GROUP / 4];                                                    \
    for (int h = 0; h < H; h++) {                                                                                  \
        for (int i = 0; i < 4; i++) ah[h][i] = al[h][i] = ZERO();                                                  \
        memcpy(wh[h], lc[h].hi, sizeof wh[h]);                                                                     \
        memcpy(wl[h], lc[h].lo, sizeof wl[h]);                                                                     \
    }                                                                                                              \
    for (int g = 0; g < ng; g++) {                                                                                 \
        VEC r0 = LOAD(vr[4 * g] + c), r1 = LOAD(vr[4 * g + 1] + c), r2 = LOAD(vr[4 * g + 2] + c),                  \
            r3 = LOAD(vr[4 * g + 3] + c);                                                                          \
        VEC a = UNLO8(r0, r1), b = UNHI8(r0, r1), e = UNLO8(r2, r3), f = UNHI8(r2, r3);                            \
        VEC x[4] = {UNLO16(a, e), UNHI16(a, e), UNLO16(b, f), UNHI16(b, f)};                                       \
        for (int h = 0; h < H; h++) {                                                                              \
            const VEC bh = SET1(wh[h][g]), bl = SET1(wl[h][g]);                                                    \
            for (int i = 0; i < 4; i++) {                                                                          \
                ah[h][i] = DP(ah[h][i], bh, x[i]);                                                                 \
                al[h][i] = DP(al[h][i], bl, x[i]);                                                                 \
            }                                                                                                      \
        }                                                                                                          \
    }                                                                                                              \
    for (int h = 0; h < H; h++) {                                                                                  \
        const VECPS d = SET1PS(lc[h].d);                                                                           \
        VEC s[4], o[4];                                                                                            \
        for (int i = 0; i < 4; i++) s[i] = ADD(SLLI(ah[h][i], 7), al[h][i]);                                       \
        UNPERMUTE(s, o);                                                                                           \
        for (int k = 0; k < 4; k++) {                                                                              \
            float *p = vkq[h] + c + (WIDTH) / 4 * k;                                                               \
            STPS(p, FMA(CVT(o[k]), d, LDPS(p)));                                                                   \
        }                                                                                                          \
    }                                                                                                              \
}
/* 512 bits: s[i] lane k = columns 16k + 4i ..; o[k] = columns 16k .. 16k + 15 = lane k of s[0..3] */
#define Q8_UNPERMUTE512(s, o) do {                                                                                 \
        __m512i t0 = _mm512_shuffle_i32x4(s[0], s[1], 0x44), t1 = _mm512_shuffle_i32x4(s[2], s[3], 0x44);        \
        __m512i t2 = _mm512_shuffle_i32x4(s[0], s[1], 0xEE), t3 = _mm512_shuffle_i32x4(s[2], s[3], 0xEE);        \
        o[0] = _mm512_shuffle_i32x4(t0, t1, 0x88); o[1] = _mm512_shuffle_i32x4(t0, t1, 0xDD);                    \
        o[2] = _mm512_shuffle_i32x4(t2, t3, 0x88); o[3] = _mm512_shuffle_i32x4(t2, t3, 0xDD);                    \
    } while (0)
/* 256 bits: s[i] = [columns 4i .. | 16 + 4i ..]; o[k] = columns 8k .. 8k + 7 */
#define Q8_UNPERMUTE256(s, o) do {                                                                                 \
        o[0] = _mm256_permute2x128_si256(s[0], s[1], 0x20); o[1] = _mm256_permute2x128_si256(s[2], s[3], 0x20);  \
        o[2] = _mm256_permute2x128_si256(s[0], s[1], 0x31); o[3] = _mm256_permute2x128_si256(s[2], s[3], 0x31);  \
    } while (0)
#define Q8_LD512(p) _mm512_loadu_si512((const void *)(p))
#define Q8_LD256(p) _mm256_loadu_si256((const __m256i *)(p))
/* AVX2 has no vpdpbusd: the same sums in three instructions. vpmaddubsw multiplies the unsigned code
 * halves (0 .. 127) by V's signed codes and adds neighbouring pairs into int16: at most
 * 2 * 127 * 128 = 32512 in size, below 32767, so never saturated; vpmaddwd by ones adds the pairs into
 * int32 lanes, each the sum of four products exactly as vpdpbusd's. */
static inline __m256i q8_avx2_dpbusd(__m256i acc, __m256i u8, __m256i s8)
{
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), _mm256_set1_epi16(1)));
}
Q8_LOWP_VNNI(q8_avx2_lowp32, __m256i, 32, Q8_LD256, _mm256_unpacklo_epi8, _mm256_unpackhi_epi8, _mm256_unpacklo_epi16,
             _mm256_unpackhi_epi16, _mm256_set1_epi32, q8_avx2_dpbusd, _mm256_slli_epi32, _mm256_add_epi32,
             _mm256_cvtepi32_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_setzero_si256,
             __m256, Q8_UNPERMUTE256)
/* vkq_lowp_rows with AVX2: one head at a time (its 8 accumulators, the 4 interleaved rows and the codes
 * fill x86's 16 registers; two heads' 16 accumulators would spill), 32 columns per step. */
static inline __attribute__((always_inline)) void q8_avx2_lowp_rows(float *const *vkq, const int8_t *const *vr,
    const fa_lowp_codes *lc, int ng, const int G, int hd)
{
    for (int g = 0; g < G; g++)
        for (int c = 0; c < hd; c += 32) q8_avx2_lowp32(vkq + g, vr, c, lc + g, ng, 1);
}
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
Q8_LOWP_VNNI(q8_vnni_lowp64, __m512i, 64, Q8_LD512, _mm512_unpacklo_epi8, _mm512_unpackhi_epi8, _mm512_unpacklo_epi16,
             _mm512_unpackhi_epi16, _mm512_set1_epi32, _mm512_dpbusd_epi32, _mm512_slli_epi32, _mm512_add_epi32,
             _mm512_cvtepi32_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_setzero_si512,
             __m512, Q8_UNPERMUTE512)
Q8_LOWP_VNNI(q8_vnni_lowp32, __m256i, 32, Q8_LD256, _mm256_unpacklo_epi8, _mm256_unpackhi_epi8, _mm256_unpacklo_epi16,
             _mm256_unpackhi_epi16, _mm256_set1_epi32, _mm256_dpbusd_epi32, _mm256_slli_epi32, _mm256_add_epi32,
             _mm256_cvtepi32_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_setzero_si256,
             __m256, Q8_UNPERMUTE256)
static inline __attribute__((always_inline)) void q8_vnni_lowp_rows(float *const *vkq, const int8_t *const *vr,
    const fa_lowp_codes *lc, int ng, const int G, int hd)
{
    for (int g = 0; g < G; g += 2) {
        const int H = g + 1 < G ? 2 : 1;
        int c = 0;
        for (; c + 64 <= hd; c += 64) {
            if (H == 2) q8_vnni_lowp64(vkq + g, vr, c, lc + g, ng, 2);
            else q8_vnni_lowp64(vkq + g, vr, c, lc + g, ng, 1);
        }
        if (c < hd) { /* hd % 64 == 32 */
            if (H == 2) q8_vnni_lowp32(vkq + g, vr, c, lc + g, ng, 2);
            else q8_vnni_lowp32(vkq + g, vr, c, lc + g, ng, 1);
        }
    }
}
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
/* The grouped kernel's scores (flash_attn_q8_group.c) with AVX-512 VNNI: segment 2 for four tokens
 * and ALL G heads from one load of the four K rows. Two 32-value blocks at a time: a 64-byte piece
 * of each K row is loaded and sign-flipped once (k ^ 0x80, as in q8_vnni_dot4) and meets every
 * head's Q in one vpdpbusd each, instead of each head loading and flipping the same rows again.
 * Each (head, row) keeps 16 fp32 lanes over the row's blocks (lane sums converted and multiplied
 * by the block's Q scale, then added), reduced once per row, not once per block: fewer shuffles
 * than fa_score4. An odd last block is read with the upper 32 bytes masked off (a masked load
 * touches no byte beyond the row). The int32 block sums are exact, as elsewhere; only the order of
 * the fp32 adds differs from fa_score4 (within the kernel tolerance). */
#define Q8_GROUP_SHARED_K 1
#define Q8_PAIRS (HD_MAX / QBLK / 2 + 1)
/* one head's Q for it, once per call: corr[p] its start value for blocks 2p and 2p + 1, minus
 * 128 * (sum of each four Q codes) (the sign flip's correction), and qs[p] their block scales,
 * lanes 0-7 for block 2p and 8-15 for 2p + 1 (zero beyond the last block) */
typedef struct { __m512i corr[Q8_PAIRS]; __m512 qs[Q8_PAIRS]; } q8_vnni_q;
static inline void q8_vnni_q_prepare(q8_vnni_q *pq, const int8_t *qi, const float *qsc, int nblk)
{
    for (int p = 0; 2 * p < nblk; p++) {
        const int two = 2 * p + 1 < nblk;
        const __mmask64 m = two ? ~(__mmask64)0 : (__mmask64)0xFFFFFFFFu;
        pq->corr[p] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                       _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80),
                                                           _mm512_maskz_loadu_epi8(m, qi + 2 * p * QBLK)));
        pq->qs[p] = _mm512_insertf32x8(_mm512_set1_ps(qsc[2 * p]), _mm256_set1_ps(two ? qsc[2 * p + 1] : 0.0f), 1);
    }
}
/* st[g * stride + j + u] = score of row kr[j + u] for head g, u < 4, times ks[j + u]. G is a
 * compile-time constant in each call, so the 4 G accumulators stay in registers (16 of the 32 zmm
 * for G = 4). */
static inline __attribute__((always_inline)) void q8_vnni_score4_group(float *st, int stride, int j,
    const int8_t (*qi)[HD_MAX], const q8_vnni_q *pq, int nblk, const int8_t *const *kr, const float *ks, const int G)
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[GQA_MAX][4];
    for (int g = 0; g < G; g++)
        for (int u = 0; u < 4; u++) acc[g][u] = _mm512_setzero_ps();
    for (int p = 0; 2 * p < nblk; p++) {
        const int o = 2 * p * QBLK;
        const __mmask64 m = 2 * p + 1 < nblk ? ~(__mmask64)0 : (__mmask64)0xFFFFFFFFu;
        __m512i k[4];
        for (int u = 0; u < 4; u++) k[u] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, kr[j + u] + o), flip);
        for (int g = 0; g < G; g++) {
            const __m512i qv = _mm512_maskz_loadu_epi8(m, qi[g] + o);
            for (int u = 0; u < 4; u++)
                acc[g][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(pq[g].corr[p], k[u], qv)),
                                            pq[g].qs[p], acc[g][u]);
        }
    }
    const __m128 ksv = _mm_loadu_ps(ks + j);
    for (int g = 0; g < G; g++) {
        __m256 r[4];
        for (int u = 0; u < 4; u++)
            r[u] = _mm256_add_ps(_mm512_castps512_ps256(acc[g][u]), _mm512_extractf32x8_ps(acc[g][u], 1));
        __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(r[0], r[1]), _mm256_hadd_ps(r[2], r[3]));
        __m128 sum = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        _mm_storeu_ps(st + g * stride + j, _mm_mul_ps(sum, ksv));
    }
}
#endif

#endif
