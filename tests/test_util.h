/*
 * test_util.h — what the cmocka unit tests share: a status check that
 * prints the library's message (OK, or an expected status), a
 * message-fragment check, a tolerance check that prints both values, and
 * the splitmix64 mixer, the per-tensor gradient buffers (grads_t) the
 * engine tests draw their gradients into, and a LLaMA-like test layout. Include
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

#endif /* IGRAD_TEST_UTIL_H */
