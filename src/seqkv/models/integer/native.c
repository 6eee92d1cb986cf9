/* The integer forward's fused CPU paths: the same integers as forward.py's torch code, bit for bit.
 *
 * forward.py evaluates the integer predictor with torch operators; a one-row decoding step runs
 * about 18,000 of them, and their dispatch, not the arithmetic, is most of the step. Here a
 * forward's decoder layers are one call (seqkv_layers), the final norm and output layer
 * another (seqkv_head), over plain C arrays; seqkv_integer_tables builds the coder's tables.
 * Every helper computes exactly what its torch counterpart computes (forward.py names each one);
 * the tests compare the two paths' logits, KV and tables bit for bit, on every instruction set
 * below that the CPU runs; seqkv_isa says which one this build is.
 *
 * Exactness rules (each result is one defined integer on every C99 compiler and CPU):
 *   - right shifts go through asr(), a floor shift written without implementation-defined
 *     behaviour; left shifts through shl(), through uint64; every amount lies in [0, 62];
 *   - no signed overflow: each site's bound is stated (the same bounds as forward.py's), and
 *     native.py builds with -fwrapv, so even outside them the result is torch's wrapped one;
 *   - floor division through floor_div(), or divide_by_total(), whose float64 estimate of the
 *     quotient is corrected in integers until it is exactly floor's; no other float in the
 *     forward (the coder's tables, at the end, use correctly rounded float64 operations as
 *     table.py does).
 * So the compiler's vectorization, unrolling and instruction choice cannot change a result.
 *
 * Layouts are row-major and contiguous; "planes" are the int8 activation planes of forward.py,
 * [2 * rows, K]: the high planes (signed, q >> 7) of every row, then the low ones (q & 127).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The instruction set of this build, chosen by the compiler flags native.py passes (one library
 * per path, each built with its own flags, so that a forced path is never vectorized with
 * instructions of another): SEQKV_ISA names it for seqkv_isa(). Every path computes the same
 * integers; only the micro-kernels differ:
 *   SEQKV_VNNI     AVX-512 VNNI: vpdpbusd tiles on packed blocks, the laid-out attention;
 *   SEQKV_AVX2     AVX2 (+ F16C): vpmaddwd on int16 activations; with SEQKV_AVXVNNI, the
 *                  256-bit vpdpwssd of AVX-VNNI in its place;
 *   SEQKV_NEON     ARMv8.2 NEON with the dot product (sdot) on the int8 planes;
 *   none           plain C99, which any compiler computes identically. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512F__) && defined(__AVX512VL__)
#include <immintrin.h>
#define SEQKV_VNNI 1
#define SEQKV_ISA 3
#elif defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define SEQKV_AVX2 1
#if defined(__AVXVNNI__)
#define SEQKV_AVXVNNI 1
#define SEQKV_ISA 2
#else
#define SEQKV_ISA 1
#endif
#elif defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
#define SEQKV_NEON 1
#define SEQKV_ISA 4
#else
#define SEQKV_ISA 0
#endif

#if defined(__GNUC__)
#define ALWAYS_INLINE __attribute__((always_inline))
#else
#define ALWAYS_INLINE
#endif

#define PLANE_BITS 7
#define LOW_MASK 127
#define ACTIVATION_BITS 14
#define NORM_BITS 16
#define TABLE_BITS 30
#define RSQRT_MIN (INT64_C(1) << 24)
#define RSQRT_CELL_BITS 9
#define SOFTMAX_BITS 14
#define SIGMOID_STEP_BITS 13
#define SIGMOID_RANGE 16
#define MASKED (-(INT64_C(1) << 60))
/* int32 dot products of int8 planes: |w * plane| <= 127 * 128, so a sum over K <= 2**17
 * terms fits (forward.py's MAX_REDUCTION is 2**13). */

static inline int64_t asr(int64_t x, int64_t s) {
    /* floor(x / 2**s) for s in [0, 62], the arithmetic shift torch computes */
    return x >= 0 ? (int64_t)((uint64_t)x >> s) : -(int64_t)(((uint64_t)(-(x + 1)) >> s)) - 1;
}

static inline int64_t shl(int64_t x, int64_t s) { return (int64_t)((uint64_t)x << s); }

static inline int64_t clamp(int64_t x, int64_t lo, int64_t hi) {
    return x < lo ? lo : (x > hi ? hi : x);
}

static inline int64_t floor_div(int64_t a, int64_t b) {  /* b > 0 */
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

static inline int64_t excess_bits(int64_t x, int64_t bits) {
    /* max(0, bit_length(x) - bits) for x >= 0 (fixedpoint.excess_bits) */
#if defined(__GNUC__)
    int64_t length = x ? 64 - __builtin_clzll((unsigned long long)x) : 0;
#else
    int64_t length = 0;
    for (uint64_t u = (uint64_t)x; u; u >>= 1) ++length;
#endif
    return length > bits ? length - bits : 0;
}

static inline int64_t peak(const int64_t *x, int64_t k) {
    int64_t m = 0, i = 0;
#ifdef SEQKV_VNNI
    __m512i most = _mm512_setzero_si512();  /* vpabsq wraps as the scalar negation does */
    for (; i + 8 <= k; i += 8)
        most = _mm512_max_epi64(most, _mm512_abs_epi64(_mm512_loadu_si512(x + i)));
    m = _mm512_reduce_max_epi64(most);
#endif
    for (; i < k; ++i) {
        int64_t a = x[i] < 0 ? -x[i] : x[i];
        m = a > m ? a : m;
    }
    return m;
}

/* forward._quantize (two activation planes) of one row: planes at high[i], low[i]. */
static int64_t quantize_row(const int64_t *x, int64_t k, int8_t *high, int8_t *low) {
    int64_t shift = excess_bits(peak(x, k), ACTIVATION_BITS), i = 0;
#ifdef SEQKV_VNNI
    /* 8 at a time: vpsraq is asr; vpmovqb keeps the low byte as the int8 casts do */
    __m128i amount = _mm_cvtsi64_si128(shift);
    __m512i mask = _mm512_set1_epi64(LOW_MASK);
    for (; i + 8 <= k; i += 8) {
        __m512i q = _mm512_sra_epi64(_mm512_loadu_si512(x + i), amount);
        _mm_storel_epi64((__m128i *)(high + i),
                         _mm512_cvtepi64_epi8(_mm512_srai_epi64(q, PLANE_BITS)));
        _mm_storel_epi64((__m128i *)(low + i),
                         _mm512_cvtepi64_epi8(_mm512_and_si512(q, mask)));
    }
#endif
    for (; i < k; ++i) {
        int64_t q = asr(x[i], shift);
        high[i] = (int8_t)asr(q, PLANE_BITS);
        low[i] = (int8_t)(q & LOW_MASK);
    }
    return shift;
}

/* forward._quantize of rows [r0, r1): planes [2 * rows, k]; exponent[r] = shift + offset
 * (+ row_offset[r]). */
static void quantize_range(const int64_t *x, int64_t rows, int64_t r0, int64_t r1, int64_t k,
                           int64_t offset, const int64_t *row_offset, int8_t *planes,
                           int64_t *exponent) {
    for (int64_t r = r0; r < r1; ++r) {
        int64_t shift = quantize_row(x + r * k, k, planes + r * k, planes + (rows + r) * k);
        exponent[r] = shift + offset + (row_offset ? row_offset[r] : 0);
    }
}

/* forward._norm of rows [r0, r1): RMSNorm as planes [2 * rows, k], with the exponents; with
 * `gain` (a 4-bit layer's norm weight at 2**-gain_frac, |gain| <= 2**16), q * gain * mantissa
 * (< 2**62) is what is quantized. */
static int64_t norm_range(const int64_t *hidden, int64_t rows, int64_t r0, int64_t r1,
                          int64_t k, int64_t eps_term, const int32_t *rsqrt_table,
                          int64_t mantissa_bits, const int64_t *gain, int64_t gain_frac,
                          int8_t *planes, int64_t *exponent) {
    int64_t *q = malloc(sizeof(int64_t) * (size_t)k);
    if (!q) return -1;
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t *h = hidden + r * k;
        int64_t shift = excess_bits(peak(h, k), NORM_BITS);
        int64_t squares = 0;  /* < k * 2**32 */
        for (int64_t i = 0; i < k; ++i) {
            q[i] = asr(h[i], shift);
            squares += q[i] * q[i];
        }
        int64_t v = squares + asr(eps_term, clamp(2 * shift, 0, 62));
        if (v < RSQRT_MIN) v = RSQRT_MIN;
        int64_t twice = excess_bits(v, 25) & -2;
        int64_t mantissa = rsqrt_table[asr(asr(v, twice), RSQRT_CELL_BITS)];
        if (gain)
            for (int64_t i = 0; i < k; ++i) q[i] = q[i] * gain[i] * mantissa;
        else
            for (int64_t i = 0; i < k; ++i) q[i] *= mantissa;  /* < 2**16 * 2**30 */
        int64_t qshift = quantize_row(q, k, planes + r * k, planes + (rows + r) * k);
        exponent[r] = qshift - (twice >> 1) - mantissa_bits - (gain ? gain_frac : 0);
    }
    free(q);
    return 0;
}


#ifdef SEQKV_VNNI
#define LANES 16
/* The products run on tiles of packed weight blocks (16 output rows each) against activation
 * rows, both activation planes at once. Per 4 bytes of k, one vpdpbusd with 4 activation bytes
 * broadcast adds 4 products to each of a block's 16 outputs, so there are no horizontal sums.
 * Each int32 lane sums k products below 2**15: exact for k <= 2**16.
 * The accumulators are named variables, not arrays: GCC keeps arrays of vectors in memory and
 * stores them back every iteration, at about half the speed. Two tiles:
 *   - 4 blocks x 3 rows (24 accumulators, 10 loads per 24 products) for prefills and drafts:
 *     more loads shared per product than 1 x 6, closer to the vpdpbusd peak;
 *   - 8 blocks x 1 row (16 accumulators, 8 weight streams) for steps, which read each weight
 *     once: a one-row step's products then run near the memory bandwidth. */
#define DP(acc, v, x) acc = _mm512_dpbusd_epi32(acc, v, x)
#define TILE_ROWS 3
#define TILE_BLOCKS 8
/* rows per work item of a linear layer (a multiple of TILE_ROWS): items small enough for two
 * threads to share even a 576-output layer evenly */
#define ROW_SPLIT 48

static inline __m512i broadcast4(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

typedef int32_t tile_out_t[TILE_ROWS][TILE_BLOCKS][LANES];

/* Blocks w[0..3] times rows h[0..2] (high planes, offset to unsigned) and l[0..2] (low). */
static void tile_4x3(const uint8_t *const h[3], const uint8_t *const l[3], int64_t k,
                     const int8_t *const w[4], tile_out_t high_out, tile_out_t low_out) {
    __m512i z = _mm512_setzero_si512();
    __m512i a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z,
            a20 = z, a21 = z, a22 = z, a23 = z, b00 = z, b01 = z, b02 = z, b03 = z,
            b10 = z, b11 = z, b12 = z, b13 = z, b20 = z, b21 = z, b22 = z, b23 = z;
    const int8_t *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
    const uint8_t *h0 = h[0], *h1 = h[1], *h2 = h[2], *l0 = l[0], *l1 = l[1], *l2 = l[2];
    for (int64_t q = 0; q < k / 4; ++q) {
        __m512i x0 = _mm512_loadu_si512(w0 + q * 64), x1 = _mm512_loadu_si512(w1 + q * 64),
                x2 = _mm512_loadu_si512(w2 + q * 64), x3 = _mm512_loadu_si512(w3 + q * 64);
#define ROW(j, plane, acc) {                                                              \
            __m512i v = broadcast4(plane##j + 4 * q);                                   \
            DP(acc##j##0, v, x0); DP(acc##j##1, v, x1);                                 \
            DP(acc##j##2, v, x2); DP(acc##j##3, v, x3); }
        ROW(0, h, a) ROW(0, l, b) ROW(1, h, a) ROW(1, l, b) ROW(2, h, a) ROW(2, l, b)
#undef ROW
    }
#define STORE(j, c) _mm512_storeu_si512(high_out[j][c], a##j##c); \
                    _mm512_storeu_si512(low_out[j][c], b##j##c);
    STORE(0, 0) STORE(0, 1) STORE(0, 2) STORE(0, 3) STORE(1, 0) STORE(1, 1) STORE(1, 2)
    STORE(1, 3) STORE(2, 0) STORE(2, 1) STORE(2, 2) STORE(2, 3)
#undef STORE
}

/* Blocks w[0..7] times one row (h0, l0). */
static void tile_8x1(const uint8_t *h0, const uint8_t *l0, int64_t k, const int8_t *const w[8],
                     tile_out_t high_out, tile_out_t low_out) {
    __m512i z = _mm512_setzero_si512();
    __m512i a0 = z, a1 = z, a2 = z, a3 = z, a4 = z, a5 = z, a6 = z, a7 = z,
            b0 = z, b1 = z, b2 = z, b3 = z, b4 = z, b5 = z, b6 = z, b7 = z;
    const int8_t *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3], *w4 = w[4], *w5 = w[5],
                 *w6 = w[6], *w7 = w[7];
    for (int64_t q = 0; q < k / 4; ++q) {
        __m512i v = broadcast4(h0 + 4 * q), u = broadcast4(l0 + 4 * q), x;
#define BLOCK(c) x = _mm512_loadu_si512(w##c + q * 64); DP(a##c, v, x); DP(b##c, u, x);
        BLOCK(0) BLOCK(1) BLOCK(2) BLOCK(3) BLOCK(4) BLOCK(5) BLOCK(6) BLOCK(7)
#undef BLOCK
    }
#define STORE(c) _mm512_storeu_si512(high_out[0][c], a##c); \
                 _mm512_storeu_si512(low_out[0][c], b##c);
    STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5) STORE(6) STORE(7)
#undef STORE
}

static inline __m512i widen8(const int32_t *p) {  /* 8 int32 to int64 */
    return _mm512_cvtepi32_epi64(_mm256_loadu_si256((const void *)p));
}

/* The plane's dot products of a tile (rows x blocks) folded into int64 totals [row][n]: the
 * high plane's offset of 128 taken back through the weights' row sums, then (for a second
 * weight plane) the earlier planes shifted up, as forward._linear sums them. */
static void fold_plane(tile_out_t high, tile_out_t low, const int32_t *sums, int64_t p,
                       int count, int blocks,
                       int64_t total[TILE_ROWS][TILE_BLOCKS * LANES]) {
    for (int j = 0; j < count; ++j)
        for (int c = 0; c < 2 * blocks; ++c) {  /* 8 lanes at a time, in int64 */
            int block = c / 2, at = 8 * (c % 2);
            __m512i hv = widen8(high[j][block] + at), lv = widen8(low[j][block] + at);
            __m512i sv = widen8(sums + block * LANES + at);
            __m512i dot = _mm512_add_epi64(
                _mm512_slli_epi64(_mm512_sub_epi64(hv, _mm512_slli_epi64(sv, PLANE_BITS)), PLANE_BITS),
                lv);
            int64_t *t = total[j] + 8 * c;
            if (p) dot = _mm512_add_epi64(_mm512_slli_epi64(_mm512_loadu_si512(t), PLANE_BITS), dot);
            _mm512_storeu_si512(t, dot);
        }
}
#endif

#ifndef SEQKV_VNNI
#define LANES 16
#define TILE_ROWS 3
#define ROW_SPLIT 48
/* Rows that share one pass over a block's weights (dot_tile) */
#define DOT_ROWS 4
/* Quads (4 k) per int32 partial sum: at most 4 products of 2**14 x 2**7 = 2**21 each per lane
 * and quad, so 128 quads stay below 2**30; the partial sums are then added in int64. */
#define FLUSH_QUADS 128

/* The packed products outside AVX-512 VNNI, on one block of 16 output rows (the layout of
 * seqkv_linear_packed) and up to DOT_ROWS activation rows: acc[j][lane] = the exact sum over k of
 * x[j][k] * weight[lane][k], where x is the row's activation q = 128 high + low (int16: |q| <=
 * 2**14) and high, low its planes (the NEON kernel multiplies the int8 planes). Every kernel
 * computes this one integer per lane; they differ only in instructions. */
#if defined(SEQKV_AVX2)
#if defined(SEQKV_AVXVNNI)
#define DPW(acc, a, b) acc = _mm256_dpwssd_avx_epi32(acc, a, b)
#else
#define DPW(acc, a, b) acc = _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#endif
static inline __m256i broadcast_quad(const int16_t *x) {  /* x[0..3] into every 64 bits */
    int64_t v;
    memcpy(&v, x, 8);
    return _mm256_set1_epi64x(v);
}

/* Lanes 8 half .. 8 half + 7 of a block: weights widened to int16 (4 lanes x 4 k per vector),
 * one vpmaddwd per row and vector adds each lane's two pairs of products to two int32 sums,
 * which the flush adds up in int64. */
static inline ALWAYS_INLINE void dot_tile_body(const int8_t *block, const int16_t *const x[DOT_ROWS],
                                               const int8_t *const high[DOT_ROWS],
                                               const int8_t *const low[DOT_ROWS], int rows,
                                               int64_t k, int64_t acc[DOT_ROWS][LANES]) {
    (void)high; (void)low;
    for (int j = 0; j < rows; ++j)
        for (int lane = 0; lane < LANES; ++lane) acc[j][lane] = 0;
    for (int half = 0; half < 2; ++half)
        for (int64_t q0 = 0; q0 < k / 4; q0 += FLUSH_QUADS) {
            int64_t q1 = q0 + FLUSH_QUADS < k / 4 ? q0 + FLUSH_QUADS : k / 4;
            __m256i a[DOT_ROWS][2];
            for (int j = 0; j < rows; ++j) a[j][0] = a[j][1] = _mm256_setzero_si256();
            for (int64_t q = q0; q < q1; ++q) {
                const int8_t *w = block + q * 64 + 32 * half;
                __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w));
                __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 16)));
                for (int j = 0; j < rows; ++j) {
                    __m256i v = broadcast_quad(x[j] + 4 * q);
                    DPW(a[j][0], w0, v);
                    DPW(a[j][1], w1, v);
                }
            }
            for (int j = 0; j < rows; ++j) {
                int32_t t[16];  /* [lane 8 half + m][pair] for m in 0..7 */
                _mm256_storeu_si256((__m256i *)t, a[j][0]);
                _mm256_storeu_si256((__m256i *)(t + 8), a[j][1]);
                for (int m = 0; m < 8; ++m)
                    acc[j][8 * half + m] += (int64_t)t[2 * m] + t[2 * m + 1];
            }
        }
}
#elif defined(SEQKV_NEON)
static inline int8x16_t broadcast4_s8(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return vreinterpretq_s8_s32(vdupq_n_s32(v));
}

/* sdot multiplies 4 int8 weights of 4 lanes by 4 broadcast plane bytes; each plane's sums stay
 * in int32 (|high * w| <= 2**14, k <= 2**17), and the lane's total is 128 high + low. */
static inline ALWAYS_INLINE void dot_tile_body(const int8_t *block, const int16_t *const x[DOT_ROWS],
                                               const int8_t *const high[DOT_ROWS],
                                               const int8_t *const low[DOT_ROWS], int rows,
                                               int64_t k, int64_t acc[DOT_ROWS][LANES]) {
    (void)x;
    for (int j = 0; j < rows; ++j) {
        int32x4_t h[4], l[4];
        for (int c = 0; c < 4; ++c) h[c] = l[c] = vdupq_n_s32(0);
        for (int64_t q = 0; q < k / 4; ++q) {
            int8x16_t bh = broadcast4_s8(high[j] + 4 * q), bl = broadcast4_s8(low[j] + 4 * q);
            for (int c = 0; c < 4; ++c) {
                int8x16_t w = vld1q_s8(block + q * 64 + 16 * c);
                h[c] = vdotq_s32(h[c], w, bh);
                l[c] = vdotq_s32(l[c], w, bl);
            }
        }
        for (int c = 0; c < 4; ++c) {
            int32_t hs[4], ls[4];
            vst1q_s32(hs, h[c]);
            vst1q_s32(ls, l[c]);
            for (int m = 0; m < 4; ++m)
                acc[j][4 * c + m] = shl(hs[m], PLANE_BITS) + ls[m];
        }
    }
}
#else
static inline ALWAYS_INLINE void dot_tile_body(const int8_t *block, const int16_t *const x[DOT_ROWS],
                                               const int8_t *const high[DOT_ROWS],
                                               const int8_t *const low[DOT_ROWS], int rows,
                                               int64_t k, int64_t acc[DOT_ROWS][LANES]) {
    (void)high; (void)low;
    for (int j = 0; j < rows; ++j) {
        for (int lane = 0; lane < LANES; ++lane) acc[j][lane] = 0;
        for (int64_t q0 = 0; q0 < k / 4; q0 += FLUSH_QUADS) {
            int64_t q1 = q0 + FLUSH_QUADS < k / 4 ? q0 + FLUSH_QUADS : k / 4;
            int32_t part[LANES] = {0};
            for (int64_t q = q0; q < q1; ++q) {
                const int8_t *w = block + q * 64;
                const int16_t *v = x[j] + 4 * q;
                for (int lane = 0; lane < LANES; ++lane)
                    part[lane] += v[0] * w[4 * lane] + v[1] * w[4 * lane + 1]
                                  + v[2] * w[4 * lane + 2] + v[3] * w[4 * lane + 3];
            }
            for (int lane = 0; lane < LANES; ++lane) acc[j][lane] += part[lane];
        }
    }
}
#endif

/* dot_tile_body with its row count a constant (1 to DOT_ROWS), so that the accumulators of
 * each row stay in registers. */
static void dot_tile(const int8_t *block, const int16_t *const x[DOT_ROWS],
                     const int8_t *const high[DOT_ROWS], const int8_t *const low[DOT_ROWS],
                     int rows, int64_t k, int64_t acc[DOT_ROWS][LANES]) {
    switch (rows) {
        case 1: dot_tile_body(block, x, high, low, 1, k, acc); break;
        case 2: dot_tile_body(block, x, high, low, 2, k, acc); break;
        case 3: dot_tile_body(block, x, high, low, 3, k, acc); break;
        default: dot_tile_body(block, x, high, low, DOT_ROWS, k, acc); break;
    }
}

/* seqkv_linear_packed outside AVX-512 VNNI: work items of (block, chunk of ROW_SPLIT rows), as
 * the VNNI path shares them; each block's weights are read once per DOT_ROWS rows. */
static int64_t linear_packed_portable(const int8_t *planes, int64_t rows, int64_t k,
                                      const int8_t *packed, int64_t wplanes, int64_t n_out,
                                      const int64_t *scale, int64_t scale_bits,
                                      const int64_t *exponent, int64_t out_frac,
                                      const int64_t *bias, int64_t *out, int64_t out_stride,
                                      int64_t threads) {
    int64_t blocks = (n_out + LANES - 1) / LANES, chunks = (rows + ROW_SPLIT - 1) / ROW_SPLIT;
    int64_t block_bytes = (k / 4) * 64;
    int16_t *x = malloc(sizeof(int16_t) * (size_t)(rows * k));  /* q = 128 high + low */
    if (!x) return -1;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < k; ++i)
            x[r * k + i] = (int16_t)(planes[r * k + i] * (1 << PLANE_BITS)
                                     + planes[(rows + r) * k + i]);
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads((int)threads) if (threads > 1)
#endif
    for (int64_t item = 0; item < blocks * chunks; ++item) {
        int64_t b = item / chunks, first = (item % chunks) * ROW_SPLIT;
        int64_t last = first + ROW_SPLIT < rows ? first + ROW_SPLIT : rows;
        int64_t n0 = b * LANES, count_lanes = n_out - n0 < LANES ? n_out - n0 : LANES;
        for (int64_t r0 = first; r0 < last; r0 += DOT_ROWS) {
            int count = last - r0 < DOT_ROWS ? (int)(last - r0) : DOT_ROWS;
            const int16_t *xr[DOT_ROWS];
            const int8_t *hr[DOT_ROWS], *lr[DOT_ROWS];
            for (int j = 0; j < DOT_ROWS; ++j) {
                int64_t row = r0 + (j < count ? j : 0);
                xr[j] = x + row * k;
                hr[j] = planes + row * k;
                lr[j] = planes + (rows + row) * k;
            }
            int64_t total[DOT_ROWS][LANES], dot[DOT_ROWS][LANES];
            for (int64_t p = 0; p < wplanes; ++p) {  /* forward._linear's planes, shifted up */
                dot_tile(packed + (p * blocks + b) * block_bytes, xr, hr, lr, count, k, dot);
                for (int j = 0; j < count; ++j)
                    for (int lane = 0; lane < LANES; ++lane)
                        total[j][lane] = p ? shl(total[j][lane], PLANE_BITS) + dot[j][lane]
                                           : dot[j][lane];
            }
            for (int j = 0; j < count; ++j) {  /* forward._scale */
                int64_t amount = clamp(scale_bits - out_frac - exponent[r0 + j], 0, 62);
                int64_t *o = out + (r0 + j) * out_stride + n0;
                for (int64_t lane = 0; lane < count_lanes; ++lane) {
                    int64_t v = asr(total[j][lane] * scale[n0 + lane], amount);
                    o[lane] = bias ? v + bias[n0 + lane] : v;
                }
            }
        }
    }
    free(x);
    return 0;
}
#endif

/* The instruction set this library was built for: 0 plain C, 1 AVX2, 2 AVX-VNNI, 3 AVX-512
 * VNNI, 4 NEON with the dot product (native.py's ISAS, in this order). */
int64_t seqkv_isa(void) { return SEQKV_ISA; }

/* seqkv_linear with weights packed for vpdpbusd: for plane p and block b of 16 rows,
 * packed[((p * blocks + b) * k / 4 + q) * 64 + 4 * lane + i] = weight[p * n_out + 16 b + lane,
 * 4 q + i] (rows past n_out are 0); row_sums [wplanes * blocks * 16] (int32, 0 past n_out).
 * k is a multiple of 4. threads: OpenMP threads (where built with it). Returns 0, or -1 when
 * out of memory or built without VNNI (nothing written). */
static int64_t seqkv_linear_packed(const int8_t *planes, int64_t rows, int64_t k, const int8_t *packed,
                         const int32_t *row_sums, int64_t wplanes, int64_t n_out,
                         const int64_t *scale, int64_t scale_bits, const int64_t *exponent,
                         int64_t out_frac, const int64_t *bias, int64_t *out,
                         int64_t out_stride, int64_t threads) {
#ifdef SEQKV_VNNI
    int64_t blocks = (n_out + LANES - 1) / LANES;
    int one_row = rows < TILE_ROWS;  /* 1 or 2 rows: each row on its own 8-block tiles */
    int tile_blocks = one_row ? 8 : 4, tile_rows = one_row ? 1 : TILE_ROWS;
    int64_t groups = (blocks + tile_blocks - 1) / tile_blocks;
    int64_t chunks = (rows + ROW_SPLIT - 1) / ROW_SPLIT;
    int64_t block_bytes = (k / 4) * 64;
    uint8_t *scratch = malloc((size_t)(rows * k));
    if (!scratch) return -1;
    for (int64_t i = 0; i < rows * k; ++i) scratch[i] = (uint8_t)(planes[i] + 128);
    /* Groups of output blocks times chunks of rows are independent, so threads share them
     * dynamically (a thread that another process delays takes fewer); the results do not
     * depend on the split. */
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads((int)threads) if (threads > 1)
#endif
    for (int64_t item = 0; item < groups * chunks; ++item) {
        int64_t g = item / chunks, first = (item % chunks) * ROW_SPLIT;
        int64_t last = first + ROW_SPLIT < rows ? first + ROW_SPLIT : rows;
        int64_t b0 = g * tile_blocks;
        int count_blocks = blocks - b0 < tile_blocks ? (int)(blocks - b0) : tile_blocks;
        tile_out_t high, low;
        int64_t total[TILE_ROWS][TILE_BLOCKS * LANES];
        for (int64_t r0 = first; r0 < last; r0 += tile_rows) {
            int count = last - r0 < tile_rows ? (int)(last - r0) : tile_rows;
            for (int64_t p = 0; p < wplanes; ++p) {
                /* A tile past the last block or row repeats the first one; those sums are
                 * computed and dropped. */
                const int8_t *w[TILE_BLOCKS];
                for (int c = 0; c < tile_blocks; ++c)
                    w[c] = packed + (p * blocks + b0 + (c < count_blocks ? c : 0)) * block_bytes;
                const uint8_t *h[TILE_ROWS], *l[TILE_ROWS];
                for (int j = 0; j < TILE_ROWS; ++j) {
                    int64_t row = r0 + (j < count ? j : 0);  /* rows of the item's chunk */
                    h[j] = scratch + row * k;
                    l[j] = (const uint8_t *)(planes + (rows + row) * k);
                }
                if (one_row) tile_8x1(h[0], l[0], k, w, high, low);
                else tile_4x3(h, l, k, w, high, low);
                fold_plane(high, low, row_sums + (p * blocks + b0) * LANES, p, count,
                           count_blocks, total);
            }
            /* forward._scale, 8 outputs at a time: vpsraq is asr (a floor shift) and vpmullq
             * the wrapped product */
            for (int j = 0; j < count; ++j) {
                __m128i amount = _mm_cvtsi64_si128(
                    clamp(scale_bits - out_frac - exponent[r0 + j], 0, 62));
                for (int c = 0; c < 2 * count_blocks; ++c) {
                    int64_t n = b0 * LANES + 8 * c;
                    if (n >= n_out) break;
                    __mmask8 mask = n_out - n >= 8 ? 0xff : (__mmask8)((1u << (n_out - n)) - 1);
                    __m512i v = _mm512_sra_epi64(
                        _mm512_mullo_epi64(_mm512_loadu_si512(total[j] + 8 * c),
                                           _mm512_maskz_loadu_epi64(mask, scale + n)),
                        amount);
                    if (bias) v = _mm512_add_epi64(v, _mm512_maskz_loadu_epi64(mask, bias + n));
                    _mm512_mask_storeu_epi64(out + (r0 + j) * out_stride + n, mask, v);
                }
            }
        }
    }
    free(scratch);
    return 0;
#else
    (void)row_sums;
    return linear_packed_portable(planes, rows, k, packed, wplanes, n_out, scale, scale_bits,
                                  exponent, out_frac, bias, out, out_stride, threads);
#endif
}

/* ---- forward._block_accumulate and forward._linear for Q4_1 blocks (blocks.py) ----
 *
 * packed: for group g of 16 output rows and block b of 32 weights along k, Q4_BYTES bytes at
 * packed + (g * kblocks + b) * Q4_BYTES:
 *   bytes 64 j + 4 l + i (j, i in 0..3, l in 0..15): low nibble q[16 g + l, 32 b + 4 j + i],
 *   high nibble q[16 g + l, 32 b + 16 + 4 j + i];
 *   bytes 256 + 2 l: the fp16 bits of d[16 g + l, b]; bytes 288 + 2 l: those of m;
 *   rows past n_out hold 0 (nibbles, d and m).
 * (blocks.py's BlockLinear, laid out by native.pack_blocks: 20 bytes per row and block, as the
 * GGUF's Q4_1 blocks.) One vpdpbusd multiplies the unsigned nibbles of 4 k of 16 rows by 4
 * broadcast activation bytes (signed: the high plane, or the low plane's 0..127), so a block's
 * S = sum q_x * q is exact int32 (|S| < 2**14 * 15 * 32 < 2**23); S times the block's D
 * (d * 2**24, an integer below 2**31) and X (the activations' block sum, below 2**19) times M
 * are int64 products (vpmuldq on the even and odd rows), summed exactly in int64 (blocks.py
 * bounds the sum below 2**62).
 * D and M come from the fp16 bits by exact IEEE-754 operations: vcvtph2ps (every fp16 value is
 * an fp32 value), a multiply by 2**24 (a power of two, no overflow) and vcvttps2dq (an integer
 * below 2**31 converts exactly). The kernel clears MXCSR's DAZ and FTZ bits on each thread for
 * its work (restored after): an fp16 subnormal (d or m below 2**-14) is then converted as IEEE
 * says, whatever mode the caller's threads run in. */
#ifdef SEQKV_VNNI
#define Q4_BLOCK 32
#define Q4_BYTES 320
#define Q4_GROUP_TILE 4  /* groups of 16 rows per work item */
#define MXCSR_FLUSH 0x8040  /* FTZ (bit 15) and DAZ (bit 6) */

static inline __m512i q4_integers(const uint8_t *halves) {  /* 16 fp16 -> value * 2**24 */
    __m512 value = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)halves));
    return _mm512_cvttps_epi32(_mm512_mul_ps(value, _mm512_set1_ps(16777216.0f)));
}

/* acc += S * D + X * M for the 16 rows of a group: even rows in even, odd rows in odd. */
static inline void q4_fold(__m512i s, __m512i d, __m512i m, int32_t x, __m512i *even,
                           __m512i *odd) {
    __m512i xb = _mm512_set1_epi64(x);
    *even = _mm512_add_epi64(*even, _mm512_add_epi64(_mm512_mul_epi32(s, d),
                                                     _mm512_mul_epi32(m, xb)));
    *odd = _mm512_add_epi64(*odd, _mm512_add_epi64(
        _mm512_mul_epi32(_mm512_srli_epi64(s, 32), _mm512_srli_epi64(d, 32)),
        _mm512_mul_epi32(_mm512_srli_epi64(m, 32), xb)));
}

/* One group, one row (h, l: its planes; x: its block sums, times 16). The high nibbles enter
 * vpdpbusd in place (v & 0xf0, 16 times the nibble), so each block's sum comes out as T = 16 S
 * (int32: below 2**27), and so does the row's total: the caller shifts 4 further. Four
 * independent vpdpbusd chains per block (low and high nibbles by high and low planes). */
static void q4_group_1(const uint8_t *p, int64_t kblocks, const int8_t *h, const int8_t *l,
                       const int32_t *x, __m512i out[2]) {
    const __m512i low = _mm512_set1_epi8(0x0f), high = _mm512_set1_epi8((char)0xf0);
    const __m512i z = _mm512_setzero_si512();
    __m512i even = z, odd = z;
    const uint8_t *hu = (const uint8_t *)h, *lu = (const uint8_t *)l;
    for (int64_t b = 0; b < kblocks; ++b, p += Q4_BYTES, hu += Q4_BLOCK, lu += Q4_BLOCK) {
        __m512i a0 = z, a1 = z, c0 = z, c1 = z;
#define NIBBLES(j) {                                                                        \
            __m512i v = _mm512_loadu_si512(p + 64 * (j));                                   \
            __m512i v0 = _mm512_and_si512(v, low), v1 = _mm512_and_si512(v, high);          \
            DP(a0, v0, broadcast4(hu + 4 * (j))); DP(c0, v0, broadcast4(lu + 4 * (j)));     \
            DP(a1, v1, broadcast4(hu + 16 + 4 * (j)));                                      \
            DP(c1, v1, broadcast4(lu + 16 + 4 * (j))); }
        NIBBLES(0) NIBBLES(1) NIBBLES(2) NIBBLES(3)
#undef NIBBLES
        /* T = 16 (128 high + low) = ((16 a0 + a1) << 7) + 16 c0 + c1 */
        __m512i t = _mm512_add_epi32(
            _mm512_slli_epi32(_mm512_add_epi32(_mm512_slli_epi32(a0, 4), a1), PLANE_BITS),
            _mm512_add_epi32(_mm512_slli_epi32(c0, 4), c1));
        q4_fold(t, q4_integers(p + 256), q4_integers(p + 288), x[b], &even, &odd);
    }
    out[0] = even;
    out[1] = odd;
}

/* One group, three rows: each block's nibbles unpacked once for all three, two vpdpbusd
 * chains per row; the block sums come out as T = 16 S, as in q4_group_1. */
static void q4_group_3(const uint8_t *p, int64_t kblocks, const int8_t *const h[3],
                       const int8_t *const l[3], const int32_t *const x[3], __m512i out[3][2]) {
    const __m512i mask = _mm512_set1_epi8(0x0f), z = _mm512_setzero_si512();
    __m512i e0 = z, o0 = z, e1 = z, o1 = z, e2 = z, o2 = z;
    const uint8_t *h0 = (const uint8_t *)h[0], *h1 = (const uint8_t *)h[1];
    const uint8_t *h2 = (const uint8_t *)h[2], *l0 = (const uint8_t *)l[0];
    const uint8_t *l1 = (const uint8_t *)l[1], *l2 = (const uint8_t *)l[2];
    for (int64_t b = 0; b < kblocks; ++b, p += Q4_BYTES) {
        __m512i w0 = _mm512_loadu_si512(p), w1 = _mm512_loadu_si512(p + 64);
        __m512i w2 = _mm512_loadu_si512(p + 128), w3 = _mm512_loadu_si512(p + 192);
        __m512i n0 = _mm512_and_si512(w0, mask), n1 = _mm512_and_si512(w1, mask);
        __m512i n2 = _mm512_and_si512(w2, mask), n3 = _mm512_and_si512(w3, mask);
        __m512i m0 = _mm512_and_si512(_mm512_srli_epi16(w0, 4), mask);
        __m512i m1 = _mm512_and_si512(_mm512_srli_epi16(w1, 4), mask);
        __m512i m2 = _mm512_and_si512(_mm512_srli_epi16(w2, 4), mask);
        __m512i m3 = _mm512_and_si512(_mm512_srli_epi16(w3, 4), mask);
        int64_t at = b * Q4_BLOCK;
        __m512i d = q4_integers(p + 256), m = q4_integers(p + 288);
#define ROW3(r) {                                                                           \
            const uint8_t *hb = h##r + at, *lb = l##r + at;                                 \
            __m512i a = z, c = z;                                                           \
            DP(a, n0, broadcast4(hb)); DP(c, n0, broadcast4(lb));                           \
            DP(a, n1, broadcast4(hb + 4)); DP(c, n1, broadcast4(lb + 4));                   \
            DP(a, n2, broadcast4(hb + 8)); DP(c, n2, broadcast4(lb + 8));                   \
            DP(a, n3, broadcast4(hb + 12)); DP(c, n3, broadcast4(lb + 12));                 \
            DP(a, m0, broadcast4(hb + 16)); DP(c, m0, broadcast4(lb + 16));                 \
            DP(a, m1, broadcast4(hb + 20)); DP(c, m1, broadcast4(lb + 20));                 \
            DP(a, m2, broadcast4(hb + 24)); DP(c, m2, broadcast4(lb + 24));                 \
            DP(a, m3, broadcast4(hb + 28)); DP(c, m3, broadcast4(lb + 28));                 \
            __m512i t = _mm512_add_epi32(_mm512_slli_epi32(a, PLANE_BITS + 4),              \
                                         _mm512_slli_epi32(c, 4));                          \
            q4_fold(t, d, m, x[r][b], &e##r, &o##r); }
        ROW3(0) ROW3(1) ROW3(2)
#undef ROW3
    }
    out[0][0] = e0; out[0][1] = o0; out[1][0] = e1; out[1][1] = o1;
    out[2][0] = e2; out[2][1] = o2;
}
#endif

#ifndef SEQKV_VNNI
#define Q4_BLOCK 32
#define Q4_BYTES 320

/* An fp16 value (its bits) times 2**24, truncated to int32 as vcvtph2ps, a multiply by 2**24 and
 * vcvttps2dq give it (the VNNI path's conversion): every finite fp16 value times 2**24 is an
 * integer, (1024 + mantissa) << (exponent - 1) or, subnormal, the mantissa itself; a magnitude
 * of 2**31 or more, an infinity or a NaN gives INT32_MIN, the instructions' "indefinite". */
static inline int32_t q4_integer(const uint8_t *bits) {
    uint32_t h = (uint32_t)bits[0] | (uint32_t)bits[1] << 8;
    uint32_t exponent = h >> 10 & 31, mantissa = h & 1023;
    if (exponent == 31) return INT32_MIN;
    uint64_t magnitude = exponent ? (uint64_t)(1024 + mantissa) << (exponent - 1) : mantissa;
    if (magnitude >= (UINT64_C(1) << 31)) return INT32_MIN;
    return h >> 15 ? -(int32_t)magnitude : (int32_t)magnitude;
}

/* S for the 16 rows of one group and one block of 32 weights: s[lane] = sum over the block of
 * q * nibble (|S| < 2**14 * 15 * 32 < 2**23), q = 128 high + low. */
#if defined(SEQKV_AVX2)
/* vpmaddubsw multiplies the unsigned nibbles by the signed plane bytes: a pair of products is at
 * most 2 * 15 * 128 = 3,840, and the block's 8 pair sums per 16-bit lane at most 30,720, so the
 * int16 sums never saturate; vpmaddwd by 1 then adds each lane's two int16 sums in int32. Each
 * half of the group's nibbles is unpacked once for all the rows. */
#define Q4_ROWS_SUMS 1
static inline __m256i broadcast4_i8(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

static void q4_rows_sums(const uint8_t *p, const int8_t *planes, int64_t rows, int64_t k,
                         int64_t at, int64_t first, int64_t last, int32_t s[][LANES]) {
    const __m256i mask = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    for (int half = 0; half < 2; ++half) {
        /* named, not an array: GCC keeps arrays of vectors in memory */
        const uint8_t *w = p + 32 * half;
        __m256i v0 = _mm256_loadu_si256((const __m256i *)w);
        __m256i v1 = _mm256_loadu_si256((const __m256i *)(w + 64));
        __m256i v2 = _mm256_loadu_si256((const __m256i *)(w + 128));
        __m256i v3 = _mm256_loadu_si256((const __m256i *)(w + 192));
        /* low nibbles: weights 4 j + i; high nibbles: 16 + 4 j + i (j = 0..3) */
        __m256i a0 = _mm256_and_si256(v0, mask);
        __m256i b0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), mask);
        __m256i a1 = _mm256_and_si256(v1, mask);
        __m256i b1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), mask);
        __m256i a2 = _mm256_and_si256(v2, mask);
        __m256i b2 = _mm256_and_si256(_mm256_srli_epi16(v2, 4), mask);
        __m256i a3 = _mm256_and_si256(v3, mask);
        __m256i b3 = _mm256_and_si256(_mm256_srli_epi16(v3, 4), mask);
        for (int64_t r = first; r < last; ++r) {
            const int8_t *h = planes + r * k + at, *l = planes + (rows + r) * k + at;
#define PLANE(x) _mm256_add_epi16(                                                         \
            _mm256_add_epi16(_mm256_add_epi16(                                              \
                _mm256_maddubs_epi16(a0, broadcast4_i8(x)),                                 \
                _mm256_maddubs_epi16(b0, broadcast4_i8(x + 16))),                           \
                _mm256_add_epi16(_mm256_maddubs_epi16(a1, broadcast4_i8(x + 4)),            \
                                 _mm256_maddubs_epi16(b1, broadcast4_i8(x + 20)))),         \
            _mm256_add_epi16(_mm256_add_epi16(                                              \
                _mm256_maddubs_epi16(a2, broadcast4_i8(x + 8)),                             \
                _mm256_maddubs_epi16(b2, broadcast4_i8(x + 24))),                           \
                _mm256_add_epi16(_mm256_maddubs_epi16(a3, broadcast4_i8(x + 12)),           \
                                 _mm256_maddubs_epi16(b3, broadcast4_i8(x + 28)))))
            __m256i total = _mm256_add_epi32(
                _mm256_slli_epi32(_mm256_madd_epi16(PLANE(h), ones), PLANE_BITS),
                _mm256_madd_epi16(PLANE(l), ones));
#undef PLANE
            _mm256_storeu_si256((__m256i *)(s[r - first] + 8 * half), total);
        }
    }
}
#elif defined(SEQKV_NEON)
/* sdot of the nibbles (0..15, valid int8) by 4 broadcast plane bytes, per plane in int32. */
static inline void q4_block_sums(const uint8_t *p, const int8_t *h, const int8_t *l,
                                 int32_t s[LANES]) {
    const uint8x16_t mask = vdupq_n_u8(0x0f);
    for (int c = 0; c < 4; ++c) {
        int32x4_t sh = vdupq_n_s32(0), sl = sh;
        for (int j = 0; j < 4; ++j) {
            uint8x16_t v = vld1q_u8(p + 64 * j + 16 * c);
            int8x16_t n0 = vreinterpretq_s8_u8(vandq_u8(v, mask));
            int8x16_t n1 = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
            sh = vdotq_s32(sh, n0, broadcast4_s8(h + 4 * j));
            sh = vdotq_s32(sh, n1, broadcast4_s8(h + 16 + 4 * j));
            sl = vdotq_s32(sl, n0, broadcast4_s8(l + 4 * j));
            sl = vdotq_s32(sl, n1, broadcast4_s8(l + 16 + 4 * j));
        }
        vst1q_s32(s + 4 * c, vaddq_s32(vshlq_n_s32(sh, PLANE_BITS), sl));
    }
}
#else
static inline void q4_block_sums(const uint8_t *p, const int8_t *h, const int8_t *l,
                                 int32_t s[LANES]) {
    for (int lane = 0; lane < LANES; ++lane) {
        int32_t total = 0;
        for (int j = 0; j < 4; ++j)
            for (int i = 0; i < 4; ++i) {
                int32_t byte = p[64 * j + 4 * lane + i];
                int32_t first = h[4 * j + i] * (1 << PLANE_BITS) + l[4 * j + i];
                int32_t second = h[16 + 4 * j + i] * (1 << PLANE_BITS) + l[16 + 4 * j + i];
                total += first * (byte & 15) + second * (byte >> 4);
            }
        s[lane] = total;
    }
}
#endif

#ifndef Q4_ROWS_SUMS
/* q4_block_sums of rows first .. last - 1, block at column `at`. */
static void q4_rows_sums(const uint8_t *p, const int8_t *planes, int64_t rows, int64_t k,
                         int64_t at, int64_t first, int64_t last, int32_t s[][LANES]) {
    for (int64_t r = first; r < last; ++r)
        q4_block_sums(p, planes + r * k + at, planes + (rows + r) * k + at, s[r - first]);
}
#endif

/* seqkv_linear_q4 outside AVX-512 VNNI: per row and group of 16 rows, the exact int64 sum over
 * blocks of S * D + X * M (X: the block's sum of q, D and M: q4_integer of d and m), shifted as
 * the VNNI path shifts it (whose totals are 16 times these: asr(16 t, a + 4) = asr(t, a)). */
static int64_t linear_q4_portable(const int8_t *planes, int64_t rows, int64_t k,
                                  const uint8_t *packed, int64_t n_out, const int64_t *exponent,
                                  int64_t out_frac, const int64_t *bias, int64_t *out,
                                  int64_t out_stride, int64_t threads) {
    int64_t kblocks = k / Q4_BLOCK, groups = (n_out + LANES - 1) / LANES;
    int64_t chunks = (rows + ROW_SPLIT - 1) / ROW_SPLIT;
    int32_t *sums = malloc(sizeof(int32_t) * (size_t)(rows * kblocks));
    if (!sums) return -1;
    for (int64_t r = 0; r < rows; ++r)  /* X: the block sums of q = 128 * high + low */
        for (int64_t b = 0; b < kblocks; ++b) {
            int32_t total = 0;  /* |X| < 2**19 */
            const int8_t *hp = planes + r * k + b * Q4_BLOCK;
            const int8_t *lp = planes + (rows + r) * k + b * Q4_BLOCK;
            for (int i = 0; i < Q4_BLOCK; ++i) total += hp[i] * (1 << PLANE_BITS) + lp[i];
            sums[r * kblocks + b] = total;
        }
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads((int)threads) if (threads > 1)
#endif
    for (int64_t item = 0; item < groups * chunks; ++item) {
        int64_t g = item / chunks, first = (item % chunks) * ROW_SPLIT;
        int64_t last = first + ROW_SPLIT < rows ? first + ROW_SPLIT : rows;
        const uint8_t *group = packed + g * kblocks * Q4_BYTES;
        int64_t total[ROW_SPLIT][LANES];
        for (int64_t r = first; r < last; ++r)
            for (int lane = 0; lane < LANES; ++lane) total[r - first][lane] = 0;
        for (int64_t b = 0; b < kblocks; ++b) {  /* each block's D and M once for the rows */
            const uint8_t *p = group + b * Q4_BYTES;
            int32_t d[LANES], m[LANES], s[ROW_SPLIT][LANES];
            for (int lane = 0; lane < LANES; ++lane) {
                d[lane] = q4_integer(p + 256 + 2 * lane);
                m[lane] = q4_integer(p + 288 + 2 * lane);
            }
            q4_rows_sums(p, planes, rows, k, b * Q4_BLOCK, first, last, s);
            for (int64_t r = first; r < last; ++r) {  /* int32 x int32 products, in int64 */
                int64_t x = sums[r * kblocks + b], *t = total[r - first];
                const int32_t *sr = s[r - first];
                for (int lane = 0; lane < LANES; ++lane)
                    t[lane] += (int64_t)sr[lane] * d[lane] + x * m[lane];
            }
        }
        for (int64_t r = first; r < last; ++r) {
            int64_t amount = clamp(24 - out_frac - exponent[r], 0, 62);
            for (int lane = 0; lane < LANES; ++lane) {
                int64_t n = g * LANES + lane;
                if (n >= n_out) break;
                int64_t v = asr(total[r - first][lane], amount);
                out[r * out_stride + n] = bias ? v + bias[n] : v;
            }
        }
    }
    free(sums);
    return 0;
}
#endif

/* forward._linear of Q4_1 blocks: out[r, n] (row stride out_stride) = the row's exact sum
 * (forward._block_accumulate) shifted right by clamp(24 - out_frac - exponent[r], 0, 62), plus
 * bias[n]. planes [2 * rows, k], k a multiple of 32. Returns 0, or -1 when out of memory or
 * built without VNNI (nothing written). */
static int64_t seqkv_linear_q4(const int8_t *planes, int64_t rows, int64_t k,
                               const uint8_t *packed, int64_t n_out, const int64_t *exponent,
                               int64_t out_frac, const int64_t *bias, int64_t *out,
                               int64_t out_stride, int64_t threads) {
#ifdef SEQKV_VNNI
    int64_t kblocks = k / Q4_BLOCK, groups = (n_out + LANES - 1) / LANES;
    int one_row = rows < TILE_ROWS;  /* 1 or 2 rows: each row on its own */
    int tile_rows = one_row ? 1 : TILE_ROWS;
    int64_t tiles = (groups + Q4_GROUP_TILE - 1) / Q4_GROUP_TILE;
    int64_t chunks = (rows + ROW_SPLIT - 1) / ROW_SPLIT;
    int32_t *sums = malloc(sizeof(int32_t) * (size_t)(rows * kblocks));
    if (!sums) return -1;
    for (int64_t r = 0; r < rows; ++r)  /* 16 X: the block sums of q = 128 * high + low */
        for (int64_t b = 0; b < kblocks; ++b) {
            int32_t total = 0;  /* |16 X| < 2**23 */
            const int8_t *hp = planes + r * k + b * Q4_BLOCK;
            const int8_t *lp = planes + (rows + r) * k + b * Q4_BLOCK;
            for (int i = 0; i < Q4_BLOCK; ++i) total += hp[i] * (1 << PLANE_BITS) + lp[i];
            sums[r * kblocks + b] = total * 16;
        }
    /* tiles of groups times chunks of rows are independent: threads share them */
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads((int)threads) if (threads > 1)
#endif
    for (int64_t item = 0; item < tiles * chunks; ++item) {
        unsigned int mode = _mm_getcsr();
        _mm_setcsr(mode & ~(unsigned int)MXCSR_FLUSH);
        int64_t g0 = (item / chunks) * Q4_GROUP_TILE, first = (item % chunks) * ROW_SPLIT;
        int64_t last = first + ROW_SPLIT < rows ? first + ROW_SPLIT : rows;
        int64_t g1 = g0 + Q4_GROUP_TILE < groups ? g0 + Q4_GROUP_TILE : groups;
        for (int64_t r0 = first; r0 < last; r0 += tile_rows) {
            int count = last - r0 < tile_rows ? (int)(last - r0) : tile_rows;
            for (int64_t g = g0; g < g1; ++g) {
                __m512i result[TILE_ROWS][2];  /* [row][even, odd rows of the group] */
                const uint8_t *p = packed + g * kblocks * Q4_BYTES;
                if (one_row) {
                    q4_group_1(p, kblocks, planes + r0 * k, planes + (rows + r0) * k,
                               sums + r0 * kblocks, result[0]);
                } else {  /* rows past the tile's last repeat its first; dropped below */
                    const int8_t *h[TILE_ROWS], *l[TILE_ROWS];
                    const int32_t *x[TILE_ROWS];
                    for (int j = 0; j < TILE_ROWS; ++j) {
                        int64_t row = r0 + (j < count ? j : 0);
                        h[j] = planes + row * k;
                        l[j] = planes + (rows + row) * k;
                        x[j] = sums + row * kblocks;
                    }
                    q4_group_3(p, kblocks, h, l, x, result);
                }
                for (int j = 0; j < count; ++j) {
                    /* the totals are 16 times the sums: asr(16 t, a + 4) = asr(t, a) for
                     * |t| < 2**58 (blocks.py), also where a + 4 is clamped to 62 */
                    int64_t amount = clamp(24 - out_frac - exponent[r0 + j], 0, 62);
                    int64_t totals[2][8];
                    amount = amount + 4 < 62 ? amount + 4 : 62;
                    _mm512_storeu_si512(totals[0], result[j][0]);
                    _mm512_storeu_si512(totals[1], result[j][1]);
                    for (int lane = 0; lane < LANES; ++lane) {
                        int64_t n = g * LANES + lane;
                        if (n >= n_out) break;
                        int64_t v = asr(totals[lane % 2][lane / 2], amount);
                        out[(r0 + j) * out_stride + n] = bias ? v + bias[n] : v;
                    }
                }
            }
        }
        _mm_setcsr(mode);
    }
    free(sums);
    return 0;
#else
    return linear_q4_portable(planes, rows, k, packed, n_out, exponent, out_frac, bias, out,
                              out_stride, threads);
#endif
}

/* forward._attention's rotation and quantization of qkv [rows, vectors, d] (at 2**-20, rotated
 * in place for the first `rotated` vectors): planes [rows, vectors, 2, d], shifts [rows,
 * vectors]. cos, sin: [positions, d] (forward._cos, forward._sin). */
static int64_t seqkv_rope_quantize(int64_t *qkv, int64_t rows, int64_t vectors, int64_t rotated,
                         int64_t d, const int64_t *positions, const int64_t *cos,
                         const int64_t *sin, int8_t *planes, int64_t *shifts) {
    int64_t half = d / 2;
    int64_t rolled[1024];
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t *c = cos + positions[r] * d, *s = sin + positions[r] * d;
        for (int64_t v = 0; v < vectors; ++v) {
            int64_t *x = qkv + (r * vectors + v) * d;
            if (v < rotated) {  /* |x| < 2**31, tables <= 2**30 */
                int64_t i = 0;
#ifdef SEQKV_VNNI
                for (; half % 8 == 0 && i < half; i += 8) {  /* both halves, 8 at a time */
                    __m512i a = _mm512_loadu_si512(x + i), b = _mm512_loadu_si512(x + half + i);
                    _mm512_storeu_si512(x + i, _mm512_srai_epi64(_mm512_add_epi64(
                        _mm512_mullo_epi64(a, _mm512_loadu_si512(c + i)),
                        _mm512_mullo_epi64(b, _mm512_loadu_si512(s + i))), TABLE_BITS));
                    _mm512_storeu_si512(x + half + i, _mm512_srai_epi64(_mm512_add_epi64(
                        _mm512_mullo_epi64(b, _mm512_loadu_si512(c + half + i)),
                        _mm512_mullo_epi64(a, _mm512_loadu_si512(s + half + i))), TABLE_BITS));
                }
#endif
                if (i < half) {
                    for (i = 0; i < d; ++i) rolled[i] = x[(i + d - half) % d];
                    for (i = 0; i < d; ++i)
                        x[i] = asr(x[i] * c[i] + rolled[i] * s[i], TABLE_BITS);
                }
            }
            int8_t *out = planes + (r * vectors + v) * 2 * d;
            shifts[r * vectors + v] = quantize_row(x, d, out, out + d);
        }
    }
    return 0;
}

static inline int64_t plane_value(const int8_t *plane, int64_t i, int64_t d) {
    return shl(plane[i], PLANE_BITS) + plane[d + i];
}

/* Each row's heads to its largest exponent: out [n, heads, d] at their own exponents
 * running [n, heads]; exponent [n]. */
static void common_exponent(int64_t *out, const int64_t *running, int64_t n, int64_t heads,
                            int64_t d, int64_t *exponent) {
    for (int64_t r = 0; r < n; ++r) {
        int64_t row_exponent = running[r * heads];
        for (int64_t h = 1; h < heads; ++h)
            row_exponent = running[r * heads + h] > row_exponent ? running[r * heads + h]
                                                                 : row_exponent;
        for (int64_t h = 0; h < heads; ++h) {
            int64_t *o = out + (r * heads + h) * d;
            for (int64_t i = 0; i < d; ++i) o[i] = asr(o[i], row_exponent - running[r * heads + h]);
        }
        exponent[r] = row_exponent;
    }
}

#define KEY_SUMS 16  /* keys whose dot products attend_group_body sums as one block */
/* query heads of one key head that attend_group_body serves in one pass (defined for every
 * build: attend_direct sizes its work items with it, and runs them one head at a time without
 * VNNI) */
#define GROUP_HEADS 4
#ifdef SEQKV_VNNI
/* Lane k of the result: the sum of the 16 lanes of v[k] (16 horizontal sums at once: pairs of
 * vectors interleaved and added, then 128-bit lanes, in 15 additions instead of 16 reductions
 * of 4 steps each). Integer addition is associative, so each lane is exactly
 * _mm512_reduce_add_epi32(v[k]); every partial sum is part of a key's sum, which stays in
 * int32 (attend_head_direct). */
static inline __m512i sum_lanes_16(const __m512i v[KEY_SUMS]) {
    __m512i quad[4];
    for (int j = 0; j < 4; ++j) {  /* 128-bit lane L of quad[j]: v[4j..4j+3]'s lane-L sums */
        const __m512i *w = v + 4 * j;
        __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(w[0], w[1]),
                                     _mm512_unpackhi_epi32(w[0], w[1]));
        __m512i b = _mm512_add_epi32(_mm512_unpacklo_epi32(w[2], w[3]),
                                     _mm512_unpackhi_epi32(w[2], w[3]));
        quad[j] = _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    }
    /* 128-bit lanes: (0 + 1, 2 + 3) of two quads side by side, then again */
    __m512i x = _mm512_add_epi32(_mm512_shuffle_i32x4(quad[0], quad[1], 0x88),
                                 _mm512_shuffle_i32x4(quad[0], quad[1], 0xdd));
    __m512i y = _mm512_add_epi32(_mm512_shuffle_i32x4(quad[2], quad[3], 0x88),
                                 _mm512_shuffle_i32x4(quad[2], quad[3], 0xdd));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(x, y, 0x88), _mm512_shuffle_i32x4(x, y, 0xdd));
}

/* One key's products with the query qv, 32 components per vpdpwssd (the first `wide`, a
 * multiple of 32): 16 int32 partial sums for its high plane kh and its low plane kl. */
static inline void key_products(const int16_t *qv, int64_t wide, const int8_t *kh,
                                const int8_t *kl, __m512i *high, __m512i *low) {
    __m512i ah = _mm512_setzero_si512(), al = _mm512_setzero_si512();
    for (int64_t i = 0; i < wide; i += 32) {
        __m512i q = _mm512_loadu_si512(qv + i);
        ah = _mm512_dpwssd_epi32(ah, q, _mm512_cvtepi8_epi16(
            _mm256_loadu_si256((const void *)(kh + i))));
        al = _mm512_dpwssd_epi32(al, q, _mm512_cvtepi8_epi16(
            _mm256_loadu_si256((const void *)(kl + i))));
    }
    *high = ah;
    *low = al;
}

#endif

#if defined(SEQKV_AVX2)
static inline int32_t sum_lanes_8(__m256i v) {  /* exact: integer addition is associative */
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4e));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xb1));
    return _mm_cvtsi128_si32(x);
}

/* One key's products with the query qv over its first `wide` components (a multiple of 16):
 * 16 int16 products per vpmaddwd (or AVX-VNNI's vpdpwssd) for its high plane kh and its low
 * plane kl; each key's sum stays in int32 (attend_head_direct), so any order gives it. */
static inline void key_products_avx2(const int16_t *qv, int64_t wide, const int8_t *kh,
                                     const int8_t *kl, int32_t *high, int32_t *low) {
    __m256i ah = _mm256_setzero_si256(), al = ah;
    for (int64_t i = 0; i < wide; i += 16) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(qv + i));
        DPW(ah, q, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(kh + i))));
        DPW(al, q, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(kl + i))));
    }
    *high = sum_lanes_8(ah);
    *low = sum_lanes_8(al);
}

/* The weighted value sums of keys t0 .. t1 - 1 (at most 512: int32, attend_head_direct) over the
 * first `narrow` components (a multiple of 16): two keys at a time, their components interleaved
 * as int16 pairs against the weight pair (w_t, w_t+1) (a weight fits int16: at most 2**14), one
 * vpmaddwd per 8 components. unpack*_epi16 pairs components within 128-bit lanes, so lane
 * 4 L + m of `even` holds component 8 L + m and of `odd` 8 L + 4 + m. values: key 0's high plane
 * of this head's group; its low plane lies `plane_stride` further. */
static void value_sums_avx2(const int64_t *weight, int64_t t0, int64_t t1, const int8_t *values,
                            int64_t token_stride, int64_t plane_stride, int64_t narrow,
                            int32_t *high, int32_t *low) {
    for (int64_t c = 0; c < narrow; c += 16) {
        __m256i even_high = _mm256_setzero_si256(), odd_high = even_high;
        __m256i even_low = even_high, odd_low = even_high;
        for (int64_t t = t0; t < t1; t += 2) {
            int64_t u = t + 1 < t1 ? t + 1 : t;  /* a last odd key pairs with weight 0 */
            int32_t w0 = (int32_t)weight[t], w1 = u > t ? (int32_t)weight[u] : 0;
            if (!w0 && !w1) continue;
            __m256i pair = _mm256_set1_epi32((int32_t)((uint32_t)(uint16_t)w0 |
                                                       ((uint32_t)(uint16_t)w1 << 16)));
            const int8_t *v0 = values + t * token_stride + c, *v1 = values + u * token_stride + c;
            __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)v0));
            __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)v1));
            DPW(even_high, _mm256_unpacklo_epi16(a, b), pair);
            DPW(odd_high, _mm256_unpackhi_epi16(a, b), pair);
            a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(v0 + plane_stride)));
            b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(v1 + plane_stride)));
            DPW(even_low, _mm256_unpacklo_epi16(a, b), pair);
            DPW(odd_low, _mm256_unpackhi_epi16(a, b), pair);
        }
        int32_t lanes[4][8];
        _mm256_storeu_si256((__m256i *)lanes[0], even_high);
        _mm256_storeu_si256((__m256i *)lanes[1], odd_high);
        _mm256_storeu_si256((__m256i *)lanes[2], even_low);
        _mm256_storeu_si256((__m256i *)lanes[3], odd_low);
        for (int lane = 0; lane < 2; ++lane)
            for (int m = 0; m < 4; ++m) {
                high[c + 8 * lane + m] = lanes[0][4 * lane + m];
                high[c + 8 * lane + 4 + m] = lanes[1][4 * lane + m];
                low[c + 8 * lane + m] = lanes[2][4 * lane + m];
                low[c + 8 * lane + 4 + m] = lanes[3][4 * lane + m];
            }
    }
}
#endif

/* One query head of one row of attend_direct (see there; it serves the heads whose d is not a
 * multiple of 32, attend_group_direct the others) over keys 0 .. end - 1: out [d] before
 * the row's common exponent, and the head's own exponent (`running`). keys: the pool's int8 key
 * planes as they lie (token t's high plane of group g at t * token_stride + g * d, its low
 * plane kv_heads * d further), widened to int16 as they are read; z and weight: scratch of
 * `end` int64 each.
 * Sums of plane products run in int32: |q| < 2**14 times a key plane (|.| <= 128) over d <= 1024
 * terms stays below 2**31 (and so does any part of such a sum); a weight (< 2**14) times a value
 * plane, below 2**21, is summed in int32 for at most 512 keys at a time (2**30) and then added
 * into int64. */
static int64_t attend_head_direct(const int8_t *q_plane, int64_t q_shift, int64_t h, int64_t g,
                           int64_t kv_heads, int64_t d, int64_t end, const int8_t *keys,
                           const int8_t *values, int64_t token_stride,
                           const int8_t *key_shift, const int8_t *value_shift,
                           int64_t shift_stride, int64_t score_scale, int64_t score_shift,
                           const int64_t *softmax, int64_t softmax_size, int64_t *z,
                           int64_t *weight, int64_t *out) {
    int16_t qv[1024];  /* 14-bit queries and 8-bit key planes: int16 products summed in int32 */
    int32_t high[1024], low[1024];
    for (int64_t i = 0; i < d; ++i) qv[i] = (int16_t)plane_value(q_plane, i, d);
    int64_t wide = 0;  /* the part of d that the vector products sum */
#if defined(SEQKV_VNNI)
    wide = d - d % 32;
#elif defined(SEQKV_AVX2)
    wide = d - d % 16;
#endif
    int64_t top = MASKED, running = 0;
    for (int64_t t = 0; t < end; ++t) {
        const int8_t *kh = keys + t * token_stride + g * d, *kl = kh + kv_heads * d;
        int32_t dot_high = 0, dot_low = 0;
#if defined(SEQKV_VNNI)
        __m512i acc_high, acc_low;
        key_products(qv, wide, kh, kl, &acc_high, &acc_low);
        dot_high = _mm512_reduce_add_epi32(acc_high);
        dot_low = _mm512_reduce_add_epi32(acc_low);
#elif defined(SEQKV_AVX2)
        key_products_avx2(qv, wide, kh, kl, &dot_high, &dot_low);
#endif
        for (int64_t i = wide; i < d; ++i) {
            dot_high += (int32_t)qv[i] * (int32_t)kh[i];
            dot_low += (int32_t)qv[i] * (int32_t)kl[i];
        }
        int64_t dot = shl(dot_high, PLANE_BITS) + dot_low;  /* < d * 2**28 */
        int64_t amount = clamp(score_shift - q_shift - key_shift[t * shift_stride + h], 0, 62);
        z[t] = asr(dot * score_scale, amount);
        top = z[t] > top ? z[t] : top;
        int64_t vs = value_shift[t * shift_stride + h];
        running = (t == 0 || vs > running) ? vs : running;
    }
    int64_t total = 0;
    for (int64_t t = 0; t < end; ++t) {
        int64_t gap = top - z[t];
        int64_t w = softmax[gap < softmax_size - 1 ? gap : softmax_size - 1];
        total += w;
        weight[t] = asr(w, clamp(running - value_shift[t * shift_stride + h], 0, 62));
    }
    for (int64_t i = 0; i < d; ++i) out[i] = 0;
    for (int64_t t0 = 0; t0 < end; t0 += 512) {
        int64_t t1 = t0 + 512 < end ? t0 + 512 : end;
        for (int64_t i = 0; i < d; ++i) high[i] = low[i] = 0;
        int64_t narrow = 0;  /* where the plain loop below starts */
#if defined(SEQKV_AVX2)
        narrow = d - d % 16;
        value_sums_avx2(weight, t0, t1, values + g * d, token_stride, kv_heads * d, narrow,
                        high, low);
#elif defined(SEQKV_VNNI)
        /* Two keys at a time, 32 components: their value planes' components interleaved as
         * int16 pairs (v_t[i], v_t+1[i]) against the weight pair (w_t, w_t+1), one vpdpwssd
         * per 16 components (a weight fits int16: it is at most 2**14). unpack*_epi16 pairs
         * components within 128-bit lanes, so lane 4L + m of `even` holds component 8L + m and
         * of `odd` 8L + 4 + m. */
        narrow = d - d % 32;
        for (int64_t c = 0; c < narrow; c += 32) {
            __m512i even_high = _mm512_setzero_si512(), odd_high = even_high;
            __m512i even_low = even_high, odd_low = even_high;
            for (int64_t t = t0; t < t1; t += 2) {
                int64_t u = t + 1 < t1 ? t + 1 : t;  /* a last odd key pairs with weight 0 */
                int32_t w0 = (int32_t)weight[t], w1 = u > t ? (int32_t)weight[u] : 0;
                if (!w0 && !w1) continue;
                __m512i pair = _mm512_set1_epi32((int32_t)((uint32_t)(uint16_t)w0 |
                                                           ((uint32_t)(uint16_t)w1 << 16)));
                const int8_t *v0 = values + t * token_stride + g * d + c;
                const int8_t *v1 = values + u * token_stride + g * d + c;
                for (int64_t plane = 0; plane < 2; ++plane) {
                    __m512i a = _mm512_cvtepi8_epi16(
                        _mm256_loadu_si256((const void *)(v0 + plane * kv_heads * d)));
                    __m512i b = _mm512_cvtepi8_epi16(
                        _mm256_loadu_si256((const void *)(v1 + plane * kv_heads * d)));
                    __m512i *even = plane ? &even_low : &even_high;
                    __m512i *odd = plane ? &odd_low : &odd_high;
                    *even = _mm512_dpwssd_epi32(*even, _mm512_unpacklo_epi16(a, b), pair);
                    *odd = _mm512_dpwssd_epi32(*odd, _mm512_unpackhi_epi16(a, b), pair);
                }
            }
            int32_t lanes[4][16];
            _mm512_storeu_si512(lanes[0], even_high);
            _mm512_storeu_si512(lanes[1], odd_high);
            _mm512_storeu_si512(lanes[2], even_low);
            _mm512_storeu_si512(lanes[3], odd_low);
            for (int lane = 0; lane < 4; ++lane)
                for (int m = 0; m < 4; ++m) {
                    high[c + 8 * lane + m] = lanes[0][4 * lane + m];
                    high[c + 8 * lane + 4 + m] = lanes[1][4 * lane + m];
                    low[c + 8 * lane + m] = lanes[2][4 * lane + m];
                    low[c + 8 * lane + 4 + m] = lanes[3][4 * lane + m];
                }
        }
#endif
        for (int64_t t = t0; t < t1 && narrow < d; ++t) {
            int32_t w = (int32_t)weight[t];
            if (!w) continue;
            const int8_t *vp = values + t * token_stride + g * d;
            const int8_t *vl = vp + kv_heads * d;
            for (int64_t i = narrow; i < d; ++i) {
                high[i] += w * (int32_t)vp[i];
                low[i] += w * (int32_t)vl[i];
            }
        }
        for (int64_t i = 0; i < d; ++i) out[i] += shl(high[i], PLANE_BITS) + low[i];
    }
    /* |out| <= tokens * 2**28 <= 2**41: shifted by 14 it stays below 2**55 */
    for (int64_t i = 0; i < d; ++i) out[i] = floor_div(shl(out[i], SOFTMAX_BITS), total);
    return running;
}

#ifdef SEQKV_VNNI
/* attend_head_direct for up to GROUP_HEADS query heads that share key/value group g, in one
 * pass over the keys and values (d a multiple of 32): each key and value vector is loaded and
 * widened once for all of them, not once per head. Every head's dot products, weights, value
 * sums and output are the integers attend_head_direct computes: the same int32 products summed
 * in another order (exact: each key's sum stays in int32 in any order, attend_head_direct),
 * the same value sums per 512 keys, the same scalar steps per head.
 * NOTE: on SmolLM2-135M (3 query heads per key head, d 64), a one-row step after some
 * thousands of tokens spends about half its time in attend_head_direct, most of it waiting for
 * keys that its three query heads each read again. Grouping alone was no faster, nor were cache
 * hints on the per-head loop alone; both together are (benchmarks/long_context_costs.py step;
 * reports/code_notes.md). */
#define PREFETCH_KEYS 16  /* keys ahead that the loops ask the cache for */
static inline ALWAYS_INLINE void attend_group_body(const int8_t *q_planes,
                                const int64_t *q_shift, int64_t h0, int64_t count,
                                int64_t g, int64_t kv_heads, int64_t d, int64_t end,
                                const int8_t *keys, const int8_t *values,
                                int64_t token_stride, const int8_t *key_shift,
                                const int8_t *value_shift, int64_t shift_stride,
                                int64_t score_scale, int64_t score_shift,
                                const int64_t *softmax, int64_t softmax_size, int64_t *scratch,
                                int64_t *out, int64_t *running_out) {
    int16_t qv[GROUP_HEADS][1024];  /* heads h0 .. h0 + count - 1, 14-bit queries */
    int64_t top[GROUP_HEADS], running[GROUP_HEADS], total[GROUP_HEADS];
    __m512i acc_high[GROUP_HEADS][KEY_SUMS], acc_low[GROUP_HEADS][KEY_SUMS];
    int32_t dot_high[GROUP_HEADS][KEY_SUMS], dot_low[GROUP_HEADS][KEY_SUMS];
    int64_t chunks = d / 32;
    for (int64_t j = 0; j < count; ++j) {
        const int8_t *q = q_planes + j * 2 * d;
        for (int64_t i = 0; i < d; ++i) qv[j][i] = (int16_t)plane_value(q, i, d);
        top[j] = MASKED;
        running[j] = 0;
        total[j] = 0;
    }
    for (int64_t t0 = 0; t0 < end; t0 += KEY_SUMS) {
        int64_t keys_here = end - t0 < KEY_SUMS ? end - t0 : KEY_SUMS;
        for (int64_t k = 0; k < keys_here; ++k) {
            const int8_t *kh = keys + (t0 + k) * token_stride + g * d, *kl = kh + kv_heads * d;
            if (t0 + k + PREFETCH_KEYS < end) {  /* no effect on results: a cache hint */
                const char *ahead = (const char *)(kh + PREFETCH_KEYS * token_stride);
                for (int64_t at = 0; at < d; at += 64) {
                    _mm_prefetch(ahead + at, _MM_HINT_T0);
                    _mm_prefetch(ahead + kv_heads * d + at, _MM_HINT_T0);
                }
            }
            __m512i ah[GROUP_HEADS], al[GROUP_HEADS];
            for (int64_t j = 0; j < count; ++j) ah[j] = al[j] = _mm512_setzero_si512();
            for (int64_t c = 0; c < chunks; ++c) {
                __m512i wh = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const void *)(kh + 32 * c)));
                __m512i wl = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const void *)(kl + 32 * c)));
                for (int64_t j = 0; j < count; ++j) {
                    __m512i q = _mm512_loadu_si512(qv[j] + 32 * c);
                    ah[j] = _mm512_dpwssd_epi32(ah[j], q, wh);
                    al[j] = _mm512_dpwssd_epi32(al[j], q, wl);
                }
            }
            for (int64_t j = 0; j < count; ++j) {
                acc_high[j][k] = ah[j];
                acc_low[j][k] = al[j];
            }
        }
        for (int64_t j = 0; j < count; ++j) {
            if (keys_here == KEY_SUMS) {
                _mm512_storeu_si512(dot_high[j], sum_lanes_16(acc_high[j]));
                _mm512_storeu_si512(dot_low[j], sum_lanes_16(acc_low[j]));
            } else {
                for (int64_t k = 0; k < keys_here; ++k) {
                    dot_high[j][k] = _mm512_reduce_add_epi32(acc_high[j][k]);
                    dot_low[j][k] = _mm512_reduce_add_epi32(acc_low[j][k]);
                }
            }
            int64_t h = h0 + j, *z = scratch + 2 * j * end;
            for (int64_t k = 0; k < keys_here; ++k) {
                int64_t t = t0 + k;
                int64_t dot = shl(dot_high[j][k], PLANE_BITS) + dot_low[j][k];  /* < d 2**28 */
                int64_t amount = clamp(score_shift - q_shift[j] - key_shift[t * shift_stride + h],
                                       0, 62);
                z[t] = asr(dot * score_scale, amount);
                top[j] = z[t] > top[j] ? z[t] : top[j];
                int64_t vs = value_shift[t * shift_stride + h];
                running[j] = (t == 0 || vs > running[j]) ? vs : running[j];
            }
        }
    }
    for (int64_t j = 0; j < count; ++j) {
        int64_t h = h0 + j, *z = scratch + 2 * j * end, *weight = z + end;
        for (int64_t t = 0; t < end; ++t) {
            int64_t gap = top[j] - z[t];
            int64_t w = softmax[gap < softmax_size - 1 ? gap : softmax_size - 1];
            total[j] += w;
            weight[t] = asr(w, clamp(running[j] - value_shift[t * shift_stride + h], 0, 62));
        }
        for (int64_t i = 0; i < d; ++i) out[j * d + i] = 0;
    }
    for (int64_t t0 = 0; t0 < end; t0 += 512) {
        int64_t t1 = t0 + 512 < end ? t0 + 512 : end;
        for (int64_t c = 0; c < d; c += 32) {
            /* as in attend_head_direct: two keys' value planes interleaved as int16 pairs
             * against each head's weight pair */
            __m512i even_high[GROUP_HEADS], odd_high[GROUP_HEADS];
            __m512i even_low[GROUP_HEADS], odd_low[GROUP_HEADS];
            for (int64_t j = 0; j < count; ++j)
                even_high[j] = odd_high[j] = even_low[j] = odd_low[j] = _mm512_setzero_si512();
            for (int64_t t = t0; t < t1; t += 2) {
                int64_t u = t + 1 < t1 ? t + 1 : t;  /* a last odd key pairs with weight 0 */
                __m512i pair[GROUP_HEADS];
                int any = 0;
                for (int64_t j = 0; j < count; ++j) {
                    const int64_t *weight = scratch + 2 * j * end + end;
                    int32_t w0 = (int32_t)weight[t], w1 = u > t ? (int32_t)weight[u] : 0;
                    any |= w0 | w1;
                    pair[j] = _mm512_set1_epi32((int32_t)((uint32_t)(uint16_t)w0 |
                                                          ((uint32_t)(uint16_t)w1 << 16)));
                }
                if (!any) continue;
                const int8_t *v0 = values + t * token_stride + g * d + c;
                const int8_t *v1 = values + u * token_stride + g * d + c;
                if (c == 0 && t + PREFETCH_KEYS + 1 < t1)
                    for (int64_t at = 0; at < d; at += 64)
                        for (int64_t ahead = PREFETCH_KEYS; ahead <= PREFETCH_KEYS + 1; ++ahead) {
                            const char *p = (const char *)(v0 + ahead * token_stride);
                            _mm_prefetch(p + at, _MM_HINT_T0);
                            _mm_prefetch(p + kv_heads * d + at, _MM_HINT_T0);
                        }
                __m512i a = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const void *)v0));
                __m512i b = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const void *)v1));
                __m512i lo_high = _mm512_unpacklo_epi16(a, b);
                __m512i hi_high = _mm512_unpackhi_epi16(a, b);
                a = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const void *)(v0 + kv_heads * d)));
                b = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const void *)(v1 + kv_heads * d)));
                __m512i lo_low = _mm512_unpacklo_epi16(a, b), hi_low = _mm512_unpackhi_epi16(a, b);
                for (int64_t j = 0; j < count; ++j) {
                    even_high[j] = _mm512_dpwssd_epi32(even_high[j], lo_high, pair[j]);
                    odd_high[j] = _mm512_dpwssd_epi32(odd_high[j], hi_high, pair[j]);
                    even_low[j] = _mm512_dpwssd_epi32(even_low[j], lo_low, pair[j]);
                    odd_low[j] = _mm512_dpwssd_epi32(odd_low[j], hi_low, pair[j]);
                }
            }
            for (int64_t j = 0; j < count; ++j) {
                int32_t lanes[4][16];
                _mm512_storeu_si512(lanes[0], even_high[j]);
                _mm512_storeu_si512(lanes[1], odd_high[j]);
                _mm512_storeu_si512(lanes[2], even_low[j]);
                _mm512_storeu_si512(lanes[3], odd_low[j]);
                int64_t *o = out + j * d + c;
                for (int lane = 0; lane < 4; ++lane)
                    for (int m = 0; m < 4; ++m) {
                        o[8 * lane + m] += shl(lanes[0][4 * lane + m], PLANE_BITS)
                                           + lanes[2][4 * lane + m];
                        o[8 * lane + 4 + m] += shl(lanes[1][4 * lane + m], PLANE_BITS)
                                               + lanes[3][4 * lane + m];
                    }
            }
        }
    }
    for (int64_t j = 0; j < count; ++j) {
        for (int64_t i = 0; i < d; ++i)
            out[j * d + i] = floor_div(shl(out[j * d + i], SOFTMAX_BITS), total[j]);
        running_out[j] = running[j];
    }
}

/* attend_group_body with its head count a constant (1 to GROUP_HEADS), so that each head's
 * accumulators stay in registers. */
static void attend_group_direct(const int8_t *q_planes, const int64_t *q_shift, int64_t h0,
                                int64_t count, int64_t g, int64_t kv_heads, int64_t d,
                                int64_t end, const int8_t *keys, const int8_t *values,
                                int64_t token_stride, const int8_t *key_shift,
                                const int8_t *value_shift, int64_t shift_stride,
                                int64_t score_scale, int64_t score_shift,
                                const int64_t *softmax, int64_t softmax_size, int64_t *scratch,
                                int64_t *out, int64_t *running_out) {
#define GROUP_CASE(heads_here) case heads_here:                                              \
        attend_group_body(q_planes, q_shift, h0, heads_here, g, kv_heads, d, end, keys,      \
                          values, token_stride, key_shift, value_shift, shift_stride,        \
                          score_scale, score_shift, softmax, softmax_size, scratch, out,     \
                          running_out);                                                      \
        break;
    switch (count) {
        GROUP_CASE(1) GROUP_CASE(2) GROUP_CASE(3) GROUP_CASE(4)
        default: break;  /* attend_direct passes 1 .. GROUP_HEADS */
    }
#undef GROUP_CASE
}
#endif

/* seqkv_attend for a few rows: each row's query heads read the keys and values as they lie in
 * the pool (a key head's query heads together, attend_group_direct), widening each key to int16
 * as they read it, and interleave each key pair's values themselves; threads share the work
 * items, so a one-row step's heads run in parallel too.
 * NOTE: the keys were once widened into an int16 copy of the whole pool per call: at 8,192
 * tokens of context that was 6.3 MB written and read again per layer and step (more than the
 * step's weights over 30 layers); reading the int8 planes directly costs one vpmovsxbw per 32
 * components of each of a group's query heads instead. */
static int64_t attend_direct(const int8_t *q_planes, const int64_t *q_shift, int64_t q_vectors,
                     int64_t n, int64_t position, int64_t heads, int64_t kv_heads, int64_t d,
                     const int8_t *keys, const int8_t *values, int64_t token_stride,
                     const int8_t *key_shift, const int8_t *value_shift, int64_t shift_stride,
                     int64_t score_scale, int64_t score_shift, const int64_t *softmax,
                     int64_t softmax_size, int64_t *out, int64_t *exponent, int64_t threads) {
    int64_t tokens = position + n, group = heads / kv_heads;
    /* work items: (row, key head, part), a part holding up to per_item of the key head's query
     * heads (attend_group_direct), or one (attend_head_direct where d is not a multiple of 32) */
#ifdef SEQKV_VNNI
    const int grouped = d % 32 == 0;
#else
    const int grouped = 0;
#endif
    int64_t per_item = grouped ? (group < GROUP_HEADS ? group : GROUP_HEADS) : 1;
    int64_t parts = (group + per_item - 1) / per_item, items = n * kv_heads * parts;
    int64_t *running = malloc(sizeof(int64_t) * (size_t)(n * heads));
    const int64_t allocated = running != NULL;
    int64_t failed = !allocated;
    /* the items are independent: threads share them (results do not depend on the split) */
#ifdef _OPENMP
#pragma omp parallel num_threads((int)threads) if (allocated && threads > 1 && items > 1)
#endif
    {
        int64_t *scratch = allocated
            ? malloc(sizeof(int64_t) * 2 * (size_t)(tokens * per_item)) : NULL;
        if (!scratch) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t item = 0; item < items; ++item) {
            if (!scratch) continue;
            int64_t r = item / (kv_heads * parts), g = item % (kv_heads * parts) / parts;
            int64_t h0 = g * group + item % parts * per_item;
            const int8_t *q = q_planes + (r * q_vectors + h0) * 2 * d;
#ifdef SEQKV_VNNI
            if (grouped) {
                int64_t count = (g + 1) * group - h0 < per_item ? (g + 1) * group - h0 : per_item;
                attend_group_direct(q, q_shift + r * q_vectors + h0, h0, count, g, kv_heads, d,
                                    position + r + 1, keys, values, token_stride, key_shift,
                                    value_shift, shift_stride, score_scale, score_shift,
                                    softmax, softmax_size, scratch, out + (r * heads + h0) * d,
                                    running + r * heads + h0);
                continue;
            }
#endif
            running[r * heads + h0] = attend_head_direct(
                q, q_shift[r * q_vectors + h0], h0, g, kv_heads, d, position + r + 1, keys,
                values, token_stride, key_shift, value_shift, shift_stride, score_scale,
                score_shift, softmax, softmax_size, scratch, scratch + tokens,
                out + (r * heads + h0) * d);
        }
        free(scratch);
    }
    if (!failed) common_exponent(out, running, n, heads, d, exponent);
    free(running);
    return failed ? -1 : 0;
}

/* ---- forward._attend on AVX-512 VNNI ----
 *
 * Each call lays its sequence's keys and values out once, for every row and head:
 *   keys   [kv_heads, 2 (plane), blocks, pairs, KEY_BLOCK] int32: lane l of (block b, pair j)
 *          holds components 2j (low half) and 2j + 1 (high half) of key 16b + l as int16, so one
 *          vpdpwssd against a broadcast query pair adds a pair's products to 16 keys' scores at
 *          once (no horizontal sum per key); keys past the last are 0;
 *   values [kv_heads, 2 (plane), key pairs, chunks, 16] int32: the int16 pair
 *          (v_2u[16c + i], v_2u+1[16c + i]) at (u, c, i), so one vpdpwssd against a broadcast
 *          weight pair adds two keys' contributions to 16 components;
 *   key and value exponents [heads, tokens] int64, and the value exponents' running maximum.
 * Sums of plane products run in int32 as the torch code's int_matmul does: |q| < 2**14 times a
 * key plane (|.| <= 128) over d <= 1024 terms stays below 2**31 (and so does any part of such a
 * sum, in whatever order); a weight (<= 2**14) times a value plane, below 2**21, is summed in
 * int32 for at most 512 keys at a time (2**30) and then added into int64. */
#ifdef SEQKV_VNNI
#define KEY_BLOCK 16
#define VALUE_FLUSH 512  /* keys per int32 sum of weighted values (even: no key pair straddles) */

typedef struct {
    int64_t tokens, blocks, pairs, chunks;
    int32_t *keys, *values;
    int64_t *key_shift, *value_shift, *running;
} attention_layout_t;

static void layout_free(attention_layout_t *a) {
    free(a->keys); free(a->values); free(a->key_shift); free(a->value_shift); free(a->running);
}

static int64_t layout_alloc(int64_t tokens, int64_t heads, int64_t kv_heads, int64_t d,
                            attention_layout_t *a) {
    a->tokens = tokens;
    a->blocks = (tokens + KEY_BLOCK - 1) / KEY_BLOCK;
    a->pairs = (d + 1) / 2;
    a->chunks = (d + 15) / 16;
    int64_t padded = a->blocks * KEY_BLOCK;  /* even: whole key pairs */
    a->keys = malloc(sizeof(int32_t) * (size_t)(kv_heads * 2 * padded * a->pairs));
    a->values = malloc(sizeof(int32_t) * (size_t)(kv_heads * 2 * padded / 2 * a->chunks * 16));
    a->key_shift = malloc(sizeof(int64_t) * (size_t)(heads * padded));
    a->value_shift = malloc(sizeof(int64_t) * (size_t)(heads * padded));
    a->running = malloc(sizeof(int64_t) * (size_t)(heads * tokens));
    if (a->keys && a->values && a->key_shift && a->value_shift && a->running) return 0;
    layout_free(a);
    return -1;
}

/* Item `item` of the layout's construction: (kv head, plane, key block) items first, then
 * (kv head, plane, block of 2 * KEY_BLOCK value keys), then one per head for the exponents. */
static void layout_item(attention_layout_t *a, int64_t item, int64_t kv_heads,
                        int64_t d, const int8_t *keys, const int8_t *values,
                        int64_t token_stride, const int8_t *key_shift,
                        const int8_t *value_shift, int64_t shift_stride) {
    int64_t tokens = a->tokens, blocks = a->blocks, pairs = a->pairs, chunks = a->chunks;
    int64_t key_items = kv_heads * 2 * blocks, value_blocks = (blocks + 1) / 2;
    int64_t value_items = kv_heads * 2 * value_blocks;
    if (item < key_items) {
        int64_t b = item % blocks, plane = (item / blocks) % 2, g = item / (2 * blocks);
        int64_t t0 = b * KEY_BLOCK, count = tokens - t0 < KEY_BLOCK ? tokens - t0 : KEY_BLOCK;
        int32_t *to = a->keys + ((g * 2 + plane) * blocks + b) * pairs * KEY_BLOCK;
        const int8_t *from = keys + t0 * token_stride + (plane * kv_heads + g) * d;
        /* 64 components (16 dwords of 4) of 16 keys at a time, loaded row by row and
         * transposed in registers to 16 vectors of one dword per key; vpshufb then places each
         * component pair's bytes in the high bytes of an int16 pair, and an arithmetic shift
         * sign-extends them. Components past d and keys past the last load as 0. */
        uint8_t control[2][64];
        for (int i = 0; i < 64; ++i) {
            int dword = i / 4 % 4, byte = i % 4;
            control[0][i] = byte % 2 ? (uint8_t)(4 * dword + byte / 2) : 0x80;
            control[1][i] = byte % 2 ? (uint8_t)(4 * dword + 2 + byte / 2) : 0x80;
        }
        __m512i even = _mm512_loadu_si512(control[0]), odd = _mm512_loadu_si512(control[1]);
        for (int64_t c0 = 0; c0 < d; c0 += 64) {
            int64_t left = d - c0;
            __mmask64 mask = left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
            __m512i r[16], t[16];
            for (int64_t l = 0; l < KEY_BLOCK; ++l)
                r[l] = l < count ? _mm512_maskz_loadu_epi8(mask, from + l * token_stride + c0)
                                 : _mm512_setzero_si512();
            for (int i = 0; i < 16; i += 2) {
                t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
                t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
            }
            for (int i = 0; i < 16; i += 4) {  /* r[i + c], 128-bit lane L: component 4L + c
                                                * of keys i .. i + 3 */
                r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
                r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
                r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
                r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
            }
            for (int c = 0; c < 4; ++c) {  /* the 4 x 4 transpose of 128-bit lanes */
                __m512i s0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44);
                __m512i s1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xee);
                __m512i s2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
                __m512i s3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xee);
                t[c] = _mm512_shuffle_i32x4(s0, s2, 0x88);  /* dword c of every key */
                t[4 + c] = _mm512_shuffle_i32x4(s0, s2, 0xdd);
                t[8 + c] = _mm512_shuffle_i32x4(s1, s3, 0x88);
                t[12 + c] = _mm512_shuffle_i32x4(s1, s3, 0xdd);
            }
            for (int64_t m = 0; m < 16; ++m) {  /* t[m]: components c0 + 4m .. c0 + 4m + 3 */
                int64_t j = c0 / 2 + 2 * m;
                if (j < pairs)
                    _mm512_storeu_si512(to + j * KEY_BLOCK,
                                        _mm512_srai_epi16(_mm512_shuffle_epi8(t[m], even), 8));
                if (j + 1 < pairs)
                    _mm512_storeu_si512(to + (j + 1) * KEY_BLOCK,
                                        _mm512_srai_epi16(_mm512_shuffle_epi8(t[m], odd), 8));
            }
        }
        return;
    }
    item -= key_items;
    if (item < value_items) {
        int64_t b = item % value_blocks, plane = (item / value_blocks) % 2;
        int64_t g = item / (2 * value_blocks);
        __m512i interleave = _mm512_setr_epi32(
            16 << 16, 1 | 17 << 16, 2 | 18 << 16, 3 | 19 << 16, 4 | 20 << 16, 5 | 21 << 16,
            6 | 22 << 16, 7 | 23 << 16, 8 | 24 << 16, 9 | 25 << 16, 10 | 26 << 16,
            11 | 27 << 16, 12 | 28 << 16, 13 | 29 << 16, 14 | 30 << 16, 15 | 31 << 16);
        int64_t key_pairs = blocks * KEY_BLOCK / 2;
        for (int64_t u = b * KEY_BLOCK; u < (b + 1) * KEY_BLOCK && u < key_pairs; ++u) {
            int32_t *to = a->values + ((g * 2 + plane) * key_pairs + u) * chunks * 16;
            const int8_t *v0 = values + (plane * kv_heads + g) * d;  /* key 2u's components */
            for (int64_t c = 0; c < chunks; ++c) {
                int64_t left = d - 16 * c;
                __mmask16 mask = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
                __m256i first = 2 * u < tokens ? _mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(
                    mask, v0 + 2 * u * token_stride + 16 * c)) : _mm256_setzero_si256();
                __m256i second = 2 * u + 1 < tokens ? _mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(
                    mask, v0 + (2 * u + 1) * token_stride + 16 * c)) : _mm256_setzero_si256();
                __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(first), second, 1);
                _mm512_storeu_si512(to + 16 * c, _mm512_permutexvar_epi16(interleave, both));
            }
        }
        return;
    }
    int64_t h = item - value_items, padded = blocks * KEY_BLOCK, running = 0;
    for (int64_t t = 0; t < padded; ++t) {
        int64_t ks = t < tokens ? key_shift[t * shift_stride + h] : 0;
        int64_t vs = t < tokens ? value_shift[t * shift_stride + h] : 0;
        a->key_shift[h * padded + t] = ks;
        a->value_shift[h * padded + t] = vs;
        if (t < tokens) a->running[h * tokens + t] = running = (t == 0 || vs > running) ? vs : running;
    }
}

/* out[i] = floor(out[i] * 2**SOFTMAX_BITS / total) for i < d, 8 at a time: |out| <= tokens *
 * 2**28 <= 2**41, shifted by 14 it stays below 2**55, and total >= 2**14 - 1 (the peak key's
 * weight). The quotient is estimated in float64 (a 64-bit integer division costs tens of cycles
 * and has no vector form), then made exact in integers: q is floor's quotient exactly when
 * 0 <= x - q * total < total, and the estimate is corrected by one either way until it is (the
 * estimate's error is below 1 for these bounds; a lane still outside takes floor_div). */
static void divide_by_total(int64_t *out, int64_t d, int64_t total) {
    __m512i divisor = _mm512_set1_epi64(total), one = _mm512_set1_epi64(1);
    __m512d scale = _mm512_set1_pd((double)total);
    for (int64_t i = 0; i < d; i += 8) {
        __mmask8 mask = d - i >= 8 ? 0xff : (__mmask8)((1u << (d - i)) - 1);
        __m512i x = _mm512_slli_epi64(_mm512_maskz_loadu_epi64(mask, out + i), SOFTMAX_BITS);
        __m512i q = _mm512_cvtpd_epi64(_mm512_roundscale_pd(
            _mm512_div_pd(_mm512_cvtepi64_pd(x), scale), _MM_FROUND_TO_NEG_INF |
            _MM_FROUND_NO_EXC));
        for (int round = 0; round < 2; ++round) {
            __m512i r = _mm512_sub_epi64(x, _mm512_mullo_epi64(q, divisor));
            q = _mm512_mask_sub_epi64(q, _mm512_cmplt_epi64_mask(r, _mm512_setzero_si512()), q,
                                      one);
            q = _mm512_mask_add_epi64(q, _mm512_cmpge_epi64_mask(r, divisor), q, one);
        }
        __m512i r = _mm512_sub_epi64(x, _mm512_mullo_epi64(q, divisor));
        __mmask8 outside = mask & (_mm512_cmplt_epi64_mask(r, _mm512_setzero_si512()) |
                                   _mm512_cmpge_epi64_mask(r, divisor));
        _mm512_mask_storeu_epi64(out + i, mask, q);
        if (outside) {
            int64_t dividend[8];
            _mm512_storeu_si512(dividend, x);
            for (int lane = 0; lane < 8; ++lane)
                if (outside >> lane & 1) out[i + lane] = floor_div(dividend[lane], total);
        }
    }
}

/* One query head h (of kv head g) of one row over keys 0 .. end - 1: out [d] before the row's
 * common exponent; returns the head's own exponent (the value exponents' running maximum).
 * z: scratch of the padded key count (int64); weight: of as many int16. */
static int64_t attend_head(const attention_layout_t *a, const int8_t *q_plane, int64_t q_shift,
                           int64_t h, int64_t g, int64_t d, int64_t end, int64_t score_scale,
                           int64_t score_shift, const int64_t *softmax, int64_t softmax_size,
                           int64_t *z, int16_t *weight, int64_t *out) {
    int64_t pairs = a->pairs, chunks = a->chunks, blocks = a->blocks;
    int64_t padded = blocks * KEY_BLOCK, key_pairs = padded / 2;
    int32_t query[512];  /* component pairs as int16 pairs */
    for (int64_t j = 0; j < pairs; ++j) {
        int64_t low = plane_value(q_plane, 2 * j, d);
        int64_t high = 2 * j + 1 < d ? plane_value(q_plane, 2 * j + 1, d) : 0;
        query[j] = (int32_t)((uint32_t)(uint16_t)low | ((uint32_t)(uint16_t)high << 16));
    }
    const int32_t *key_high = a->keys + g * 2 * padded * pairs;
    const int32_t *key_low = key_high + padded * pairs;
    const int64_t *key_shift = a->key_shift + h * padded;
    const int64_t *value_shift = a->value_shift + h * padded;
    int64_t running = a->running[h * a->tokens + end - 1];
    __m512i scale = _mm512_set1_epi64(score_scale);
    __m512i base = _mm512_set1_epi64(score_shift - q_shift), zero = _mm512_setzero_si512();
    __m512i cap = _mm512_set1_epi64(62), top = _mm512_set1_epi64(MASKED);
    for (int64_t b = 0; b * KEY_BLOCK < end; ++b) {
        const int32_t *kh = key_high + b * pairs * KEY_BLOCK, *kl = key_low + b * pairs * KEY_BLOCK;
        __m512i h0 = zero, h1 = zero, l0 = zero, l1 = zero;
        int64_t j = 0;
        for (; j + 1 < pairs; j += 2) {
            __m512i q0 = _mm512_set1_epi32(query[j]), q1 = _mm512_set1_epi32(query[j + 1]);
            h0 = _mm512_dpwssd_epi32(h0, _mm512_loadu_si512(kh + j * KEY_BLOCK), q0);
            l0 = _mm512_dpwssd_epi32(l0, _mm512_loadu_si512(kl + j * KEY_BLOCK), q0);
            h1 = _mm512_dpwssd_epi32(h1, _mm512_loadu_si512(kh + (j + 1) * KEY_BLOCK), q1);
            l1 = _mm512_dpwssd_epi32(l1, _mm512_loadu_si512(kl + (j + 1) * KEY_BLOCK), q1);
        }
        if (j < pairs) {
            __m512i q0 = _mm512_set1_epi32(query[j]);
            h0 = _mm512_dpwssd_epi32(h0, _mm512_loadu_si512(kh + j * KEY_BLOCK), q0);
            l0 = _mm512_dpwssd_epi32(l0, _mm512_loadu_si512(kl + j * KEY_BLOCK), q0);
        }
        __m512i high = _mm512_add_epi32(h0, h1), low = _mm512_add_epi32(l0, l1);
        for (int half = 0; half < 2; ++half) {
            int64_t t = b * KEY_BLOCK + 8 * half;
            if (t >= end) break;
            __mmask8 valid = end - t >= 8 ? 0xff : (__mmask8)((1u << (end - t)) - 1);
            __m512i dot = _mm512_add_epi64(  /* < d * 2**28 */
                _mm512_slli_epi64(_mm512_cvtepi32_epi64(half ? _mm512_extracti64x4_epi64(high, 1)
                                                             : _mm512_castsi512_si256(high)),
                                  PLANE_BITS),
                _mm512_cvtepi32_epi64(half ? _mm512_extracti64x4_epi64(low, 1)
                                           : _mm512_castsi512_si256(low)));
            __m512i amount = _mm512_min_epi64(_mm512_max_epi64(
                _mm512_sub_epi64(base, _mm512_loadu_si512(key_shift + t)), zero), cap);
            __m512i score = _mm512_srav_epi64(_mm512_mullo_epi64(dot, scale), amount);
            _mm512_storeu_si512(z + t, score);
            top = _mm512_mask_max_epi64(top, valid, top, score);
        }
    }
    /* softmax weights from the table, scaled to the running exponent; 0 past the last key (up
     * to the end of its pair) */
    __m512i peak = _mm512_set1_epi64(_mm512_reduce_max_epi64(top));
    __m512i last = _mm512_set1_epi64(softmax_size - 1), ceiling = _mm512_set1_epi64(running);
    __m512i sum = zero;
    for (int64_t t = 0; t < end; t += 8) {
        __mmask8 valid = end - t >= 8 ? 0xff : (__mmask8)((1u << (end - t)) - 1);
        __m512i gap = _mm512_min_epi64(_mm512_sub_epi64(peak, _mm512_loadu_si512(z + t)), last);
        __m512i w = _mm512_mask_i64gather_epi64(zero, valid, gap, softmax, 8);
        sum = _mm512_add_epi64(sum, w);
        __m512i amount = _mm512_min_epi64(_mm512_max_epi64(
            _mm512_sub_epi64(ceiling, _mm512_loadu_si512(value_shift + t)), zero), cap);
        _mm_storeu_si128((__m128i *)(weight + t),
                         _mm512_cvtepi64_epi16(_mm512_srav_epi64(w, amount)));
    }
    int64_t total = _mm512_reduce_add_epi64(sum);
    /* weighted values: two keys per vpdpwssd, 32 components per pass */
    int64_t used_pairs = (end + 1) / 2;
    for (int64_t i = 0; i < d; ++i) out[i] = 0;
    const int32_t *value_high = a->values + g * 2 * key_pairs * chunks * 16;
    const int32_t *value_low = value_high + key_pairs * chunks * 16;
    for (int64_t c = 0; c < chunks; c += 2) {
        int two = c + 1 < chunks;
        for (int64_t u0 = 0; u0 < used_pairs; u0 += VALUE_FLUSH / 2) {
            int64_t u1 = u0 + VALUE_FLUSH / 2 < used_pairs ? u0 + VALUE_FLUSH / 2 : used_pairs;
            __m512i h0 = zero, h1 = zero, l0 = zero, l1 = zero;
            for (int64_t u = u0; u < u1; ++u) {
                int32_t pair;  /* weights 2u and 2u + 1 as one int16 pair */
                memcpy(&pair, weight + 2 * u, sizeof pair);
                if (!pair) continue;
                __m512i w = _mm512_set1_epi32(pair);
                const int32_t *vh = value_high + (u * chunks + c) * 16;
                const int32_t *vl = value_low + (u * chunks + c) * 16;
                h0 = _mm512_dpwssd_epi32(h0, _mm512_loadu_si512(vh), w);
                l0 = _mm512_dpwssd_epi32(l0, _mm512_loadu_si512(vl), w);
                if (two) {
                    h1 = _mm512_dpwssd_epi32(h1, _mm512_loadu_si512(vh + 16), w);
                    l1 = _mm512_dpwssd_epi32(l1, _mm512_loadu_si512(vl + 16), w);
                }
            }
            __m512i parts[2][2] = {{h0, l0}, {h1, l1}};
            for (int k = 0; k < 1 + two; ++k)
                for (int half = 0; half < 2; ++half) {
                    int64_t i = 16 * (c + k) + 8 * half;
                    if (i >= d) break;
                    __m512i hv = _mm512_cvtepi32_epi64(
                        half ? _mm512_extracti64x4_epi64(parts[k][0], 1)
                             : _mm512_castsi512_si256(parts[k][0]));
                    __m512i lv = _mm512_cvtepi32_epi64(
                        half ? _mm512_extracti64x4_epi64(parts[k][1], 1)
                             : _mm512_castsi512_si256(parts[k][1]));
                    __mmask8 mask = d - i >= 8 ? 0xff : (__mmask8)((1u << (d - i)) - 1);
                    __m512i sum8 = _mm512_add_epi64(_mm512_maskz_loadu_epi64(mask, out + i),
                        _mm512_add_epi64(_mm512_slli_epi64(hv, PLANE_BITS), lv));
                    _mm512_mask_storeu_epi64(out + i, mask, sum8);
                }
        }
    }
    divide_by_total(out, d, total);
    return running;
}
#endif

#ifdef SEQKV_VNNI
/* seqkv_attend for many rows: the call's keys and values laid out once (see above).
 * Threads share the layout's items, then the (row, head) pairs (results do not depend on the
 * split). */
static int64_t attend_laid_out(const int8_t *q_planes, const int64_t *q_shift, int64_t q_vectors,
                     int64_t n, int64_t position, int64_t heads, int64_t kv_heads, int64_t d,
                     const int8_t *keys, const int8_t *values, int64_t token_stride,
                     const int8_t *key_shift, const int8_t *value_shift, int64_t shift_stride,
                     int64_t score_scale, int64_t score_shift, const int64_t *softmax,
                     int64_t softmax_size, int64_t *out, int64_t *exponent, int64_t threads) {
    if (d > 1024) return -1;
    int64_t tokens = position + n, group = heads / kv_heads, pairs = n * heads;
    attention_layout_t layout;
    if (layout_alloc(tokens, heads, kv_heads, d, &layout)) return -1;
    int64_t *running = malloc(sizeof(int64_t) * (size_t)pairs);
    int64_t padded = layout.blocks * KEY_BLOCK;
    int64_t items = kv_heads * 2 * (layout.blocks + (layout.blocks + 1) / 2) + heads;
    const int64_t allocated = running != NULL;
    int64_t failed = !allocated;
#ifdef _OPENMP
#pragma omp parallel num_threads((int)threads) if (allocated && threads > 1)
#endif
    {
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t item = 0; item < (allocated ? items : 0); ++item)
            layout_item(&layout, item, kv_heads, d, keys, values, token_stride,
                        key_shift, value_shift, shift_stride);
        int64_t *z = allocated ? malloc(sizeof(int64_t) * (size_t)padded) : NULL;
        int16_t *weight = allocated ? malloc(sizeof(int16_t) * (size_t)padded) : NULL;
        if (allocated && (!z || !weight)) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t pair = 0; pair < (allocated ? pairs : 0); ++pair) {
            if (!z || !weight) continue;
            int64_t r = pair / heads, h = pair % heads;
            running[pair] = attend_head(&layout, q_planes + (r * q_vectors + h) * 2 * d,
                                        q_shift[r * q_vectors + h], h, h / group, d,
                                        position + r + 1, score_scale, score_shift, softmax,
                                        softmax_size, z, weight, out + pair * d);
        }
        free(z);
        free(weight);
    }
    if (!failed) common_exponent(out, running, n, heads, d, exponent);
    layout_free(&layout);
    free(running);
    return failed ? -1 : 0;
}
#endif

/* forward._attend: rows [0, n) of one sequence at positions position .. position + n - 1.
 *   q_planes [n, q_vectors, 2, d] (int8), q_shift [n, q_vectors] (int64): the first `heads`
 *   vectors of each row are the queries;
 *   keys, values: the slot's planes [tokens, 2, kv_heads, d] (int8) with row stride
 *   token_stride (elements), key_shift, value_shift [tokens, heads] (int8, stride shift_stride);
 *   out [n, heads, d], exponent [n]. Returns 0, or -1 when out of memory or built without VNNI.
 * Both ways compute the same integers. Laying the keys and values out costs about what a few
 * rows' direct scores cost, so it pays from LAYOUT_ROWS rows (reports/code_notes.md). */
#define LAYOUT_ROWS 4
static int64_t seqkv_attend(const int8_t *q_planes, const int64_t *q_shift, int64_t q_vectors,
                     int64_t n, int64_t position, int64_t heads, int64_t kv_heads, int64_t d,
                     const int8_t *keys, const int8_t *values, int64_t token_stride,
                     const int8_t *key_shift, const int8_t *value_shift, int64_t shift_stride,
                     int64_t score_scale, int64_t score_shift, const int64_t *softmax,
                     int64_t softmax_size, int64_t *out, int64_t *exponent, int64_t threads) {
#ifdef SEQKV_VNNI
    if (n >= LAYOUT_ROWS)
        return attend_laid_out(q_planes, q_shift, q_vectors, n, position, heads, kv_heads, d,
                               keys, values, token_stride, key_shift, value_shift,
                               shift_stride, score_scale, score_shift, softmax, softmax_size,
                               out, exponent, threads);
#endif
    return attend_direct(
        q_planes, q_shift, q_vectors, n, position, heads, kv_heads, d, keys, values,
        token_stride, key_shift, value_shift, shift_stride, score_scale, score_shift, softmax,
        softmax_size, out, exponent, threads);
}

/* forward._mlp's SiLU and product: silu(gate) * up into x [rows * n] (quantized by the caller).
 * gate, up at 2**-frac_bits. */
static int64_t seqkv_silu_mul(const int64_t *gate, const int64_t *up, int64_t count, int64_t frac_bits,
                    const int32_t *sigmoid, int64_t *x) {
    int64_t cell_bits = frac_bits - SIGMOID_STEP_BITS;
    int64_t bound = shl(SIGMOID_RANGE, frac_bits);
    int64_t half_cell = shl(1, cell_bits - 1);
    int64_t i = 0;
#ifdef SEQKV_VNNI
    /* 8 at a time: vpsraq is asr, vpmullq the wrapped product, a gather the table lookup */
    __m512i offset = _mm512_set1_epi64(bound + half_cell), top = _mm512_set1_epi64(2 * bound - 1);
    __m128i cell = _mm_cvtsi64_si128(cell_bits), table_bits = _mm_cvtsi64_si128(TABLE_BITS);
    for (; i + 8 <= count; i += 8) {
        __m512i g = _mm512_loadu_si512(gate + i);
        __m512i index = _mm512_sra_epi64(_mm512_min_epi64(_mm512_max_epi64(
            _mm512_add_epi64(g, offset), _mm512_setzero_si512()), top), cell);
        __m512i sig = _mm512_cvtepi32_epi64(_mm512_i64gather_epi32(index, sigmoid, 4));
        __m512i silu = _mm512_sra_epi64(_mm512_mullo_epi64(g, sig), table_bits);
        _mm512_storeu_si512(x + i, _mm512_mullo_epi64(silu, _mm512_loadu_si512(up + i)));
    }
#endif
    for (; i < count; ++i) {
        int64_t index = asr(clamp(gate[i] + (bound + half_cell), 0, 2 * bound - 1), cell_bits);
        int64_t silu = asr(gate[i] * sigmoid[index], TABLE_BITS);
        x[i] = silu * up[i];  /* |silu|, |up| < 2**23 */
    }
    return 0;
}

/* ---- One whole decoder layer in one call (forward._attention and forward._mlp). ---- */

typedef struct {  /* a linear layer as seqkv_linear_packed (kind 0) or seqkv_linear_q4 (kind 1,
                   * packed then holds the Q4_1 layout, and sums, scale, scale_bits and planes
                   * are unused) takes it */
    const int8_t *packed;
    const int32_t *sums;
    const int64_t *scale;
    const int64_t *bias;  /* or NULL */
    int64_t scale_bits, planes, n_out, k, kind;
} seqkv_linear_t;

typedef struct {  /* a layer's weights, tables and constants (forward.IntegerForward's) */
    seqkv_linear_t qkv, o, gate, up, down;
    const int32_t *rsqrt;
    const int32_t *sigmoid;
    const int64_t *softmax;
    const int64_t *cos, *sin;
    int64_t softmax_size, eps_term, heads, kv_heads, head_dim, score_scale, score_shift;
    int64_t qkv_frac, hidden_frac, gate_frac, mantissa_bits, attention_offset, mlp_offset;
    const int64_t *attention_gain, *mlp_gain;  /* a 4-bit layer's norm gains, or NULL */
    int64_t attention_gain_frac, mlp_gain_frac;
} seqkv_layer_t;

typedef struct {  /* forward._Span, with its sequence's slot in its pool */
    int64_t start, count, position;
    int8_t *planes;  /* &pool.planes[0, 0, slot, 0] */
    int8_t *shifts;  /* &pool.shifts[0, 0, slot, 0] */
    int64_t plane_layer_stride, plane_kv_stride, shift_layer_stride, shift_kv_stride;
} seqkv_span_t;

/* Row ranges of the elementwise passes for OpenMP threads (rows are independent). */
#define ROW_CHUNK 8

static int64_t norm_rows(const seqkv_layer_t *L, const int64_t *hidden, int64_t rows,
                         const int64_t *gain, int64_t gain_frac, int8_t *planes,
                         int64_t *exponent, int64_t threads) {
    int64_t failed = 0, chunks = (rows + ROW_CHUNK - 1) / ROW_CHUNK;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads((int)threads) if (threads > 1 && chunks > 1)
#endif
    for (int64_t c = 0; c < chunks; ++c) {
        int64_t r1 = (c + 1) * ROW_CHUNK < rows ? (c + 1) * ROW_CHUNK : rows;
        if (norm_range(hidden, rows, c * ROW_CHUNK, r1, L->qkv.k, L->eps_term, L->rsqrt,
                       L->mantissa_bits, gain, gain_frac, planes, exponent)) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
    }
    return failed ? -1 : 0;
}

static void quantize_rows(const int64_t *x, int64_t rows, int64_t k, int64_t offset,
                          const int64_t *row_offset, int8_t *planes, int64_t *exponent,
                          int64_t threads) {
    int64_t chunks = (rows + ROW_CHUNK - 1) / ROW_CHUNK;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads((int)threads) if (threads > 1 && chunks > 1)
#endif
    for (int64_t c = 0; c < chunks; ++c) {
        int64_t r1 = (c + 1) * ROW_CHUNK < rows ? (c + 1) * ROW_CHUNK : rows;
        quantize_range(x, rows, c * ROW_CHUNK, r1, k, offset, row_offset, planes, exponent);
    }
}

static int64_t linear_into(const seqkv_linear_t *w, const int8_t *planes, int64_t rows,
                           const int64_t *exponent, int64_t out_frac, int64_t *out,
                           int64_t threads) {
    if (w->kind == 1)
        return seqkv_linear_q4(planes, rows, w->k, (const uint8_t *)w->packed, w->n_out,
                               exponent, out_frac, w->bias, out, w->n_out, threads);
    return seqkv_linear_packed(planes, rows, w->k, w->packed, w->sums, w->planes, w->n_out,
                               w->scale, w->scale_bits, exponent, out_frac, w->bias, out,
                               w->n_out, threads);
}

/* The working memory of one layer for `rows` rows, allocated once for all layers of a forward
 * (a fresh allocation per layer costs its page faults again, a visible share of a prefill). */
typedef struct {
    int8_t *planes, *qkv_planes;
    int64_t *exponent, *qkv, *shift, *attended, *attended_exponent, *gate, *up, *delta;
} workspace_t;

static void workspace_free(workspace_t *ws) {
    free(ws->planes); free(ws->exponent); free(ws->qkv); free(ws->qkv_planes); free(ws->shift);
    free(ws->attended); free(ws->attended_exponent); free(ws->gate); free(ws->up);
    free(ws->delta);
}

/* Sized for the largest of `count` layers (every layer of a model has the same shape today). */
static int64_t workspace_alloc(const seqkv_layer_t *layers, int64_t count, int64_t rows,
                               workspace_t *ws) {
    int64_t heads = 0, d = 0, width = 0, inner = 0, vectors = 0;
    for (int64_t i = 0; i < count; ++i) {
        const seqkv_layer_t *L = &layers[i];
        heads = L->heads > heads ? L->heads : heads;
        d = L->head_dim > d ? L->head_dim : d;
        width = L->qkv.k > width ? L->qkv.k : width;
        inner = L->gate.n_out > inner ? L->gate.n_out : inner;
        vectors = L->heads + 2 * L->kv_heads > vectors ? L->heads + 2 * L->kv_heads : vectors;
    }
    int64_t wide = inner > width ? inner : width;
    wide = heads * d > wide ? heads * d : wide;
    ws->planes = malloc((size_t)(2 * rows * wide));
    ws->exponent = malloc(sizeof(int64_t) * (size_t)rows);
    ws->qkv = malloc(sizeof(int64_t) * (size_t)(rows * vectors * d));
    ws->qkv_planes = malloc((size_t)(rows * vectors * 2 * d));
    ws->shift = malloc(sizeof(int64_t) * (size_t)(rows * vectors));
    ws->attended = malloc(sizeof(int64_t) * (size_t)(rows * heads * d));
    ws->attended_exponent = malloc(sizeof(int64_t) * (size_t)rows);
    ws->gate = malloc(sizeof(int64_t) * (size_t)(rows * inner));
    ws->up = malloc(sizeof(int64_t) * (size_t)(rows * inner));
    ws->delta = malloc(sizeof(int64_t) * (size_t)(rows * width));
    if (ws->planes && ws->exponent && ws->qkv && ws->qkv_planes && ws->shift && ws->attended &&
        ws->attended_exponent && ws->gate && ws->up && ws->delta)
        return 0;
    workspace_free(ws);
    return -1;
}

/* hidden [rows, hidden] += attention(hidden), then += mlp(hidden), for layer `index` of every
 * span's pool (whose keys and values at the rows' positions it writes). Returns 0, or -1 when
 * out of memory or built without VNNI (hidden is then unspecified). */
static int64_t layer(const seqkv_layer_t *L, int64_t index, const workspace_t *ws,
                     int64_t *hidden, int64_t rows, const int64_t *positions,
                     const seqkv_span_t *spans, int64_t span_count, int64_t threads) {
    int64_t heads = L->heads, kvh = L->kv_heads, d = L->head_dim;
    int64_t vectors = heads + 2 * kvh, group = heads / kvh, width = L->qkv.k;
    int64_t inner = L->gate.n_out;
    int8_t *planes = ws->planes, *qkv_planes = ws->qkv_planes;
    int64_t *exponent = ws->exponent, *qkv = ws->qkv, *shift = ws->shift;
    int64_t *attended = ws->attended, *attended_exponent = ws->attended_exponent;
    int64_t *gate = ws->gate, *up = ws->up, *delta = ws->delta;
    /* attention */
    if (norm_rows(L, hidden, rows, L->attention_gain, L->attention_gain_frac, planes, exponent,
                  threads)) return -1;
    if (linear_into(&L->qkv, planes, rows, exponent, L->qkv_frac, qkv, threads)) return -1;
    int64_t chunks = (rows + ROW_CHUNK - 1) / ROW_CHUNK;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads((int)threads) if (threads > 1 && chunks > 1)
#endif
    for (int64_t c = 0; c < chunks; ++c) {
        int64_t r0 = c * ROW_CHUNK, count = rows - r0 < ROW_CHUNK ? rows - r0 : ROW_CHUNK;
        seqkv_rope_quantize(qkv + r0 * vectors * d, count, vectors, heads + kvh, d,
                            positions + r0, L->cos, L->sin, qkv_planes + r0 * vectors * 2 * d,
                            shift + r0 * vectors);
    }
    for (int64_t s = 0; s < span_count; ++s) {
        const seqkv_span_t *span = &spans[s];
        int8_t *keys = span->planes + index * span->plane_layer_stride;
        int8_t *values = keys + span->plane_kv_stride;
        int8_t *key_shift = span->shifts + index * span->shift_layer_stride;
        int8_t *value_shift = key_shift + span->shift_kv_stride;
        for (int64_t i = 0; i < span->count; ++i) {  /* the rows' keys and values into the pool */
            int64_t row = span->start + i, position = span->position + i;
            const int8_t *source = qkv_planes + row * vectors * 2 * d;
            for (int64_t plane = 0; plane < 2; ++plane)
                for (int64_t g = 0; g < kvh; ++g) {
                    int64_t at = position * 2 * kvh * d + (plane * kvh + g) * d;
                    memcpy(keys + at, source + ((heads + g) * 2 + plane) * d, (size_t)d);
                    memcpy(values + at, source + ((heads + kvh + g) * 2 + plane) * d, (size_t)d);
                }
            for (int64_t h = 0; h < heads; ++h) {
                key_shift[position * heads + h] = (int8_t)shift[row * vectors + heads + h / group];
                value_shift[position * heads + h] =
                    (int8_t)shift[row * vectors + heads + kvh + h / group];
            }
        }
    }
    for (int64_t s = 0; s < span_count; ++s) {
        const seqkv_span_t *span = &spans[s];
        int8_t *keys = span->planes + index * span->plane_layer_stride;
        int8_t *key_shift = span->shifts + index * span->shift_layer_stride;
        if (seqkv_attend(qkv_planes + span->start * vectors * 2 * d, shift + span->start * vectors,
                         vectors, span->count, span->position, heads, kvh, d, keys,
                         keys + span->plane_kv_stride, 2 * kvh * d, key_shift,
                         key_shift + span->shift_kv_stride, heads, L->score_scale,
                         L->score_shift, L->softmax, L->softmax_size,
                         attended + span->start * heads * d, attended_exponent + span->start,
                         threads)) return -1;
    }
    quantize_rows(attended, rows, heads * d, L->attention_offset, attended_exponent, planes,
                  exponent, threads);
    if (linear_into(&L->o, planes, rows, exponent, L->hidden_frac, delta, threads)) return -1;
    for (int64_t i = 0; i < rows * width; ++i) hidden[i] += delta[i];
    /* mlp */
    if (norm_rows(L, hidden, rows, L->mlp_gain, L->mlp_gain_frac, planes, exponent, threads))
        return -1;
    if (linear_into(&L->gate, planes, rows, exponent, L->gate_frac, gate, threads)) return -1;
    if (linear_into(&L->up, planes, rows, exponent, L->gate_frac, up, threads)) return -1;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads((int)threads) if (threads > 1 && chunks > 1)
#endif
    for (int64_t c = 0; c < chunks; ++c) {
        int64_t r0 = c * ROW_CHUNK, count = rows - r0 < ROW_CHUNK ? rows - r0 : ROW_CHUNK;
        seqkv_silu_mul(gate + r0 * inner, up + r0 * inner, count * inner, L->gate_frac,
                       L->sigmoid, gate + r0 * inner);
    }
    quantize_rows(gate, rows, inner, L->mlp_offset, NULL, planes, exponent, threads);
    if (linear_into(&L->down, planes, rows, exponent, L->hidden_frac, delta, threads)) return -1;
    for (int64_t i = 0; i < rows * width; ++i) hidden[i] += delta[i];
    return 0;
}

/* Layers 0 .. count - 1 (descriptions layers[0 .. count - 1]) over hidden, in order: see
 * layer(). Returns 0, or -1 when out of memory or built without VNNI. */
int64_t seqkv_layers(const seqkv_layer_t *layers, int64_t count, int64_t *hidden, int64_t rows,
                     const int64_t *positions, const seqkv_span_t *spans, int64_t span_count,
                     int64_t threads) {
    if (count < 1) return 0;
    workspace_t ws;
    if (workspace_alloc(layers, count, rows, &ws)) return -1;
    int64_t status = 0;
    for (int64_t index = 0; index < count && !status; ++index)
        status = layer(&layers[index], index, &ws, hidden, rows, positions, spans, span_count,
                       threads);
    workspace_free(&ws);
    return status;
}

/* forward._head: the final RMSNorm (its weights folded into `head`) and the output layer, into
 * logits [rows, head->n_out] at 2**-out_frac. L: any layer's description (for the norm's table
 * and epsilon). Returns 0, or -1 when out of memory or built without VNNI. */
int64_t seqkv_head(const seqkv_layer_t *L, const seqkv_linear_t *head, const int64_t *hidden,
                   int64_t rows, int64_t out_frac, int64_t *logits, int64_t threads) {
    int64_t status = -1;
    int8_t *planes = malloc((size_t)(2 * rows * head->k));
    int64_t *exponent = malloc(sizeof(int64_t) * (size_t)rows);
    if (planes && exponent && !norm_rows(L, hidden, rows, NULL, 0, planes, exponent, threads))
        status = linear_into(head, planes, rows, exponent, out_frac, logits, threads);
    free(planes);
    free(exponent);
    return status;
}

/* ---- table.integer_tables: integer logits to the coder's cumulative tables. ---- */

/* Per row of logits [rows, vocab] (int64 at 2**-16): top_bits - z * 2**-20 ([rows, vocab],
 * float64; z the base-2 gaps at 2**-20, the log2-probabilities before the row's log2 of the
 * weight sum), the cumulative table [rows, vocab + 1] from 0 to `total_frequency` and the
 * weight sum [rows], exactly as table.integer_tables computes them (see there): integer
 * operations and
 * IEEE-754 float64 elementwise operations (int64 -> double conversions, one division, one
 * multiplication, floor), each correctly rounded; native.py builds with -ffp-contract=off so
 * that no multiply-add is fused. fine_high, fine_low: fixedpoint.fine_tables (1,024 each).
 * weighted_gaps [rows]: the sum of weight * z over the row (float64 products and sums in a
 * fixed order: the same bits for a row in any batch, on any thread count), from which
 * table.py states the row's entropy without a pass over its log2-probabilities; it never
 * feeds the table. threads: OpenMP threads sharing the rows. Returns 0, or -2 when a row's
 * largest count would fall below 1 (table.py asserts it). */
/* One logit's weight (into *count, for now) and its base-2 gap d at 2**-20, returned. */
static inline int64_t table_weight(int64_t logit, int64_t top, int64_t max_gap,
                                   int64_t log2e_fixed, int64_t gap_shift,
                                   const int64_t *fine_high, const int64_t *fine_low,
                                   int64_t top_bits, int64_t *count) {
    int64_t gap = top - logit;
    gap = gap < max_gap ? gap : max_gap;
    int64_t d = asr(gap * log2e_fixed + shl(1, gap_shift - 1), gap_shift);
    int64_t fraction = d & ((INT64_C(1) << 20) - 1);
    int64_t product = fine_high[fraction >> 10] * fine_low[fraction & 1023];
    int64_t shift = asr(d, 20) + (60 - top_bits);
    *count = asr(product, shift < 62 ? shift : 62);
    return d;
}

int64_t seqkv_integer_tables(const int64_t *logits, int64_t rows, int64_t vocab,
                             int64_t top_bits, int64_t log2e_fixed, int64_t gap_shift,
                             int64_t max_gap, const int64_t *fine_high, const int64_t *fine_low,
                             int64_t total_frequency, double *log2p, int64_t *cumulative,
                             int64_t *totals, double *weighted_gaps, int64_t threads) {
    int64_t failed = 0;
    /* rows are independent: threads share them (results do not depend on the split) */
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads((int)threads) if (threads > 1 && rows > 1)
#endif
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t *row = logits + r * vocab;
        double *lr = log2p + r * vocab;
        int64_t *counts = cumulative + r * (vocab + 1) + 1;
        int64_t top = row[0];
        for (int64_t j = 1; j < vocab; ++j) top = row[j] > top ? row[j] : top;
        int64_t total = 0, j = 0;
        double weighted = 0.0, lane_sums[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
#ifdef SEQKV_VNNI
        /* 8 at a time, the same operations: vpsraq is asr, vpmullq the wrapped product, two
         * gathers the fine tables; (double) d and its scaling by 2**-20 are exact, and the one
         * subtraction is correctly rounded as the scalar one is */
        __m512i peak = _mm512_set1_epi64(top), cap = _mm512_set1_epi64(max_gap);
        __m512i factor = _mm512_set1_epi64(log2e_fixed);
        __m512i half = _mm512_set1_epi64(shl(1, gap_shift - 1));
        __m512i fine_mask = _mm512_set1_epi64((INT64_C(1) << 20) - 1);
        __m512i low_mask = _mm512_set1_epi64(1023), offset = _mm512_set1_epi64(60 - top_bits);
        __m512i limit = _mm512_set1_epi64(62), weights = _mm512_setzero_si512();
        __m512d bits = _mm512_set1_pd((double)top_bits), unit = _mm512_set1_pd(0x1p-20);
        __m128i gap_amount = _mm_cvtsi64_si128(gap_shift);
        __m512d lane_weighted = _mm512_setzero_pd();
        for (; j + 8 <= vocab; j += 8) {
            __m512i gap = _mm512_min_epi64(_mm512_sub_epi64(peak, _mm512_loadu_si512(row + j)),
                                           cap);
            __m512i d = _mm512_sra_epi64(_mm512_add_epi64(_mm512_mullo_epi64(gap, factor), half),
                                         gap_amount);
            __m512i fraction = _mm512_and_si512(d, fine_mask);
            __m512i product = _mm512_mullo_epi64(
                _mm512_i64gather_epi64(_mm512_srli_epi64(fraction, 10), fine_high, 8),
                _mm512_i64gather_epi64(_mm512_and_si512(fraction, low_mask), fine_low, 8));
            __m512i shift = _mm512_min_epi64(_mm512_add_epi64(_mm512_srai_epi64(d, 20), offset),
                                             limit);
            __m512i weight = _mm512_srav_epi64(product, shift);
            _mm512_storeu_si512(counts + j, weight);
            weights = _mm512_add_epi64(weights, weight);
            _mm512_storeu_pd(lr + j, _mm512_sub_pd(bits, _mm512_mul_pd(_mm512_cvtepi64_pd(d),
                                                                       unit)));
            lane_weighted = _mm512_add_pd(lane_weighted, _mm512_mul_pd(
                _mm512_cvtepi64_pd(weight), _mm512_cvtepi64_pd(d)));
        }
        total = _mm512_reduce_add_epi64(weights);
        _mm512_storeu_pd(lane_sums, lane_weighted);
#else
        /* the same eight lanes as the AVX-512 loop, so that every build sums in one order */
        for (; j + 8 <= vocab; j += 8)
            for (int lane = 0; lane < 8; ++lane) {
                int64_t d = table_weight(row[j + lane], top, max_gap, log2e_fixed, gap_shift,
                                         fine_high, fine_low, top_bits, counts + j + lane);
                total += counts[j + lane];
                lr[j + lane] = (double)top_bits - (double)d * 0x1p-20;
                lane_sums[lane] += (double)counts[j + lane] * (double)d;
            }
#endif
        /* the lanes' float64 sums added in one fixed tree, whatever the build */
        weighted = ((lane_sums[6] + lane_sums[2]) + (lane_sums[4] + lane_sums[0]))
                   + ((lane_sums[7] + lane_sums[3]) + (lane_sums[5] + lane_sums[1]));
        for (; j < vocab; ++j) {
            int64_t d = table_weight(row[j], top, max_gap, log2e_fixed, gap_shift, fine_high,
                                     fine_low, top_bits, counts + j);
            total += counts[j];
            lr[j] = (double)top_bits - (double)d * 0x1p-20;  /* d < 2**53: exact conversion */
            weighted += (double)counts[j] * (double)d;
        }
        totals[r] = total;
        weighted_gaps[r] = weighted;
        double ratio = (double)(total_frequency - vocab) / (double)total;
        int64_t sum = 0, best = 0;
        j = 0;
#ifdef SEQKV_VNNI
        {  /* 8 at a time: floor by roundscale, and each lane's first largest count, then the
            * first index among the lanes holding the largest */
            __m512d scale = _mm512_set1_pd(ratio);
            __m512i one = _mm512_set1_epi64(1), sums = _mm512_setzero_si512();
            __m512i index = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
            __m512i step = _mm512_set1_epi64(8), lane_best = _mm512_set1_epi64(INT64_MIN);
            __m512i lane_index = _mm512_setzero_si512();
            for (; j + 8 <= vocab; j += 8) {
                __m512i c = _mm512_add_epi64(_mm512_cvttpd_epi64(_mm512_roundscale_pd(
                    _mm512_mul_pd(_mm512_cvtepi64_pd(_mm512_loadu_si512(counts + j)), scale),
                    _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)), one);
                _mm512_storeu_si512(counts + j, c);
                sums = _mm512_add_epi64(sums, c);
                __mmask8 better = _mm512_cmpgt_epi64_mask(c, lane_best);
                lane_best = _mm512_mask_mov_epi64(lane_best, better, c);
                lane_index = _mm512_mask_mov_epi64(lane_index, better, index);
                index = _mm512_add_epi64(index, step);
            }
            sum = _mm512_reduce_add_epi64(sums);
            if (j > 0) {
                int64_t most = _mm512_reduce_max_epi64(lane_best);
                best = _mm512_mask_reduce_min_epi64(
                    _mm512_cmpeq_epi64_mask(lane_best, _mm512_set1_epi64(most)), lane_index);
            }
        }
#endif
        for (; j < vocab; ++j) {
            counts[j] = (int64_t)floor((double)counts[j] * ratio) + 1;
            sum += counts[j];
            if (counts[j] > counts[best]) best = j;
        }
        counts[best] += total_frequency - sum;
        if (counts[best] < 1) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
        counts[-1] = 0;
        for (int64_t j = 0; j < vocab; ++j) counts[j] += counts[j - 1];
    }
    return failed ? -2 : 0;
}
