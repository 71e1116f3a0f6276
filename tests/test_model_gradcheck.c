/*
 * test_model_gradcheck.c — the trainer model's analytic gradients against
 * central finite differences, plus properties of forward/backward that a
 * gradient check cannot see: causality, masked targets, accumulation over
 * micro-batches, determinism across thread counts, and loss going down
 * when the tiny model memorises a short text with AdamW.
 *
 * Finite differences run on an independent double-precision forward pass
 * written here with naive loops (ref_loss: no BLAS, no shared code with
 * model.c except the name -> offset table), so they are not drowned in
 * float32 rounding: step 1e-4, truncation ~1e-9, rounding ~1e-11. The same
 * reference checks the float forward's loss (relative 1e-5). Per sampled
 * entry the float32 analytic gradient must satisfy
 *   |analytic - fd| <= 1e-3 * |fd| + 1e-5 * max|gradient of that tensor|
 * i.e. relative error below 1e-3 for every entry that is not tiny against
 * its tensor (measured: worst ~6e-5). Sampled per tensor: the 4 entries
 * with the largest |gradient| and 12 pseudo-random ones, for untied + GQA,
 * tied + MHA, and MQA with masked targets. Weights are drawn with std 0.3
 * (not HF's 0.02) and norm weights in [0.7, 1.3], so attention is far from
 * uniform and every nonlinearity matters.
 *
 * The PyTorch cross-check of logits and every gradient is
 * tests/python/test_model_vs_torch.py.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <omp.h>

#include "model.h"
#include "optim.h"

static uint64_t rng_state;

static uint32_t rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static model_t *make_model(model_config_t cfg, uint64_t seed, float std)
{
    model_t *m = NULL;
    igrad_status_t st = model_create(&cfg, &m);
    if (st != IGRAD_OK) fail_msg("model_create: %s", trainer_last_error());
    model_init_random(m, seed, std);
    rng_state = seed * 2654435761u + 1;
    for (int i = 0; i < m->n_tensors; i++) {
        if (m->tensors[i].ndim != 1) continue;
        float *w = m->params + m->tensors[i].offset;
        for (int64_t j = 0; j < m->tensors[i].count; j++)
            w[j] = 0.7f + 0.6f * (float)(rng_u32() % 1000) / 1000.0f;
    }
    return m;
}

static model_config_t tiny(void)
{
    model_config_t cfg;
    assert_int_equal(model_config_preset("tiny", &cfg), IGRAD_OK);
    return cfg;
}

static void random_tokens(int32_t *inputs, int32_t *targets, int n, int V, int mask_every)
{
    for (int i = 0; i < n; i++) {
        inputs[i] = (int32_t)(rng_u32() % (uint32_t)V);
        targets[i] = (int32_t)(rng_u32() % (uint32_t)V);
        if (mask_every && i % mask_every == 0) targets[i] = MODEL_IGNORE_INDEX;
    }
}

/* ---- an independent double-precision forward (naive loops, no BLAS) ---- */

typedef struct ref {
    const model_t *m; /* only for the config and the name -> offset table */
    const double *w;  /* (num_params) weights in double */
} ref_t;

static const double *ref_tensor(const ref_t *r, const char *fmt, int layer)
{
    char name[MODEL_NAME_MAX];
    snprintf(name, sizeof name, fmt, layer);
    int i = model_find_tensor(r->m, name);
    if (i < 0) fail_msg("reference: no tensor %s", name);
    return r->w + r->m->tensors[i].offset;
}

/* y (n, out) = x (n, in) @ W^T */
static void ref_linear(double *y, const double *x, const double *W, int n, int in, int out)
{
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            double s = 0.0;
            for (int k = 0; k < in; k++) s += x[i * in + k] * W[o * in + k];
            y[i * out + o] = s;
        }
}

static void ref_rmsnorm(double *y, const double *x, const double *w, int n, int C, double eps)
{
    for (int i = 0; i < n; i++) {
        double ss = 0.0;
        for (int c = 0; c < C; c++) ss += x[i * C + c] * x[i * C + c];
        double r = 1.0 / sqrt(ss / C + eps);
        for (int c = 0; c < C; c++) y[i * C + c] = x[i * C + c] * r * w[c];
    }
}

/* HF rotate_half RoPE on `heads` heads of width hd in each of T rows. */
static void ref_rope(double *x, int T, int heads, int hd, double theta)
{
    int half = hd / 2;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < heads; h++) {
            double *v = x + (t * heads + h) * hd;
            for (int i = 0; i < half; i++) {
                double a = t * pow(theta, -2.0 * i / hd), c = cos(a), s = sin(a);
                double x1 = v[i], x2 = v[i + half];
                v[i] = x1 * c - x2 * s;
                v[i + half] = x2 * c + x1 * s;
            }
        }
}

static double ref_loss(const ref_t *r, const int32_t *in, const int32_t *tg, int B, int T)
{
    const model_config_t *c = &r->m->config;
    int C = c->dim, H = c->n_head, KV = c->n_kv_head, hd = C / H, F = c->ffn_dim;
    int V = c->vocab_size;
    size_t big = (size_t)T * (size_t)(C + 3 * H * hd + 3 * F + V + T + 8);
    double *buf = malloc(big * 4 * sizeof(double));
    assert_non_null(buf);
    double *x = buf, *h = x + T * C, *q = h + T * C, *k = q + T * H * hd, *v = k + T * KV * hd;
    double *y = v + T * KV * hd, *o = y + T * H * hd, *g = o + T * C, *u = g + T * F;
    double *logits = u + T * F, *p = logits + T * V;
    double total = 0.0;
    int count = 0;
    const double *emb = ref_tensor(r, "model.embed_tokens.weight", 0);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++)
            for (int j = 0; j < C; j++) x[t * C + j] = emb[in[b * T + t] * C + j];
        for (int l = 0; l < c->n_layer; l++) {
            ref_rmsnorm(h, x, ref_tensor(r, "model.layers.%d.input_layernorm.weight", l), T, C,
                        c->rms_norm_eps);
            ref_linear(q, h, ref_tensor(r, "model.layers.%d.self_attn.q_proj.weight", l), T, C,
                       H * hd);
            ref_linear(k, h, ref_tensor(r, "model.layers.%d.self_attn.k_proj.weight", l), T, C,
                       KV * hd);
            ref_linear(v, h, ref_tensor(r, "model.layers.%d.self_attn.v_proj.weight", l), T, C,
                       KV * hd);
            ref_rope(q, T, H, hd, c->rope_theta);
            ref_rope(k, T, KV, hd, c->rope_theta);
            for (int hh = 0; hh < H; hh++) {
                int kh = hh / (H / KV);
                for (int t = 0; t < T; t++) {
                    double mx = -INFINITY, sum = 0.0;
                    for (int j = 0; j <= t; j++) {
                        double s = 0.0;
                        for (int d = 0; d < hd; d++)
                            s += q[(t * H + hh) * hd + d] * k[(j * KV + kh) * hd + d];
                        p[j] = s / sqrt((double)hd);
                        mx = fmax(mx, p[j]);
                    }
                    for (int j = 0; j <= t; j++) sum += (p[j] = exp(p[j] - mx));
                    for (int d = 0; d < hd; d++) {
                        double acc = 0.0;
                        for (int j = 0; j <= t; j++) acc += p[j] / sum * v[(j * KV + kh) * hd + d];
                        y[(t * H + hh) * hd + d] = acc;
                    }
                }
            }
            ref_linear(o, y, ref_tensor(r, "model.layers.%d.self_attn.o_proj.weight", l), T,
                       H * hd, C);
            for (int i = 0; i < T * C; i++) x[i] += o[i];
            ref_rmsnorm(h, x, ref_tensor(r, "model.layers.%d.post_attention_layernorm.weight", l),
                        T, C, c->rms_norm_eps);
            ref_linear(g, h, ref_tensor(r, "model.layers.%d.mlp.gate_proj.weight", l), T, C, F);
            ref_linear(u, h, ref_tensor(r, "model.layers.%d.mlp.up_proj.weight", l), T, C, F);
            for (int i = 0; i < T * F; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            ref_linear(o, g, ref_tensor(r, "model.layers.%d.mlp.down_proj.weight", l), T, F, C);
            for (int i = 0; i < T * C; i++) x[i] += o[i];
        }
        ref_rmsnorm(h, x, ref_tensor(r, "model.norm.weight", 0), T, C, c->rms_norm_eps);
        const double *head = c->tie_embeddings ? emb : ref_tensor(r, "lm_head.weight", 0);
        ref_linear(logits, h, head, T, C, V);
        for (int t = 0; t < T; t++) {
            int target = tg[b * T + t];
            if (target == MODEL_IGNORE_INDEX) continue;
            double mx = -INFINITY, sum = 0.0;
            for (int j = 0; j < V; j++) mx = fmax(mx, logits[t * V + j]);
            for (int j = 0; j < V; j++) sum += exp(logits[t * V + j] - mx);
            total += mx + log(sum) - logits[t * V + target];
            count++;
        }
    }
    free(buf);
    return count ? total / count : 0.0;
}

/* Samples entries of every tensor and compares the float analytic gradient
 * with central differences of the double reference (step 1e-4: truncation
 * ~1e-9, rounding ~1e-11). Returns the number of entries checked. */
static int gradcheck(model_t *m, int B, int T, int mask_every, uint64_t seed)
{
    int BT = B * T;
    int32_t *in = malloc((size_t)BT * sizeof *in), *tg = malloc((size_t)BT * sizeof *tg);
    double *w = malloc((size_t)m->num_params * sizeof *w);
    assert_non_null(in);
    assert_non_null(tg);
    assert_non_null(w);
    rng_state = seed;
    random_tokens(in, tg, BT, m->config.vocab_size, mask_every);
    model_zero_grad(m);
    assert_int_equal(model_forward(m, in, tg, B, T), IGRAD_OK);
    assert_int_equal(model_backward(m), IGRAD_OK);
    for (int64_t i = 0; i < m->num_params; i++) w[i] = m->params[i];
    ref_t r = {m, w};

    /* the forward itself: float model vs double reference */
    double lref = ref_loss(&r, in, tg, B, T);
    if (fabs(m->loss - lref) > 1e-5 * fabs(lref))
        fail_msg("loss: model %.9g vs double reference %.9g", m->loss, lref);

    const double step = 1e-4, rtol = 1e-3, floor_frac = 1e-5;
    int checked = 0;
    double worst_rel = 0.0;
    for (int t = 0; t < m->n_tensors; t++) {
        const model_tensor_t *tt = &m->tensors[t];
        const float *an = m->grads + tt->offset;
        double gmax = 0.0;
        for (int64_t j = 0; j < tt->count; j++) gmax = fmax(gmax, fabsf(an[j]));
        if (!(gmax > 0.0)) fail_msg("%s: gradient is all zero", tt->name);
        int64_t picks[16];
        int npick = 0;
        for (int k = 0; k < 4; k++) { /* the 4 largest |g| */
            int64_t best = -1;
            for (int64_t j = 0; j < tt->count; j++) {
                int taken = 0;
                for (int q = 0; q < npick; q++) taken |= picks[q] == j;
                if (!taken && (best < 0 || fabsf(an[j]) > fabsf(an[best]))) best = j;
            }
            picks[npick++] = best;
        }
        while (npick < 16) picks[npick++] = (int64_t)(rng_u32() % (uint32_t)tt->count);
        for (int k = 0; k < npick; k++) {
            double *wp = w + tt->offset + picks[k], saved = *wp;
            *wp = saved + step;
            double lp = ref_loss(&r, in, tg, B, T);
            *wp = saved - step;
            double lm = ref_loss(&r, in, tg, B, T);
            *wp = saved;
            double fd = (lp - lm) / (2.0 * step);
            double err = fabs(an[picks[k]] - fd), allowed = rtol * fabs(fd) + floor_frac * gmax;
            if (fabs(fd) > 1e-2 * gmax) worst_rel = fmax(worst_rel, err / fabs(fd));
            if (err > allowed)
                fail_msg("%s[%lld]: analytic %.8g vs finite difference %.8g (error %.3g, "
                         "allowed %.3g)", tt->name, (long long)picks[k], an[picks[k]], fd, err,
                         allowed);
            checked++;
        }
    }
    print_message("  %d entries over %d tensors; loss %.6f (reference %.6f); worst relative "
                  "error %.2e (entries above 1%% of their tensor's largest)\n", checked,
                  m->n_tensors, m->loss, lref, worst_rel);
    free(w);
    free(in);
    free(tg);
    return checked;
}

static void test_gradcheck_untied_gqa(void **state)
{
    (void)state;
    model_config_t cfg = tiny(); /* H=4, KV=2: two query heads per key/value head */
    assert_int_equal(cfg.n_kv_head * 2, cfg.n_head);
    model_t *m = make_model(cfg, 11, 0.3f);
    assert_int_equal(gradcheck(m, 2, 12, 0, 101), 16 * m->n_tensors);
    model_free(m);
}

static void test_gradcheck_tied_mha(void **state)
{
    (void)state;
    model_config_t cfg = tiny();
    cfg.tie_embeddings = 1;
    cfg.n_kv_head = cfg.n_head;
    model_t *m = make_model(cfg, 12, 0.3f);
    assert_int_equal(model_find_tensor(m, "lm_head.weight"), -1);
    assert_ptr_equal(m->p.lm_head, m->p.embed);
    gradcheck(m, 2, 12, 0, 202);
    model_free(m);
}

static void test_gradcheck_masked_mqa(void **state)
{
    (void)state;
    model_config_t cfg = tiny();
    cfg.n_kv_head = 1; /* every query head shares one key/value head */
    model_t *m = make_model(cfg, 13, 0.3f);
    gradcheck(m, 2, 12, 3, 303); /* every third target masked */
    model_free(m);
}

/* Changing a later token must not change earlier logits. */
static void test_causal(void **state)
{
    (void)state;
    model_t *m = make_model(tiny(), 21, 0.3f);
    int T = 20, V = m->config.vocab_size;
    int32_t in[20];
    rng_state = 5;
    for (int i = 0; i < T; i++) in[i] = (int32_t)(rng_u32() % (uint32_t)V);
    assert_int_equal(model_forward(m, in, NULL, 1, T), IGRAD_OK);
    float *before = malloc((size_t)T * V * sizeof(float));
    assert_non_null(before);
    memcpy(before, m->acts.logits, (size_t)T * V * sizeof(float));
    in[12] = (in[12] + 1) % V;
    assert_int_equal(model_forward(m, in, NULL, 1, T), IGRAD_OK);
    for (int i = 0; i < 12 * V; i++)
        if (before[i] != m->acts.logits[i])
            fail_msg("logit %d (position %d) changed with token 12: %.9g vs %.9g", i, i / V,
                     before[i], m->acts.logits[i]);
    int changed = 0;
    for (int i = 12 * V; i < T * V; i++) changed += before[i] != m->acts.logits[i];
    assert_true(changed > 0);
    free(before);
    model_free(m);
}

/* Masked loss = mean of the unmasked per-position losses of a full run;
 * all masked = zero loss and zero gradient. */
static void test_masked_targets(void **state)
{
    (void)state;
    model_t *m = make_model(tiny(), 31, 0.3f);
    int B = 3, T = 10, BT = 30;
    int32_t in[30], full[30], masked[30], none[30];
    rng_state = 7;
    random_tokens(in, full, BT, m->config.vocab_size, 0);
    assert_int_equal(model_forward(m, in, full, B, T), IGRAD_OK);
    double per_pos[30], sum = 0.0;
    memcpy(per_pos, m->acts.losses, sizeof per_pos);
    int count = 0;
    for (int i = 0; i < BT; i++) {
        masked[i] = (i % T) < 4 ? MODEL_IGNORE_INDEX : full[i]; /* a "prompt" of 4 */
        none[i] = MODEL_IGNORE_INDEX;
        if (masked[i] != MODEL_IGNORE_INDEX) sum += per_pos[i], count++;
    }
    assert_int_equal(model_forward(m, in, masked, B, T), IGRAD_OK);
    assert_int_equal(m->loss_count, count);
    if (fabs(m->loss - sum / count) > 1e-12)
        fail_msg("masked loss %.12g, mean of unmasked positions %.12g", m->loss, sum / count);
    model_zero_grad(m);
    assert_int_equal(model_forward(m, in, none, B, T), IGRAD_OK);
    assert_true(m->loss == 0.0);
    assert_int_equal(model_backward(m), IGRAD_OK);
    for (int64_t i = 0; i < m->num_params; i++)
        if (m->grads[i] != 0.0f) fail_msg("grad[%lld] = %g with every target masked",
                                          (long long)i, m->grads[i]);
    int32_t bad[30];
    memcpy(bad, full, sizeof bad);
    bad[5] = m->config.vocab_size;
    assert_int_equal(model_forward(m, in, bad, B, T), IGRAD_E_INVALID);
    assert_int_equal(model_backward(m), IGRAD_E_STATE);
    model_free(m);
}

/* Two half batches with grads scaled by 1/2 = one full batch (equal target
 * counts), up to float rounding. */
static void test_accumulation(void **state)
{
    (void)state;
    model_t *m = make_model(tiny(), 41, 0.3f);
    int B = 4, T = 16, BT = B * T;
    int32_t in[64], tg[64];
    rng_state = 9;
    random_tokens(in, tg, BT, m->config.vocab_size, 0);
    model_zero_grad(m);
    assert_int_equal(model_forward(m, in, tg, B, T), IGRAD_OK);
    assert_int_equal(model_backward(m), IGRAD_OK);
    float *full = malloc((size_t)m->num_params * sizeof(float));
    assert_non_null(full);
    memcpy(full, m->grads, (size_t)m->num_params * sizeof(float));
    model_zero_grad(m);
    for (int half = 0; half < 2; half++) {
        assert_int_equal(model_forward(m, in + half * BT / 2, tg + half * BT / 2, B / 2, T),
                         IGRAD_OK);
        assert_int_equal(model_backward(m), IGRAD_OK);
    }
    optim_scale(m->grads, m->num_params, 0.5f);
    double maxabs = 0.0, maxerr = 0.0;
    for (int64_t i = 0; i < m->num_params; i++) {
        maxabs = fmax(maxabs, fabs(full[i]));
        maxerr = fmax(maxerr, fabs((double)full[i] - m->grads[i]));
    }
    if (maxerr > 1e-5 * maxabs)
        fail_msg("accumulated grads differ from the full batch by %.3g (max |g| %.3g)", maxerr,
                 maxabs);
    free(full);
    model_free(m);
}

/* Same inputs, same bits: twice in a row and with 1 vs 2 OpenMP threads. */
static void test_deterministic(void **state)
{
    (void)state;
    model_t *m = make_model(tiny(), 51, 0.3f);
    int B = 4, T = 32, BT = B * T;
    int32_t in[128], tg[128];
    rng_state = 11;
    random_tokens(in, tg, BT, m->config.vocab_size, 5);
    float *first = malloc((size_t)m->num_params * sizeof(float));
    assert_non_null(first);
    double first_loss = 0.0;
    int saved_threads = omp_get_max_threads();
    for (int run = 0; run < 3; run++) {
        omp_set_num_threads(run == 2 ? 2 : 1);
        model_zero_grad(m);
        assert_int_equal(model_forward(m, in, tg, B, T), IGRAD_OK);
        assert_int_equal(model_backward(m), IGRAD_OK);
        if (run == 0) {
            memcpy(first, m->grads, (size_t)m->num_params * sizeof(float));
            first_loss = m->loss;
            continue;
        }
        assert_true(first_loss == m->loss);
        for (int64_t i = 0; i < m->num_params; i++)
            if (memcmp(&first[i], &m->grads[i], sizeof(float)) != 0)
                fail_msg("run %d: grad[%lld] %.9g vs %.9g", run, (long long)i, first[i],
                         m->grads[i]);
    }
    omp_set_num_threads(saved_threads);
    free(first);
    model_free(m);
}

/* The tiny model memorises a short fixed text: 50 AdamW steps on the same
 * batch bring the loss well down, and everything stays finite. */
static void test_loss_goes_down(void **state)
{
    (void)state;
    static const char text[] =
        "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over "
        "the lazy dog again. pack my box with five dozen liquor jugs.";
    model_config_t cfg = tiny();
    model_t *m = make_model(cfg, 61, 0.02f);
    model_init_random(m, 61, 0.02f); /* HF init: norms exactly 1 */
    int B = 4, T = 32, BT = B * T;
    int32_t in[128], tg[128];
    int n = (int)strlen(text);
    for (int i = 0; i < BT; i++) {
        in[i] = (unsigned char)text[i % n];
        tg[i] = (unsigned char)text[(i + 1) % n];
    }
    optim_config_t oc = optim_config_default();
    oc.lr = 1e-2;
    oc.min_lr = 1e-3;
    oc.warmup_steps = 5;
    oc.total_steps = 50;
    oc.weight_decay = 0.0;
    optim_t *opt = NULL;
    assert_int_equal(optim_create_for_model(&oc, m, &opt), IGRAD_OK);
    double first = 0.0, last = 0.0;
    for (int step = 0; step < 50; step++) {
        model_zero_grad(m);
        assert_int_equal(model_forward(m, in, tg, B, T), IGRAD_OK);
        assert_int_equal(model_backward(m), IGRAD_OK);
        double norm = optim_clip_grad_norm(m->grads, m->num_params, oc.grad_clip);
        if (!isfinite(m->loss) || !isfinite(norm))
            fail_msg("step %d: loss %g, grad norm %g", step, m->loss, norm);
        optim_update(opt, m->params, m->grads, optim_lr(&oc, step));
        if (step == 0) first = m->loss;
        last = m->loss;
    }
    for (int64_t i = 0; i < m->num_params; i++)
        if (!isfinite(m->params[i])) fail_msg("param %lld is %g", (long long)i, m->params[i]);
    print_message("  loss %.4f -> %.4f over 50 steps\n", first, last);
    assert_true(first > 5.0 && first < 6.0); /* ~ln(257) = 5.55 at init */
    if (!(last < 0.5 * first)) fail_msg("loss only fell from %.4f to %.4f", first, last);
    assert_int_equal(opt->step, 50);
    optim_free(opt);
    model_free(m);
}

/* The parameter table is Hugging Face's, and igrad's layout of it agrees
 * with the flat-buffer offsets. */
static void test_table_and_layout(void **state)
{
    (void)state;
    model_config_t cfg = tiny();
    model_t *m = make_model(cfg, 1, 0.02f);
    assert_int_equal(m->n_tensors, 1 + 9 * cfg.n_layer + 2);
    assert_int_equal(m->num_params, model_config_num_params(&cfg));
    assert_string_equal(m->tensors[0].name, "model.embed_tokens.weight");
    assert_string_equal(m->tensors[1].name, "model.layers.0.self_attn.q_proj.weight");
    assert_string_equal(m->tensors[2].name, "model.layers.0.self_attn.k_proj.weight");
    assert_int_equal(m->tensors[2].shape[0], cfg.n_kv_head * (cfg.dim / cfg.n_head));
    assert_string_equal(m->tensors[8].name, "model.layers.0.input_layernorm.weight");
    assert_string_equal(m->tensors[m->n_tensors - 1].name, "lm_head.weight");
    igrad_layout_t *layout = NULL;
    assert_int_equal(model_layout(m, &layout), IGRAD_OK);
    assert_int_equal(igrad_layout_count(layout), m->n_tensors);
    assert_int_equal(igrad_layout_total_count(layout), m->num_params);
    for (int i = 0; i < m->n_tensors; i++) {
        igrad_tensor_info_t ti;
        assert_int_equal(igrad_layout_tensor(layout, (size_t)i, &ti), IGRAD_OK);
        assert_string_equal(ti.name, m->tensors[i].name);
        assert_int_equal(ti.offset, m->tensors[i].offset);
        assert_int_equal(ti.count, m->tensors[i].count);
    }
    float *ptrs[32];
    model_tensor_pointers(m, m->grads, ptrs);
    assert_ptr_equal(ptrs[0], m->g.embed);
    assert_ptr_equal(ptrs[7], m->g.layers[0].wdown);
    igrad_layout_free(layout);
    model_free(m);

    model_config_t bad = cfg;
    bad.n_kv_head = 3;
    model_t *none = NULL;
    assert_int_equal(model_create(&bad, &none), IGRAD_E_INVALID);
    assert_null(none);
    assert_non_null(strstr(trainer_last_error(), "num_key_value_heads"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_and_layout),
        cmocka_unit_test(test_gradcheck_untied_gqa),
        cmocka_unit_test(test_gradcheck_tied_mha),
        cmocka_unit_test(test_gradcheck_masked_mqa),
        cmocka_unit_test(test_causal),
        cmocka_unit_test(test_masked_targets),
        cmocka_unit_test(test_accumulation),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_loss_goes_down),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
