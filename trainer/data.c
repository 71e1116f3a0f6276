/*
 * data.c — the reference trainer's data: reading the sources of a `--data`
 * spec into documents (files, directories, JSONL, alpaca records, prepared
 * corpora), the byte-level token streams of the train / validation split,
 * and the stateless, rank-sharded batch sampler. data.h documents the
 * formats and the sampling scheme.
 *
 * Not here: preparing the corpora (scripts/fetch-corpus), the model, the
 * training loop. Nothing here prints or exits; errors go to data_error_t.
 */
#define _POSIX_C_SOURCE 200809L

#include "data.h"
#include "task.h"
#include "core/json_strict.h" /* libigrad's check for \u0000 in JSON strings */

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if defined(__GNUC__)
#  define DATA_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#  define DATA_PRINTF(a, b)
#endif

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

static int fail(data_error_t *err, int status, const char *fmt, ...) DATA_PRINTF(3, 4);

static int fail(data_error_t *err, int status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}

static int fail_nomem(data_error_t *err, const char *what)
{
    return fail(err, DATA_E_NOMEM, "%s: out of memory", what);
}

/* ------------------------------------------------------------------------ */
/* Tokenizer                                                                */
/* ------------------------------------------------------------------------ */

void data_encode(const void *bytes, size_t nbytes, data_token_t *out)
{
    const unsigned char *b = bytes;
    for (size_t i = 0; i < nbytes; i++) out[i] = b[i];
}

size_t data_decode(const data_token_t *tokens, size_t count, char *out, size_t cap)
{
    static const char eot[] = DATA_EOT_TEXT;
    size_t n = 0;
    for (size_t i = 0; i < count; i++) {
        const char *piece;
        size_t len;
        char byte;
        if (tokens[i] < 256) {
            byte = (char)(unsigned char)tokens[i];
            piece = &byte;
            len = 1;
        } else if (tokens[i] == DATA_EOT) {
            piece = eot;
            len = sizeof eot - 1;
        } else {
            piece = "?";
            len = 1;
        }
        for (size_t k = 0; k < len; k++, n++)
            if (n < cap) out[n] = piece[k];
    }
    return n;
}

/* ------------------------------------------------------------------------ */
/* Documents                                                                */
/* ------------------------------------------------------------------------ */

/* Where a document's split comes from. */
enum { SPLIT_BY_HASH = 0, SPLIT_TRAIN = 1, SPLIT_VAL = 2 };

typedef struct doc {
    char *text;           /* owned; not NUL-terminated necessarily */
    size_t nbytes;
    size_t prompt_nbytes; /* leading bytes whose targets are masked */
    int split;            /* SPLIT_*: task problems choose their own */
    size_t task_prompt;   /* > 0: a held-out task problem whose response
                             starts at this byte (an exact-match row) */
} doc_t;

typedef struct doclist {
    doc_t *items;
    size_t count;
    size_t cap;
} doclist_t;

static void doclist_free(doclist_t *dl)
{
    for (size_t i = 0; i < dl->count; i++) free(dl->items[i].text);
    free(dl->items);
    memset(dl, 0, sizeof *dl);
}

static int is_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r' &&
            s[i] != '\f' && s[i] != '\v')
            return 0;
    return 1;
}

/* Takes ownership of `text` (freed even on failure). Whitespace-only
 * documents are dropped: they would only add an EOT. */
static int doclist_push(doclist_t *dl, char *text, size_t nbytes, size_t prompt_nbytes,
                        data_error_t *err)
{
    if (is_blank(text, nbytes)) {
        free(text);
        return DATA_OK;
    }
    if (dl->count == dl->cap) {
        size_t cap = dl->cap ? 2 * dl->cap : 64;
        doc_t *items = realloc(dl->items, cap * sizeof *items);
        if (!items) {
            free(text);
            return fail_nomem(err, "documents");
        }
        dl->items = items;
        dl->cap = cap;
    }
    dl->items[dl->count++] = (doc_t){text, nbytes, prompt_nbytes, SPLIT_BY_HASH, 0};
    return DATA_OK;
}

static int doclist_push_copy(doclist_t *dl, const char *text, size_t nbytes,
                             data_error_t *err)
{
    char *copy = malloc(nbytes ? nbytes : 1);
    if (!copy) return fail_nomem(err, "documents");
    memcpy(copy, text, nbytes);
    return doclist_push(dl, copy, nbytes, 0, err);
}

/* ------------------------------------------------------------------------ */
/* Files                                                                    */
/* ------------------------------------------------------------------------ */

/* Whole file into a malloc'd, NUL-terminated buffer (*nbytes excludes the
 * NUL, which lets JSON lines be parsed in place). */
static int read_file(const char *path, char **data, size_t *nbytes, data_error_t *err)
{
    *data = NULL;
    *nbytes = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return fail(err, DATA_E_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(fp);
        return fail_nomem(err, path);
    }
    for (;;) {
        if (cap - n < 2) {
            char *bigger = realloc(buf, 2 * cap);
            if (!bigger) {
                free(buf);
                fclose(fp);
                return fail_nomem(err, path);
            }
            buf = bigger;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, fp);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(fp);
    int saved = errno;
    fclose(fp);
    if (bad) {
        free(buf);
        return fail(err, DATA_E_IO, "%s: read error: %s", path, strerror(saved));
    }
    buf[n] = '\0';
    *data = buf;
    *nbytes = n;
    return DATA_OK;
}

/* A file looks binary when its first 8 KiB hold a NUL byte or more than a
 * tenth of control bytes that text does not use. Backspace and escape are
 * allowed: old text files (fortunes among them) overstrike with them. */
static int looks_binary(const char *data, size_t nbytes)
{
    size_t n = nbytes < 8192 ? nbytes : 8192, odd = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)data[i];
        if (c == 0) return 1;
        if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f' &&
             c != '\v' && c != '\b' && c != 0x1b) || c == 0x7f)
            odd++;
    }
    return n > 0 && odd * 10 > n;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t ns = strlen(s), nx = strlen(suffix);
    return ns >= nx && strcmp(s + ns - nx, suffix) == 0;
}

typedef struct strlist {
    char **items;
    size_t count;
    size_t cap;
} strlist_t;

static void strlist_free(strlist_t *sl)
{
    for (size_t i = 0; i < sl->count; i++) free(sl->items[i]);
    free(sl->items);
    memset(sl, 0, sizeof *sl);
}

/* Takes ownership of s. */
static int strlist_push(strlist_t *sl, char *s, data_error_t *err)
{
    if (!s) return fail_nomem(err, "file list");
    if (sl->count == sl->cap) {
        size_t cap = sl->cap ? 2 * sl->cap : 32;
        char **items = realloc(sl->items, cap * sizeof *items);
        if (!items) {
            free(s);
            return fail_nomem(err, "file list");
        }
        sl->items = items;
        sl->cap = cap;
    }
    sl->items[sl->count++] = s;
    return DATA_OK;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static char *join_path(const char *dir, const char *name)
{
    size_t nd = strlen(dir), nn = strlen(name);
    int slash = nd > 0 && dir[nd - 1] != '/';
    char *p = malloc(nd + slash + nn + 1);
    if (!p) return NULL;
    memcpy(p, dir, nd);
    if (slash) p[nd] = '/';
    memcpy(p + nd + slash, name, nn + 1);
    return p;
}

/* Collects the regular files under `dir` (hidden names skipped; symlinks to
 * files followed, symlinks to directories not, so cycles cannot occur). */
static int walk_dir(const char *dir, strlist_t *files, size_t *nskipped, data_error_t *err)
{
    DIR *d = opendir(dir);
    if (!d) return fail(err, DATA_E_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    int st = DATA_OK;
    struct dirent *e;
    while (st == DATA_OK && (errno = 0, e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') {
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) (*nskipped)++;
            continue;
        }
        char *path = join_path(dir, e->d_name);
        if (!path) {
            st = fail_nomem(err, dir);
            break;
        }
        struct stat sb;
        if (lstat(path, &sb) != 0) {
            st = fail(err, DATA_E_IO, "%s: %s", path, strerror(errno));
            free(path);
        } else if (S_ISDIR(sb.st_mode)) {
            st = walk_dir(path, files, nskipped, err);
            free(path);
        } else if (S_ISREG(sb.st_mode) || (S_ISLNK(sb.st_mode) && stat(path, &sb) == 0 &&
                                          S_ISREG(sb.st_mode))) {
            st = strlist_push(files, path, err);
        } else {
            (*nskipped)++; /* sockets, fifos, dangling or directory links */
            free(path);
        }
    }
    if (st == DATA_OK && errno != 0)
        st = fail(err, DATA_E_IO, "%s: cannot list directory: %s", dir, strerror(errno));
    closedir(d);
    return st;
}

static int load_text_file(const char *path, int skip_binary, doclist_t *docs,
                          size_t *nskipped, data_error_t *err)
{
    char *text;
    size_t n;
    int st = read_file(path, &text, &n, err);
    if (st != DATA_OK) return st;
    if (looks_binary(text, n)) {
        free(text);
        if (skip_binary) {
            (*nskipped)++;
            return DATA_OK;
        }
        return fail(err, DATA_E_FORMAT, "%s: looks like a binary file, not text", path);
    }
    return doclist_push(docs, text, n, 0, err);
}

static int load_dir(const char *dir, doclist_t *docs, size_t *nskipped, data_error_t *err)
{
    strlist_t files = {0};
    int st = walk_dir(dir, &files, nskipped, err);
    if (st == DATA_OK && files.count > 1)
        qsort(files.items, files.count, sizeof *files.items, cmp_str);
    for (size_t i = 0; st == DATA_OK && i < files.count; i++)
        st = load_text_file(files.items[i], 1, docs, nskipped, err);
    strlist_free(&files);
    return st;
}

/* ------------------------------------------------------------------------ */
/* JSONL                                                                    */
/* ------------------------------------------------------------------------ */

enum jsonl_kind { JSONL_AUTO, JSONL_TEXT, JSONL_ALPACA };

/* The string value of `key`, NULL if absent or null; *bad set if present
 * with another type. */
static const char *json_str(const cJSON *obj, const char *key, int *bad)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return NULL;
    if (!cJSON_IsString(v)) {
        *bad = 1;
        return NULL;
    }
    return v->valuestring;
}

/* Formats one record with the alpaca template of data.h and pushes it;
 * *nprompt_out (if not NULL) gets the prompt's length in bytes. */
static int alpaca_push(const char *what, const char *ins, const char *in, const char *out,
                       int response_only, doclist_t *docs, size_t *nprompt_out,
                       data_error_t *err)
{
    size_t nins = strlen(ins), nin = in ? strlen(in) : 0, nout = strlen(out);
    static const char h_ins[] = "### Instruction:\n", h_in[] = "\n\n### Input:\n",
                      h_out[] = "\n\n### Response:\n";
    size_t nprompt = (sizeof h_ins - 1) + nins + (nin ? (sizeof h_in - 1) + nin : 0) +
                     (sizeof h_out - 1);
    char *text = malloc(nprompt + nout + 1);
    if (!text) return fail_nomem(err, what);
    char *p = text;
    memcpy(p, h_ins, sizeof h_ins - 1), p += sizeof h_ins - 1;
    memcpy(p, ins, nins), p += nins;
    if (nin) {
        memcpy(p, h_in, sizeof h_in - 1), p += sizeof h_in - 1;
        memcpy(p, in, nin), p += nin;
    }
    memcpy(p, h_out, sizeof h_out - 1), p += sizeof h_out - 1;
    memcpy(p, out, nout);
    if (nprompt_out) *nprompt_out = nprompt;
    return doclist_push(docs, text, nprompt + nout, response_only ? nprompt : 0, err);
}

static int alpaca_doc(const char *path, size_t line, const cJSON *obj, int response_only,
                      doclist_t *docs, data_error_t *err)
{
    int bad = 0;
    const char *ins = json_str(obj, "instruction", &bad);
    if (!ins || bad)
        return fail(err, DATA_E_FORMAT, "%s:%zu: alpaca record without an \"instruction\" string",
                    path, line);
    const char *out = json_str(obj, "output", &bad);
    if (!out || bad)
        return fail(err, DATA_E_FORMAT, "%s:%zu: alpaca record without an \"output\" string",
                    path, line);
    const char *in = json_str(obj, "input", &bad);
    if (bad)
        return fail(err, DATA_E_FORMAT, "%s:%zu: alpaca \"input\" is not a string", path, line);
    return alpaca_push(path, ins, in, out, response_only, docs, NULL, err);
}

static int load_jsonl(const char *path, enum jsonl_kind kind, int response_only,
                      doclist_t *docs, data_error_t *err)
{
    char *data;
    size_t n;
    int st = read_file(path, &data, &n, err);
    if (st != DATA_OK) return st;
    size_t line = 0, pos = 0;
    while (st == DATA_OK && pos < n) {
        size_t end = pos;
        while (end < n && data[end] != '\n') end++;
        line++;
        size_t stop = end;
        if (stop > pos && data[stop - 1] == '\r') stop--;
        char saved = data[stop];
        data[stop] = '\0'; /* parse the line in place */
        const char *nul_byte = memchr(data + pos, '\0', stop - pos);
        size_t str_at = 0, nul = IGRAD__JSON_NO_NUL;
        if (nul_byte) {
            /* cJSON would stop at it and accept the line's first part */
            st = fail(err, DATA_E_FORMAT, "%s:%zu:%zu: NUL byte in a JSONL line", path, line,
                      (size_t)(nul_byte - (data + pos)) + 1);
        } else if (!is_blank(data + pos, stop - pos)) {
            cJSON *obj = cJSON_ParseWithOpts(data + pos, NULL, 1);
            if (obj && cJSON_IsObject(obj))
                nul = igrad__json_find_nul_escape(data + pos, stop - pos, &str_at);
            if (!obj || !cJSON_IsObject(obj)) {
                st = fail(err, DATA_E_FORMAT, "%s:%zu: malformed JSONL line (%s)", path, line,
                          obj ? "not a JSON object" : "invalid JSON");
            } else if (nul != IGRAD__JSON_NO_NUL) {
                /* cJSON's C strings would end the document at the NUL. */
                char excerpt[64];
                igrad__json_nul_excerpt(data + pos, nul, str_at, excerpt, sizeof excerpt);
                st = fail(err, DATA_E_FORMAT,
                          "%s:%zu:%zu: string %s holds \\u0000 (a NUL character), which "
                          "documents cannot contain here", path, line, nul + 1, excerpt);
            } else {
                if (kind == JSONL_AUTO) {
                    if (cJSON_GetObjectItemCaseSensitive(obj, "text"))
                        kind = JSONL_TEXT;
                    else if (cJSON_GetObjectItemCaseSensitive(obj, "instruction") &&
                             cJSON_GetObjectItemCaseSensitive(obj, "output"))
                        kind = JSONL_ALPACA;
                    else
                        st = fail(err, DATA_E_FORMAT,
                                  "%s:%zu: JSONL record has neither a \"text\" field nor "
                                  "\"instruction\"/\"output\" fields", path, line);
                }
                if (st == DATA_OK && kind == JSONL_TEXT) {
                    int bad = 0;
                    const char *text = json_str(obj, "text", &bad);
                    if (!text || bad)
                        st = fail(err, DATA_E_FORMAT, "%s:%zu: record without a \"text\" string",
                                  path, line);
                    else
                        st = doclist_push_copy(docs, text, strlen(text), err);
                } else if (st == DATA_OK) {
                    st = alpaca_doc(path, line, obj, response_only, docs, err);
                }
            }
            cJSON_Delete(obj);
        }
        data[stop] = saved;
        pos = end + 1;
    }
    free(data);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Prepared corpora (scripts/fetch-corpus)                                  */
/* ------------------------------------------------------------------------ */

/* Documents separated by lines that are exactly "%"; a separator's preceding
 * newline belongs to it, not to the document. */
static int load_separated(const char *path, doclist_t *docs, data_error_t *err)
{
    char *data;
    size_t n;
    int st = read_file(path, &data, &n, err);
    if (st != DATA_OK) return st;
    size_t doc_start = 0, pos = 0;
    while (st == DATA_OK && pos <= n) {
        size_t end = pos;
        while (end < n && data[end] != '\n') end++;
        size_t len = end - pos;
        if (len > 0 && data[end - 1] == '\r') len--;
        int sep = len == 1 && data[pos] == '%';
        if (sep || end >= n) {
            size_t doc_end = sep ? (pos > doc_start ? pos - 1 : doc_start) : n;
            if (!sep && doc_end > doc_start && data[doc_end - 1] == '\n') doc_end--;
            st = doclist_push_copy(docs, data + doc_start, doc_end - doc_start, err);
            doc_start = end + 1;
        }
        pos = end + 1;
    }
    free(data);
    return st;
}

void data_dir_resolve(const char *opts_dir, char *buf, size_t cap)
{
    const char *env = getenv("IGRAD_DATA_DIR");
    if (opts_dir) {
        snprintf(buf, cap, "%s", opts_dir);
    } else if (env && env[0]) {
        snprintf(buf, cap, "%s", env);
    } else {
        /* This file's own path locates the source tree when the build used
         * absolute paths (CMake does), so the trainer finds data/ from any
         * working directory. */
        static const char self[] = __FILE__, tail[] = "trainer/data.c";
        size_t ns = sizeof self - 1, nt = sizeof tail - 1;
        if (self[0] == '/' && ns > nt && strcmp(self + ns - nt, tail) == 0)
            snprintf(buf, cap, "%.*sdata", (int)(ns - nt), self);
        else
            snprintf(buf, cap, "data");
    }
}

static int corpus_missing(data_error_t *err, const char *element, const char *path,
                          const char *dir)
{
    return fail(err, DATA_E_CORPUS,
                "%s: corpus not prepared (%s is missing); run scripts/fetch-corpus "
                "(data directory %s; set IGRAD_DATA_DIR to use another)",
                element, path, dir);
}

/* Reads a list of names: genres.txt lines, or the *.txt names of a folder. */
static int list_names(const char *dir, const char *listfile, strlist_t *names,
                      data_error_t *err)
{
    if (listfile) {
        char *data;
        size_t n;
        int st = read_file(listfile, &data, &n, err);
        if (st != DATA_OK) return st;
        for (char *line = strtok(data, "\r\n"); st == DATA_OK && line; line = strtok(NULL, "\r\n"))
            if (line[0]) {
                char *copy = malloc(strlen(line) + 1);
                if (copy) strcpy(copy, line);
                st = strlist_push(names, copy, err);
            }
        free(data);
        return st;
    }
    DIR *d = opendir(dir);
    if (!d) return fail(err, DATA_E_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    int st = DATA_OK;
    struct dirent *e;
    while (st == DATA_OK && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || !ends_with(e->d_name, ".txt")) continue;
        size_t len = strlen(e->d_name) - 4;
        char *name = malloc(len + 1);
        if (name) {
            memcpy(name, e->d_name, len);
            name[len] = '\0';
        }
        st = strlist_push(names, name, err);
    }
    closedir(d);
    if (st == DATA_OK && names->count > 1)
        qsort(names->items, names->count, sizeof *names->items, cmp_str);
    return st;
}

static int name_known(const strlist_t *names, const char *name)
{
    for (size_t i = 0; i < names->count; i++)
        if (strcmp(names->items[i], name) == 0) return 1;
    return 0;
}

static int unknown_name(data_error_t *err, const char *element, const char *what,
                        const char *name, const strlist_t *names)
{
    char valid[768];
    size_t used = 0;
    valid[0] = '\0';
    for (size_t i = 0; i < names->count && used < sizeof valid; i++) {
        int w = snprintf(valid + used, sizeof valid - used, "%s%s", i ? ", " : "",
                         names->items[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
    return fail(err, DATA_E_ARG, "%s: unknown %s '%s'; valid: %s", element, what, name, valid);
}

/* brown:G+G / fortunes:N+N — `arg` empty (or "all" for brown) means every
 * name, in the order of the list. */
static int load_named(const char *element, const char *corpus, const char *arg,
                      const char *data_dir, doclist_t *docs, data_error_t *err)
{
    int brown = strcmp(corpus, "brown") == 0;
    char *dir = join_path(data_dir, corpus);
    char *listfile = brown ? join_path(dir ? dir : "", "genres.txt") : NULL;
    char *args = malloc(strlen(arg) + 1);
    strlist_t names = {0};
    int st = DATA_OK;
    if (!dir || (brown && !listfile) || !args) {
        st = fail_nomem(err, element);
        goto cleanup;
    }
    strcpy(args, arg);
    struct stat sb;
    const char *probe = brown ? listfile : dir;
    if (stat(probe, &sb) != 0) {
        st = corpus_missing(err, element, probe, data_dir);
        goto cleanup;
    }
    st = list_names(dir, listfile, &names, err);
    if (st != DATA_OK) goto cleanup;
    if (names.count == 0) {
        st = corpus_missing(err, element, dir, data_dir);
        goto cleanup;
    }
    int all = args[0] == '\0' || (brown && strcmp(args, "all") == 0);
    size_t nwant = all ? names.count : 1;
    if (!all) {
        for (char *c = args; *c; c++)
            if (*c == '+') nwant++;
    }
    char *cursor = args;
    for (size_t i = 0; st == DATA_OK && i < nwant; i++) {
        const char *name;
        if (all) {
            name = names.items[i];
        } else {
            char *plus = strchr(cursor, '+');
            if (plus) *plus = '\0';
            name = cursor;
            cursor = plus ? plus + 1 : cursor + strlen(cursor);
            if (!name_known(&names, name)) {
                st = unknown_name(err, element, brown ? "genre" : "fortune file", name, &names);
                break;
            }
        }
        char *file = malloc(strlen(dir) + strlen(name) + 6);
        if (!file) {
            st = fail_nomem(err, element);
            break;
        }
        sprintf(file, "%s/%s.txt", dir, name);
        if (stat(file, &sb) != 0)
            st = corpus_missing(err, element, file, data_dir);
        else
            st = load_separated(file, docs, err);
        free(file);
    }
cleanup:
    strlist_free(&names);
    free(args);
    free(listfile);
    free(dir);
    return st;
}

/* kjv: / lodash: — a corpus that is one prepared file, <corpus>/<corpus>.txt,
 * read whole; it takes no argument. */
static int load_single(const char *element, const char *corpus, const char *arg,
                       const char *data_dir, doclist_t *docs, data_error_t *err)
{
    if (arg[0])
        return fail(err, DATA_E_ARG, "%s: %s takes no argument (use '%s:')", element, corpus,
                    corpus);
    char *file = malloc(strlen(data_dir) + 2 * strlen(corpus) + sizeof "//.txt");
    if (!file) return fail_nomem(err, element);
    sprintf(file, "%s/%s/%s.txt", data_dir, corpus, corpus);
    struct stat sb;
    int st = stat(file, &sb) != 0 ? corpus_missing(err, element, file, data_dir)
                                  : load_separated(file, docs, err);
    free(file);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Synthetic tasks (task.h)                                                 */
/* ------------------------------------------------------------------------ */

/* task:KINDS[:train=N][:test=N] — training problems, then the held-out
 * ones, each an alpaca record whose split is its own (task.h). */
static int load_task(const char *element, const char *arg, int response_only,
                     doclist_t *docs, data_error_t *err)
{
    task_spec_t spec;
    task_problem_t *train = NULL, *test = NULL;
    uint64_t ninst = 0;
    char msg[512];
    if (task_spec_parse(arg, &spec, msg, sizeof msg) != 0)
        return fail(err, DATA_E_ARG, "%s", msg);
    if (task_build(&spec, &train, &test, &ninst, msg, sizeof msg) != 0)
        return fail(err, strstr(msg, "out of memory") ? DATA_E_NOMEM : DATA_E_ARG, "%s: %s",
                    element, msg);
    int st = DATA_OK;
    for (size_t i = 0; st == DATA_OK && i < spec.ntrain + spec.ntest; i++) {
        int held = i >= spec.ntrain;
        const task_problem_t *p = held ? &test[i - spec.ntrain] : &train[i];
        size_t nprompt = 0;
        st = alpaca_push(element, p->instruction, p->input, p->output, response_only, docs,
                         &nprompt, err);
        if (st == DATA_OK) {
            docs->items[docs->count - 1].split = held ? SPLIT_VAL : SPLIT_TRAIN;
            docs->items[docs->count - 1].task_prompt = held ? nprompt : 0;
        }
    }
    free(train);
    free(test);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Spec                                                                     */
/* ------------------------------------------------------------------------ */

static int load_path(const char *path, int force_text, doclist_t *docs, size_t *nskipped,
                     int response_only, data_error_t *err)
{
    struct stat sb;
    if (path[0] == '\0') return fail(err, DATA_E_ARG, "empty path in the data spec");
    if (stat(path, &sb) != 0)
        return fail(err, DATA_E_IO, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) return load_dir(path, docs, nskipped, err);
    if (!S_ISREG(sb.st_mode))
        return fail(err, DATA_E_IO, "%s: not a regular file or directory", path);
    if (!force_text && (ends_with(path, ".jsonl") || ends_with(path, ".JSONL")))
        return load_jsonl(path, JSONL_AUTO, response_only, docs, err);
    return load_text_file(path, 0, docs, nskipped, err);
}

/* One element of the spec: "prefix:arg" for a known prefix, else a path. */
static int load_element(const char *element, const data_options_t *opts, doclist_t *docs,
                        size_t *nskipped, data_error_t *err)
{
    char data_dir[4096];
    const char *colon = strchr(element, ':');
    size_t nprefix = colon ? (size_t)(colon - element) : 0;
    const char *arg = colon ? colon + 1 : element;
#define PREFIX_IS(s) (colon && nprefix == sizeof(s) - 1 && memcmp(element, s, nprefix) == 0)
    if (PREFIX_IS("text")) return load_path(arg, 1, docs, nskipped, 0, err);
    if (PREFIX_IS("jsonl") || PREFIX_IS("alpaca")) {
        struct stat sb;
        if (stat(arg, &sb) != 0)
            return fail(err, DATA_E_IO, "%s: cannot open: %s", arg, strerror(errno));
        if (!S_ISREG(sb.st_mode)) return fail(err, DATA_E_IO, "%s: not a regular file", arg);
        return load_jsonl(arg, PREFIX_IS("alpaca") ? JSONL_ALPACA : JSONL_AUTO,
                          opts->response_only, docs, err);
    }
    if (PREFIX_IS("task")) return load_task(element, arg, opts->response_only, docs, err);
    if (PREFIX_IS("brown") || PREFIX_IS("fortunes") || PREFIX_IS("kjv") ||
        PREFIX_IS("lodash")) {
        data_dir_resolve(opts->data_dir, data_dir, sizeof data_dir);
        if (PREFIX_IS("kjv")) return load_single(element, "kjv", arg, data_dir, docs, err);
        if (PREFIX_IS("lodash"))
            return load_single(element, "lodash", arg, data_dir, docs, err);
        return load_named(element, PREFIX_IS("brown") ? "brown" : "fortunes", arg, data_dir,
                          docs, err);
    }
#undef PREFIX_IS
    return load_path(element, 0, docs, nskipped, opts->response_only, err);
}

/* ------------------------------------------------------------------------ */
/* Hashing and the split                                                    */
/* ------------------------------------------------------------------------ */

/* splitmix64's finalizer: a bijective mix, so distinct inputs never
 * collide, and stable across platforms. */
uint64_t data_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Distinct domains keep the split, the permutation and the shift
 * independent for the same seed. */
enum { DOMAIN_SPLIT = 1, DOMAIN_PERM = 2, DOMAIN_SHIFT = 3 };

static uint64_t hash3(uint64_t seed, uint64_t domain, uint64_t x)
{
    return data_mix64(data_mix64(data_mix64(seed) ^ domain) ^ x);
}

static double unit_from_hash(uint64_t h)
{
    return (double)(h >> 11) * 0x1.0p-53; /* [0, 1) */
}

/* A pseudo-random permutation of [0, n): a 4-round Feistel network on the
 * smallest even number of bits that covers n, cycle-walking values >= n back
 * in. Stateless, so any window of any epoch is found in O(1) without
 * storing a shuffled array. */
static uint64_t permute(uint64_t k, uint64_t n, uint64_t key)
{
    if (n <= 1) return 0;
    unsigned bits = 0;
    while (bits < 64 && ((n - 1) >> bits) != 0) bits++;
    unsigned half = (bits + 1) / 2;
    uint64_t mask = (half >= 64) ? ~0ULL : ((1ULL << half) - 1);
    do {
        uint64_t l = k >> half, r = k & mask;
        for (uint64_t round = 0; round < 4; round++) {
            uint64_t f = data_mix64(r ^ data_mix64(key + round)) & mask;
            uint64_t nl = r;
            r = l ^ f;
            l = nl;
        }
        k = (l << half) | r;
    } while (k >= n);
    return k;
}

/* ------------------------------------------------------------------------ */
/* Dataset                                                                  */
/* ------------------------------------------------------------------------ */

static int build_split(data_split_t *sp, const doclist_t *docs, const uint8_t *in_val,
                       uint8_t want_val, data_error_t *err)
{
    size_t count = 0, ndocs = 0;
    int masked = 0;
    for (size_t i = 0; i < docs->count; i++)
        if (in_val[i] == want_val) {
            count += docs->items[i].nbytes + 1;
            ndocs++;
            masked |= docs->items[i].prompt_nbytes > 0;
        }
    sp->count = count;
    sp->ndocs = ndocs;
    if (count == 0) return DATA_OK;
    sp->tokens = malloc(count * sizeof *sp->tokens);
    if (masked) sp->counts = malloc(count);
    if (!sp->tokens || (masked && !sp->counts)) return fail_nomem(err, "token stream");
    size_t at = 0;
    for (size_t i = 0; i < docs->count; i++) {
        const doc_t *d = &docs->items[i];
        if (in_val[i] != want_val) continue;
        data_encode(d->text, d->nbytes, sp->tokens + at);
        sp->tokens[at + d->nbytes] = DATA_EOT;
        if (masked) {
            memset(sp->counts + at, 0, d->prompt_nbytes);
            memset(sp->counts + at + d->prompt_nbytes, 1, d->nbytes - d->prompt_nbytes + 1);
        }
        at += d->nbytes + 1;
    }
    return DATA_OK;
}

/* The exact-match rows: every held-out task problem, in order. */
static int build_task_rows(dataset_t *ds, const doclist_t *docs, size_t T, const char *spec,
                           data_error_t *err)
{
    size_t n = 0, nbytes = 0, longest = 0;
    for (size_t i = 0; i < docs->count; i++)
        if (docs->items[i].task_prompt > 0) {
            n++;
            nbytes += docs->items[i].nbytes;
            if (docs->items[i].nbytes > longest) longest = docs->items[i].nbytes;
        }
    if (n == 0) return DATA_OK;
    if (longest + 1 > T)
        return fail(err, DATA_E_ARG,
                    "%s: a held-out task problem needs %zu tokens (end-of-text, record), more "
                    "than the sequence length %zu", spec, longest + 1, T);
    ds->task_tokens = malloc(nbytes * sizeof *ds->task_tokens);
    ds->task_offsets = malloc((n + 1) * sizeof *ds->task_offsets);
    ds->task_prompts = malloc(n * sizeof *ds->task_prompts);
    if (!ds->task_tokens || !ds->task_offsets || !ds->task_prompts)
        return fail_nomem(err, "task problems");
    size_t k = 0, at = 0;
    for (size_t i = 0; i < docs->count; i++) {
        const doc_t *d = &docs->items[i];
        if (d->task_prompt == 0) continue;
        data_encode(d->text, d->nbytes, ds->task_tokens + at);
        ds->task_offsets[k] = at;
        ds->task_prompts[k++] = d->task_prompt;
        at += d->nbytes;
    }
    ds->task_offsets[n] = at;
    ds->ntask = n;
    ds->task_seq_len = (int)(longest + 1);
    return DATA_OK;
}

void dataset_free(dataset_t *ds)
{
    if (!ds) return;
    free(ds->task_tokens);
    free(ds->task_offsets);
    free(ds->task_prompts);
    free(ds->train.tokens);
    free(ds->train.counts);
    free(ds->val.tokens);
    free(ds->val.counts);
    free(ds->val_starts);
    free(ds->spec);
    memset(ds, 0, sizeof *ds);
}

int dataset_load(dataset_t *ds, const char *spec, const data_options_t *opts,
                 data_error_t *err)
{
    static const data_options_t defaults = DATA_OPTIONS_INIT;
    if (err) {
        err->status = DATA_OK;
        err->message[0] = '\0';
    }
    if (!ds) return fail(err, DATA_E_ARG, "dataset_load: no dataset");
    memset(ds, 0, sizeof *ds);
    if (!opts) opts = &defaults;
    if (!spec || !spec[0]) return fail(err, DATA_E_ARG, "empty data spec");
    if (opts->seq_len < 1)
        return fail(err, DATA_E_ARG, "%s: sequence length must be >= 1 (got %d)", spec,
                    opts->seq_len);
    if (!(opts->val_fraction >= 0.0 && opts->val_fraction < 1.0))
        return fail(err, DATA_E_ARG, "%s: validation fraction must be in [0, 1) (got %g)", spec,
                    opts->val_fraction);

    doclist_t docs = {0};
    uint8_t *in_val = NULL;
    size_t nskipped = 0;
    int ntask_elements = 0;
    const size_t T = (size_t)opts->seq_len;
    int st = DATA_OK;
    char *elements = malloc(strlen(spec) + 1);
    ds->spec = malloc(strlen(spec) + 1);
    if (!elements || !ds->spec) {
        st = fail_nomem(err, spec);
        goto cleanup;
    }
    strcpy(ds->spec, spec);
    strcpy(elements, spec);

    /* Each element in turn; an element that yields nothing is an error of
     * its own, so a typo'd path inside a list is not silently ignored. */
    for (char *el = elements; st == DATA_OK && el;) {
        char *comma = strchr(el, ',');
        if (comma) *comma = '\0';
        while (*el == ' ' || *el == '\t') el++;
        size_t len = strlen(el);
        while (len > 0 && (el[len - 1] == ' ' || el[len - 1] == '\t')) el[--len] = '\0';
        if (len == 0) {
            st = fail(err, DATA_E_ARG, "%s: empty element in the data spec", spec);
            break;
        }
        if (strncmp(el, "task:", 5) == 0 && ntask_elements++ > 0) {
            st = fail(err, DATA_E_ARG,
                      "%s: more than one task: element; give every kind in one (task:A+B)",
                      spec);
            break;
        }
        size_t before = docs.count;
        st = load_element(el, opts, &docs, &nskipped, err);
        if (st == DATA_OK && docs.count == before)
            st = fail(err, DATA_E_EMPTY, "%s: no documents (empty corpus)", el);
        el = comma ? comma + 1 : NULL;
    }
    if (st != DATA_OK) goto cleanup;

    /* The split: by document, from (seed, index) only; task problems
     * bring their own (task.h), which the fix-ups below never move. */
    size_t n = docs.count, nforced = 0;
    for (size_t i = 0; i < n; i++) nforced += docs.items[i].split != SPLIT_BY_HASH;
    if (opts->val_fraction > 0.0 && n < 2) {
        st = fail(err, DATA_E_EMPTY,
                  "%s: 1 document cannot be split into train and validation; give several "
                  "documents (a directory, JSONL) or validation fraction 0", spec);
        goto cleanup;
    }
    in_val = calloc(n, 1);
    if (!in_val) {
        st = fail_nomem(err, spec);
        goto cleanup;
    }
    size_t nval = 0;
    for (size_t i = 0; i < n; i++) {
        in_val[i] = docs.items[i].split == SPLIT_VAL;
        nval += in_val[i];
    }
    if (opts->val_fraction > 0.0 && nforced < n) {
        size_t lo = 0, hi = 0;
        double ulo = 2.0, uhi = -1.0;
        for (size_t i = 0; i < n; i++) {
            if (docs.items[i].split != SPLIT_BY_HASH) continue;
            double u = unit_from_hash(hash3(opts->seed, DOMAIN_SPLIT, i));
            in_val[i] = u < opts->val_fraction;
            nval += in_val[i];
            if (u < ulo) ulo = u, lo = i;
            if (u > uhi) uhi = u, hi = i;
        }
        if (nval == 0) in_val[lo] = 1, nval++;
        if (nval == n) in_val[hi] = 0;
    }
    st = build_task_rows(ds, &docs, T, spec, err);
    if (st != DATA_OK) goto cleanup;
    st = build_split(&ds->train, &docs, in_val, 0, err);
    if (st == DATA_OK) st = build_split(&ds->val, &docs, in_val, 1, err);
    if (st != DATA_OK) goto cleanup;
    ds->ndocs = n;
    ds->nskipped = nskipped;
    ds->seq_len = opts->seq_len;
    ds->seed = opts->seed;

    if (ds->train.count < T + 1) {
        st = fail(err, DATA_E_EMPTY,
                  "%s: sequence length %zu needs %zu tokens, but the training split has only "
                  "%zu (%zu documents)", spec, T, T + 1, ds->train.count, ds->train.ndocs);
        goto cleanup;
    }
    if (ds->val.count > 0 && ds->val.count < T + 1) {
        st = fail(err, DATA_E_EMPTY,
                  "%s: sequence length %zu needs %zu tokens, but the validation split has only "
                  "%zu (%zu documents); raise the validation fraction or shorten the sequence",
                  spec, T, T + 1, ds->val.count, ds->val.ndocs);
        goto cleanup;
    }
    ds->nwindows = (ds->train.count - 1) / T;
    if (ds->val.count > 0) {
        size_t cv = (ds->val.count - 1) / T;
        size_t nv = (opts->val_max_seqs && opts->val_max_seqs < cv) ? opts->val_max_seqs : cv;
        ds->val_starts = malloc(nv * sizeof *ds->val_starts);
        if (!ds->val_starts) {
            st = fail_nomem(err, spec);
            goto cleanup;
        }
        for (size_t i = 0; i < nv; i++) ds->val_starts[i] = (i * cv / nv) * T;
        ds->nval_seqs = nv;
    }

cleanup:
    free(in_val);
    free(elements);
    doclist_free(&docs);
    if (st != DATA_OK) dataset_free(ds);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Batches                                                                  */
/* ------------------------------------------------------------------------ */

static void fill_row(const data_split_t *sp, size_t start, size_t T, int *inputs, int *targets)
{
    const data_token_t *tok = sp->tokens + start;
    for (size_t t = 0; t < T; t++) {
        inputs[t] = tok[t];
        targets[t] = (!sp->counts || sp->counts[start + t + 1]) ? tok[t + 1] : -1;
    }
}

void data_shard(size_t n, int rank, int nranks, size_t *begin, size_t *end)
{
    *begin = n * (size_t)rank / (size_t)nranks;
    *end = n * (size_t)(rank + 1) / (size_t)nranks;
}

int dataset_train_batch(const dataset_t *ds, int64_t step, int global_batch, int rank,
                        int nranks, int *inputs, int *targets, data_error_t *err)
{
    if (!ds || !ds->train.tokens || !inputs || !targets)
        return fail(err, DATA_E_ARG, "dataset_train_batch: no dataset or buffers");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return fail(err, DATA_E_ARG, "rank %d is outside [0, %d)", rank, nranks);
    if (global_batch < 1 || global_batch % nranks != 0)
        return fail(err, DATA_E_ARG,
                    "global batch %d must be a positive multiple of the number of ranks %d",
                    global_batch, nranks);
    if (step < 0) return fail(err, DATA_E_ARG, "step %lld is negative", (long long)step);
    const size_t T = (size_t)ds->seq_len, C = ds->nwindows;
    const size_t spare = ds->train.count - 1 - C * T; /* room for the epoch's shift */
    const int B = global_batch / nranks;
    for (int b = 0; b < B; b++) {
        uint64_t g = (uint64_t)step * (uint64_t)global_batch + (uint64_t)(rank * B + b);
        uint64_t epoch = g / C;
        uint64_t w = permute(g % C, C, hash3(ds->seed, DOMAIN_PERM, epoch));
        uint64_t shift = hash3(ds->seed, DOMAIN_SHIFT, epoch) % (spare + 1);
        fill_row(&ds->train, (size_t)(shift + w * T), T, inputs + (size_t)b * T,
                 targets + (size_t)b * T);
    }
    return DATA_OK;
}

int dataset_val_batch(const dataset_t *ds, size_t first, size_t count, int *inputs,
                      int *targets, data_error_t *err)
{
    if (!ds || (count > 0 && (!inputs || !targets)))
        return fail(err, DATA_E_ARG, "dataset_val_batch: no dataset or buffers");
    if (first > ds->nval_seqs || count > ds->nval_seqs - first)
        return fail(err, DATA_E_ARG, "validation sequences [%zu, %zu) are outside [0, %zu)",
                    first, first + count, ds->nval_seqs);
    const size_t T = (size_t)ds->seq_len;
    for (size_t i = 0; i < count; i++)
        fill_row(&ds->val, ds->val_starts[first + i], T, inputs + i * T, targets + i * T);
    return DATA_OK;
}

int dataset_task_batch(const dataset_t *ds, size_t first, size_t count, int T, int *inputs,
                       int *targets, data_error_t *err)
{
    if (!ds || (count > 0 && (!inputs || !targets)))
        return fail(err, DATA_E_ARG, "dataset_task_batch: no dataset or buffers");
    if (first > ds->ntask || count > ds->ntask - first)
        return fail(err, DATA_E_ARG, "task problems [%zu, %zu) are outside [0, %zu)", first,
                    first + count, ds->ntask);
    if (count > 0 && T < ds->task_seq_len)
        return fail(err, DATA_E_ARG, "task rows of %d tokens are shorter than the longest "
                    "problem (%d)", T, ds->task_seq_len);
    for (size_t i = 0; i < count; i++) {
        const data_token_t *rec = ds->task_tokens + ds->task_offsets[first + i];
        size_t nb = ds->task_offsets[first + i + 1] - ds->task_offsets[first + i];
        size_t np = ds->task_prompts[first + i];
        int *in = inputs + i * (size_t)T, *tg = targets + i * (size_t)T;
        for (size_t t = 0; t < (size_t)T; t++) {
            in[t] = t == 0 ? DATA_EOT : t <= nb ? rec[t - 1] : DATA_EOT;
            tg[t] = t < np || t > nb ? -1 : t < nb ? rec[t] : DATA_EOT;
        }
    }
    return DATA_OK;
}
