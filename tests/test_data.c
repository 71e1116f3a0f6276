/*
 * test_data.c — the trainer's data side (trainer/data.c): tokenizer round
 * trip, every source kind read from files written into a temporary folder,
 * the document split, rank-independent batches, validation sequences and
 * every documented error. References are computed here independently: the
 * expected token streams are spelled out, windows are located by brute-force
 * search in the stream, the per-epoch window set is checked by sorting.
 *
 * The real corpora are tested by `test_data --corpus` (its own CTest entry,
 * test_data_corpus) in the data directory the trainer would use
 * ($IGRAD_DATA_DIR, else the source tree's data/). A corpus that
 * scripts/fetch-corpus has not prepared is a cmocka skip; when none is,
 * the run exits 77, which CTest reports as "Skipped", never "Passed".
 */
#define _XOPEN_SOURCE 700

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"

static char g_tmp[256];

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static const char *tmp_path(const char *name)
{
    static char buf[8][512];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", g_tmp, name);
    return p;
}

static void write_bytes(const char *name, const void *data, size_t n)
{
    const char *path = tmp_path(name);
    /* make parent folders */
    char dir[512];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *s = dir + strlen(g_tmp) + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            mkdir(dir, 0755);
            *s = '/';
        }
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(data, 1, n, fp), n);
    assert_int_equal(fclose(fp), 0);
}

static void write_text(const char *name, const char *text)
{
    write_bytes(name, text, strlen(text));
}

static data_options_t opts_with(int T, double val_fraction)
{
    data_options_t o = DATA_OPTIONS_INIT;
    o.seq_len = T;
    o.val_fraction = val_fraction;
    return o;
}

/* The expected stream: documents each followed by EOT. */
static void assert_stream(const data_split_t *sp, const char *const *docs, size_t ndocs)
{
    size_t at = 0;
    for (size_t d = 0; d < ndocs; d++) {
        size_t n = strlen(docs[d]);
        assert_true(at + n + 1 <= sp->count);
        for (size_t i = 0; i < n; i++) {
            if (sp->tokens[at + i] != (unsigned char)docs[d][i])
                print_error("doc %zu byte %zu: token %u, expected %u\n", d, i,
                            (unsigned)sp->tokens[at + i], (unsigned)(unsigned char)docs[d][i]);
            assert_int_equal(sp->tokens[at + i], (unsigned char)docs[d][i]);
        }
        assert_int_equal(sp->tokens[at + n], DATA_EOT);
        at += n + 1;
    }
    assert_int_equal(at, sp->count);
    assert_int_equal(sp->ndocs, ndocs);
}

static int expect_error(const char *spec, const data_options_t *o, int status,
                        const char *needle)
{
    dataset_t ds;
    data_error_t err;
    int st = dataset_load(&ds, spec, o, &err);
    if (st != status || !strstr(err.message, needle))
        print_error("spec '%s': status %d (want %d), message '%s' (want '%s')\n", spec, st,
                    status, err.message, needle);
    assert_int_equal(st, status);
    assert_int_equal(err.status, status);
    assert_non_null(strstr(err.message, needle));
    assert_null(ds.train.tokens); /* zeroed on failure */
    dataset_free(&ds);
    return st;
}

/* Position of `row` (T+1 tokens) in the stream, found by brute force;
 * (size_t)-1 when absent. */
static size_t find_window(const data_split_t *sp, const int *inputs, const int *targets,
                          size_t T)
{
    for (size_t s = 0; s + T + 1 <= sp->count; s++) {
        size_t t = 0;
        while (t < T && sp->tokens[s + t] == inputs[t] && sp->tokens[s + t + 1] == targets[t])
            t++;
        if (t == T) return s;
    }
    return (size_t)-1;
}

/* Text that makes every 17-byte window unique with overwhelming odds. */
static void random_text(char *out, size_t n, uint64_t seed)
{
    uint64_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        out[i] = (char)('a' + (x >> 11) % 26);
    }
    out[n] = '\0';
}

/* ------------------------------------------------------------------------ */
/* Setup                                                                    */
/* ------------------------------------------------------------------------ */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/igrad-test-data-XXXXXX");
    return mkdtemp(g_tmp) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return nftw(g_tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ------------------------------------------------------------------------ */
/* Tests                                                                    */
/* ------------------------------------------------------------------------ */

static void test_tokenizer_round_trip(void **state)
{
    (void)state;
    unsigned char bytes[256 * 3];
    data_token_t tok[sizeof bytes];
    char back[sizeof bytes];
    for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (unsigned char)((i * 167 + 13) % 256);
    data_encode(bytes, sizeof bytes, tok);
    for (size_t i = 0; i < sizeof bytes; i++) assert_int_equal(tok[i], bytes[i]);
    assert_int_equal(data_decode(tok, sizeof bytes, back, sizeof back), sizeof bytes);
    assert_memory_equal(back, bytes, sizeof bytes);

    /* EOT renders as its marker; the return value is the full length even
     * when the buffer is too small (like snprintf). */
    data_token_t mixed[] = {'h', 'i', DATA_EOT, 'x'};
    char out[64];
    size_t need = data_decode(mixed, 4, out, sizeof out);
    assert_int_equal(need, 3 + strlen(DATA_EOT_TEXT));
    out[need] = '\0';
    assert_string_equal(out, "hi" DATA_EOT_TEXT "x");
    memset(out, '#', sizeof out);
    assert_int_equal(data_decode(mixed, 4, out, 3), need);
    assert_memory_equal(out, "hi<#", 4);
    assert_int_equal(DATA_VOCAB_SIZE, 257);
}

static void test_text_file(void **state)
{
    (void)state;
    write_text("one.txt", "Hello, world.\nSecond line\n");
    data_options_t o = opts_with(4, 0.0);
    dataset_t ds;
    data_error_t err;
    assert_int_equal(dataset_load(&ds, tmp_path("one.txt"), &o, &err), DATA_OK);
    const char *docs[] = {"Hello, world.\nSecond line\n"};
    assert_stream(&ds.train, docs, 1);
    assert_null(ds.train.counts);
    assert_int_equal(ds.val.count, 0);
    assert_int_equal(ds.nval_seqs, 0);
    assert_int_equal(ds.ndocs, 1);
    assert_int_equal(ds.nwindows, (ds.train.count - 1) / 4);
    dataset_free(&ds);
    dataset_free(&ds); /* zeroed: harmless */
    dataset_free(NULL);

    /* a .jsonl file forced to plain text with text: */
    write_text("raw.jsonl", "{\"text\": \"a\"}\n");
    char spec[600];
    snprintf(spec, sizeof spec, "text:%s", tmp_path("raw.jsonl"));
    assert_int_equal(dataset_load(&ds, spec, &o, &err), DATA_OK);
    const char *raw[] = {"{\"text\": \"a\"}\n"};
    assert_stream(&ds.train, raw, 1);
    dataset_free(&ds);
}

static void test_directory(void **state)
{
    (void)state;
    write_text("dir/b.txt", "bravo");
    write_text("dir/a.txt", "alpha");
    write_text("dir/sub/c.md", "charlie");
    write_text("dir/.hidden", "never read");
    write_text("dir/.git/config", "never read either");
    write_text("dir/empty.txt", "");
    write_text("dir/blank.txt", "  \n\t\n");
    const unsigned char bin[] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, 0, 0};
    write_bytes("dir/zz.bin", bin, sizeof bin);
    const char overstrike[] = "b\bbold\033[0m text";
    write_text("dir/d.txt", overstrike);

    data_options_t o = opts_with(3, 0.0);
    dataset_t ds;
    data_error_t err;
    assert_int_equal(dataset_load(&ds, tmp_path("dir"), &o, &err), DATA_OK);
    /* sorted by path; empty and blank files drop out; hidden entries (2)
     * and the binary file are skipped and counted */
    const char *docs[] = {"alpha", "bravo", overstrike, "charlie"};
    assert_stream(&ds.train, docs, 4);
    assert_int_equal(ds.nskipped, 3);
    dataset_free(&ds);

    /* a comma-separated spec concatenates in order */
    char spec[1200];
    snprintf(spec, sizeof spec, "%s, %s", tmp_path("dir/sub"), tmp_path("dir/a.txt"));
    assert_int_equal(dataset_load(&ds, spec, &o, &err), DATA_OK);
    const char *two[] = {"charlie", "alpha"};
    assert_stream(&ds.train, two, 2);
    assert_string_equal(ds.spec, spec);
    dataset_free(&ds);
}

static void test_jsonl_text(void **state)
{
    (void)state;
    write_text("t.jsonl",
               "{\"text\": \"first doc\", \"id\": 1}\r\n"
               "\n"
               "{\"text\": \"second\\nwith \\\"quotes\\\" and \\u00e9\"}\n"
               "   \n"
               "{\"meta\": {\"x\": [1,2]}, \"text\": \"third\"}");
    data_options_t o = opts_with(2, 0.0);
    dataset_t ds;
    data_error_t err;
    assert_int_equal(dataset_load(&ds, tmp_path("t.jsonl"), &o, &err), DATA_OK);
    const char *docs[] = {"first doc", "second\nwith \"quotes\" and \xc3\xa9", "third"};
    assert_stream(&ds.train, docs, 3);
    dataset_free(&ds);

    char spec[600];
    snprintf(spec, sizeof spec, "jsonl:%s", tmp_path("t.jsonl"));
    assert_int_equal(dataset_load(&ds, spec, &o, &err), DATA_OK);
    assert_stream(&ds.train, docs, 3);
    dataset_free(&ds);
}

/* "\u0000" in a JSONL string: cJSON's C strings ended the document there
 * ("abc\u0000def" trained on "abc"). Refused with file:line:column; an
 * escaped backslash before "u0000" is ordinary text. A raw NUL byte made
 * cJSON ignore the rest of the line. */
static void test_jsonl_nul(void **state)
{
    (void)state;
    data_options_t o = opts_with(2, 0.0);
    char spec[600];
    write_text("nul.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"abc\\u0000def\"}\n");
    snprintf(spec, sizeof spec, "%s", tmp_path("nul.jsonl"));
    expect_error(spec, &o, DATA_E_FORMAT, "nul.jsonl:2:14: string \"abc\\u0000...\" holds");
    write_text("nul_a.jsonl", "{\"instruction\": \"Say\\u0000 hi.\", \"output\": \"Hi\"}\n");
    snprintf(spec, sizeof spec, "%s", tmp_path("nul_a.jsonl"));
    expect_error(spec, &o, DATA_E_FORMAT, "nul_a.jsonl:1:21: string \"Say\\u0000...\"");
    write_text("nul_k.jsonl", "{\"te\\u0000xt\": \"a\", \"text\": \"b\"}\n");
    snprintf(spec, sizeof spec, "%s", tmp_path("nul_k.jsonl"));
    expect_error(spec, &o, DATA_E_FORMAT, "holds \\u0000");
    write_bytes("nul_b.jsonl", "{\"text\": \"a\"}\0{\"text\"\n", 23);
    snprintf(spec, sizeof spec, "%s", tmp_path("nul_b.jsonl"));
    expect_error(spec, &o, DATA_E_FORMAT, "nul_b.jsonl:1:14: NUL byte");

    write_text("bs.jsonl", "{\"text\": \"C:\\\\u0000\"}\n");
    dataset_t ds;
    data_error_t err;
    assert_int_equal(dataset_load(&ds, tmp_path("bs.jsonl"), &o, &err), DATA_OK);
    const char *docs[] = {"C:\\u0000"};
    assert_stream(&ds.train, docs, 1);
    dataset_free(&ds);
}

#define P1 "### Instruction:\nAdd the numbers.\n\n### Input:\n2 and 3\n\n### Response:\n"
#define R1 "5"
#define P2 "### Instruction:\nSay hi.\n\n### Response:\n"
#define R2 "Hi there!"
#define P3 "### Instruction:\nName a color.\n\n### Response:\n"
#define R3 "Blue."

static void write_alpaca(void)
{
    write_text("a.jsonl",
               "{\"instruction\": \"Add the numbers.\", \"input\": \"2 and 3\", \"output\": \"5\"}\n"
               "{\"instruction\": \"Say hi.\", \"input\": \"\", \"output\": \"Hi there!\"}\n"
               "{\"instruction\": \"Name a color.\", \"output\": \"Blue.\"}\n");
}

static void test_alpaca(void **state)
{
    (void)state;
    write_alpaca();
    const char *docs[] = {P1 R1, P2 R2, P3 R3};
    const size_t prompt[] = {strlen(P1), strlen(P2), strlen(P3)};
    dataset_t ds;
    data_error_t err;

    for (int response_only = 0; response_only <= 1; response_only++) {
        /* T = stream length - 1 makes one window that starts at 0, so the
         * batch row is the whole stream. */
        size_t total = strlen(docs[0]) + strlen(docs[1]) + strlen(docs[2]) + 3;
        data_options_t o = opts_with((int)total - 1, 0.0);
        o.response_only = response_only;
        assert_int_equal(dataset_load(&ds, tmp_path("a.jsonl"), &o, &err), DATA_OK);
        assert_stream(&ds.train, docs, 3);
        assert_int_equal(ds.nwindows, 1);
        const size_t T = total - 1;
        int *in = malloc(T * sizeof *in), *tg = malloc(T * sizeof *tg);
        assert_non_null(in);
        assert_non_null(tg);
        assert_int_equal(dataset_train_batch(&ds, 7, 1, 0, 1, in, tg, &err), DATA_OK);
        /* reference mask: target position p (stream index t+1) is masked iff
         * p lies inside a prompt */
        size_t doc_start = 0, d = 0, masked = 0;
        for (size_t t = 0; t < T; t++) {
            size_t p = t + 1;
            while (p >= doc_start + strlen(docs[d]) + 1) doc_start += strlen(docs[d++]) + 1;
            int is_prompt = p - doc_start < prompt[d];
            int want = (response_only && is_prompt) ? -1 : (int)ds.train.tokens[p];
            if (tg[t] != want)
                print_error("response_only=%d t=%zu: target %d, expected %d\n", response_only,
                            t, tg[t], want);
            assert_int_equal(tg[t], want);
            assert_int_equal(in[t], ds.train.tokens[t]);
            masked += tg[t] == -1;
        }
        /* the first prompt byte is only ever an input, never a target */
        assert_int_equal(masked, response_only ? prompt[0] - 1 + prompt[1] + prompt[2] : 0);
        if (!response_only) assert_null(ds.train.counts);
        free(in);
        free(tg);
        dataset_free(&ds);
    }

    /* alpaca: forces the kind; a text-only file is then an error */
    char spec[600];
    snprintf(spec, sizeof spec, "alpaca:%s", tmp_path("a.jsonl"));
    data_options_t o = opts_with(4, 0.0);
    assert_int_equal(dataset_load(&ds, spec, &o, &err), DATA_OK);
    assert_stream(&ds.train, docs, 3);
    dataset_free(&ds);
    write_text("textonly.jsonl", "{\"text\": \"abc\"}\n");
    snprintf(spec, sizeof spec, "alpaca:%s", tmp_path("textonly.jsonl"));
    expect_error(spec, &o, DATA_E_FORMAT, ":1: alpaca record without an \"instruction\"");
}

/* A directory of `ndocs` documents "doc NNN <random text>". */
static void write_many(const char *dir, int ndocs, size_t nbytes)
{
    char name[128], *text = malloc(nbytes + 32);
    assert_non_null(text);
    for (int i = 0; i < ndocs; i++) {
        snprintf(name, sizeof name, "%s/%04d.txt", dir, i);
        int k = snprintf(text, 32, "doc %04d ", i);
        random_text(text + k, nbytes, (uint64_t)i + 1);
        write_text(name, text);
    }
    free(text);
}

/* The document ids ("doc NNNN") of a split, in stream order. */
static size_t split_ids(const data_split_t *sp, int *ids, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < sp->count; i++) {
        if (i == 0 || sp->tokens[i - 1] == DATA_EOT) {
            char head[9];
            for (int k = 0; k < 8; k++) head[k] = (char)sp->tokens[i + (size_t)k];
            head[8] = '\0';
            assert_true(n < cap);
            assert_int_equal(sscanf(head, "doc %d", &ids[n]), 1);
            n++;
        }
    }
    return n;
}

static void test_split(void **state)
{
    (void)state;
    write_many("many", 200, 40);
    data_options_t o = opts_with(8, 0.1);
    dataset_t a, b, c;
    data_error_t err;
    assert_int_equal(dataset_load(&a, tmp_path("many"), &o, &err), DATA_OK);
    assert_int_equal(dataset_load(&b, tmp_path("many"), &o, &err), DATA_OK);
    o.seed = 99;
    assert_int_equal(dataset_load(&c, tmp_path("many"), &o, &err), DATA_OK);

    int tr[256], va[256], seen[200] = {0};
    size_t ntr = split_ids(&a.train, tr, 256), nva = split_ids(&a.val, va, 256);
    assert_int_equal(ntr, a.train.ndocs);
    assert_int_equal(nva, a.val.ndocs);
    assert_int_equal(ntr + nva, 200);
    assert_int_equal(a.ndocs, 200);
    /* disjoint and covering; each split keeps document order */
    for (size_t i = 0; i < ntr; i++) seen[tr[i]]++;
    for (size_t i = 0; i < nva; i++) seen[va[i]]++;
    for (int i = 0; i < 200; i++) assert_int_equal(seen[i], 1);
    for (size_t i = 1; i < ntr; i++) assert_true(tr[i - 1] < tr[i]);
    for (size_t i = 1; i < nva; i++) assert_true(va[i - 1] < va[i]);
    /* roughly the fraction asked for (binomial(200, 0.1): mean 20, sd 4.2) */
    assert_in_range(nva, 5, 40);
    /* deterministic; another seed gives another split */
    assert_int_equal(a.val.count, b.val.count);
    assert_memory_equal(a.val.tokens, b.val.tokens, a.val.count * sizeof *a.val.tokens);
    assert_memory_equal(a.train.tokens, b.train.tokens, a.train.count * sizeof *a.train.tokens);
    int vc[256];
    size_t nvc = split_ids(&c.val, vc, 256);
    assert_true(nvc != nva || memcmp(vc, va, nva * sizeof *va) != 0);
    dataset_free(&a);
    dataset_free(&b);
    dataset_free(&c);

    /* tiny fractions still leave one validation document; two documents
     * always split one and one */
    o = opts_with(2, 1e-9);
    assert_int_equal(dataset_load(&a, tmp_path("many"), &o, &err), DATA_OK);
    assert_int_equal(a.val.ndocs, 1);
    dataset_free(&a);
    o.val_fraction = 0.999999;
    write_text("pair/x.txt", "xxxx");
    write_text("pair/y.txt", "yyyy");
    assert_int_equal(dataset_load(&a, tmp_path("pair"), &o, &err), DATA_OK);
    assert_int_equal(a.val.ndocs, 1);
    assert_int_equal(a.train.ndocs, 1);
    dataset_free(&a);
}

static void test_batches_same_for_any_rank_count(void **state)
{
    (void)state;
    write_many("batch", 30, 200);
    data_options_t o = opts_with(16, 0.1);
    dataset_t ds;
    data_error_t err;
    assert_int_equal(dataset_load(&ds, tmp_path("batch"), &o, &err), DATA_OK);
    const size_t T = 16;
    enum { G = 8 };
    int in1[G * 16], tg1[G * 16], inP[G * 16], tgP[G * 16];
    for (int64_t step = 0; step < 40; step++) {
        assert_int_equal(dataset_train_batch(&ds, step, G, 0, 1, in1, tg1, &err), DATA_OK);
        for (int P = 2; P <= 4; P *= 2) {
            for (int r = 0; r < P; r++) {
                size_t off = (size_t)r * (G / P) * T;
                assert_int_equal(dataset_train_batch(&ds, step, G, r, P, inP + off, tgP + off,
                                                     &err), DATA_OK);
            }
            assert_memory_equal(inP, in1, sizeof in1);
            assert_memory_equal(tgP, tg1, sizeof tg1);
        }
        /* every row is a real window of the training stream */
        for (int b = 0; b < G; b++)
            assert_true(find_window(&ds.train, in1 + b * T, tg1 + b * T, T) != (size_t)-1);
    }
    /* a pure function of the step: asking again (out of order) repeats it */
    int again[G * 16], again_t[G * 16];
    assert_int_equal(dataset_train_batch(&ds, 3, G, 0, 1, in1, tg1, &err), DATA_OK);
    assert_int_equal(dataset_train_batch(&ds, 39, G, 0, 1, again, again_t, &err), DATA_OK);
    assert_int_equal(dataset_train_batch(&ds, 3, G, 0, 1, again, again_t, &err), DATA_OK);
    assert_memory_equal(again, in1, sizeof in1);
    assert_memory_equal(again_t, tg1, sizeof tg1);
    /* consecutive steps differ */
    assert_int_equal(dataset_train_batch(&ds, 4, G, 0, 1, again, again_t, &err), DATA_OK);
    assert_memory_not_equal(again, in1, sizeof in1);
    dataset_free(&ds);
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

static void test_epoch_covers_every_window(void **state)
{
    (void)state;
    write_many("epoch", 12, 100);
    /* several T, so the permutation is exercised on several window counts
     * (odd and even bit widths) */
    static const size_t Ts[] = {16, 12, 40, 100};
    for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
        const size_t T = Ts[ti];
        data_options_t o = opts_with((int)T, 0.0);
        dataset_t ds;
        data_error_t err;
        assert_int_equal(dataset_load(&ds, tmp_path("epoch"), &o, &err), DATA_OK);
        const size_t C = ds.nwindows;
        assert_int_equal(C, (ds.train.count - 1) / T);
        assert_true(C > 8);
        size_t *starts = malloc(2 * C * sizeof *starts);
        int *in = malloc(T * sizeof *in), *tg = malloc(T * sizeof *tg);
        assert_true(starts && in && tg);
        /* G = 1: step s is global sequence s; epochs 0 and 1 */
        for (size_t s = 0; s < 2 * C; s++) {
            assert_int_equal(dataset_train_batch(&ds, (int64_t)s, 1, 0, 1, in, tg, &err),
                             DATA_OK);
            starts[s] = find_window(&ds.train, in, tg, T);
            assert_true(starts[s] != (size_t)-1);
        }
        int differs = 0;
        for (int e = 0; e < 2; e++) {
            size_t *ep = starts + (size_t)e * C;
            differs |= e == 1 && memcmp(starts, ep, C * sizeof *ep) != 0;
            qsort(ep, C, sizeof *ep, cmp_size);
            /* a permutation of the C windows, all shifted by the epoch's
             * offset */
            size_t shift = ep[0];
            assert_true(shift <= ds.train.count - 1 - C * T);
            for (size_t k = 0; k < C; k++) assert_int_equal(ep[k], shift + k * T);
        }
        assert_true(differs); /* the order changes between epochs */
        free(starts);
        free(in);
        free(tg);
        dataset_free(&ds);
    }
}

static void test_validation(void **state)
{
    (void)state;
    write_many("val", 40, 300);
    data_options_t o = opts_with(16, 0.2);
    dataset_t ds;
    data_error_t err;
    assert_int_equal(dataset_load(&ds, tmp_path("val"), &o, &err), DATA_OK);
    const size_t T = 16, N = ds.nval_seqs;
    assert_int_equal(N, (ds.val.count - 1) / T);
    int *in = malloc(N * T * sizeof *in), *tg = malloc(N * T * sizeof *tg);
    int *in2 = malloc(N * T * sizeof *in), *tg2 = malloc(N * T * sizeof *tg);
    assert_true(in && tg && in2 && tg2);
    assert_int_equal(dataset_val_batch(&ds, 0, N, in, tg, &err), DATA_OK);
    /* consecutive, non-overlapping windows from the start of the stream */
    for (size_t i = 0; i < N; i++)
        for (size_t t = 0; t < T; t++) {
            assert_int_equal(in[i * T + t], ds.val.tokens[i * T + t]);
            assert_int_equal(tg[i * T + t], ds.val.tokens[i * T + t + 1]);
        }
    /* the same on every call, and rank shards (each evaluated separately)
     * concatenate to the whole for any P */
    for (int P = 1; P <= 4; P++) {
        memset(in2, 0, N * T * sizeof *in2);
        for (int r = 0; r < P; r++) {
            size_t lo, hi;
            data_shard(N, r, P, &lo, &hi);
            assert_int_equal(dataset_val_batch(&ds, lo, hi - lo, in2 + lo * T, tg2 + lo * T,
                                               &err), DATA_OK);
        }
        assert_memory_equal(in2, in, N * T * sizeof *in);
        assert_memory_equal(tg2, tg, N * T * sizeof *tg);
    }
    assert_int_equal(dataset_val_batch(&ds, N, 1, in, tg, &err), DATA_E_ARG);
    assert_non_null(strstr(err.message, "outside"));
    dataset_free(&ds);

    /* a cap spreads the sequences evenly over the stream */
    o.val_max_seqs = 5;
    assert_int_equal(dataset_load(&ds, tmp_path("val"), &o, &err), DATA_OK);
    assert_int_equal(ds.nval_seqs, 5);
    assert_int_equal(dataset_val_batch(&ds, 0, 5, in2, tg2, &err), DATA_OK);
    for (size_t i = 0; i < 5; i++)
        assert_memory_equal(in2 + i * T, in + (i * N / 5) * T, T * sizeof *in);
    dataset_free(&ds);
    free(in);
    free(tg);
    free(in2);
    free(tg2);
}

static void test_shard(void **state)
{
    (void)state;
    for (size_t n = 0; n < 20; n++)
        for (int P = 1; P <= 5; P++) {
            size_t expect = 0;
            for (int r = 0; r < P; r++) {
                size_t lo, hi;
                data_shard(n, r, P, &lo, &hi);
                assert_int_equal(lo, expect);
                assert_true(hi >= lo && hi - lo <= n / (size_t)P + 1);
                expect = hi;
            }
            assert_int_equal(expect, n);
        }
}

static void test_errors(void **state)
{
    (void)state;
    data_options_t o = opts_with(8, 0.0);
    char spec[1200];
    data_error_t err;
    dataset_t ds;

    expect_error(tmp_path("nope.txt"), &o, DATA_E_IO, "nope.txt: cannot open");
    snprintf(spec, sizeof spec, "jsonl:%s", tmp_path("nope.jsonl"));
    expect_error(spec, &o, DATA_E_IO, "nope.jsonl");
    if (geteuid() != 0) { /* root reads mode-000 files anyway */
        write_text("locked.txt", "secret");
        chmod(tmp_path("locked.txt"), 0);
        expect_error(tmp_path("locked.txt"), &o, DATA_E_IO, "locked.txt: cannot open");
    }
    expect_error("", &o, DATA_E_ARG, "empty data spec");

    /* empty corpus: an empty file, an empty directory, a list element */
    write_text("empty.txt", "");
    expect_error(tmp_path("empty.txt"), &o, DATA_E_EMPTY, "empty.txt: no documents");
    mkdir(tmp_path("emptydir"), 0755);
    expect_error(tmp_path("emptydir"), &o, DATA_E_EMPTY, "emptydir: no documents");
    write_text("ok.txt", "some text long enough for T");
    snprintf(spec, sizeof spec, "%s,%s", tmp_path("ok.txt"), tmp_path("empty.txt"));
    expect_error(spec, &o, DATA_E_EMPTY, "empty.txt: no documents");
    snprintf(spec, sizeof spec, "%s,,%s", tmp_path("ok.txt"), tmp_path("ok.txt"));
    expect_error(spec, &o, DATA_E_ARG, "empty element");

    /* T + 1 larger than a split */
    write_text("short.txt", "abcdefg"); /* 7 bytes + EOT = 8 tokens */
    expect_error(tmp_path("short.txt"), &o, DATA_E_EMPTY,
                 "sequence length 8 needs 9 tokens, but the training split has only 8");
    data_options_t o7 = opts_with(7, 0.0);
    assert_int_equal(dataset_load(&ds, tmp_path("short.txt"), &o7, &err), DATA_OK);
    assert_int_equal(ds.nwindows, 1);
    dataset_free(&ds);
    /* 50 documents of 11 tokens: train has ~500, validation ~30 (5 %) */
    write_many("valshort", 50, 1);
    data_options_t ov = opts_with(100, 0.05);
    expect_error(tmp_path("valshort"), &ov, DATA_E_EMPTY, "validation split has only");

    /* malformed JSONL names the line */
    write_text("bad.jsonl", "{\"text\": \"a\"}\n\n{\"text\": \"b\"\n");
    expect_error(tmp_path("bad.jsonl"), &o, DATA_E_FORMAT, "bad.jsonl:3: malformed JSONL");
    write_text("arr.jsonl", "{\"text\": \"a\"}\n[1, 2]\n");
    expect_error(tmp_path("arr.jsonl"), &o, DATA_E_FORMAT, "arr.jsonl:2: malformed JSONL");
    write_text("junk.jsonl", "{\"text\": \"a\"} trailing\n");
    expect_error(tmp_path("junk.jsonl"), &o, DATA_E_FORMAT, "junk.jsonl:1: malformed");
    /* JSONL without the expected fields */
    write_text("nofield.jsonl", "{\"body\": \"a\"}\n");
    expect_error(tmp_path("nofield.jsonl"), &o, DATA_E_FORMAT,
                 "nofield.jsonl:1: JSONL record has neither a \"text\" field");
    write_text("later.jsonl", "{\"text\": \"a\"}\n{\"txt\": \"b\"}\n");
    expect_error(tmp_path("later.jsonl"), &o, DATA_E_FORMAT,
                 "later.jsonl:2: record without a \"text\" string");
    write_text("num.jsonl", "{\"text\": 5}\n");
    expect_error(tmp_path("num.jsonl"), &o, DATA_E_FORMAT, "num.jsonl:1: record without");
    write_text("al.jsonl", "{\"instruction\": \"a\", \"output\": \"b\"}\n"
                           "{\"instruction\": \"c\"}\n");
    expect_error(tmp_path("al.jsonl"), &o, DATA_E_FORMAT,
                 "al.jsonl:2: alpaca record without an \"output\" string");
    write_text("al2.jsonl", "{\"instruction\": \"a\", \"input\": 3, \"output\": \"b\"}\n");
    expect_error(tmp_path("al2.jsonl"), &o, DATA_E_FORMAT, "al2.jsonl:1: alpaca \"input\"");

    /* a named binary file is refused (in a directory it is skipped) */
    const unsigned char bin[] = {1, 2, 0, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    write_bytes("blob.bin", bin, sizeof bin);
    expect_error(tmp_path("blob.bin"), &o, DATA_E_FORMAT, "blob.bin: looks like a binary");

    /* options and batches */
    data_options_t bad = opts_with(0, 0.0);
    expect_error(tmp_path("ok.txt"), &bad, DATA_E_ARG, "sequence length must be >= 1");
    bad = opts_with(4, 1.0);
    expect_error(tmp_path("ok.txt"), &bad, DATA_E_ARG, "validation fraction");
    data_options_t o1 = opts_with(4, 0.05);
    expect_error(tmp_path("ok.txt"), &o1, DATA_E_EMPTY, "1 document cannot be split");
    data_options_t o4 = opts_with(4, 0.0);
    assert_int_equal(dataset_load(&ds, tmp_path("ok.txt"), &o4, &err), DATA_OK);
    int in[4 * 6], tg[4 * 6];
    assert_int_equal(dataset_train_batch(&ds, 0, 6, 0, 4, in, tg, &err), DATA_E_ARG);
    assert_non_null(strstr(err.message, "global batch 6 must be a positive multiple"));
    assert_int_equal(dataset_train_batch(&ds, 0, 4, 4, 4, in, tg, &err), DATA_E_ARG);
    assert_int_equal(dataset_train_batch(&ds, -1, 4, 0, 4, in, tg, &err), DATA_E_ARG);
    assert_int_equal(dataset_train_batch(&ds, 0, 0, 0, 1, in, tg, &err), DATA_E_ARG);
    assert_int_equal(dataset_val_batch(&ds, 0, 1, in, tg, &err), DATA_E_ARG);
    assert_int_equal(dataset_val_batch(&ds, 0, 0, in, tg, &err), DATA_OK);
    dataset_free(&ds);
}

/* Small stand-ins for the prepared corpora, in scripts/fetch-corpus's
 * format, under a private data directory. */
static void test_corpus_specs(void **state)
{
    (void)state;
    write_text("fake/brown/genres.txt", "news\nhumor\n");
    write_text("fake/brown/news.txt", "First story.\nSecond paragraph.\n%\nAnother story.\n");
    write_text("fake/brown/humor.txt", "A joke\n%\n\n%\nLast one, no newline");
    write_text("fake/fortunes/computers.txt", "Bugs.\n%\nMore bugs.\n%\n");
    write_text("fake/fortunes/science.txt", "E = mc^2\r\n%\r\n");
    write_text("fake/kjv/kjv.txt", "Genesis\n1:1 In the beginning.\n%\nExodus\n1:1 Names.\n");
    write_text("fake/lodash/lodash.txt",
               "function id(x) {\n  return x % 2;\n}\n%\nmodule.exports = id;\n");
    data_options_t o = opts_with(2, 0.0);
    o.data_dir = tmp_path("fake");
    dataset_t ds;
    data_error_t err;

    assert_int_equal(dataset_load(&ds, "brown:news", &o, &err), DATA_OK);
    const char *news[] = {"First story.\nSecond paragraph.", "Another story."};
    assert_stream(&ds.train, news, 2);
    dataset_free(&ds);
    /* all genres in the list's order; the empty document between "%" lines
     * drops out */
    const char *all[] = {"First story.\nSecond paragraph.", "Another story.", "A joke",
                         "Last one, no newline"};
    assert_int_equal(dataset_load(&ds, "brown:", &o, &err), DATA_OK);
    assert_stream(&ds.train, all, 4);
    dataset_free(&ds);
    assert_int_equal(dataset_load(&ds, "brown:all", &o, &err), DATA_OK);
    assert_stream(&ds.train, all, 4);
    dataset_free(&ds);
    const char *hn[] = {"A joke", "Last one, no newline", "First story.\nSecond paragraph.",
                        "Another story."};
    assert_int_equal(dataset_load(&ds, "brown:humor+news", &o, &err), DATA_OK);
    assert_stream(&ds.train, hn, 4);
    dataset_free(&ds);

    const char *fort[] = {"Bugs.", "More bugs.", "E = mc^2\r"};
    assert_int_equal(dataset_load(&ds, "fortunes:", &o, &err), DATA_OK);
    assert_stream(&ds.train, fort, 3);
    dataset_free(&ds);
    assert_int_equal(dataset_load(&ds, "fortunes:science", &o, &err), DATA_OK);
    assert_stream(&ds.train, fort + 2, 1);
    dataset_free(&ds);

    const char *kjv[] = {"Genesis\n1:1 In the beginning.", "Exodus\n1:1 Names."};
    assert_int_equal(dataset_load(&ds, "kjv:", &o, &err), DATA_OK);
    assert_stream(&ds.train, kjv, 2);
    dataset_free(&ds);
    const char *js[] = {"function id(x) {\n  return x % 2;\n}", "module.exports = id;"};
    assert_int_equal(dataset_load(&ds, "lodash:", &o, &err), DATA_OK);
    assert_stream(&ds.train, js, 2);
    dataset_free(&ds);
    /* a list mixing corpora */
    const char *mix[] = {"Genesis\n1:1 In the beginning.", "Exodus\n1:1 Names.", "E = mc^2\r"};
    assert_int_equal(dataset_load(&ds, "kjv:,fortunes:science", &o, &err), DATA_OK);
    assert_stream(&ds.train, mix, 3);
    dataset_free(&ds);

    expect_error("brown:news+sports", &o, DATA_E_ARG,
                 "brown:news+sports: unknown genre 'sports'; valid: news, humor");
    expect_error("fortunes:nope", &o, DATA_E_ARG, "valid: computers, science");
    expect_error("kjv:Genesis", &o, DATA_E_ARG, "kjv takes no argument");
    expect_error("lodash:map", &o, DATA_E_ARG, "lodash takes no argument (use 'lodash:')");

    /* not prepared: say how to prepare it */
    o.data_dir = tmp_path("nodata");
    expect_error("brown:news", &o, DATA_E_CORPUS, "run scripts/fetch-corpus");
    expect_error("fortunes:", &o, DATA_E_CORPUS, "run scripts/fetch-corpus");
    expect_error("kjv:", &o, DATA_E_CORPUS, "nodata/kjv/kjv.txt is missing");
    expect_error("lodash:", &o, DATA_E_CORPUS, "nodata/lodash/lodash.txt is missing");

    /* data_dir_resolve: option, then IGRAD_DATA_DIR, then the source tree */
    char dir[512];
    data_dir_resolve("/x/y", dir, sizeof dir);
    assert_string_equal(dir, "/x/y");
    char *saved = getenv("IGRAD_DATA_DIR") ? strdup(getenv("IGRAD_DATA_DIR")) : NULL;
    setenv("IGRAD_DATA_DIR", "/from/env", 1);
    data_dir_resolve(NULL, dir, sizeof dir);
    assert_string_equal(dir, "/from/env");
    unsetenv("IGRAD_DATA_DIR");
    data_dir_resolve(NULL, dir, sizeof dir);
    assert_true(strlen(dir) >= 4);
    assert_string_equal(dir + strlen(dir) - 4, "data");
    if (saved) {
        setenv("IGRAD_DATA_DIR", saved, 1);
        free(saved);
    }
}

/* ------------------------------------------------------------------------ */
/* The real corpora, when prepared                                          */
/* ------------------------------------------------------------------------ */

/* The data directory the trainer resolves (option unset), and whether
 * `probe` exists in it. */
static int real_data_dir(char *buf, size_t cap, const char *probe)
{
    data_dir_resolve(NULL, buf, cap);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", buf, probe);
    struct stat sb;
    return stat(path, &sb) == 0;
}

static int g_corpus_ran; /* corpus tests that found their corpus */

static void test_real_brown(void **state)
{
    (void)state;
    char dir[512];
    if (!real_data_dir(dir, sizeof dir, "brown/genres.txt")) {
        print_message("note: Brown corpus not prepared under %s (run scripts/fetch-corpus "
                      "or set IGRAD_DATA_DIR); skipping\n", dir);
        skip();
    }
    g_corpus_ran++;
    data_options_t o = opts_with(256, 0.05);
    o.data_dir = dir;
    dataset_t ds;
    data_error_t err;
    if (dataset_load(&ds, "brown:news", &o, &err) != DATA_OK)
        print_error("brown:news: %s\n", err.message);
    assert_int_equal(err.status, DATA_OK);
    /* 44 press reportage texts of ~2000 words each */
    assert_int_equal(ds.ndocs, 44);
    assert_true(ds.train.ndocs >= 1 && ds.val.ndocs >= 1);
    size_t total = ds.train.count + ds.val.count;
    assert_in_range(total, 400000, 700000);
    /* no part-of-speech tags left: "word/tag" would show as a slash followed
     * by lower-case letters and then a space */
    static const char *tags[] = {"/nn", "/at ", "/in ", "/vbd", "/jj", "/np", "/cd ", "/. "};
    for (int half = 0; half < 2; half++) {
        const data_split_t *sp = half ? &ds.val : &ds.train;
        char *text = malloc(sp->count + 1);
        assert_non_null(text);
        for (size_t i = 0; i < sp->count; i++)
            text[i] = sp->tokens[i] == DATA_EOT ? '\n' : (char)sp->tokens[i];
        text[sp->count] = '\0';
        for (size_t k = 0; k < sizeof tags / sizeof *tags; k++) {
            if (strstr(text, tags[k])) print_error("found tag '%s' in brown:news\n", tags[k]);
            assert_null(strstr(text, tags[k]));
        }
        assert_null(strstr(text, "``"));
        assert_null(strstr(text, "''"));
        free(text);
    }
    dataset_free(&ds);
    expect_error("brown:nonsense", &o, DATA_E_ARG,
                 "valid: news, editorial, reviews, religion, hobbies, lore, belles_lettres, "
                 "government, learned, fiction, mystery, science_fiction, adventure, romance, "
                 "humor");
    assert_int_equal(dataset_load(&ds, "brown:all", &o, &err), DATA_OK);
    assert_int_equal(ds.ndocs, 500);
    dataset_free(&ds);
}

static void test_real_fortunes_kjv(void **state)
{
    (void)state;
    char dir[512];
    if (!real_data_dir(dir, sizeof dir, "kjv/kjv.txt") ||
        !real_data_dir(dir, sizeof dir, "fortunes")) {
        print_message("note: fortunes/kjv not prepared under %s (run scripts/fetch-corpus "
                      "or set IGRAD_DATA_DIR); skipping\n", dir);
        skip();
    }
    g_corpus_ran++;
    data_options_t o = opts_with(256, 0.05);
    o.data_dir = dir;
    dataset_t ds;
    data_error_t err;
    assert_int_equal(dataset_load(&ds, "kjv:", &o, &err), DATA_OK);
    assert_int_equal(ds.ndocs, 66);
    dataset_free(&ds);
    assert_int_equal(dataset_load(&ds, "fortunes:computers+science", &o, &err), DATA_OK);
    assert_in_range(ds.ndocs, 1000, 3000);
    dataset_free(&ds);
}

/* scripts/fetch-corpus lodash: npm lodash 4.17.21's 629 one-function
 * modules, one document each, JavaScript and nothing of Brown's prose. */
static void test_real_lodash(void **state)
{
    (void)state;
    char dir[512];
    if (!real_data_dir(dir, sizeof dir, "lodash/lodash.txt")) {
        print_message("note: lodash not prepared under %s (run scripts/fetch-corpus "
                      "or set IGRAD_DATA_DIR); skipping\n", dir);
        skip();
    }
    g_corpus_ran++;
    data_options_t o = opts_with(256, 0.05);
    o.data_dir = dir;
    dataset_t ds;
    data_error_t err;
    if (dataset_load(&ds, "lodash:", &o, &err) != DATA_OK)
        print_error("lodash: %s\n", err.message);
    assert_int_equal(err.status, DATA_OK);
    assert_int_equal(ds.ndocs, 629);
    assert_true(ds.train.ndocs >= 1 && ds.val.ndocs >= 1);
    size_t total = ds.train.count + ds.val.count;
    assert_in_range(total, 500000, 650000);
    /* every module is CommonJS: the text holds one export per document */
    size_t exports = 0;
    for (int half = 0; half < 2; half++) {
        const data_split_t *sp = half ? &ds.val : &ds.train;
        static const char needle[] = "module.exports = ";
        size_t n = sizeof needle - 1;
        for (size_t i = 0; i + n <= sp->count; i++) {
            size_t k = 0;
            while (k < n && sp->tokens[i + k] == (unsigned char)needle[k]) k++;
            exports += k == n;
        }
    }
    assert_int_equal(exports, 629);
    dataset_free(&ds);
}

/* CTest's SKIP_RETURN_CODE for test_data_corpus */
#define EXIT_SKIPPED 77

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--corpus") == 0) {
        const struct CMUnitTest corpus[] = {
            cmocka_unit_test(test_real_brown),
            cmocka_unit_test(test_real_fortunes_kjv),
            cmocka_unit_test(test_real_lodash),
        };
        int failed = cmocka_run_group_tests_name("real corpora", corpus, setup, teardown);
        if (failed == 0 && g_corpus_ran == 0) {
            printf("no corpus prepared: every real-corpus test skipped\n");
            return EXIT_SKIPPED;
        }
        return failed;
    }
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--corpus]\n", argv[0]);
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenizer_round_trip),
        cmocka_unit_test(test_text_file),
        cmocka_unit_test(test_directory),
        cmocka_unit_test(test_jsonl_text),
        cmocka_unit_test(test_jsonl_nul),
        cmocka_unit_test(test_alpaca),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_batches_same_for_any_rank_count),
        cmocka_unit_test(test_epoch_covers_every_window),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_shard),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_corpus_specs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
