/*
 * fuzz_main.c — what the parser fuzz targets (tests/fuzz_*.c) share: the
 * layout checker, the fixed-defect report, and two drivers. Each target
 * defines igrad_fuzz_one(), which must never crash (ASan/UBSan catch memory
 * errors and undefined behaviour) and returns nonzero when an invariant
 * breaks (determinism, round trip); plus its name and built-in seeds.
 *
 * Built with IGRAD_LIBFUZZER (clang -fsanitize=fuzzer, `make fuzz`, build
 * directory build-fuzz/): LLVMFuzzerTestOneInput() calls igrad_fuzz_one()
 * and aborts on a broken invariant, so libFuzzer saves the input; seeds are
 * the committed corpus tests/fuzz/corpus/<target>/ (tests/fuzz/run).
 *
 * Built without it (the gcc builds, CTest): a small deterministic mutation
 * fuzzer. It runs the built-in seeds and the files of
 * $IGRAD_SOURCE_DIR/tests/fuzz/corpus/<name>/, then `--iterations N`
 * mutants: bit flips, byte overwrites, truncation, insertion and deletion,
 * chunk duplication, splicing of two seeds and insertion of format tokens
 * (numbers at the edges of int64/double, brackets, quotes, dtype names).
 * Same --seed, same inputs, so a failure reproduces exactly. Also:
 *   --replay DIR      runs every file of DIR once (tests/fuzz/regressions/
 *                     <target>/ in CTest), each under a 10 s alarm: a
 *                     timeout is a failure, as in libFuzzer;
 *   --dump-seeds DIR  writes the built-in seeds as files (corpus making).
 *
 * Defects found and fixed (a tensor named "__metadata__", "\u0000" in a
 * JSON string) are checked by name (igrad_fuzz_fixed_defect), so a
 * regression says which one came back.
 */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/layout_internal.h"

/* Provided by each fuzz_*.c. */
int igrad_fuzz_one(const uint8_t *data, size_t size);
const char *igrad_fuzz_name(void);
size_t igrad_fuzz_seed_count(void);
const uint8_t *igrad_fuzz_seed(size_t i, size_t *size);

/* Provided here for the targets: checks a successfully parsed layout
 * (internal consistency, JSON rendering, safetensors and name-list round
 * trips). Returns 0 if all hold, else prints why and returns 1. */
int igrad_fuzz_check_layout(const igrad_layout_t *layout);

/* Provided here: reports that a defect fixed earlier is back (issue 9's
 * parser findings). Prints "invariant broken: fixed defect is back: what"
 * and returns 1. */
int igrad_fuzz_fixed_defect(const char *what);

/* Provided here: whether data holds the JSON escape \u0000 (any case). */
int igrad_fuzz_has_u0000(const uint8_t *data, size_t size);

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "invariant broken: " __VA_ARGS__);             \
            fprintf(stderr, " [%s:%d]\n", __FILE__, __LINE__);             \
            return 1;                                                      \
        }                                                                  \
    } while (0)

/* Same tensors (names, dtypes unless ignore_dtype, shapes) in the same order. */
static int same_table(const igrad_layout_t *a, const igrad_layout_t *b, int ignore_dtype)
{
    CHECK(igrad_layout_count(a) == igrad_layout_count(b), "round trip: %zu vs %zu tensors",
          igrad_layout_count(a), igrad_layout_count(b));
    for (size_t i = 0; i < igrad_layout_count(a); i++) {
        igrad_tensor_info_t x, y;
        igrad_layout_tensor(a, i, &x);
        igrad_layout_tensor(b, i, &y);
        CHECK(strcmp(x.name, y.name) == 0 && x.ndim == y.ndim &&
                  memcmp(x.shape, y.shape, sizeof x.shape) == 0 &&
                  (ignore_dtype || x.dtype == y.dtype),
              "round trip: row %zu '%s' vs '%s'", i, x.name, y.name);
    }
    return 0;
}

int igrad_fuzz_fixed_defect(const char *what)
{
    fprintf(stderr, "invariant broken: fixed defect is back (issue 9): %s\n", what);
    return 1;
}

int igrad_fuzz_has_u0000(const uint8_t *data, size_t size)
{
    for (size_t i = 0; i + 6 <= size; i++)
        if (data[i] == '\\' && (data[i + 1] | 0x20) == 'u' && data[i + 2] == '0' &&
            data[i + 3] == '0' && data[i + 4] == '0' && data[i + 5] == '0')
            return 1;
    return 0;
}

int igrad_fuzz_check_layout(const igrad_layout_t *l)
{
    size_t n = igrad_layout_count(l);
    CHECK(n > 0, "a parsed layout has no tensors");
    /* Refused by every reader: the safetensors round trip would lose it
     * (the writer's own "__metadata__" key). */
    if (igrad_layout_find(l, "__metadata__") >= 0)
        return igrad_fuzz_fixed_defect("a tensor named __metadata__ was accepted");
    int64_t offset = 0, in_components = 0;
    int all_f32 = 1;
    for (size_t i = 0; i < n; i++) {
        igrad_tensor_info_t t;
        CHECK(igrad_layout_tensor(l, i, &t) == IGRAD_OK, "tensor %zu unreadable", i);
        CHECK(t.offset == offset, "tensor %zu offset %lld, expected %lld", i,
              (long long)t.offset, (long long)offset);
        CHECK(t.count >= 1, "tensor %zu has count %lld", i, (long long)t.count);
        offset += t.count;
        CHECK(igrad_layout_find(l, t.name) == (int)i, "find('%s') != %zu", t.name, i);
        if (t.dtype != IGRAD_DTYPE_F32) all_f32 = 0;
        if (t.kind == IGRAD_KIND_OTHER) {
            CHECK(t.component == -1 && t.layer == -1, "OTHER tensor with a component");
        } else {
            igrad_component_info_t c;
            CHECK(igrad_layout_component(l, (size_t)t.component, &c) == IGRAD_OK &&
                      c.layer == t.layer && c.kind == t.kind,
                  "tensor %zu points at the wrong component", i);
            in_components += t.count;
        }
    }
    CHECK(offset == igrad_layout_total_count(l), "total %lld != sum %lld",
          (long long)igrad_layout_total_count(l), (long long)offset);
    int64_t comp_sum = 0;
    for (size_t c = 0; c < igrad_layout_component_count(l); c++) {
        igrad_component_info_t ci, prev;
        igrad_layout_component(l, c, &ci);
        comp_sum += ci.count;
        if (c > 0) {
            igrad_layout_component(l, c - 1, &prev);
            CHECK(prev.layer < ci.layer || (prev.layer == ci.layer && prev.kind < ci.kind),
                  "components out of order at %zu", c);
        }
    }
    CHECK(comp_sum == in_components, "components hold %lld entries, tensors %lld",
          (long long)comp_sum, (long long)in_components);

    char *json = NULL;
    CHECK(igrad_layout_to_json(l, &json) == IGRAD_OK, "to_json: %s", igrad_last_error());
    cJSON *root = cJSON_Parse(json);
    CHECK(root && cJSON_GetArraySize(cJSON_GetObjectItem(root, "tensors")) == (int)n,
          "to_json output does not parse back");
    cJSON_Delete(root);
    igrad_free(json);

    /* Round trips are skipped for tables too large to rewrite cheaply. */
    if (n > 5000) return 0;
    unsigned char *hdr = NULL;
    size_t hdr_n = 0;
    uint64_t data_n = 0;
    igrad_status_t st = igrad__layout_to_safetensors_header(l, &hdr, &hdr_n, &data_n);
    if (st == IGRAD_OK) {
        igrad_layout_t *back = NULL;
        st = igrad_layout_from_safetensors_bytes(hdr, hdr_n, hdr_n + data_n, "rt", &back);
        free(hdr);
        CHECK(st == IGRAD_OK, "safetensors round trip fails: %s", igrad_last_error());
        int bad = same_table(l, back, 0);
        CHECK(!bad && igrad_layout_hash(back) == igrad_layout_hash(l),
              "safetensors round trip changes the hash");
        igrad_layout_free(back);
    } else {
        CHECK(st == IGRAD_E_INVALID, "safetensors writer: %s", igrad_last_error());
    }
    char *text = NULL;
    size_t text_n = 0;
    st = igrad__layout_to_name_list(l, &text, &text_n);
    if (st == IGRAD_OK) {
        igrad_layout_t *back = NULL;
        st = igrad__layout_from_name_list_text(text, text_n, "rt", &back);
        free(text);
        CHECK(st == IGRAD_OK, "name-list round trip fails: %s", igrad_last_error());
        int bad = same_table(l, back, 1);
        /* name lists carry no dtype (F32), so the hash only matches then */
        CHECK(!bad && (!all_f32 || igrad_layout_hash(back) == igrad_layout_hash(l)),
              "name-list round trip changes the table");
        igrad_layout_free(back);
    } else {
        CHECK(st == IGRAD_E_INVALID, "name-list writer: %s", igrad_last_error());
    }
    return 0;
}

#ifdef IGRAD_LIBFUZZER

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (igrad_fuzz_one(data, size) != 0) {
        fprintf(stderr, "%s: invariant broken (message above); libFuzzer saves the input\n",
                igrad_fuzz_name());
        abort();
    }
    return 0;
}

#else /* the CTest driver */

#define MAX_INPUT (256u * 1024u)

typedef struct buf {
    uint8_t *data;
    size_t size;
} buf_t;

static uint64_t rng_state;

static uint64_t rng(void)
{
    /* splitmix64: tiny, good enough, stable across platforms */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static size_t rnd(size_t n) { return n ? (size_t)(rng() % n) : 0; }

static const char *const tokens[] = {
    "0", "1", "-1", "2", "8", "255", "65536", "4294967296", "9007199254740993",
    "18446744073709551616", "9223372036854775807", "-9223372036854775808", "1e300", "-0",
    "1.5", "NaN", "null", "true", "false", "\"\"", "\"x\"", "[", "]", "{", "}", ",", ":",
    "\"", "\\", "\\u0000", "[]", "{}", "[0,0]", "[0]", "[1,2]", "\"F32\"", "\"BF16\"",
    "\"F16\"", "\"I64\"", "\"BOOL\"", "\"F8_E4M3\"", "\"dtype\"", "\"shape\"",
    "\"data_offsets\"", "\"__metadata__\"", "\"model_type\"", "\"llama\"", "\"mixtral\"",
    "\"opt\"", "\"gpt2\"", "\"falcon\"", "\"phi\"", "\"hidden_size\"",
    "\"num_hidden_layers\"", "\"tie_word_embeddings\"", "\"torch_dtype\"", "\"float16\"",
    "\n", " ", "#", "(", ")", "\t", "\r\n", ".weight", ".bias", "model.layers.0.",
};

static void mutate_once(buf_t *b, const buf_t *seeds, size_t nseeds)
{
    size_t op = rnd(9);
    if (b->size == 0 && op < 6) op = 6;
    switch (op) {
    case 0: /* bit flip */
        b->data[rnd(b->size)] ^= (uint8_t)(1u << rnd(8));
        break;
    case 1: { /* overwrite a byte with an interesting value */
        static const uint8_t vals[] = {0, 0xff, 0x7f, 0x80, '0', '9', '{', '}', '[', ']',
                                       '"', ',', ':', '-', ' ', '\n', '#', '.'};
        b->data[rnd(b->size)] = vals[rnd(sizeof vals)];
        break;
    }
    case 2: /* truncate */
        b->size = rnd(b->size + 1);
        break;
    case 3: { /* delete a range */
        size_t at = rnd(b->size);
        size_t n = 1 + rnd(b->size - at < 16 ? b->size - at : 16);
        memmove(b->data + at, b->data + at + n, b->size - at - n);
        b->size -= n;
        break;
    }
    case 4: { /* duplicate a chunk */
        size_t at = rnd(b->size);
        size_t n = 1 + rnd(b->size - at < 64 ? b->size - at : 64);
        if (b->size + n > MAX_INPUT) break;
        size_t to = rnd(b->size + 1);
        uint8_t tmp[64];
        memcpy(tmp, b->data + at, n);
        memmove(b->data + to + n, b->data + to, b->size - to);
        memcpy(b->data + to, tmp, n);
        b->size += n;
        break;
    }
    case 5: { /* replace a digit run with a token (numbers are where bugs live) */
        size_t at = rnd(b->size);
        while (at < b->size && !(b->data[at] >= '0' && b->data[at] <= '9')) at++;
        if (at == b->size) break;
        size_t end = at;
        while (end < b->size && b->data[end] >= '0' && b->data[end] <= '9') end++;
        const char *t = tokens[rnd(20)];
        size_t tn = strlen(t);
        if (b->size - (end - at) + tn > MAX_INPUT) break;
        memmove(b->data + at + tn, b->data + end, b->size - end);
        memcpy(b->data + at, t, tn);
        b->size = b->size - (end - at) + tn;
        break;
    }
    case 6: { /* insert a token */
        const char *t = tokens[rnd(sizeof tokens / sizeof tokens[0])];
        size_t tn = strlen(t);
        if (b->size + tn > MAX_INPUT) break;
        size_t to = rnd(b->size + 1);
        memmove(b->data + to + tn, b->data + to, b->size - to);
        memcpy(b->data + to, t, tn);
        b->size += tn;
        break;
    }
    case 7: { /* insert a random byte */
        if (b->size + 1 > MAX_INPUT) break;
        size_t to = rnd(b->size + 1);
        memmove(b->data + to + 1, b->data + to, b->size - to);
        b->data[to] = (uint8_t)rng();
        b->size += 1;
        break;
    }
    case 8: { /* splice: our head, another seed's tail */
        const buf_t *o = &seeds[rnd(nseeds)];
        size_t cut = rnd(b->size + 1), from = rnd(o->size + 1);
        size_t n = o->size - from;
        if (cut + n > MAX_INPUT) n = MAX_INPUT - cut;
        memcpy(b->data + cut, o->data + from, n);
        b->size = cut + n;
        break;
    }
    }
}

static void print_input(const buf_t *b)
{
    fprintf(stderr, "input (%zu bytes): \"", b->size);
    for (size_t i = 0; i < b->size && i < 4096; i++) {
        uint8_t c = b->data[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') fputc(c, stderr);
        else fprintf(stderr, "\\x%02x", c);
    }
    fprintf(stderr, "%s\"\n", b->size > 4096 ? "..." : "");
}

static int add_seed(buf_t **seeds, size_t *n, size_t *cap, const uint8_t *data, size_t size)
{
    if (size > MAX_INPUT) size = MAX_INPUT;
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        buf_t *s = realloc(*seeds, c * sizeof *s);
        if (!s) return -1;
        *seeds = s;
        *cap = c;
    }
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return -1;
    if (size) memcpy(copy, data, size);
    (*seeds)[*n].data = copy;
    (*seeds)[*n].size = size;
    (*n)++;
    return 0;
}

static void load_seed_dir(buf_t **seeds, size_t *n, size_t *cap)
{
    const char *src = getenv("IGRAD_SOURCE_DIR");
    if (!src) return;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/%s", src, igrad_fuzz_name());
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *fp = fopen(path, "rb");
        if (!fp) continue;
        uint8_t *data = malloc(MAX_INPUT);
        size_t got = data ? fread(data, 1, MAX_INPUT, fp) : 0;
        fclose(fp);
        if (data) add_seed(seeds, n, cap, data, got);
        free(data);
    }
    closedir(d);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs every file of dir once, in name order, each under a 10 s alarm
 * (SIGALRM ends the process: a timeout fails the test). A missing
 * directory has nothing to replay. */
static int replay(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        printf("%s: no %s, nothing to replay\n", igrad_fuzz_name(), dir);
        return 0;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) return 1;
            names = nn;
        }
        names[n] = strdup(e->d_name);
        if (!names[n]) return 1;
        n++;
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_str);
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        FILE *fp = fopen(path, "rb");
        struct stat sb;
        uint8_t *data = NULL;
        size_t got = 0;
        if (fp && fstat(fileno(fp), &sb) == 0 && S_ISREG(sb.st_mode)) {
            data = malloc(sb.st_size > 0 ? (size_t)sb.st_size : 1);
            got = data ? fread(data, 1, (size_t)sb.st_size, fp) : 0;
        }
        if (fp) fclose(fp);
        if (!data) {
            fprintf(stderr, "%s: cannot read %s\n", igrad_fuzz_name(), path);
            failed = 1;
        } else {
            alarm(10);
            if (igrad_fuzz_one(data, got) != 0) {
                fprintf(stderr, "%s: regression %s breaks an invariant\n", igrad_fuzz_name(),
                        path);
                failed = 1;
            }
            alarm(0);
        }
        free(data);
        free(names[i]);
    }
    free(names);
    printf("%s: replayed %zu file(s) of %s, %s\n", igrad_fuzz_name(), n, dir,
           failed ? "FAILED" : "ok");
    return failed;
}

static int dump_seeds(const char *dir)
{
    for (size_t i = 0; i < igrad_fuzz_seed_count(); i++) {
        size_t size = 0;
        const uint8_t *data = igrad_fuzz_seed(i, &size);
        char path[8192];
        snprintf(path, sizeof path, "%s/seed-%02zu", dir, i);
        FILE *fp = fopen(path, "wb");
        if (!fp || fwrite(data, 1, size, fp) != size) {
            fprintf(stderr, "%s: cannot write %s\n", igrad_fuzz_name(), path);
            if (fp) fclose(fp);
            return 1;
        }
        fclose(fp);
    }
    printf("%s: %zu seed(s) written to %s\n", igrad_fuzz_name(), igrad_fuzz_seed_count(), dir);
    return 0;
}

int main(int argc, char **argv)
{
    long long iterations = 1000;
    unsigned long long seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iterations") && i + 1 < argc) {
            iterations = atoll(argv[++i]);
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--replay") && i + 1 < argc) {
            return replay(argv[i + 1]);
        } else if (!strcmp(argv[i], "--dump-seeds") && i + 1 < argc) {
            return dump_seeds(argv[i + 1]);
        } else {
            fprintf(stderr, "usage: %s [--iterations N] [--seed S] | --replay DIR | "
                            "--dump-seeds DIR\n", argv[0]);
            return 2;
        }
    }
    rng_state = seed;

    buf_t *seeds = NULL;
    size_t nseeds = 0, cap = 0;
    for (size_t i = 0; i < igrad_fuzz_seed_count(); i++) {
        size_t size = 0;
        const uint8_t *data = igrad_fuzz_seed(i, &size);
        if (add_seed(&seeds, &nseeds, &cap, data, size) != 0) return 1;
    }
    load_seed_dir(&seeds, &nseeds, &cap);
    if (nseeds == 0) {
        fprintf(stderr, "%s: no seeds\n", igrad_fuzz_name());
        return 1;
    }

    int failed = 0;
    for (size_t i = 0; i < nseeds && !failed; i++) {
        if (igrad_fuzz_one(seeds[i].data, seeds[i].size) != 0) {
            fprintf(stderr, "%s: seed %zu breaks an invariant\n", igrad_fuzz_name(), i);
            print_input(&seeds[i]);
            failed = 1;
        }
    }

    buf_t b = {malloc(MAX_INPUT), 0};
    if (!b.data) return 1;
    for (long long it = 0; it < iterations && !failed; it++) {
        const buf_t *s = &seeds[rnd(nseeds)];
        memcpy(b.data, s->data, s->size);
        b.size = s->size;
        /* half the mutants get one change, so more of them still parse */
        size_t nmut = rnd(2) ? 1 : 1 + rnd(4);
        for (size_t m = 0; m < nmut; m++) mutate_once(&b, seeds, nseeds);
        if (igrad_fuzz_one(b.data, b.size) != 0) {
            fprintf(stderr, "%s: iteration %lld (--seed %llu) breaks an invariant\n",
                    igrad_fuzz_name(), it, seed);
            print_input(&b);
            failed = 1;
        }
    }
    printf("%s: %zu seeds, %lld iterations, %s\n", igrad_fuzz_name(), nseeds, iterations,
           failed ? "FAILED" : "ok");
    free(b.data);
    for (size_t i = 0; i < nseeds; i++) free(seeds[i].data);
    free(seeds);
    return failed;
}

#endif /* IGRAD_LIBFUZZER */
