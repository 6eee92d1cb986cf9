/* native.c's exported functions against the torch statement's outputs, without Python.
 *
 * Built by tests/test_native_aarch64.py for aarch64 (plain C, and NEON with the dot product)
 * and run under qemu-user, and natively on x86-64: it #includes native.c, reads a vector file
 * written by tests/native_vectors.py (its format and contents are described there), rebuilds
 * native.c's structs (seqkv_layer_t, seqkv_linear_t, seqkv_span_t) with pointers into the
 * loaded arrays, and runs
 *   - "forward": every recorded call as seqkv_layers then seqkv_head over one KV pool, comparing
 *     the logits and the whole pool (planes and shifts) after each call;
 *   - "tables": seqkv_integer_tables over each recorded logit matrix (the calls' expected logits
 *     and synthetic ones), comparing the cumulative tables, log2p and the weight sums byte for
 *     byte, and weighted_gaps to a relative 1e-12 (a float sum whose order table.py leaves
 *     free);
 * once per thread count given. Every output buffer starts filled with 0xA5 bytes, so an element
 * native.c does not write is a mismatch.
 *
 *   harness FILE [forward|tables|all] [THREADS...]      (defaults: all, 1 2)
 *
 * Prints one line per compared array (how many elements differ, and the first); exits 0 when
 * every array is equal and every call returned 0, 1 otherwise, 2 on a malformed file or usage.
 *
 * Build: cc -O3 -std=c99 -fwrapv -ffp-contract=off [-fopenmp] -DSEQKV_NATIVE_C='"native.c"'
 *        harness.c -lm
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SEQKV_NATIVE_C
#error "give native.c's path: -DSEQKV_NATIVE_C='\"path/to/native.c\"'"
#endif
#include SEQKV_NATIVE_C

/* ---- The vector file: named arrays (tests/native_vectors.py). ---- */

#define HV_MAX_ARRAYS 4096
#define HV_MAX_DIMS 8
#define HV_NAME 160
#define HV_FILL 0xA5

typedef struct {
    char name[HV_NAME];
    char dtype[3];  /* "i1", "u1", "i4", "i8", "f8" */
    int64_t ndim, shape[HV_MAX_DIMS], count, itemsize;
    void *data;  /* 64-byte aligned copy */
} hv_array_t;

static hv_array_t hv_arrays[HV_MAX_ARRAYS];
static int64_t hv_array_count;

static void hv_die(const char *format, ...) {
    va_list args;
    va_start(args, format);
    fprintf(stderr, "harness: ");
    vfprintf(stderr, format, args);
    fprintf(stderr, "\n");
    va_end(args);
    exit(2);
}

/* Never freed: the process is short. */
static void *hv_alloc(int64_t bytes) {
    unsigned char *raw = malloc((size_t)bytes + 64);
    if (!raw) hv_die("out of memory (%lld bytes)", (long long)bytes);
    return raw + (64 - (uintptr_t)raw % 64);
}

static void *hv_filled(int64_t bytes) {
    void *p = hv_alloc(bytes);
    memset(p, HV_FILL, (size_t)bytes);
    return p;
}

static const unsigned char *hv_take(const unsigned char **at, const unsigned char *end,
                                    int64_t bytes) {
    if (bytes < 0 || end - *at < bytes) hv_die("the vector file ends inside an array");
    const unsigned char *p = *at;
    *at += bytes;
    return p;
}

static uint32_t hv_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int64_t hv_i64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
    return (int64_t)v;
}

static void hv_load(const char *path) {
    const uint16_t probe = 1;
    if (*(const unsigned char *)&probe != 1) hv_die("this harness reads on little-endian hosts");
    FILE *file = fopen(path, "rb");
    if (!file) hv_die("cannot open %s", path);
    size_t size = 0, capacity = 1 << 20, got;
    unsigned char *bytes = malloc(capacity);
    while (bytes && (got = fread(bytes + size, 1, capacity - size, file)) > 0) {
        size += got;
        if (size == capacity) bytes = realloc(bytes, capacity *= 2);
    }
    fclose(file);
    if (!bytes) hv_die("out of memory reading %s", path);
    const unsigned char *at = bytes, *end = bytes + size;
    if (memcmp(hv_take(&at, end, 8), "SEQKVVEC", 8)) hv_die("%s is no vector file", path);
    while (at < end) {
        if (hv_array_count == HV_MAX_ARRAYS) hv_die("more than %d arrays", HV_MAX_ARRAYS);
        hv_array_t *a = &hv_arrays[hv_array_count++];
        uint32_t length = hv_u32(hv_take(&at, end, 4));
        if (length == 0 || length >= HV_NAME) hv_die("an array name of %u bytes", length);
        memcpy(a->name, hv_take(&at, end, length), length);
        const unsigned char *code = hv_take(&at, end, 4);
        memcpy(a->dtype, code, 2);
        if (!strcmp(a->dtype, "i1") || !strcmp(a->dtype, "u1")) a->itemsize = 1;
        else if (!strcmp(a->dtype, "i4")) a->itemsize = 4;
        else if (!strcmp(a->dtype, "i8") || !strcmp(a->dtype, "f8")) a->itemsize = 8;
        else hv_die("%s: unknown dtype %.2s", a->name, (const char *)code);
        a->ndim = hv_u32(hv_take(&at, end, 4));
        if (a->ndim > HV_MAX_DIMS) hv_die("%s: %lld dimensions", a->name, (long long)a->ndim);
        a->count = 1;
        for (int64_t d = 0; d < a->ndim; ++d) {
            a->shape[d] = hv_i64(hv_take(&at, end, 8));
            if (a->shape[d] < 0 || (a->shape[d] && a->count > INT64_MAX / 16 / a->shape[d]))
                hv_die("%s: bad shape", a->name);
            a->count *= a->shape[d];
        }
        a->data = hv_alloc(a->count * a->itemsize);
        memcpy(a->data, hv_take(&at, end, a->count * a->itemsize),
               (size_t)(a->count * a->itemsize));
    }
    free(bytes);
}

static const hv_array_t *hv_find(const char *name) {
    for (int64_t i = 0; i < hv_array_count; ++i)
        if (!strcmp(hv_arrays[i].name, name)) return &hv_arrays[i];
    return NULL;
}

static const char *hv_name(const char *format, ...) {
    static char buffer[HV_NAME];
    va_list args;
    va_start(args, format);
    vsnprintf(buffer, sizeof buffer, format, args);
    va_end(args);
    return buffer;
}

/* `name` of one of the dtypes in `dtypes` ("i1|u1"); NULL if absent and not required. */
static const hv_array_t *hv_get(const char *name, const char *dtypes, int required) {
    const hv_array_t *a = hv_find(name);
    if (!a) {
        if (required) hv_die("the vector file has no %s", name);
        return NULL;
    }
    if (!strstr(dtypes, a->dtype)) hv_die("%s is %s, not %s", name, a->dtype, dtypes);
    return a;
}

static int64_t hv_scalar(const char *name) {
    const hv_array_t *a = hv_get(name, "i8", 1);
    if (a->ndim != 0) hv_die("%s is not a scalar", name);
    return *(const int64_t *)a->data;
}

static void *hv_pointer(const char *prefix, const char *field, const char *dtypes,
                        int required) {
    const hv_array_t *a = hv_get(hv_name("%s.%s", prefix, field), dtypes, required);
    return a ? a->data : NULL;
}

static int64_t hv_field(const char *prefix, const char *field) {
    return hv_scalar(hv_name("%s.%s", prefix, field));
}

/* A fresh, writable copy of an array (the KV pool, the hidden rows). */
static void *hv_copy(const hv_array_t *a) {
    void *p = hv_alloc(a->count * a->itemsize);
    memcpy(p, a->data, (size_t)(a->count * a->itemsize));
    return p;
}

/* ---- Comparison. ---- */

static void hv_print_element(const char *dtype, const void *p) {
    if (!strcmp(dtype, "i1")) printf("%d", *(const int8_t *)p);
    else if (!strcmp(dtype, "u1")) printf("%u", *(const uint8_t *)p);
    else if (!strcmp(dtype, "i4")) printf("%ld", (long)*(const int32_t *)p);
    else if (!strcmp(dtype, "i8")) printf("%lld", (long long)*(const int64_t *)p);
    else printf("%.17g", *(const double *)p);
}

/* Elements of `got` (laid out as `want`) whose bytes differ from `want`'s; prints one line. */
static int64_t hv_compare(const char *label, const void *got, const hv_array_t *want) {
    int64_t differ = 0, first = -1, size = want->itemsize;
    for (int64_t i = 0; i < want->count; ++i)
        if (memcmp((const char *)got + i * size, (const char *)want->data + i * size,
                   (size_t)size)) {
            if (first < 0) first = i;
            ++differ;
        }
    printf("  %-34s %s [", label, want->dtype);
    for (int64_t d = 0; d < want->ndim; ++d) printf(d ? " x %lld" : "%lld", (long long)want->shape[d]);
    printf("]: %lld of %lld elements differ", (long long)differ, (long long)want->count);
    if (differ) {
        printf(" (first at flat index %lld: got ", (long long)first);
        hv_print_element(want->dtype, (const char *)got + first * size);
        printf(", expected ");
        hv_print_element(want->dtype, (const char *)want->data + first * size);
        printf(")");
    }
    printf("\n");
    return differ;
}

/* ---- native.c's structs from the file. ---- */

static seqkv_linear_t hv_linear(const char *prefix_in) {
    char prefix[HV_NAME];
    snprintf(prefix, sizeof prefix, "%s", prefix_in);
    seqkv_linear_t w;
    memset(&w, 0, sizeof w);
    w.packed = hv_pointer(prefix, "packed", "i1|u1", 1);  /* u1: the Q4_1 layout */
    w.sums = hv_pointer(prefix, "sums", "i4", 0);
    w.scale = hv_pointer(prefix, "scale", "i8", 0);
    w.bias = hv_pointer(prefix, "bias", "i8", 0);
    w.scale_bits = hv_field(prefix, "scale_bits");
    w.planes = hv_field(prefix, "planes");
    w.n_out = hv_field(prefix, "n_out");
    w.k = hv_field(prefix, "k");
    w.kind = hv_field(prefix, "kind");
    return w;
}

static void hv_layer(seqkv_layer_t *L, int64_t index) {
    char p[HV_NAME];
    snprintf(p, sizeof p, "layer%lld", (long long)index);
    memset(L, 0, sizeof *L);
    L->qkv = hv_linear(hv_name("%s.qkv", p));
    L->o = hv_linear(hv_name("%s.o", p));
    L->gate = hv_linear(hv_name("%s.gate", p));
    L->up = hv_linear(hv_name("%s.up", p));
    L->down = hv_linear(hv_name("%s.down", p));
    L->rsqrt = hv_pointer(p, "rsqrt", "i4", 1);
    L->sigmoid = hv_pointer(p, "sigmoid", "i4", 1);
    L->softmax = hv_pointer(p, "softmax", "i8", 1);
    L->cos = hv_pointer(p, "cos", "i8", 1);
    L->sin = hv_pointer(p, "sin", "i8", 1);
    L->softmax_size = hv_field(p, "softmax_size");
    L->eps_term = hv_field(p, "eps_term");
    L->heads = hv_field(p, "heads");
    L->kv_heads = hv_field(p, "kv_heads");
    L->head_dim = hv_field(p, "head_dim");
    L->score_scale = hv_field(p, "score_scale");
    L->score_shift = hv_field(p, "score_shift");
    L->qkv_frac = hv_field(p, "qkv_frac");
    L->hidden_frac = hv_field(p, "hidden_frac");
    L->gate_frac = hv_field(p, "gate_frac");
    L->mantissa_bits = hv_field(p, "mantissa_bits");
    L->attention_offset = hv_field(p, "attention_offset");
    L->mlp_offset = hv_field(p, "mlp_offset");
    L->attention_gain = hv_pointer(p, "attention_gain", "i8", 0);
    L->mlp_gain = hv_pointer(p, "mlp_gain", "i8", 0);
    L->attention_gain_frac = hv_field(p, "attention_gain_frac");
    L->mlp_gain_frac = hv_field(p, "mlp_gain_frac");
}

/* ---- The two parts. ---- */

static int64_t hv_forward(int64_t threads) {
    int64_t count = hv_scalar("layers"), calls = hv_scalar("calls"), failures = 0;
    seqkv_layer_t *layers = hv_alloc(count * (int64_t)sizeof(seqkv_layer_t));
    for (int64_t i = 0; i < count; ++i) hv_layer(&layers[i], i);
    seqkv_linear_t head = hv_linear("head");
    int64_t out_frac = hv_scalar("head.out_frac");
    const hv_array_t *pool_planes = hv_get("pool.planes", "i1", 1);
    const hv_array_t *pool_shifts = hv_get("pool.shifts", "i1", 1);
    int8_t *planes = hv_copy(pool_planes), *shifts = hv_copy(pool_shifts);
    for (int64_t c = 0; c < calls; ++c) {
        char p[HV_NAME];
        snprintf(p, sizeof p, "call%lld", (long long)c);
        const hv_array_t *hidden_in = hv_get(hv_name("%s.hidden", p), "i8", 1);
        const hv_array_t *positions = hv_get(hv_name("%s.positions", p), "i8", 1);
        const hv_array_t *span_rows = hv_get(hv_name("%s.spans", p), "i8", 1);
        const hv_array_t *logits_want = hv_get(hv_name("%s.logits", p), "i8", 1);
        const hv_array_t *planes_want = hv_get(hv_name("%s.pool.planes", p), "i1", 1);
        const hv_array_t *shifts_want = hv_get(hv_name("%s.pool.shifts", p), "i1", 1);
        if (hidden_in->ndim != 2 || span_rows->ndim != 2 || span_rows->shape[1] != 9 ||
            logits_want->ndim != 2 || logits_want->shape[0] != hidden_in->shape[0] ||
            positions->count != hidden_in->shape[0] || planes_want->count != pool_planes->count ||
            shifts_want->count != pool_shifts->count)
            hv_die("%s: inconsistent shapes", p);
        int64_t rows = hidden_in->shape[0], n = span_rows->shape[0];
        const int64_t *s = span_rows->data;
        seqkv_span_t *spans = hv_alloc(n * (int64_t)sizeof(seqkv_span_t));
        for (int64_t i = 0; i < n; ++i, s += 9) {
            if (s[3] < 0 || s[3] >= pool_planes->count || s[4] < 0 || s[4] >= pool_shifts->count)
                hv_die("%s: a span outside the pool", p);
            spans[i].start = s[0];
            spans[i].count = s[1];
            spans[i].position = s[2];
            spans[i].planes = planes + s[3];
            spans[i].shifts = shifts + s[4];
            spans[i].plane_layer_stride = s[5];
            spans[i].plane_kv_stride = s[6];
            spans[i].shift_layer_stride = s[7];
            spans[i].shift_kv_stride = s[8];
        }
        int64_t *hidden = hv_copy(hidden_in);
        int64_t status = seqkv_layers(layers, count, hidden, rows, positions->data, spans, n,
                                      threads);
        printf("  %s: seqkv_layers(%lld rows, %lld spans) returned %lld\n", p, (long long)rows,
               (long long)n, (long long)status);
        if (status) return failures + 1;  /* the later calls would read a wrong pool */
        int64_t *logits = hv_filled(logits_want->count * 8);
        status = seqkv_head(&layers[0], &head, hidden, rows, out_frac, logits, threads);
        if (status) {
            printf("  %s: seqkv_head returned %lld\n", p, (long long)status);
            return failures + 1;
        }
        failures += hv_compare(hv_name("%s logits", p), logits, logits_want) != 0;
        failures += hv_compare(hv_name("%s pool.planes", p), planes, planes_want) != 0;
        failures += hv_compare(hv_name("%s pool.shifts", p), shifts, shifts_want) != 0;
    }
    return failures;
}

static int64_t hv_tables(int64_t threads) {
    int64_t failures = 0, cases = hv_scalar("tables.cases");
    const int64_t *high = hv_get("tables.fine_high", "i8", 1)->data;
    const int64_t *low = hv_get("tables.fine_low", "i8", 1)->data;
    int64_t log2e = hv_scalar("tables.log2e_fixed"), gap_shift = hv_scalar("tables.gap_shift");
    int64_t max_gap = hv_scalar("tables.max_gap");
    int64_t total_frequency = hv_scalar("tables.total_frequency");
    for (int64_t t = 0; t < cases; ++t) {
        char p[HV_NAME];
        snprintf(p, sizeof p, "tables%lld", (long long)t);
        const hv_array_t *logits = hv_get(hv_name("%s.logits", p), "i8", 1);
        const hv_array_t *cumulative_want = hv_get(hv_name("%s.cumulative", p), "i8", 1);
        const hv_array_t *log2p_want = hv_get(hv_name("%s.log2p", p), "f8", 1);
        const hv_array_t *totals_want = hv_get(hv_name("%s.totals", p), "i8", 1);
        const hv_array_t *gaps_want = hv_get(hv_name("%s.weighted_gaps", p), "f8", 1);
        if (logits->ndim != 2) hv_die("%s.logits is not 2-D", p);
        int64_t rows = logits->shape[0], vocab = logits->shape[1];
        if (cumulative_want->count != rows * (vocab + 1) || log2p_want->count != rows * vocab ||
            totals_want->count != rows || gaps_want->count != rows)
            hv_die("%s: inconsistent shapes", p);
        double *log2p = hv_filled(rows * vocab * 8), *gaps = hv_filled(rows * 8);
        int64_t *cumulative = hv_filled(rows * (vocab + 1) * 8), *totals = hv_filled(rows * 8);
        int64_t status = seqkv_integer_tables(logits->data, rows, vocab,
                                              hv_scalar(hv_name("%s.top_bits", p)), log2e,
                                              gap_shift, max_gap, high, low, total_frequency,
                                              log2p, cumulative, totals, gaps, threads);
        printf("  %s: seqkv_integer_tables(%lld x %lld) returned %lld\n", p, (long long)rows,
               (long long)vocab, (long long)status);
        if (status) {
            ++failures;
            continue;
        }
        failures += hv_compare(hv_name("%s cumulative", p), cumulative, cumulative_want) != 0;
        failures += hv_compare(hv_name("%s log2p", p), log2p, log2p_want) != 0;
        failures += hv_compare(hv_name("%s totals", p), totals, totals_want) != 0;
        const double *want = gaps_want->data;
        int64_t far = 0;
        for (int64_t r = 0; r < rows; ++r) {
            double scale = fabs(want[r]) > 1.0 ? fabs(want[r]) : 1.0;
            far += !(fabs(gaps[r] - want[r]) <= 1e-12 * scale);  /* NaN is far */
        }
        printf("  %-34s f8 [%lld]: %lld of %lld beyond a relative 1e-12\n",
               hv_name("%s weighted_gaps", p), (long long)rows, (long long)far, (long long)rows);
        failures += far != 0;
    }
    return failures;
}

int main(int argc, char **argv) {
    if (argc < 2) hv_die("usage: harness FILE [forward|tables|all] [THREADS...]");
    const char *part = argc > 2 ? argv[2] : "all";
    int forward = !strcmp(part, "forward") || !strcmp(part, "all");
    int tables = !strcmp(part, "tables") || !strcmp(part, "all");
    if (!forward && !tables) hv_die("the part must be forward, tables or all, not %s", part);
    hv_load(argv[1]);
    /* the path native.c was built for (seqkv_isa(), native.py's ISAS order) */
    static const char *const isas[] = {"scalar", "avx2", "avxvnni", "avx512vnni", "neon"};
    long long isa = (long long)seqkv_isa();
    printf("harness: native.c for %s, isa=%s openmp=%d; %lld arrays from %s\n",
#if defined(__aarch64__)
           "aarch64",
#elif defined(__x86_64__)
           "x86-64",
#else
           "another CPU",
#endif
           isa >= 0 && isa < 5 ? isas[isa] : "unknown",
#ifdef _OPENMP
           1,
#else
           0,
#endif
           (long long)hv_array_count, argv[1]);
    int64_t failures = 0;
    int runs = argc > 3 ? argc - 3 : 2;
    for (int i = 0; i < runs; ++i) {
        int64_t threads = argc > 3 ? strtoll(argv[3 + i], NULL, 10) : i + 1;
        if (threads < 1) hv_die("a thread count of %lld", (long long)threads);
        printf("threads=%lld\n", (long long)threads);
        if (forward) failures += hv_forward(threads);
        if (tables) failures += hv_tables(threads);
    }
    printf("harness: %s\n", failures ? "MISMATCH" : "all equal");
    return failures ? 1 : 0;
}
