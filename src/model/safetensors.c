/*
 * safetensors.c — reads the header of a .safetensors file into a layout,
 * and writes a header for a layout (round-trip checks, test fixtures).
 *
 * The format: 8-byte little-endian header length N, N bytes of JSON
 * {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
 * {...}}, then the data region. Only the 8 + N header bytes are ever read;
 * the weights are not, so the layout of a multi-gigabyte checkpoint loads
 * in milliseconds.
 *
 * Validation is strict because the header decides how callers size their
 * buffers: known dtype, shape of non-negative integers (at most 4 dims),
 * no overflow, data_offsets consistent with dtype and shape, inside the
 * data region and not overlapping, no duplicate names. Tensors with a zero
 * dimension are validated and then left out of the layout: they have no
 * entries, hence no gradient to synchronize.
 *
 * Not here: the table (layout.c), config.json (layout_hf.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "core/json_strict.h"
#include "model/layout_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Integers in the header travel as JSON numbers (doubles): beyond 2^53
 * they are no longer exact, and no real file gets near. */
#define MAX_EXACT ((double)(INT64_C(1) << 53))

typedef struct entry {
    const char *name;
    igrad_dtype_t dtype;
    int ndim;
    int64_t shape[IGRAD_MAX_DIMS];
    uint64_t begin, end;
    size_t order; /* position in the header (tie-break for equal offsets) */
} entry_t;

static int entry_by_offset(const void *a, const void *b)
{
    const entry_t *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static igrad_status_t json_uint(const cJSON *v, const char *src, const char *name,
                                const char *what, uint64_t *out)
{
    IGRAD_FAIL_IF(!cJSON_IsNumber(v), IGRAD_E_FORMAT,
                  "%s: tensor '%s': %s is not a number", src, name, what);
    double d = v->valuedouble;
    IGRAD_FAIL_IF(!(d >= 0.0), IGRAD_E_FORMAT, "%s: tensor '%s': %s is negative (%.17g)", src,
                  name, what, d);
    IGRAD_FAIL_IF(d > MAX_EXACT, IGRAD_E_FORMAT, "%s: tensor '%s': %s is too large (%.17g)",
                  src, name, what, d);
    IGRAD_FAIL_IF(d != (double)(uint64_t)d, IGRAD_E_FORMAT,
                  "%s: tensor '%s': %s is not an integer (%.17g)", src, name, what, d);
    *out = (uint64_t)d;
    return IGRAD_OK;
}

/* Parses one tensor entry; *count receives its number of elements. */
static igrad_status_t parse_entry(const cJSON *item, const char *src, uint64_t data_nbytes,
                                  entry_t *e, uint64_t *count)
{
    const char *name = item->string;
    IGRAD_FAIL_IF(!cJSON_IsObject(item), IGRAD_E_FORMAT, "%s: tensor '%s' is not an object",
                  src, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    IGRAD_FAIL_IF(!dt, IGRAD_E_FORMAT, "%s: tensor '%s': missing 'dtype'", src, name);
    IGRAD_FAIL_IF(!cJSON_IsString(dt), IGRAD_E_FORMAT, "%s: tensor '%s': 'dtype' is not a string",
                  src, name);
    IGRAD_FAIL_IF(igrad_dtype_from_name(dt->valuestring, &e->dtype) != IGRAD_OK, IGRAD_E_FORMAT,
                  "%s: tensor '%s': unknown dtype '%.32s'", src, name, dt->valuestring);
    IGRAD_FAIL_IF(!sh, IGRAD_E_FORMAT, "%s: tensor '%s': missing 'shape'", src, name);
    IGRAD_FAIL_IF(!cJSON_IsArray(sh), IGRAD_E_FORMAT, "%s: tensor '%s': 'shape' is not an array",
                  src, name);
    int ndim = cJSON_GetArraySize(sh);
    IGRAD_FAIL_IF(ndim > IGRAD_MAX_DIMS, IGRAD_E_FORMAT,
                  "%s: tensor '%s': %d dimensions (at most %d supported)", src, name, ndim,
                  IGRAD_MAX_DIMS);
    e->ndim = ndim;
    uint64_t n = 1;
    int zero = 0;
    for (int d = 0; d < ndim; d++) {
        uint64_t dim;
        IGRAD_CHECK(json_uint(cJSON_GetArrayItem(sh, d), src, name, "a shape dimension", &dim));
        e->shape[d] = (int64_t)dim;
        if (dim == 0) zero = 1;
        else if (!zero) {
            IGRAD_FAIL_IF(n > (uint64_t)INT64_MAX / dim, IGRAD_E_FORMAT,
                          "%s: tensor '%s': element count overflows", src, name);
            n *= dim;
        }
    }
    if (zero) n = 0;
    size_t esize = igrad_dtype_nbytes(e->dtype);
    IGRAD_FAIL_IF(n > (uint64_t)INT64_MAX / esize, IGRAD_E_FORMAT,
                  "%s: tensor '%s': byte size overflows", src, name);

    IGRAD_FAIL_IF(!off, IGRAD_E_FORMAT, "%s: tensor '%s': missing 'data_offsets'", src, name);
    IGRAD_FAIL_IF(!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2, IGRAD_E_FORMAT,
                  "%s: tensor '%s': 'data_offsets' is not [begin, end]", src, name);
    IGRAD_CHECK(json_uint(cJSON_GetArrayItem(off, 0), src, name, "data_offsets[0]", &e->begin));
    IGRAD_CHECK(json_uint(cJSON_GetArrayItem(off, 1), src, name, "data_offsets[1]", &e->end));
    IGRAD_FAIL_IF(e->end < e->begin, IGRAD_E_FORMAT,
                  "%s: tensor '%s': data_offsets [%llu, %llu] end before begin", src, name,
                  (unsigned long long)e->begin, (unsigned long long)e->end);
    IGRAD_FAIL_IF(e->end - e->begin != n * esize, IGRAD_E_FORMAT,
                  "%s: tensor '%s': data_offsets [%llu, %llu] span %llu bytes, but %s %llu "
                  "elements need %llu", src, name, (unsigned long long)e->begin,
                  (unsigned long long)e->end, (unsigned long long)(e->end - e->begin),
                  igrad_dtype_name(e->dtype), (unsigned long long)n,
                  (unsigned long long)(n * esize));
    IGRAD_FAIL_IF(e->end > data_nbytes, IGRAD_E_FORMAT,
                  "%s: tensor '%s': data_offsets end %llu is past the data region (%llu bytes)",
                  src, name, (unsigned long long)e->end, (unsigned long long)data_nbytes);
    *count = n;
    return IGRAD_OK;
}

igrad_status_t igrad_layout_from_safetensors_bytes(const void *bytes, size_t nbytes,
                                                   uint64_t file_nbytes, const char *source,
                                                   igrad_layout_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_layout_from_safetensors_bytes: NULL out");
    *out = NULL;
    IGRAD_FAIL_IF(!bytes && nbytes, IGRAD_E_INVALID,
                  "igrad_layout_from_safetensors_bytes: NULL bytes");
    const char *src = source ? source : "<safetensors>";
    const unsigned char *b = bytes;
    IGRAD_FAIL_IF(file_nbytes < 8 || nbytes < 8, IGRAD_E_FORMAT,
                  "%s: %llu bytes, too short for the 8-byte safetensors header length", src,
                  (unsigned long long)(nbytes < file_nbytes ? nbytes : file_nbytes));
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)b[i] << (8 * i);
    IGRAD_FAIL_IF(hlen > IGRAD__SAFETENSORS_MAX_HEADER, IGRAD_E_FORMAT,
                  "%s: header length %llu is more than the %u allowed", src,
                  (unsigned long long)hlen, IGRAD__SAFETENSORS_MAX_HEADER);
    IGRAD_FAIL_IF(hlen > file_nbytes - 8, IGRAD_E_FORMAT,
                  "%s: header length %llu is larger than the file (%llu bytes)", src,
                  (unsigned long long)hlen, (unsigned long long)file_nbytes);
    IGRAD_FAIL_IF(hlen > nbytes - 8, IGRAD_E_FORMAT,
                  "%s: truncated header: %llu bytes announced, %llu present", src,
                  (unsigned long long)hlen, (unsigned long long)(nbytes - 8));
    IGRAD_FAIL_IF(hlen < 2, IGRAD_E_FORMAT, "%s: header of %llu bytes cannot hold a JSON object",
                  src, (unsigned long long)hlen);
    const char *json = (const char *)b + 8;
    IGRAD_FAIL_IF(memchr(json, '\0', (size_t)hlen) != NULL, IGRAD_E_FORMAT,
                  "%s: NUL byte in the JSON header", src);
    uint64_t data_nbytes = file_nbytes - 8 - hlen;

    igrad_status_t st = IGRAD_OK;
    entry_t *entries = NULL;
    const char **names = NULL;
    igrad_layout_t *layout = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)hlen, &end, 0);
    if (!root) {
        size_t at = end && end >= json ? (size_t)(end - json) : 0;
        return igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__,
                           "%s: malformed JSON header near byte %zu", src, 8 + at);
    }
    /* The writer pads the header with spaces to an 8-byte boundary. */
    for (size_t at = (size_t)(end - json); at < hlen; at++) {
        IGRAD_FAIL_GOTO(json[at] != ' ' && json[at] != '\n' && json[at] != '\r' &&
                            json[at] != '\t',
                        IGRAD_E_FORMAT, "%s: trailing data after the JSON header at byte %zu",
                        src, 8 + at);
    }
    IGRAD_FAIL_GOTO(!cJSON_IsObject(root), IGRAD_E_FORMAT, "%s: header is not a JSON object",
                    src);
    size_t str_at = 0, nul = igrad__json_find_nul_escape(json, (size_t)hlen, &str_at);
    if (nul != IGRAD__JSON_NO_NUL) {
        /* cJSON would cut the name (or dtype) at the NUL: "a\u0000b" and
         * "a" would be one tensor. */
        char excerpt[64];
        igrad__json_nul_excerpt(json, nul, str_at, excerpt, sizeof excerpt);
        IGRAD_FAIL_GOTO(1, IGRAD_E_FORMAT,
                        "%s: string %s at byte %zu holds \\u0000 (a NUL character), which "
                        "igrad does not accept in tensor names or header strings",
                        src, excerpt, 8 + nul);
    }

    size_t n = 0;
    for (const cJSON *it = root->child; it; it = it->next) n++;
    entries = calloc(n ? n : 1, sizeof *entries);
    names = calloc(n ? n : 1, sizeof *names);
    IGRAD_FAIL_GOTO(!entries || !names, IGRAD_E_NOMEM, "%s: out of memory", src);

    size_t ne = 0, nn = 0;
    for (const cJSON *it = root->child; it; it = it->next) {
        names[nn++] = it->string;
        if (strcmp(it->string, "__metadata__") == 0) {
            /* The format makes it a string -> string map; anything else
             * (a tensor entry under the reserved name, say) would be
             * dropped silently. */
            IGRAD_FAIL_GOTO(!cJSON_IsObject(it), IGRAD_E_FORMAT,
                            "%s: '__metadata__' is not an object", src);
            for (const cJSON *m = it->child; m; m = m->next) {
                IGRAD_FAIL_GOTO(!cJSON_IsString(m), IGRAD_E_FORMAT,
                                "%s: '__metadata__' entry '%.64s' is not a string (the key is "
                                "reserved for a string -> string map, not a tensor)",
                                src, m->string);
            }
            continue;
        }
        entry_t *e = &entries[ne];
        uint64_t count = 0;
        IGRAD_CHECK_GOTO(parse_entry(it, src, data_nbytes, e, &count));
        e->name = it->string;
        e->order = ne;
        ne++;
    }
    /* cJSON keeps repeated keys; a header with two entries of one name is
     * ambiguous about which bytes belong to it. */
    qsort(names, nn, sizeof *names, name_cmp);
    for (size_t i = 1; i < nn; i++) {
        IGRAD_FAIL_GOTO(strcmp(names[i - 1], names[i]) == 0, IGRAD_E_FORMAT,
                        "%s: duplicate tensor name '%s'", src, names[i]);
    }

    qsort(entries, ne, sizeof *entries, entry_by_offset);
    for (size_t i = 1; i < ne; i++) {
        IGRAD_FAIL_GOTO(entries[i].begin < entries[i - 1].end, IGRAD_E_FORMAT,
                        "%s: tensors '%s' and '%s' overlap in the data region", src,
                        entries[i - 1].name, entries[i].name);
    }

    IGRAD_CHECK_GOTO(igrad_layout_create(&layout));
    IGRAD_CHECK_GOTO(igrad__layout_set_family(layout, "safetensors"));
    for (size_t i = 0; i < ne; i++) {
        const entry_t *e = &entries[i];
        if (e->end == e->begin) continue; /* zero entries: nothing to sync */
        st = igrad_layout_add(layout, e->name, e->dtype, e->ndim, e->shape);
        if (st == IGRAD_E_INVALID) {
            char why[512];
            snprintf(why, sizeof why, "%s", igrad_last_error());
            st = igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__, "%s: %s", src, why);
        }
        if (st != IGRAD_OK) goto cleanup;
    }
    IGRAD_FAIL_GOTO(igrad_layout_count(layout) == 0, IGRAD_E_FORMAT,
                    "%s: no tensors with entries in the header", src);

cleanup:
    cJSON_Delete(root);
    free(entries);
    free(names);
    if (st != IGRAD_OK) {
        igrad_layout_free(layout);
        return st;
    }
    *out = layout;
    return IGRAD_OK;
}

igrad_status_t igrad_layout_from_safetensors(const char *path, igrad_layout_t **out)
{
    IGRAD_FAIL_IF(!out || !path, IGRAD_E_INVALID,
                  "igrad_layout_from_safetensors: NULL argument");
    *out = NULL;
    FILE *fp;
    uint64_t file_nbytes;
    IGRAD_CHECK(igrad__open_regular(path, &fp, &file_nbytes));
    igrad_status_t st = IGRAD_OK;
    unsigned char *buf = NULL;
    unsigned char len8[8];
    size_t got = fread(len8, 1, 8, fp);
    IGRAD_FAIL_GOTO(ferror(fp), IGRAD_E_IO, "%s: read failed", path);
    if (got < 8) {
        st = igrad_layout_from_safetensors_bytes(len8, got, got, path, out);
        goto cleanup;
    }
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)len8[i] << (8 * i);
    /* Read just the header; bad lengths are reported by the bytes reader. */
    uint64_t want = hlen;
    if (want > IGRAD__SAFETENSORS_MAX_HEADER || want > file_nbytes - 8) want = 0;
    buf = malloc(8 + (size_t)want);
    IGRAD_FAIL_GOTO(!buf, IGRAD_E_NOMEM, "%s: out of memory", path);
    memcpy(buf, len8, 8);
    got = want ? fread(buf + 8, 1, (size_t)want, fp) : 0;
    IGRAD_FAIL_GOTO(ferror(fp), IGRAD_E_IO, "%s: read failed", path);
    st = igrad_layout_from_safetensors_bytes(buf, 8 + got, file_nbytes, path, out);

cleanup:
    fclose(fp);
    free(buf);
    return st;
}

/* An integer as exact JSON text. cJSON_CreateNumber goes through a double
 * and prints it with 15 significant digits whenever the 17-digit form
 * compares equal within its epsilon, which rounds integers above ~1e15
 * (2^53 printed as 9007199254740990): offsets and shapes are written as
 * raw digits instead. */
static cJSON *json_u64(uint64_t v)
{
    char text[24];
    snprintf(text, sizeof text, "%llu", (unsigned long long)v);
    return cJSON_CreateRaw(text);
}

igrad_status_t igrad__layout_to_safetensors_header(const igrad_layout_t *layout,
                                                   unsigned char **bytes, size_t *nbytes,
                                                   uint64_t *data_nbytes)
{
    *bytes = NULL;
    *nbytes = 0;
    *data_nbytes = 0;
    igrad_status_t st = IGRAD_OK;
    char *json = NULL;
    cJSON *root = cJSON_CreateObject();
    IGRAD_FAIL_GOTO(!root, IGRAD_E_NOMEM, "safetensors: out of memory");
    uint64_t at = 0;
    for (size_t i = 0; i < igrad_layout_count(layout); i++) {
        igrad_tensor_info_t t;
        IGRAD_CHECK_GOTO(igrad_layout_tensor(layout, i, &t));
        /* The reader takes offsets up to 2^53 (exact in a JSON double);
         * the count is checked before the product, which could wrap. */
        uint64_t elem = igrad_dtype_nbytes(t.dtype);
        IGRAD_FAIL_GOTO((uint64_t)t.count > ((uint64_t)MAX_EXACT - at) / (elem ? elem : 1),
                        IGRAD_E_INVALID, "safetensors: layout needs more than 2^53 data bytes");
        uint64_t size = (uint64_t)t.count * elem;
        cJSON *e = cJSON_CreateObject();
        IGRAD_FAIL_GOTO(!e, IGRAD_E_NOMEM, "safetensors: out of memory");
        cJSON_AddItemToObject(root, t.name, e);
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        cJSON *off = cJSON_AddArrayToObject(e, "data_offsets");
        IGRAD_FAIL_GOTO(!cJSON_AddStringToObject(e, "dtype", igrad_dtype_name(t.dtype)) ||
                            !shape || !off,
                        IGRAD_E_NOMEM, "safetensors: out of memory");
        for (int d = 0; d < t.ndim; d++) {
            cJSON *v = json_u64((uint64_t)t.shape[d]);
            IGRAD_FAIL_GOTO(!v, IGRAD_E_NOMEM, "safetensors: out of memory");
            cJSON_AddItemToArray(shape, v);
        }
        cJSON *b = json_u64(at);
        cJSON *en = json_u64(at + size);
        IGRAD_FAIL_GOTO(!b || !en, IGRAD_E_NOMEM, "safetensors: out of memory");
        cJSON_AddItemToArray(off, b);
        cJSON_AddItemToArray(off, en);
        at += size;
    }
    json = cJSON_PrintUnformatted(root);
    IGRAD_FAIL_GOTO(!json, IGRAD_E_NOMEM, "safetensors: out of memory");
    size_t len = strlen(json);
    size_t padded = (len + 7) / 8 * 8;
    unsigned char *buf = malloc(8 + padded);
    IGRAD_FAIL_GOTO(!buf, IGRAD_E_NOMEM, "safetensors: out of memory");
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, json, len);
    memset(buf + 8 + len, ' ', padded - len);
    *bytes = buf;
    *nbytes = 8 + padded;
    *data_nbytes = at;

cleanup:
    cJSON_free(json);
    cJSON_Delete(root);
    return st;
}
