/*
 * test_name_map.c — user name rules (igrad_name_map_t): regex rules with
 * the layer from a capture group, globs, the block's layer, first match
 * wins, fallback to the built-in rules, every refusal by name, the map
 * file reader, a layout's map (set before tensors, remap, folded into the
 * hash only when set) and the report of unmapped tensors in blocks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "igrad.h"
#include "model/layout_internal.h"

static void expect_map(const igrad_name_map_t *m, const char *name, int layer,
                       igrad_kind_t kind)
{
    igrad_kind_t k;
    int l;
    if (igrad_name_map_component_of(m, name, &k, &l) != IGRAD_OK) {
        print_error("'%s': %s\n", name, igrad_last_error());
        fail();
    }
    if (k != kind || l != layer) {
        print_error("'%s': got (%d, %s), expected (%d, %s)\n", name, l, igrad_kind_name(k),
                    layer, igrad_kind_name(kind));
        fail();
    }
}

static void expect_error(igrad_status_t st, igrad_status_t want, const char *needle)
{
    if (st != want || !strstr(igrad_last_error(), needle)) {
        print_error("status %d (want %d), message '%s' lacks '%s'\n", st, want,
                    igrad_last_error(), needle);
        fail();
    }
}

static void test_rules(void **state)
{
    (void)state;
    igrad_name_map_t *m = NULL;
    assert_int_equal(igrad_name_map_create(&m), IGRAD_OK);
    assert_int_equal(igrad_name_map_add(m, "enc\\.stage(\\d+)\\.qkv\\.(weight|bias)",
                                        IGRAD_KIND_QKV, 1),
                     IGRAD_OK);
    assert_int_equal(igrad_name_map_add(m, "glob:*.gate.weight", IGRAD_KIND_OTHER,
                                        IGRAD_NAME_LAYER_NONE),
                     IGRAD_OK);
    assert_int_equal(igrad_name_map_add(m, "model\\.layers\\.[0-9]+\\.router\\.weight",
                                        IGRAD_KIND_FC1, IGRAD_NAME_LAYER_BLOCK),
                     IGRAD_OK);
    /* shadows the built-in rules: the first matching rule decides */
    assert_int_equal(igrad_name_map_add(m, "glob:*.o_proj.*", IGRAD_KIND_FC2,
                                        IGRAD_NAME_LAYER_BLOCK),
                     IGRAD_OK);
    assert_int_equal(igrad_name_map_add(m, "glob:*.o_proj.weight", IGRAD_KIND_Q,
                                        IGRAD_NAME_LAYER_BLOCK),
                     IGRAD_OK);
    assert_int_equal(igrad_name_map_count(m), 5);

    expect_map(m, "enc.stage12.qkv.weight", 12, IGRAD_KIND_QKV);
    expect_map(m, "enc.stage3.qkv.bias", 3, IGRAD_KIND_QKV);
    expect_map(m, "xenc.stage3.qkv.bias", -1, IGRAD_KIND_OTHER); /* whole-name match */
    expect_map(m, "enc.stage3.qkv.biasx", -1, IGRAD_KIND_OTHER);
    expect_map(m, "model.layers.4.router.weight", 4, IGRAD_KIND_FC1);
    expect_map(m, "model.layers.4.self_attn.o_proj.weight", 4, IGRAD_KIND_FC2);
    expect_map(m, "model.layers.4.self_attn.q_proj.weight", 4, IGRAD_KIND_Q); /* built-in */
    expect_map(m, "model.layers.4.self_attn.q_proj.bias", 4, IGRAD_KIND_Q);
    expect_map(NULL, "model.layers.4.self_attn.o_proj.weight", 4, IGRAD_KIND_O);

    /* a layer that cannot be read from the matching name */
    igrad_kind_t k;
    int l;
    expect_error(igrad_name_map_component_of(m, "head.o_proj.weight", &k, &l),
                 IGRAD_E_INVALID, "no numbered block");
    igrad_name_map_free(m);

    assert_int_equal(igrad_name_map_create(&m), IGRAD_OK);
    assert_int_equal(igrad_name_map_add(m, "s\\.([a-z0-9]+)\\.w", IGRAD_KIND_V, 1), IGRAD_OK);
    expect_map(m, "s.17.w", 17, IGRAD_KIND_V);
    expect_error(igrad_name_map_component_of(m, "s.ab.w", &k, &l), IGRAD_E_INVALID,
                 "captured 'ab', not a layer number");
    /* refusals, each naming the rule */
    expect_error(igrad_name_map_add(m, "a(b", IGRAD_KIND_Q, 1), IGRAD_E_INVALID,
                 "rule 'a(b': not a POSIX extended regex");
    expect_error(igrad_name_map_add(m, "a)|(b", IGRAD_KIND_Q, 1), IGRAD_E_INVALID,
                 "rule 'a)|(b'");
    expect_error(igrad_name_map_add(m, "x(\\d+)", IGRAD_KIND_Q, 2), IGRAD_E_INVALID,
                 "layer from group 2, but the pattern has 1 group(s)");
    expect_error(igrad_name_map_add(m, "x", IGRAD_KIND_Q, IGRAD_NAME_LAYER_NONE),
                 IGRAD_E_INVALID, "kind Q needs a layer");
    expect_error(igrad_name_map_add(m, "x", IGRAD_KIND_EMB, IGRAD_NAME_LAYER_BLOCK),
                 IGRAD_E_INVALID, "kind EMB has no layer");
    expect_error(igrad_name_map_add(m, "glob:x*", IGRAD_KIND_Q, 1), IGRAD_E_INVALID,
                 "a glob has no capture groups");
    expect_error(igrad_name_map_add(m, "x", IGRAD_KIND_Q, 10), IGRAD_E_INVALID,
                 "layer 10");
    expect_error(igrad_name_map_add(m, "", IGRAD_KIND_Q, 1), IGRAD_E_INVALID, "empty pattern");
    /* bounds on what regcomp and matching may cost: nested intervals
     * (which made regcomp take gigabytes), back-references, long
     * patterns, globs with many stars; a modest interval still reads */
    expect_error(igrad_name_map_add(m, "((a{99}){99}){99}", IGRAD_KIND_Q, 1), IGRAD_E_INVALID,
                 "interval counts {m,n} too large");
    expect_error(igrad_name_map_add(m, "(a+){2,}", IGRAD_KIND_Q, 1), IGRAD_E_INVALID,
                 "nested repetition");
    expect_error(igrad_name_map_add(m, "(a{99})(b{99})(c{99})", IGRAD_KIND_Q, 1), IGRAD_E_INVALID,
                 "interval counts {m,n} too large");
    expect_error(igrad_name_map_add(m, ".***", IGRAD_KIND_NORM, IGRAD_NAME_LAYER_NONE),
                 IGRAD_E_INVALID, "nested repetition");
    expect_error(igrad_name_map_add(m, "x(.?)*", IGRAD_KIND_NORM, IGRAD_NAME_LAYER_NONE),
                 IGRAD_E_INVALID, "nested repetition");
    expect_error(igrad_name_map_add(m, "x{1,99999999999999999999}", IGRAD_KIND_Q, 1),
                 IGRAD_E_INVALID, "interval counts {m,n} too large");
    expect_error(igrad_name_map_add(m, "(a*)\\1", IGRAD_KIND_Q, 1), IGRAD_E_INVALID,
                 "a back-reference");
    expect_error(igrad_name_map_add(m, "glob:*a*b*c*d*", IGRAD_KIND_NORM, IGRAD_NAME_LAYER_NONE),
                 IGRAD_E_INVALID, "more than 4 '*'");
    {
        char long_pattern[600];
        memset(long_pattern, 'a', sizeof long_pattern - 1);
        long_pattern[sizeof long_pattern - 1] = '\0';
        expect_error(igrad_name_map_add(m, long_pattern, IGRAD_KIND_NORM, IGRAD_NAME_LAYER_NONE),
                     IGRAD_E_INVALID, "longer than 512 characters");
    }
    assert_int_equal(igrad_name_map_add(m, "blk\\.(\\d{1,3})\\.[a-z*]{2,8}(_[0-9]+)?\\.w+",
                                        IGRAD_KIND_Q, 1),
                     IGRAD_OK);
    assert_int_equal(igrad_name_map_count(m), 2);
    igrad_name_map_free(m);
    igrad_name_map_free(NULL);
}

static void test_map_file(void **state)
{
    (void)state;
    const char *text = "# user rules\n"
                       "\n"
                       "enc\\.stage(\\d+)\\.qkv\\.weight   QKV  1   # group 1\n"
                       "glob:*.gate.weight OTHER none\n"
                       "model\\.layers\\.[0-9]+\\.ls#1 NORM block\n"
                       "glob:emb.* EMB -\r\n";
    igrad_name_map_t *m = NULL;
    assert_int_equal(igrad__name_map_from_text(text, strlen(text), "m.txt", &m), IGRAD_OK);
    assert_int_equal(igrad_name_map_count(m), 4);
    expect_map(m, "enc.stage2.qkv.weight", 2, IGRAD_KIND_QKV);
    expect_map(m, "model.layers.2.ls#1", 2, IGRAD_KIND_NORM); /* '#' inside a field */
    expect_map(m, "emb.x", -1, IGRAD_KIND_EMB);
    igrad_name_map_free(m);

    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"a Q\n", "m.txt:1: 2 field(s)"},
        {"\na Q block extra\n", "m.txt:2: 4 field(s)"},
        {"a QQ block\n", "m.txt:1: unknown component kind 'QQ'"},
        {"a Q 0\n", "m.txt:1: layer '0'"},
        {"a Q somewhere\n", "m.txt:1: layer 'somewhere'"},
        {"a( Q block\n", "m.txt:1: name map: rule 'a(': not a POSIX"},
        {"a HEAD block\n", "m.txt:1: name map: rule 'a': kind HEAD has no layer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        m = (igrad_name_map_t *)1;
        expect_error(igrad__name_map_from_text(bad[i].text, strlen(bad[i].text), "m.txt", &m),
                     IGRAD_E_FORMAT, bad[i].needle);
        assert_null(m);
    }
    expect_error(igrad__name_map_from_text("a Q 1\0", 6, "m.txt", &m), IGRAD_E_FORMAT,
                 "NUL byte");
    expect_error(igrad_name_map_load("/nonexistent/map.txt", &m), IGRAD_E_IO,
                 "/nonexistent/map.txt");
}

/* A UTF-8 byte order mark before the first rule is not part of its pattern. */
static void test_map_file_bom(void **state)
{
    (void)state;
    const char *text = "\xEF\xBB\xBFmodel\\.extra_scale NORM none\nb Q block\n";
    igrad_name_map_t *m = NULL;
    assert_int_equal(igrad__name_map_from_text(text, strlen(text), "m.txt", &m), IGRAD_OK);
    assert_int_equal(igrad_name_map_count(m), 2);
    expect_map(m, "model.extra_scale", -1, IGRAD_KIND_NORM);
    igrad_name_map_free(m);
}

/* The cost of a map is bounded as a whole (docs/formats.md §3a): an
 * optional part repeated by an interval weighs count^2, a file holds at most
 * 256 rules and a summed weight of at most 16384, each refusal at file:line. */
static void test_map_file_bounds(void **state)
{
    (void)state;
    igrad_name_map_t *m = (igrad_name_map_t *)1;
    const char *worst = "(x?){800} OTHER none\n";
    expect_error(igrad__name_map_from_text(worst, strlen(worst), "m.txt", &m), IGRAD_E_FORMAT,
                 "m.txt:1: name map: rule '(x?){800}': an optional part repeated");
    assert_null(m);
    /* a count over a part that is not optional is a plain copy (x count) */
    const char *plain = "(xy){1000} OTHER none\n";
    expect_error(igrad__name_map_from_text(plain, strlen(plain), "m.txt", &m), IGRAD_E_FORMAT,
                 "interval counts {m,n} too large");
    const char *fine = "(x?){20}z OTHER none\n(xy){800} OTHER none\n";
    assert_int_equal(igrad__name_map_from_text(fine, strlen(fine), "m.txt", &m), IGRAD_OK);
    igrad_name_map_free(m);

    /* 257 plain rules: the 257th is refused by line */
    size_t cap = 300 * 32;
    char *text = malloc(cap), *p = text;
    for (int i = 0; i < 300; i++) p += snprintf(p, cap - (size_t)(p - text), "rule%d OTHER none\n", i);
    m = (igrad_name_map_t *)1;
    expect_error(igrad__name_map_from_text(text, (size_t)(p - text), "m.txt", &m), IGRAD_E_FORMAT,
                 "m.txt:257: name map: more than 256 rules");
    assert_null(m);
    /* heavy rules: the summed weight refuses the third (3 x 8100 > 16384) */
    p = text;
    for (int i = 0; i < 3; i++) p += snprintf(p, cap - (size_t)(p - text), "(x?){30}%d OTHER none\n", i);
    m = (igrad_name_map_t *)1;
    expect_error(igrad__name_map_from_text(text, (size_t)(p - text), "m.txt", &m), IGRAD_E_FORMAT,
                 "m.txt:3: name map: rule '(x?){30}2' brings the rules' total weight");
    assert_null(m);
    free(text);
}

static igrad_layout_t *mlp_layout(const igrad_name_map_t *m)
{
    static const char *const names[] = {
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.router.weight",
        "model.layers.0.mystery.weight",          "model.layers.1.mystery.weight",
        "model.extra_scale",
    };
    igrad_layout_t *l = NULL;
    assert_int_equal(igrad_layout_create(&l), IGRAD_OK);
    assert_int_equal(igrad_layout_set_name_map(l, m), IGRAD_OK);
    int64_t shape[2] = {4, 25};
    for (size_t i = 0; i < 5; i++)
        assert_int_equal(igrad_layout_add(l, names[i], IGRAD_DTYPE_F32, 2, shape), IGRAD_OK);
    return l;
}

static void test_layout_map(void **state)
{
    (void)state;
    igrad_name_map_t *m = NULL;
    assert_int_equal(igrad_name_map_create(&m), IGRAD_OK);
    assert_int_equal(igrad_name_map_add(m, "glob:*.router.weight", IGRAD_KIND_FC1,
                                        IGRAD_NAME_LAYER_BLOCK),
                     IGRAD_OK);

    igrad_layout_t *plain = mlp_layout(NULL), *mapped = mlp_layout(m);
    igrad_tensor_info_t ti;
    assert_int_equal(igrad_layout_tensor(plain, 1, &ti), IGRAD_OK);
    assert_int_equal(ti.kind, IGRAD_KIND_OTHER);
    assert_int_equal(igrad_layout_tensor(mapped, 1, &ti), IGRAD_OK);
    assert_int_equal(ti.kind, IGRAD_KIND_FC1);
    assert_int_equal(ti.layer, 0);
    assert_int_equal(igrad_layout_component_count(plain), 1);
    assert_int_equal(igrad_layout_component_count(mapped), 2);

    /* The hash: names/dtypes/shapes alone without a map (the same chain
     * as before maps existed), the assignment folded in with one. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < igrad_layout_count(plain); i++) {
        assert_int_equal(igrad_layout_tensor(plain, i, &ti), IGRAD_OK);
        for (const char *c = ti.name;; c++) {
            h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
            if (!*c) break;
        }
        int64_t vals[4] = {ti.dtype, ti.ndim, ti.shape[0], ti.shape[1]};
        for (int v = 0; v < 4; v++)
            for (int b = 0; b < 8; b++)
                h = (h ^ (((uint64_t)vals[v] >> (8 * b)) & 0xff)) * 0x100000001b3ull;
    }
    assert_int_equal(igrad_layout_hash(plain), h);
    assert_int_not_equal(igrad_layout_hash(mapped), h);

    /* the same assignment through another map hashes the same; a map
     * that changes no assignment (empty, or rules that match nothing)
     * leaves the hash as it was */
    igrad_name_map_t *m2 = NULL, *empty = NULL;
    assert_int_equal(igrad_name_map_create(&m2), IGRAD_OK);
    assert_int_equal(igrad_name_map_add(m2, "model\\.layers\\.([0-9])\\.router\\.weight",
                                        IGRAD_KIND_FC1, 1),
                     IGRAD_OK);
    assert_int_equal(igrad_name_map_create(&empty), IGRAD_OK);
    igrad_layout_t *mapped2 = mlp_layout(m2), *emptied = mlp_layout(empty);
    assert_int_equal(igrad_layout_hash(mapped2), igrad_layout_hash(mapped));
    assert_int_equal(igrad_layout_hash(emptied), igrad_layout_hash(plain));
    assert_int_equal(igrad_name_map_add(empty, "glob:nothing.*", IGRAD_KIND_Q,
                                        IGRAD_NAME_LAYER_BLOCK),
                     IGRAD_OK);
    igrad_layout_t *unmatched = mlp_layout(empty);
    assert_int_equal(igrad_layout_hash(unmatched), igrad_layout_hash(plain));
    igrad_layout_free(unmatched);

    /* remap = building with the map; remap to NULL = the plain layout */
    igrad_layout_t *re = NULL, *back = NULL;
    assert_int_equal(igrad_layout_remap(plain, m, &re), IGRAD_OK);
    assert_int_equal(igrad_layout_hash(re), igrad_layout_hash(mapped));
    assert_int_equal(igrad_layout_component_count(re), 2);
    assert_int_equal(igrad_layout_remap(re, NULL, &back), IGRAD_OK);
    assert_int_equal(igrad_layout_hash(back), igrad_layout_hash(plain));
    assert_string_equal(igrad_layout_family(re), igrad_layout_family(plain));
    igrad_layout_t *like = NULL;
    assert_int_equal(igrad__layout_create_like(mapped, &like), IGRAD_OK);
    int64_t shape[2] = {4, 25};
    assert_int_equal(igrad_layout_add(like, "model.layers.3.router.weight", IGRAD_DTYPE_F32, 2,
                                      shape),
                     IGRAD_OK);
    assert_int_equal(igrad_layout_tensor(like, 0, &ti), IGRAD_OK);
    assert_int_equal(ti.kind, IGRAD_KIND_FC1);

    /* a map comes before the tensors */
    expect_error(igrad_layout_set_name_map(mapped, m), IGRAD_E_INVALID, "already has 5 tensors");

    /* a rule whose layer cannot be read fails the add, naming the tensor */
    igrad_name_map_t *bad = NULL;
    assert_int_equal(igrad_name_map_create(&bad), IGRAD_OK);
    assert_int_equal(igrad_name_map_add(bad, "glob:*scale", IGRAD_KIND_NORM,
                                        IGRAD_NAME_LAYER_BLOCK),
                     IGRAD_OK);
    igrad_layout_t *bl = NULL;
    expect_error(igrad_layout_remap(plain, bad, &bl), IGRAD_E_INVALID,
                 "tensor 'model.extra_scale' matches rule 1");
    assert_null(bl);

    /* unmapped: OTHER inside a numbered block only (not model.extra_scale) */
    assert_int_equal(igrad_layout_is_unmapped(plain, 0), 0);
    assert_int_equal(igrad_layout_is_unmapped(plain, 1), 1);
    assert_int_equal(igrad_layout_is_unmapped(plain, 2), 1);
    assert_int_equal(igrad_layout_is_unmapped(plain, 4), 0);
    assert_int_equal(igrad_layout_is_unmapped(plain, 99), 0);
    assert_int_equal(igrad_layout_is_unmapped(mapped, 1), 0);
    char *text = NULL;
    assert_int_equal(igrad_layout_unmapped_report(plain, 2, &text), IGRAD_OK);
    assert_non_null(text);
    assert_non_null(strstr(text, "3 of 5 tensors inside numbered blocks (60.00 % of the entries)"));
    assert_non_null(strstr(text, "model.layers.0.router.weight (20.00 %), "
                                 "model.layers.0.mystery.weight (20.00 %), ..."));
    assert_null(strstr(text, "model.layers.1.mystery"));
    assert_non_null(strstr(text, "--map FILE"));
    igrad_free(text);
    assert_int_equal(igrad_layout_unmapped_report(mapped, 10, &text), IGRAD_OK);
    assert_non_null(strstr(text, "2 of 5 tensors"));
    assert_non_null(strstr(text, "model.layers.1.mystery.weight (20.00 %);"));
    igrad_free(text);
    igrad_layout_t *clean = NULL;
    assert_int_equal(igrad_layout_create(&clean), IGRAD_OK);
    assert_int_equal(igrad_layout_add(clean, "model.layers.0.mlp.up_proj.weight",
                                      IGRAD_DTYPE_F32, 2, shape),
                     IGRAD_OK);
    text = (char *)1;
    assert_int_equal(igrad_layout_unmapped_report(clean, 10, &text), IGRAD_OK);
    assert_null(text);

    igrad_layout_free(clean);
    igrad_layout_free(like);
    igrad_layout_free(re);
    igrad_layout_free(back);
    igrad_layout_free(plain);
    igrad_layout_free(mapped);
    igrad_layout_free(mapped2);
    igrad_layout_free(emptied);
    igrad_name_map_free(m);
    igrad_name_map_free(m2);
    igrad_name_map_free(empty);
    igrad_name_map_free(bad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_map_file),
        cmocka_unit_test(test_map_file_bom),
        cmocka_unit_test(test_map_file_bounds),
        cmocka_unit_test(test_layout_map),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
