/* The integer forward's fused CPU paths: the same integers as forward.py's torch code, bit for bit.
 *
 * forward.py evaluates the integer predictor with torch operators; a one-row decoding step runs
 * about 18,000 of them, and their dispatch, not the arithmetic, is most of the step. Here a
 * decoder layer is one call (seqkv_layer), the final norm and output layer another (seqkv_head),
 * over plain C arrays; seqkv_integer_tables builds the coder's tables. Every helper computes
 * exactly what its torch counterpart computes (forward.py names each one); the tests compare the
 * two paths' logits, KV and tables bit for bit. The forward needs AVX-512 VNNI (its products run
 * only on packed weights); seqkv_has_packed says whether this build has it.
 *
 * Exactness rules (each result is one defined integer on every C99 compiler and CPU):
 *   - right shifts go through asr(), a floor shift written without implementation-defined
 *     behaviour; left shifts through shl(), through uint64; every amount lies in [0, 62];
 *   - no signed overflow: each site's bound is stated (the same bounds as forward.py's), and
 *     native.py builds with -fwrapv, so even outside them the result is torch's wrapped one;
 *   - floor division through floor_div(); no float in the forward (the coder's tables, at the
 *     end, use correctly rounded float64 operations as table.py does).
 * So the compiler's vectorization, unrolling and instruction choice cannot change a result.
 *
 * Layouts are row-major and contiguous; "planes" are the int8 activation planes of forward.py,
 * [2 * rows, K]: the high planes (signed, q >> 7) of every row, then the low ones (q & 127).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
    int64_t m = 0;
    for (int64_t i = 0; i < k; ++i) {
        int64_t a = x[i] < 0 ? -x[i] : x[i];
        m = a > m ? a : m;
    }
    return m;
}

/* forward._quantize (two activation planes) of one row: planes at high[i], low[i]. */
static int64_t quantize_row(const int64_t *x, int64_t k, int8_t *high, int8_t *low) {
    int64_t shift = excess_bits(peak(x, k), ACTIVATION_BITS);
    for (int64_t i = 0; i < k; ++i) {
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

/* forward._norm of rows [r0, r1): RMSNorm as planes [2 * rows, k], with the exponents. */
static int64_t norm_range(const int64_t *hidden, int64_t rows, int64_t r0, int64_t r1,
                          int64_t k, int64_t eps_term, const int32_t *rsqrt_table,
                          int64_t mantissa_bits, int8_t *planes, int64_t *exponent) {
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
        for (int64_t i = 0; i < k; ++i) q[i] *= mantissa;  /* < 2**16 * 2**30 */
        int64_t qshift = quantize_row(q, k, planes + r * k, planes + (rows + r) * k);
        exponent[r] = qshift - (twice >> 1) - mantissa_bits;
    }
    free(q);
    return 0;
}

/* forward._scale of one value */
static inline int64_t scaled(int64_t acc, int64_t scale, int64_t amount, const int64_t *bias,
                             int64_t n) {
    int64_t result = asr(acc * scale, amount);  /* acc * scale < 2**58 */
    return bias ? result + bias[n] : result;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>
#define SEQKV_VNNI 1
#endif

#ifdef SEQKV_VNNI
#define LANES 16
#define GROUP 6
/* One block of 16 output rows for `count` activation rows (count <= GROUP, a constant after
 * inlining): the packed weights hold, per block, k / 4 vectors of 16 rows x 4 bytes, so one
 * vpdpbusd with 4 activation bytes broadcast adds 4 products to each of 16 outputs (no
 * horizontal sums). Each int32 lane sums k products below 2**15: exact for k <= 2**16. */
static inline __attribute__((always_inline)) void packed_block(
        const uint8_t *high_u, const uint8_t *low, int64_t k, const int8_t *w, int count,
        int32_t high_out[GROUP][LANES], int32_t low_out[GROUP][LANES]) {
    __m512i a[GROUP], b[GROUP];
    for (int j = 0; j < count; ++j) a[j] = b[j] = _mm512_setzero_si512();
    for (int64_t q = 0; q < k / 4; ++q) {
        __m512i x = _mm512_loadu_si512(w + q * 64);
        for (int j = 0; j < count; ++j) {
            int32_t h, l;
            memcpy(&h, high_u + j * k + 4 * q, 4);
            memcpy(&l, low + j * k + 4 * q, 4);
            a[j] = _mm512_dpbusd_epi32(a[j], _mm512_set1_epi32(h), x);
            b[j] = _mm512_dpbusd_epi32(b[j], _mm512_set1_epi32(l), x);
        }
    }
    for (int j = 0; j < count; ++j) {
        _mm512_storeu_si512(high_out[j], a[j]);
        _mm512_storeu_si512(low_out[j], b[j]);
    }
}
#endif

/* Whether seqkv_linear_packed runs here (built with AVX-512 VNNI). */
int64_t seqkv_has_packed(void) {
#ifdef SEQKV_VNNI
    return 1;
#else
    return 0;
#endif
}

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
    uint8_t *scratch = malloc((size_t)(rows * k));
    if (!scratch) return -1;
    for (int64_t i = 0; i < rows * k; ++i) scratch[i] = (uint8_t)(planes[i] + 128);
    /* Blocks of output rows are independent, so threads share them dynamically (a thread
     * that another process delays takes fewer); the results do not depend on the split. */
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 4) num_threads((int)threads) if (threads > 1)
#endif
    for (int64_t block = 0; block < blocks; ++block) {
        int32_t high[GROUP][LANES], low[GROUP][LANES];
        int64_t total[GROUP][LANES];
        for (int64_t r0 = 0; r0 < rows; r0 += GROUP) {
            int count = rows - r0 < GROUP ? (int)(rows - r0) : GROUP;
            for (int64_t p = 0; p < wplanes; ++p) {
                const int8_t *w = packed + (p * blocks + block) * (k / 4) * 64;
                const uint8_t *h = scratch + r0 * k;
                const uint8_t *l = (const uint8_t *)(planes + (rows + r0) * k);
                switch (count) {  /* constant counts, so the accumulators stay in registers */
                    case 1: packed_block(h, l, k, w, 1, high, low); break;
                    case 2: packed_block(h, l, k, w, 2, high, low); break;
                    case 3: packed_block(h, l, k, w, 3, high, low); break;
                    case 4: packed_block(h, l, k, w, 4, high, low); break;
                    case 5: packed_block(h, l, k, w, 5, high, low); break;
                    default: packed_block(h, l, k, w, GROUP, high, low); break;
                }
                const int32_t *sums = row_sums + (p * blocks + block) * LANES;
                for (int j = 0; j < count; ++j)
                    for (int lane = 0; lane < LANES; ++lane) {
                        int64_t dot = shl((int64_t)high[j][lane] - shl(sums[lane], PLANE_BITS),
                                          PLANE_BITS) + low[j][lane];
                        total[j][lane] = p ? shl(total[j][lane], PLANE_BITS) + dot : dot;
                    }
            }
            for (int j = 0; j < count; ++j) {
                int64_t amount = clamp(scale_bits - out_frac - exponent[r0 + j], 0, 62);
                for (int lane = 0; lane < LANES; ++lane) {
                    int64_t n = block * LANES + lane;
                    if (n < n_out)
                        out[(r0 + j) * out_stride + n] = scaled(total[j][lane], scale[n], amount,
                                                                bias, n);
                }
            }
        }
    }
    free(scratch);
    return 0;
#else
    (void)planes; (void)rows; (void)k; (void)packed; (void)row_sums; (void)wplanes;
    (void)n_out; (void)scale; (void)scale_bits; (void)exponent; (void)out_frac; (void)bias;
    (void)out; (void)out_stride; (void)threads;
    return -1;
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
            if (v < rotated) {
                for (int64_t i = 0; i < d; ++i) rolled[i] = x[(i + d - half) % d];
                for (int64_t i = 0; i < d; ++i)  /* |x| < 2**31, tables <= 2**30 */
                    x[i] = asr(x[i] * c[i] + rolled[i] * s[i], TABLE_BITS);
            }
            int64_t shift = excess_bits(peak(x, d), ACTIVATION_BITS);
            int8_t *out = planes + (r * vectors + v) * 2 * d;
            for (int64_t i = 0; i < d; ++i) {
                int64_t q = asr(x[i], shift);
                out[i] = (int8_t)asr(q, PLANE_BITS);
                out[d + i] = (int8_t)(q & LOW_MASK);
            }
            shifts[r * vectors + v] = shift;
        }
    }
    return 0;
}

static inline int64_t plane_value(const int8_t *plane, int64_t i, int64_t d) {
    return shl(plane[i], PLANE_BITS) + plane[d + i];
}

/* forward._attend: rows [0, n) of one sequence at positions position .. position + n - 1.
 *   q_planes [n, q_vectors, 2, d] (int8), q_shift [n, q_vectors] (int64): the first `heads`
 *   vectors of each row are the queries;
 *   keys, values: the slot's planes [tokens, 2, kv_heads, d] (int8) with row stride
 *   token_stride (elements), key_shift, value_shift [tokens, heads] (int8, stride shift_stride);
 *   out [n, heads, d], exponent [n]. Returns 0, or -1 when out of memory. */
/* One row of seqkv_attend (see there); z and weight: scratch of `end` int64 each, kv_high and
 * kv_low of end * d int16 each.
 * Sums of plane products run in int32: |q| < 2**14 times a key plane (|.| <= 128) over d <= 1024
 * terms stays below 2**31; a weight (< 2**14) times a value plane, below 2**21, is summed in
 * int32 for at most 512 keys at a time (2**30) and then added into int64. */
static void attend_row(const int8_t *q_planes, const int64_t *q_shift, int64_t heads,
                       int64_t kv_heads, int64_t d, int64_t end, const int8_t *keys,
                       const int8_t *values, int64_t token_stride, const int8_t *key_shift,
                       const int8_t *value_shift, int64_t shift_stride, int64_t score_scale,
                       int64_t score_shift, const int64_t *softmax, int64_t softmax_size,
                       int64_t *z, int64_t *weight, int16_t *kv_high, int16_t *kv_low,
                       int64_t *out, int64_t *exponent) {
    int64_t group = heads / kv_heads;
    int16_t qv[1024];  /* 14-bit queries and 8-bit key planes: int16 products summed in int32 */
    int32_t high[1024], low[1024];
    int64_t running_of[1024];
    int64_t row_exponent = 0;
    for (int64_t h = 0; h < heads; ++h) {
        int64_t g = h / group;
        if (h % group == 0)  /* the group's key planes as int16, once for its query heads */
            for (int64_t t = 0; t < end; ++t) {
                const int8_t *kp = keys + t * token_stride + g * d;  /* planes kv_heads*d apart */
                for (int64_t i = 0; i < d; ++i) {
                    kv_high[t * d + i] = kp[i];
                    kv_low[t * d + i] = kp[kv_heads * d + i];
                }
            }
        const int8_t *qp = q_planes + h * 2 * d;
        for (int64_t i = 0; i < d; ++i) qv[i] = (int16_t)plane_value(qp, i, d);
        int64_t top = MASKED, running = 0;
        for (int64_t t = 0; t < end; ++t) {
            int32_t dot_high = 0, dot_low = 0;
            for (int64_t i = 0; i < d; ++i) {
                dot_high += (int32_t)qv[i] * (int32_t)kv_high[t * d + i];
                dot_low += (int32_t)qv[i] * (int32_t)kv_low[t * d + i];
            }
            int64_t dot = shl(dot_high, PLANE_BITS) + dot_low;  /* < d * 2**28 */
            int64_t amount = clamp(score_shift - q_shift[h] - key_shift[t * shift_stride + h],
                                   0, 62);
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
        int64_t *o = out + h * d;
        for (int64_t i = 0; i < d; ++i) o[i] = 0;
        for (int64_t t0 = 0; t0 < end; t0 += 512) {
            int64_t t1 = t0 + 512 < end ? t0 + 512 : end;
            for (int64_t i = 0; i < d; ++i) high[i] = low[i] = 0;
            for (int64_t t = t0; t < t1; ++t) {
                int32_t w = (int32_t)weight[t];
                if (!w) continue;
                const int8_t *vp = values + t * token_stride + g * d;
                const int8_t *vl = vp + kv_heads * d;
                for (int64_t i = 0; i < d; ++i) {
                    high[i] += w * (int32_t)vp[i];
                    low[i] += w * (int32_t)vl[i];
                }
            }
            for (int64_t i = 0; i < d; ++i) o[i] += shl(high[i], PLANE_BITS) + low[i];
        }
        /* |o| <= tokens * 2**28 <= 2**41: shifted by 14 it stays below 2**55 */
        for (int64_t i = 0; i < d; ++i) o[i] = floor_div(shl(o[i], SOFTMAX_BITS), total);
        running_of[h] = running;
        row_exponent = (h == 0 || running > row_exponent) ? running : row_exponent;
    }
    for (int64_t h = 0; h < heads; ++h) {
        int64_t *o = out + h * d;
        for (int64_t i = 0; i < d; ++i) o[i] = asr(o[i], row_exponent - running_of[h]);
    }
    *exponent = row_exponent;
}

static int64_t seqkv_attend(const int8_t *q_planes, const int64_t *q_shift, int64_t q_vectors,
                     int64_t n, int64_t position, int64_t heads, int64_t kv_heads, int64_t d,
                     const int8_t *keys, const int8_t *values, int64_t token_stride,
                     const int8_t *key_shift, const int8_t *value_shift, int64_t shift_stride,
                     int64_t score_scale, int64_t score_shift, const int64_t *softmax,
                     int64_t softmax_size, int64_t *out, int64_t *exponent, int64_t threads) {
    int64_t failed = 0;
    /* rows are independent: threads share them (results do not depend on the split) */
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 4) num_threads((int)threads) if (threads > 1 && n > 4)
#endif
    for (int64_t r = 0; r < n; ++r) {
        int64_t end = position + r + 1;  /* keys 0 .. position + r */
        int64_t *scratch = malloc((sizeof(int64_t) * 2 + sizeof(int16_t) * 2 * (size_t)d)
                                  * (size_t)end);
        if (!scratch) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
            continue;
        }
        attend_row(q_planes + r * q_vectors * 2 * d, q_shift + r * q_vectors, heads, kv_heads, d,
                   end, keys, values, token_stride, key_shift, value_shift, shift_stride,
                   score_scale, score_shift, softmax, softmax_size, scratch, scratch + end,
                   (int16_t *)(scratch + 2 * end), (int16_t *)(scratch + 2 * end) + end * d,
                   out + r * heads * d, exponent + r);
        free(scratch);
    }
    return failed ? -1 : 0;
}

/* forward._mlp's SiLU and product: silu(gate) * up into x [rows * n] (quantized by the caller).
 * gate, up at 2**-frac_bits. */
static int64_t seqkv_silu_mul(const int64_t *gate, const int64_t *up, int64_t count, int64_t frac_bits,
                    const int32_t *sigmoid, int64_t *x) {
    int64_t cell_bits = frac_bits - SIGMOID_STEP_BITS;
    int64_t bound = shl(SIGMOID_RANGE, frac_bits);
    int64_t half_cell = shl(1, cell_bits - 1);
    for (int64_t i = 0; i < count; ++i) {
        int64_t index = asr(clamp(gate[i] + (bound + half_cell), 0, 2 * bound - 1), cell_bits);
        int64_t silu = asr(gate[i] * sigmoid[index], TABLE_BITS);
        x[i] = silu * up[i];  /* |silu|, |up| < 2**23 */
    }
    return 0;
}

/* ---- One whole decoder layer in one call (forward._attention and forward._mlp). ---- */

typedef struct {  /* a linear layer as seqkv_linear_packed takes it */
    const int8_t *packed;
    const int32_t *sums;
    const int64_t *scale;
    const int64_t *bias;  /* or NULL */
    int64_t scale_bits, planes, n_out, k;
} seqkv_linear_t;

typedef struct {  /* a layer's weights, tables and constants (forward.IntegerForward's) */
    seqkv_linear_t qkv, o, gate, up, down;
    const int32_t *rsqrt;
    const int32_t *sigmoid;
    const int64_t *softmax;
    const int64_t *cos, *sin;
    int64_t softmax_size, eps_term, heads, kv_heads, head_dim, score_scale, score_shift;
    int64_t qkv_frac, hidden_frac, gate_frac, mantissa_bits, attention_offset, mlp_offset;
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
                         int8_t *planes, int64_t *exponent, int64_t threads) {
    int64_t failed = 0, chunks = (rows + ROW_CHUNK - 1) / ROW_CHUNK;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads((int)threads) if (threads > 1 && chunks > 1)
#endif
    for (int64_t c = 0; c < chunks; ++c) {
        int64_t r1 = (c + 1) * ROW_CHUNK < rows ? (c + 1) * ROW_CHUNK : rows;
        if (norm_range(hidden, rows, c * ROW_CHUNK, r1, L->qkv.k, L->eps_term, L->rsqrt,
                       L->mantissa_bits, planes, exponent)) {
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
    return seqkv_linear_packed(planes, rows, w->k, w->packed, w->sums, w->planes, w->n_out,
                               w->scale, w->scale_bits, exponent, out_frac, w->bias, out,
                               w->n_out, threads);
}

/* hidden [rows, hidden] += attention(hidden), then += mlp(hidden), for layer `index` of every
 * span's pool (whose keys and values at the rows' positions it writes). Returns 0, or -1 when
 * out of memory or built without VNNI (hidden is then unspecified). */
int64_t seqkv_layer(const seqkv_layer_t *L, int64_t index, int64_t *hidden, int64_t rows,
                    const int64_t *positions, const seqkv_span_t *spans, int64_t span_count,
                    int64_t threads) {
    int64_t heads = L->heads, kvh = L->kv_heads, d = L->head_dim;
    int64_t vectors = heads + 2 * kvh, group = heads / kvh, width = L->qkv.k;
    int64_t inner = L->gate.n_out;
    int64_t wide = inner > width ? inner : width;
    int64_t attention_width = heads * d > width ? heads * d : width;
    int64_t status = -1;
    int8_t *planes = malloc((size_t)(2 * rows * (wide > attention_width ? wide : attention_width)));
    int64_t *exponent = malloc(sizeof(int64_t) * (size_t)rows);
    int64_t *qkv = malloc(sizeof(int64_t) * (size_t)(rows * vectors * d));
    int8_t *qkv_planes = malloc((size_t)(rows * vectors * 2 * d));
    int64_t *shift = malloc(sizeof(int64_t) * (size_t)(rows * vectors));
    int64_t *attended = malloc(sizeof(int64_t) * (size_t)(rows * heads * d));
    int64_t *attended_exponent = malloc(sizeof(int64_t) * (size_t)rows);
    int64_t *gate = malloc(sizeof(int64_t) * (size_t)(rows * inner));
    int64_t *up = malloc(sizeof(int64_t) * (size_t)(rows * inner));
    int64_t *delta = malloc(sizeof(int64_t) * (size_t)(rows * width));
    if (!planes || !exponent || !qkv || !qkv_planes || !shift || !attended ||
        !attended_exponent || !gate || !up || !delta)
        goto done;
    /* attention */
    if (norm_rows(L, hidden, rows, planes, exponent, threads)) goto done;
    if (linear_into(&L->qkv, planes, rows, exponent, L->qkv_frac, qkv, threads)) goto done;
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
                         threads)) goto done;
    }
    quantize_rows(attended, rows, heads * d, L->attention_offset, attended_exponent, planes,
                  exponent, threads);
    if (linear_into(&L->o, planes, rows, exponent, L->hidden_frac, delta, threads)) goto done;
    for (int64_t i = 0; i < rows * width; ++i) hidden[i] += delta[i];
    /* mlp */
    if (norm_rows(L, hidden, rows, planes, exponent, threads)) goto done;
    if (linear_into(&L->gate, planes, rows, exponent, L->gate_frac, gate, threads)) goto done;
    if (linear_into(&L->up, planes, rows, exponent, L->gate_frac, up, threads)) goto done;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads((int)threads) if (threads > 1 && chunks > 1)
#endif
    for (int64_t c = 0; c < chunks; ++c) {
        int64_t r0 = c * ROW_CHUNK, count = rows - r0 < ROW_CHUNK ? rows - r0 : ROW_CHUNK;
        seqkv_silu_mul(gate + r0 * inner, up + r0 * inner, count * inner, L->gate_frac,
                       L->sigmoid, gate + r0 * inner);
    }
    quantize_rows(gate, rows, inner, L->mlp_offset, NULL, planes, exponent, threads);
    if (linear_into(&L->down, planes, rows, exponent, L->hidden_frac, delta, threads)) goto done;
    for (int64_t i = 0; i < rows * width; ++i) hidden[i] += delta[i];
    status = 0;
done:
    free(planes); free(exponent); free(qkv); free(qkv_planes); free(shift); free(attended);
    free(attended_exponent); free(gate); free(up); free(delta);
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
    if (planes && exponent && !norm_rows(L, hidden, rows, planes, exponent, threads))
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
 * Returns 0, or -2 when a row's largest count would fall below 1 (table.py asserts it). */
int64_t seqkv_integer_tables(const int64_t *logits, int64_t rows, int64_t vocab,
                             int64_t top_bits, int64_t log2e_fixed, int64_t gap_shift,
                             int64_t max_gap, const int64_t *fine_high, const int64_t *fine_low,
                             int64_t total_frequency, double *log2p, int64_t *cumulative,
                             int64_t *totals) {
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t *row = logits + r * vocab;
        double *lr = log2p + r * vocab;
        int64_t *counts = cumulative + r * (vocab + 1) + 1;
        int64_t top = row[0];
        for (int64_t j = 1; j < vocab; ++j) top = row[j] > top ? row[j] : top;
        int64_t total = 0;
        for (int64_t j = 0; j < vocab; ++j) {
            int64_t gap = top - row[j];
            gap = gap < max_gap ? gap : max_gap;
            int64_t d = asr(gap * log2e_fixed + shl(1, gap_shift - 1), gap_shift);
            int64_t fraction = d & ((INT64_C(1) << 20) - 1);
            int64_t product = fine_high[fraction >> 10] * fine_low[fraction & 1023];
            int64_t shift = asr(d, 20) + (60 - top_bits);
            counts[j] = asr(product, shift < 62 ? shift : 62);  /* the weight, for now */
            total += counts[j];
            lr[j] = (double)top_bits - (double)d * 0x1p-20;  /* d < 2**53: exact conversion */
        }
        totals[r] = total;
        double ratio = (double)(total_frequency - vocab) / (double)total;
        int64_t sum = 0, best = 0;
        for (int64_t j = 0; j < vocab; ++j) {
            counts[j] = (int64_t)floor((double)counts[j] * ratio) + 1;
            sum += counts[j];
            if (counts[j] > counts[best]) best = j;
        }
        counts[best] += total_frequency - sum;
        if (counts[best] < 1) return -2;
        counts[-1] = 0;
        for (int64_t j = 0; j < vocab; ++j) counts[j] += counts[j - 1];
    }
    return 0;
}
