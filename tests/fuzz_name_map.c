/*
 * fuzz_name_map.c — fuzz target for the name-map file reader
 * (igrad__name_map_from_text): rule files with regexes, capture groups,
 * globs, comments and every layer form, mutated by tests/fuzz_main.c. Each
 * input is read twice (same status and message); a map that reads is
 * applied twice to a fixed set of names of several families (same kinds,
 * layers and statuses; a rule's failure only IGRAD_E_INVALID), and a layout
 * built with it has consistent components and the hash of remapping the
 * plain layout. Reader failures other than FORMAT (or NOMEM) are bugs.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "model/layout_internal.h"

int igrad_fuzz_one(const uint8_t *data, size_t size);
const char *igrad_fuzz_name(void);
size_t igrad_fuzz_seed_count(void);
const uint8_t *igrad_fuzz_seed(size_t i, size_t *size);
int igrad_fuzz_check_layout(const igrad_layout_t *layout);

static const char *const seeds[] = {
    "# rules\nenc\\.stage(\\d+)\\.qkv\\.(weight|bias) QKV 1\nglob:*.gate.weight OTHER none\n",
    "model\\.layers\\.[0-9]+\\.router\\.weight FC1 block\nglob:*.o_proj.* FC2 block\n",
    "glob:emb.* EMB -\r\nhead\\.(w|b) HEAD none # comment\n\n",
    "model\\.layers\\.([0-9]+)\\.ls#1 NORM 1\n[]a-z]+ NORM block\n[^]x]\\d V 1\n",
    "(a)(b)(c)(d)(e)(f)(g)(h)(i) Q 9\nx{2,3} K block\n",
};

static const char *const names[] = {
    "model.layers.3.self_attn.q_proj.weight",
    "model.layers.0.router.weight",
    "enc.stage12.qkv.weight",
    "encoder.layers.1.self_attn.in_proj_weight",
    "base_model.model.model.layers.2.mlp.down_proj.lora_A.default.weight",
    "emb.x",
    "head.w",
    "model.norm.weight",
    "abcdefghi",
    "xx",
    "a9",
};
#define NNAMES (sizeof names / sizeof names[0])

const char *igrad_fuzz_name(void) { return "name_map"; }

size_t igrad_fuzz_seed_count(void) { return sizeof seeds / sizeof seeds[0]; }

const uint8_t *igrad_fuzz_seed(size_t i, size_t *size)
{
    *size = strlen(seeds[i]);
    return (const uint8_t *)seeds[i];
}

static int apply_twice(const igrad_name_map_t *m)
{
    for (size_t i = 0; i < NNAMES; i++) {
        igrad_kind_t k1 = IGRAD_KIND_OTHER, k2 = IGRAD_KIND_OTHER;
        int l1 = -1, l2 = -1;
        igrad_status_t s1 = igrad_name_map_component_of(m, names[i], &k1, &l1);
        igrad_status_t s2 = igrad_name_map_component_of(m, names[i], &k2, &l2);
        if (s1 != s2 || (s1 == IGRAD_OK && (k1 != k2 || l1 != l2))) {
            fprintf(stderr, "'%s': not deterministic\n", names[i]);
            return 1;
        }
        if (s1 != IGRAD_OK && s1 != IGRAD_E_INVALID && s1 != IGRAD_E_NOMEM) {
            fprintf(stderr, "'%s': unexpected status %d: %s\n", names[i], (int)s1,
                    igrad_last_error());
            return 1;
        }
        if (s1 == IGRAD_OK && (k1 < 0 || k1 >= IGRAD_KIND_COUNT || l1 < -1)) {
            fprintf(stderr, "'%s': kind %d layer %d out of range\n", names[i], (int)k1, l1);
            return 1;
        }
    }
    return 0;
}

/* The layout of the names that add without error, with the map (or none). */
static igrad_layout_t *build(const igrad_name_map_t *m, int *bad)
{
    igrad_layout_t *l = NULL;
    if (igrad_layout_create(&l) != IGRAD_OK) return NULL;
    if (igrad_layout_set_name_map(l, m) != IGRAD_OK) {
        igrad_layout_free(l);
        return NULL;
    }
    int64_t shape[2] = {2, 3};
    for (size_t i = 0; i < NNAMES; i++) {
        igrad_status_t st = igrad_layout_add(l, names[i], IGRAD_DTYPE_F32, 2, shape);
        if (st != IGRAD_OK && st != IGRAD_E_INVALID && st != IGRAD_E_NOMEM) *bad = 1;
    }
    return l;
}

/* A layout built with the map: every tensor's component is its (layer,
 * kind); building it again, or remapping the plain layout, gives the same
 * hash when every name added (files carry no rules, so the file round
 * trips of igrad_fuzz_check_layout hold for the plain layout only). */
/* A layout built with the map: every tensor's component is its (layer,
 * kind); building it again, or remapping the plain layout, gives the same
 * hash when every name added (files carry no rules, so the file round
 * trips of igrad_fuzz_check_layout hold for the plain layout only). */
static int layout_with(const igrad_name_map_t *m)
{
    int bad = 0;
    igrad_layout_t *l = build(m, &bad), *again = build(m, &bad), *plain = build(NULL, &bad);
    if (l && again && plain) {
        for (size_t i = 0; !bad && i < igrad_layout_count(l); i++) {
            igrad_tensor_info_t t;
            igrad_component_info_t c;
            igrad_layout_tensor(l, i, &t);
            if (t.kind == IGRAD_KIND_OTHER) {
                bad = t.component != -1 || t.layer != -1;
            } else {
                bad = igrad_layout_component(l, (size_t)t.component, &c) != IGRAD_OK ||
                      c.layer != t.layer || c.kind != t.kind;
            }
            if (bad) fprintf(stderr, "tensor %zu points at the wrong component\n", i);
        }
        if (!bad && igrad_layout_hash(l) != igrad_layout_hash(again)) {
            fprintf(stderr, "not deterministic: layout hashes differ\n");
            bad = 1;
        }
        igrad_layout_t *re = NULL;
        if (!bad && igrad_layout_count(l) == NNAMES &&
            igrad_layout_remap(plain, m, &re) == IGRAD_OK &&
            igrad_layout_hash(re) != igrad_layout_hash(l)) {
            fprintf(stderr, "remap and a layout built with the map hash differently\n");
            bad = 1;
        }
        igrad_layout_free(re);
        if (!bad) bad = igrad_fuzz_check_layout(plain);
    }
    igrad_layout_free(l);
    igrad_layout_free(again);
    igrad_layout_free(plain);
    return bad;
}

int igrad_fuzz_one(const uint8_t *data, size_t size)
{
    igrad_name_map_t *a = NULL, *b = NULL;
    char msg[1024];
    const char *text = (const char *)data;
    igrad_status_t sa = igrad__name_map_from_text(text, size, "fuzz.map", &a);
    snprintf(msg, sizeof msg, "%s", sa == IGRAD_OK ? "" : igrad_last_error());
    igrad_status_t sb = igrad__name_map_from_text(text, size, "fuzz.map", &b);
    int bad = 0;
    if (sa != sb || (sa != IGRAD_OK && strcmp(msg, igrad_last_error()) != 0)) {
        fprintf(stderr, "not deterministic: %d '%s' vs %d '%s'\n", (int)sa, msg, (int)sb,
                igrad_last_error());
        bad = 1;
    } else if (sa == IGRAD_OK) {
        if (igrad_name_map_count(a) != igrad_name_map_count(b)) {
            fprintf(stderr, "not deterministic: rule counts differ\n");
            bad = 1;
        } else {
            bad = apply_twice(a) || layout_with(a);
        }
    } else if (a || b) {
        fprintf(stderr, "failed read left a map behind\n");
        bad = 1;
    } else if (sa != IGRAD_E_FORMAT && sa != IGRAD_E_NOMEM) {
        fprintf(stderr, "unexpected status %d: %s\n", (int)sa, msg);
        bad = 1;
    }
    igrad_name_map_free(a);
    igrad_name_map_free(b);
    return bad;
}
