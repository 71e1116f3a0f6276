/*
 * train_state.c — reading and writing train_state.json (rules in
 * train_state.h, format in docs/formats.md §10) with cJSON. Every check
 * here is about the file alone; comparing it with a run is train.c's.
 *
 * Not here: the checksums of the other files (checkpoint_file_hash) and
 * the parameter hash (train_hash_floats); this file only carries them.
 */
#define _POSIX_C_SOURCE 200809L
#include "train_state.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h" /* checkpoint_json_refuse_nul */
#include "core/json_strict.h" /* igrad__text_line_col */
#include "metrics.h"    /* metrics_write_text */
#include "model.h"      /* trainer_fail */

/* A number field that must be an integer in [lo, hi] (checked before any
 * conversion: a double outside the target type is undefined behaviour). */
static igrad_status_t state_int(const cJSON *root, const char *path, const char *key, double lo,
                                double hi, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(v))
        return trainer_fail(IGRAD_E_FORMAT, "%s: \"%s\" is missing or not a number", path, key);
    double d = v->valuedouble;
    if (!(d >= lo && d <= hi) || floor(d) != d)
        return trainer_fail(IGRAD_E_FORMAT, "%s: \"%s\" is %.17g, not an integer in "
                            "[%.0f, %.0f]", path, key, d, lo, hi);
    *out = (int64_t)d;
    return IGRAD_OK;
}

/* An informational field: *has = 1 and *out set only when it is present
 * as an integer in [lo, hi]; anything else is ignored, as it always was. */
static void state_info(const cJSON *root, const char *key, double lo, double hi, int *has,
                       int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    *has = 0;
    *out = 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi) ||
        floor(v->valuedouble) != v->valuedouble)
        return;
    *has = 1;
    *out = (int64_t)v->valuedouble;
}

/* Exactly 16 hex digits. */
static int parse_hex64(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    int n = 0;
    for (; s[n]; n++) {
        char c = s[n];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0 || n >= 16) return 0;
        v = v << 4 | (uint64_t)d;
    }
    if (n != 16) return 0;
    *out = v;
    return 1;
}

/* "seed": a number in [0, 2^53] or a string of decimal digits that fits
 * 64 bits (what the writer uses above 2^53). */
static igrad_status_t parse_seed(const cJSON *seed, const char *path, uint64_t *out)
{
    if (cJSON_IsNumber(seed) && seed->valuedouble >= 0 &&
        seed->valuedouble <= TRAIN_STATE_EXACT_MAX &&
        floor(seed->valuedouble) == seed->valuedouble) {
        *out = (uint64_t)seed->valuedouble;
        return IGRAD_OK;
    }
    char *end = NULL;
    uint64_t v = 0;
    errno = 0;
    if (cJSON_IsString(seed) && seed->valuestring[0] >= '0' && seed->valuestring[0] <= '9')
        v = strtoull(seed->valuestring, &end, 10);
    if (!end || *end || errno)
        return trainer_fail(IGRAD_E_FORMAT, "%s: \"seed\" is not an integer in [0, 2^53] or a "
                            "decimal string", path);
    *out = v;
    return IGRAD_OK;
}

static igrad_status_t read_files(train_state_t *s, const cJSON *files, const char *path)
{
    if (!cJSON_IsObject(files))
        return trainer_fail(IGRAD_E_FORMAT, "%s: \"files\" is missing or not an object", path);
    int n = cJSON_GetArraySize(files);
    s->files = calloc((size_t)(n > 0 ? n : 1), sizeof *s->files);
    if (!s->files) return trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", path);
    const cJSON *e;
    cJSON_ArrayForEach(e, files)
    {
        train_state_file_t *f = &s->files[s->nfiles];
        const cJSON *hx = cJSON_GetObjectItemCaseSensitive(e, "fnv1a64");
        if (strlen(e->string) >= sizeof f->name || !cJSON_IsObject(e) || !cJSON_IsString(hx) ||
            !parse_hex64(hx->valuestring, &f->hash))
            return trainer_fail(IGRAD_E_FORMAT, "%s: files.\"%.64s\" needs \"nbytes\" and "
                                "\"fnv1a64\" (16 hex digits)", path, e->string);
        const cJSON *nb = cJSON_GetObjectItemCaseSensitive(e, "nbytes");
        if (!cJSON_IsNumber(nb) ||
            !(nb->valuedouble >= 0 && nb->valuedouble <= TRAIN_STATE_EXACT_MAX) ||
            floor(nb->valuedouble) != nb->valuedouble)
            return trainer_fail(IGRAD_E_FORMAT, "%s: \"files.%s.nbytes\" is not an integer in "
                                "[0, 2^53]", path, e->string);
        f->nbytes = (uint64_t)nb->valuedouble;
        snprintf(f->name, sizeof f->name, "%s", e->string);
        s->nfiles++;
    }
    return IGRAD_OK;
}

static char *dup_string(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* Everything but the size limit and the \u0000 check, on parsed JSON. */
static igrad_status_t parse_root(const cJSON *root, const char *path, train_state_t *s)
{
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, TRAIN_STATE_FORMAT) != 0)
        return trainer_fail(IGRAD_E_FORMAT, "%s: \"format\" is not \"" TRAIN_STATE_FORMAT "\"",
                            path);
    int64_t version = 0, ranks = 0, batch = 0, seq = 0;
    igrad_status_t st;
    if ((st = state_int(root, path, "version", 1, TRAIN_STATE_VERSION, &version)) != IGRAD_OK ||
        (st = state_int(root, path, "step", 0, TRAIN_STATE_EXACT_MAX, &s->step)) != IGRAD_OK ||
        (st = state_int(root, path, "ranks", 1, 2147483647.0, &ranks)) != IGRAD_OK ||
        (st = state_int(root, path, "batch", 1, 2147483647.0, &batch)) != IGRAD_OK ||
        (st = state_int(root, path, "seq_len", 1, 2147483647.0, &seq)) != IGRAD_OK)
        return st;
    s->version = (int)version;
    s->ranks = (int)ranks;
    s->batch = (int)batch;
    s->seq_len = (int)seq;
    if ((st = parse_seed(cJSON_GetObjectItemCaseSensitive(root, "seed"), path, &s->seed)) !=
        IGRAD_OK)
        return st;
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(root, "method");
    const cJSON *phash = cJSON_GetObjectItemCaseSensitive(root, "param_hash");
    if (!cJSON_IsString(data) || !cJSON_IsString(method) || !cJSON_IsString(phash) ||
        !parse_hex64(phash->valuestring, &s->param_hash))
        return trainer_fail(IGRAD_E_FORMAT, "%s: \"data\", \"method\" or \"param_hash\" (16 hex "
                            "digits) is missing or malformed", path);
    if (!(s->data = dup_string(data->valuestring)) ||
        !(s->method = dup_string(method->valuestring)))
        return trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", path);
    const cJSON *ef = cJSON_GetObjectItemCaseSensitive(root, "ef_on");
    if (ef && !(cJSON_IsString(ef) && (strcmp(ef->valuestring, "grad") == 0 ||
                                       strcmp(ef->valuestring, "update") == 0)))
        return trainer_fail(IGRAD_E_FORMAT, "%s: \"ef_on\" is not \"grad\" or \"update\"", path);
    s->ef_on_update = ef && strcmp(ef->valuestring, "update") == 0;
    if (s->version >= 2 &&
        (st = read_files(s, cJSON_GetObjectItemCaseSensitive(root, "files"), path)) != IGRAD_OK)
        return st;
    state_info(root, "sequences_consumed", 0, TRAIN_STATE_EXACT_MAX, &s->has_sequences_consumed,
               &s->sequences_consumed);
    state_info(root, "steps", 0, TRAIN_STATE_EXACT_MAX, &s->has_steps, &s->steps);
    state_info(root, "optimizer_step", 0, TRAIN_STATE_EXACT_MAX, &s->has_optimizer_step,
               &s->optimizer_step);
    state_info(root, "engine_step", -1, TRAIN_STATE_EXACT_MAX, &s->has_engine_step,
               &s->engine_step);
    return IGRAD_OK;
}

igrad_status_t train_state_parse(const char *path, const char *text, size_t nbytes,
                                 train_state_t *out)
{
    memset(out, 0, sizeof *out);
    if (nbytes > TRAIN_STATE_MAX_NBYTES)
        return trainer_fail(IGRAD_E_FORMAT, "%s: larger than 16 MiB (or unreadable)", path);
    const char *end = text;
    cJSON *root = cJSON_ParseWithLengthOpts(text, nbytes, &end, 0);
    igrad_status_t st = IGRAD_OK;
    if (!root || !cJSON_IsObject(root))
        st = trainer_fail(IGRAD_E_FORMAT, "%s: not a valid JSON object", path);
    /* a NUL byte anywhere (cJSON skips one as white space and ends a
     * string at one: "corpus\0x" would resume as "corpus"), or \u0000 */
    if (st == IGRAD_OK) st = checkpoint_json_refuse_nul(path, "train state", text, nbytes);
    if (st == IGRAD_OK) st = parse_root(root, path, out);
    cJSON_Delete(root);
    if (st != IGRAD_OK) train_state_free(out);
    return st;
}

igrad_status_t train_state_read(const char *path, train_state_t *out)
{
    memset(out, 0, sizeof *out);
    FILE *fp = fopen(path, "rb");
    if (!fp) return trainer_fail(IGRAD_E_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0 || sb.st_size > TRAIN_STATE_MAX_NBYTES) {
        fclose(fp);
        return trainer_fail(IGRAD_E_FORMAT, "%s: larger than 16 MiB (or unreadable)", path);
    }
    char *text = calloc(1, (size_t)sb.st_size + 1);
    size_t n = text ? fread(text, 1, (size_t)sb.st_size, fp) : 0;
    fclose(fp);
    if (!text) return trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", path);
    igrad_status_t st = train_state_parse(path, text, n, out);
    free(text);
    return st;
}

/* Integers are printed as integers, not through cJSON's double printer:
 * that one stops at 15 digits when they read back within DBL_EPSILON
 * (relative), so 5000000000000001 came out as 5e+15. */
static int add_uint(cJSON *obj, const char *key, uint64_t v)
{
    char text[24];
    snprintf(text, sizeof text, "%" PRIu64, v);
    return cJSON_AddRawToObject(obj, key, text) != NULL;
}

static int add_int(cJSON *obj, const char *key, int64_t v)
{
    char text[24];
    snprintf(text, sizeof text, "%" PRId64, v);
    return cJSON_AddRawToObject(obj, key, text) != NULL;
}

/* "files" entry: {"nbytes": N, "fnv1a64": "<16 hex>"}. */
static cJSON *file_entry(const train_state_file_t *f)
{
    cJSON *e = cJSON_CreateObject();
    char hex[24];
    snprintf(hex, sizeof hex, "%016" PRIx64, f->hash);
    if (e && (!add_uint(e, "nbytes", f->nbytes) ||
              !cJSON_AddStringToObject(e, "fnv1a64", hex))) {
        cJSON_Delete(e);
        e = NULL;
    }
    return e;
}

char *train_state_print(const train_state_t *s)
{
    cJSON *root = cJSON_CreateObject();
    char hash[24], seed[32];
    snprintf(hash, sizeof hash, "%016" PRIx64, s->param_hash);
    int ok = root && cJSON_AddStringToObject(root, "format", TRAIN_STATE_FORMAT) &&
             add_int(root, "version", s->version) && add_int(root, "step", s->step) &&
             (!s->has_sequences_consumed ||
              add_int(root, "sequences_consumed", s->sequences_consumed)) &&
             add_int(root, "ranks", s->ranks) &&
             cJSON_AddStringToObject(root, "data", s->data ? s->data : "") &&
             add_int(root, "batch", s->batch) && add_int(root, "seq_len", s->seq_len);
    /* Compared as integers: (double)seed of 2^53 + 1 rounds to 2^53. */
    if (ok && s->seed <= (UINT64_C(1) << 53)) {
        ok = add_uint(root, "seed", s->seed);
    } else if (ok) { /* a JSON number would not hold it */
        snprintf(seed, sizeof seed, "%" PRIu64, s->seed);
        ok = cJSON_AddStringToObject(root, "seed", seed) != NULL;
    }
    ok = ok && cJSON_AddStringToObject(root, "method", s->method ? s->method : "") &&
         (!s->ef_on_update || cJSON_AddStringToObject(root, "ef_on", "update")) &&
         (!s->has_steps || add_int(root, "steps", s->steps)) &&
         cJSON_AddStringToObject(root, "param_hash", hash) &&
         (!s->has_optimizer_step || add_int(root, "optimizer_step", s->optimizer_step)) &&
         (!s->has_engine_step || add_int(root, "engine_step", s->engine_step));
    if (ok && s->version >= 2) { /* "files" last, for readers of the file */
        cJSON *files = cJSON_AddObjectToObject(root, "files");
        ok = files != NULL;
        for (int i = 0; ok && i < s->nfiles; i++) {
            cJSON *e = file_entry(&s->files[i]);
            ok = e && cJSON_AddItemToObject(files, s->files[i].name, e);
            if (!ok) cJSON_Delete(e);
        }
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) return NULL;
    size_t n = strlen(text);
    char *withnl = malloc(n + 2);
    if (withnl) {
        memcpy(withnl, text, n);
        memcpy(withnl + n, "\n", 2);
    }
    cJSON_free(text);
    return withnl;
}

igrad_status_t train_state_write(const char *path, const train_state_t *s)
{
    char *text = train_state_print(s);
    if (!text) return trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", path);
    igrad_status_t st = metrics_write_text(path, text);
    free(text);
    return st;
}

void train_state_free(train_state_t *s)
{
    if (!s) return;
    free(s->data);
    free(s->method);
    free(s->files);
    memset(s, 0, sizeof *s);
}
