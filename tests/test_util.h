/*
 * test_util.h — what the cmocka unit tests share: a status check that
 * prints the library's message (OK, or an expected status), a
 * message-fragment check, a tolerance check that prints both values, and
 * the splitmix64 mixer, the per-tensor gradient buffers (grads_t) the
 * engine tests draw their gradients into, a LLaMA-like test layout and the
 * sort-based top-k reference of the selection tests. Include
 * after <cmocka.h> and "igrad.h".
 */
#ifndef IGRAD_TEST_UTIL_H
#define IGRAD_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline void assert_ok_(igrad_status_t st, const char *expr, const char *file, int line)
{
    if (st != IGRAD_OK) {
        print_error("%s:%d: %s returned %d (%s): %s\n", file, line, expr, (int)st,
                    igrad_status_str(st), igrad_last_error());
        fail();
    }
}
#define assert_ok(expr) assert_ok_((expr), #expr, __FILE__, __LINE__)

static inline void assert_status_(igrad_status_t st, igrad_status_t want, const char *expr,
                                  const char *file, int line)
{
    if (st != want) {
        print_error("%s:%d: %s returned %d (%s), expected %d (%s); last error: %s\n", file, line,
                    expr, (int)st, igrad_status_str(st), (int)want, igrad_status_str(want),
                    igrad_last_error());
        fail();
    }
}
#define assert_status(expr, want) assert_status_((expr), (want), #expr, __FILE__, __LINE__)

/* splitmix64: a well-mixed 64-bit hash of x (deterministic test data). */
static inline uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static inline void assert_error_has(const char *frag)
{
    const char *msg = igrad_last_error();
    if (!strstr(msg, frag)) {
        print_error("last error '%s' does not contain '%s'\n", msg, frag);
        fail();
    }
}

static inline void check_near(double a, double b, double tol, const char *ea, const char *eb,
                              const char *file, int line)
{
    if (!(fabs(a - b) <= tol)) {
        print_error("%s:%d: %s = %.17g, %s = %.17g, |diff| %.3g > %.3g\n", file, line, ea, a,
                    eb, b, fabs(a - b), tol);
        fail();
    }
}
#define assert_near(a, b, tol) check_near((a), (b), (tol), #a, #b, __FILE__, __LINE__)

/* One float buffer per tensor of a layout, zeroed (the gradients of a
 * step; each test fills them its own way). */
typedef struct grads {
    size_t T;
    int64_t *n;
    float **g;
} grads_t;

static inline grads_t grads_new(const igrad_layout_t *L)
{
    grads_t G;
    G.T = igrad_layout_count(L);
    G.n = calloc(G.T, sizeof *G.n);
    G.g = calloc(G.T, sizeof *G.g);
    assert_non_null(G.n);
    assert_non_null(G.g);
    for (size_t t = 0; t < G.T; t++) {
        igrad_tensor_info_t ti;
        assert_ok(igrad_layout_tensor(L, t, &ti));
        G.n[t] = ti.count;
        G.g[t] = calloc((size_t)ti.count, sizeof(float));
        assert_non_null(G.g[t]);
    }
    return G;
}

static inline void grads_free(grads_t *G)
{
    for (size_t t = 0; t < G->T; t++) free(G->g[t]);
    free(G->g);
    free(G->n);
}

/* A LLaMA-like layout of `layers` blocks: the token embedding (vocab x
 * dim), per block q/k/v/o (dim x dim), up (ffn x dim), down (dim x ffn) and
 * input_layernorm (dim), then model.norm (of dtype `norm_dtype`) and an
 * untied lm_head (vocab x dim); everything else F32. */
static inline igrad_layout_t *llama_test_layout(int layers, int64_t vocab, int64_t dim,
                                                int64_t ffn, igrad_dtype_t norm_dtype)
{
    igrad_layout_t *L = NULL;
    assert_ok(igrad_layout_create(&L));
    int64_t emb[2] = {vocab, dim}, sq[2] = {dim, dim}, up[2] = {ffn, dim}, down[2] = {dim, ffn};
    int64_t vec[1] = {dim};
    char name[128];
    assert_ok(igrad_layout_add(L, "model.embed_tokens.weight", IGRAD_DTYPE_F32, 2, emb));
    static const char *const attn[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    for (int l = 0; l < layers; l++) {
        for (int a = 0; a < 4; a++) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.weight", l, attn[a]);
            assert_ok(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, sq));
        }
        snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", l);
        assert_ok(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, up));
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", l);
        assert_ok(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, down));
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        assert_ok(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 1, vec));
    }
    assert_ok(igrad_layout_add(L, "model.norm.weight", norm_dtype, 1, vec));
    assert_ok(igrad_layout_add(L, "lm_head.weight", IGRAD_DTYPE_F32, 2, emb));
    return L;
}

/* A profile whose important set is the top `fixed` share of components by
 * a made-up activity (component c: (c * 7) % 5 + 1). */
static inline igrad_profile_t *fixed_rule_profile(const igrad_layout_t *L, const char *method)
{
    igrad_trace_t *tr = NULL;
    assert_ok(igrad_trace_create(L, &tr));
    assert_ok(igrad_trace_set_sparsifier(tr, IGRAD_SPARSIFIER_ADTOPK, 0.01));
    for (int64_t s = 0; s < 4; s++)
        for (size_t t = 0; t < igrad_layout_count(L); t++) {
            igrad_tensor_info_t ti;
            assert_ok(igrad_layout_tensor(L, t, &ti));
            if (ti.component < 0) continue;
            double act = (double)((ti.component * 7) % 5 + 1) + 0.1 * (double)s;
            assert_ok(igrad_trace_record(tr, s, t, act * act, 1));
        }
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    opts.method = method;
    igrad_profile_t *p = NULL;
    assert_ok(igrad_profile_build(tr, &opts, &p));
    igrad_trace_free(tr);
    return p;
}

/* ---- top-k by sorting: the reference the selection tests compare with ---- */

typedef struct ref_entry {
    float mag;
    uint32_t index;
} ref_entry_t;

static inline int cmp_ref(const void *pa, const void *pb)
{
    const ref_entry_t *a = pa, *b = pb;
    if (a->mag != b->mag) return a->mag > b->mag ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

static inline int cmp_u32(const void *pa, const void *pb)
{
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    return (a > b) - (a < b);
}

/* Kept indices (ascending) of the top k of |a[0..n)| (no NaN), ties to the
 * lower index, by sorting everything. */
static inline void ref_topk(const float *a, int64_t n, int64_t k, uint32_t *out)
{
    ref_entry_t *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) {
        v[i].mag = fabsf(a[i]);
        v[i].index = (uint32_t)i;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_ref);
    for (int64_t j = 0; j < k; j++) out[j] = v[j].index;
    qsort(out, (size_t)k, sizeof *out, cmp_u32);
    free(v);
}

#endif /* IGRAD_TEST_UTIL_H */
