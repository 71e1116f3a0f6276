/*
 * checkpoint.c — safetensors writing and validated reading, config.json
 * (cJSON), optimizer state files and crash-safe checkpoint directories for
 * the reference trainer (rules in checkpoint.h).
 *
 * Not here: the layout-only safetensors header reader of libigrad
 * (igrad_layout_from_safetensors reads names and shapes, not data); this
 * file reads data offsets and weights, which the trainer needs, with its own
 * small parser. Byte order: safetensors is little-endian, and so are the
 * hosts this runs on; a big-endian host is refused rather than mis-read.
 */
#define _POSIX_C_SOURCE 200809L
#include "checkpoint.h"
#include "core/internal.h"    /* igrad__atomic_* */
#include "core/json_strict.h" /* libigrad's check for \u0000 in JSON strings */

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_HEADER_NBYTES (100u << 20) /* as the reference safetensors reader */

static int host_is_little_endian(void)
{
    uint32_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

static char *path_join(const char *dir, const char *file)
{
    size_t n = strlen(dir) + strlen(file) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, file);
    return p;
}

/* ------------------------------------------------------------------------ */
/* crash-safe files and directories                                         */
/* ------------------------------------------------------------------------ */

/* Crash-safe, link-safe writing: the library's (core/internal.h), whose
 * temporary is created O_EXCL | O_NOFOLLOW under an unpredictable name. */
typedef igrad__atomic_file_t afile_t;

static igrad_status_t afile_open(afile_t *af, const char *path)
{
    igrad_status_t st = igrad__atomic_open(af, path);
    return st == IGRAD_OK ? st : trainer_fail(st, "%s", igrad_last_error());
}

static void afile_abort(afile_t *af)
{
    igrad__atomic_abort(af);
}

static igrad_status_t afile_commit(afile_t *af)
{
    igrad_status_t st = igrad__atomic_commit(af);
    return st == IGRAD_OK ? st : trainer_fail(st, "%s", igrad_last_error());
}

/* fsync a directory so a rename inside it survives a crash. */
static void sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

static char *parent_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, path, n);
        p[n] = '\0';
    }
    return p;
}

/* Removes a directory tree (regular files and subdirectories). */
static int remove_tree(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(sb.st_mode)) return unlink(path);
    DIR *d = opendir(path);
    if (!d) return -1;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *child = path_join(path, e->d_name);
        if (!child || remove_tree(child) != 0) rc = -1;
        free(child);
    }
    closedir(d);
    if (rmdir(path) != 0) rc = -1;
    return rc;
}

/* This host's name as it goes into a file name: [A-Za-z0-9._-] only
 * (anything else becomes '_'), at most 63 characters. */
static void host_tag(char *buf, size_t cap)
{
    char host[256];
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "unknown");
    host[sizeof host - 1] = '\0';
    size_t n = 0;
    for (const char *s = host; *s && n + 1 < cap && n < 63; s++, n++) {
        char c = *s;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '-' || c == '_';
        buf[n] = ok ? c : '_';
    }
    buf[n] = '\0';
}

/* "<dir>.<kind>.<pid>@<host>": whose save it was, so that a later start
 * can tell a dead process's leftovers from a live one's. */
static char *aside_name(const char *dir, const char *kind)
{
    char host[64];
    host_tag(host, sizeof host);
    size_t n = strlen(dir) + strlen(kind) + strlen(host) + 32;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s.%s.%ld@%s", dir, kind, (long)getpid(), host);
    return p;
}

igrad_status_t checkpoint_begin(const char *dir, char **tmp_dir)
{
    *tmp_dir = NULL;
    char *tmp = aside_name(dir, "tmp");
    if (!tmp) return trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", dir);
    if (remove_tree(tmp) != 0 || mkdir(tmp, 0755) != 0) {
        igrad_status_t st = trainer_fail(IGRAD_E_IO, "%s: cannot create directory: %s", tmp,
                                         strerror(errno));
        free(tmp);
        return st;
    }
    *tmp_dir = tmp;
    return IGRAD_OK;
}

void checkpoint_abort(char *tmp_dir)
{
    if (!tmp_dir) return;
    remove_tree(tmp_dir);
    free(tmp_dir);
}

igrad_status_t checkpoint_commit(char *tmp_dir, const char *dir)
{
    igrad_status_t st = IGRAD_OK;
    char *old = NULL, *parent = parent_dir(dir);
    struct stat sb;
    sync_dir(tmp_dir);
    if (stat(dir, &sb) == 0) {
        /* Move the previous checkpoint aside first: rename(2) cannot replace
         * a non-empty directory, and the old one must stay whole until the
         * new one has its name. */
        old = aside_name(dir, "old");
        if (!old) {
            st = trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", dir);
            goto cleanup;
        }
        remove_tree(old);
        if (rename(dir, old) != 0) {
            st = trainer_fail(IGRAD_E_IO, "%s: cannot move the previous checkpoint aside: %s",
                              dir, strerror(errno));
            goto cleanup;
        }
    }
    if (rename(tmp_dir, dir) != 0) {
        st = trainer_fail(IGRAD_E_IO, "%s: cannot rename %s to it: %s", dir, tmp_dir,
                          strerror(errno));
        if (old) rename(old, dir); /* put the previous one back */
        goto cleanup;
    }
    if (parent) sync_dir(parent);
    if (old) remove_tree(old);
cleanup:
    if (st != IGRAD_OK) remove_tree(tmp_dir);
    free(old);
    free(parent);
    free(tmp_dir);
    return st;
}

igrad_status_t checkpoint_remove(const char *dir)
{
    if (remove_tree(dir) != 0)
        return trainer_fail(IGRAD_E_IO, "%s: cannot remove: %s", dir, strerror(errno));
    return IGRAD_OK;
}

/* Parses "<base>.<kind>.<pid>[@<host>]" (the host part is absent in names
 * written before it was added: those were made on this host's file system
 * by an older igrad, and are taken as local). @return 1 and the pid and
 * whether it was made here, 0 if the name is not of that shape. */
static int parse_aside(const char *name, const char *base, const char *kind, long *pid,
                       int *local)
{
    size_t nb = strlen(base), nk = strlen(kind);
    if (strncmp(name, base, nb) != 0 || name[nb] != '.' || strncmp(name + nb + 1, kind, nk) != 0 ||
        name[nb + 1 + nk] != '.')
        return 0;
    const char *p = name + nb + nk + 2;
    if (*p < '0' || *p > '9') return 0;
    char *end = NULL;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (errno || v <= 0) return 0;
    if (*end == '\0') {
        *local = 1;
    } else if (*end == '@') {
        char host[64];
        host_tag(host, sizeof host);
        *local = strcmp(end + 1, host) == 0;
    } else {
        return 0;
    }
    *pid = v;
    return 1;
}

/* Is process `pid` of this host alive? EPERM: it exists, owned by another
 * user. A zombie (killed, not yet reaped: in a container whose init does
 * not reap, it can stay so) is dead: it will never finish its save. */
static int pid_alive(long pid)
{
    if (pid == (long)getpid()) return 1;
    if (pid <= 0) return 0;
    if (kill((pid_t)pid, 0) != 0 && errno != EPERM) return 0;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *fp = fopen(path, "r");
    if (!fp) return 1; /* no /proc: trust kill() */
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    /* "pid (comm) S ...": the state follows the last ')' */
    const char *rp = strrchr(buf, ')');
    return !(rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X'));
}

igrad_status_t checkpoint_tidy(const char *dir, const char *marker, int *recovered)
{
    if (recovered) *recovered = 0;
    char *parent = parent_dir(dir);
    const char *slash = strrchr(dir, '/');
    const char *base = slash ? slash + 1 : dir;
    if (!parent) return trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", dir);
    DIR *d = opendir(parent);
    if (!d) {
        free(parent);
        return IGRAD_OK; /* no output directory yet: nothing to tidy */
    }
    struct stat sb;
    int have_dir = stat(dir, &sb) == 0;
    char *best = NULL; /* the newest complete moved-aside checkpoint of a dead save */
    double best_mtime = -1.0;
    igrad_status_t st = IGRAD_OK;
    struct dirent *e;
    /* Pass 1: with no checkpoint, pick the one to put back. */
    while (!have_dir && (e = readdir(d)) != NULL) {
        long pid = 0;
        int local = 0;
        if (!parse_aside(e->d_name, base, "old", &pid, &local) || !local || pid_alive(pid))
            continue;
        char *cand = path_join(parent, e->d_name);
        char *mark = cand ? path_join(cand, marker) : NULL;
        if (mark && stat(mark, &sb) == 0) {
            double mt = (double)sb.st_mtim.tv_sec + 1e-9 * (double)sb.st_mtim.tv_nsec;
            if (mt > best_mtime) {
                free(best);
                best = cand;
                cand = NULL;
                best_mtime = mt;
            }
        }
        free(mark);
        free(cand);
    }
    if (best) {
        if (rename(best, dir) != 0) {
            st = trainer_fail(IGRAD_E_IO, "%s: cannot restore the previous checkpoint from %s: %s",
                              dir, best, strerror(errno));
            goto cleanup;
        }
        sync_dir(parent);
        fprintf(stderr, "igrad: train: %s was missing (a save was interrupted between its two "
                        "renames): restored it from %s\n", dir, best);
        if (recovered) *recovered = 1;
    }
    /* Pass 2: remove what dead saves left behind. */
    rewinddir(d);
    while ((e = readdir(d)) != NULL) {
        long pid = 0;
        int local = 0;
        if (!parse_aside(e->d_name, base, "tmp", &pid, &local) &&
            !parse_aside(e->d_name, base, "old", &pid, &local))
            continue;
        char *path = path_join(parent, e->d_name);
        if (!path) {
            st = trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", dir);
            goto cleanup;
        }
        if (!local) {
            fprintf(stderr, "igrad: train: note: left %s alone (made by process %ld on another "
                            "host; remove it if no run writes there)\n", path, pid);
        } else if (pid_alive(pid)) {
            fprintf(stderr, "igrad: train: note: left %s alone (process %ld, which made it, is "
                            "still running)\n", path, pid);
        } else if (remove_tree(path) != 0) {
            fprintf(stderr, "igrad: train: warning: cannot remove %s: %s\n", path,
                    strerror(errno));
        } else {
            fprintf(stderr, "igrad: train: removed %s, left by an interrupted save (process "
                            "%ld, no longer running)\n", path, pid);
        }
        free(path);
    }
cleanup:
    closedir(d);
    free(best);
    free(parent);
    return st;
}

igrad_status_t checkpoint_file_hash(const char *path, uint64_t *hash, uint64_t *nbytes)
{
    if (!host_is_little_endian())
        return trainer_fail(IGRAD_E_UNSUPPORTED, "%s: checksums need a little-endian host", path);
    FILE *fp = fopen(path, "rb");
    if (!fp) return trainer_fail(IGRAD_E_IO, "%s: cannot open: %s", path, strerror(errno));
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = malloc(CHUNK);
    if (!buf) {
        fclose(fp);
        return trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", path);
    }
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0) {
        fclose(fp);
        free(buf);
        return trainer_fail(IGRAD_E_IO, "%s: cannot stat: %s", path, strerror(errno));
    }
    /* The size goes in first. Without it, a file that ends with its own
     * word-wise FNV-1a (an engine state does) would always hash to 0. */
    uint64_t h = CHECKPOINT_HASH_SEED, total = 0, size = (uint64_t)sb.st_size;
    h ^= size;
    h *= 0x100000001b3ULL;
    size_t got;
    /* fread fills the whole chunk except at the end of the file, so only
     * the file's last word is ever partial (zero-padded). */
    while ((got = fread(buf, 1, CHUNK, fp)) > 0) {
        size_t full = got / 8 * 8;
        for (size_t i = 0; i < full; i += 8) {
            uint64_t w;
            memcpy(&w, buf + i, 8); /* little-endian host (checked above) */
            h ^= w;
            h *= 0x100000001b3ULL;
        }
        if (full < got) {
            uint64_t w = 0;
            for (size_t j = 0; full + j < got; j++) w |= (uint64_t)buf[full + j] << (8 * j);
            h ^= w;
            h *= 0x100000001b3ULL;
        }
        total += got;
    }
    int err = ferror(fp);
    fclose(fp);
    free(buf);
    if (err) return trainer_fail(IGRAD_E_IO, "%s: read error", path);
    if (total != size)
        return trainer_fail(IGRAD_E_IO, "%s: changed size while being read", path);
    *hash = h;
    if (nbytes) *nbytes = total;
    return IGRAD_OK;
}

/* ------------------------------------------------------------------------ */
/* safetensors writing                                                      */
/* ------------------------------------------------------------------------ */

static igrad_status_t write_bytes(afile_t *af, const void *data, size_t nbytes)
{
    if (nbytes && fwrite(data, 1, nbytes, af->fp) != nbytes)
        return trainer_fail(IGRAD_E_IO, "%s: write failed: %s", af->final_path, strerror(errno));
    return IGRAD_OK;
}

static int64_t tensor_count(const checkpoint_tensor_t *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

igrad_status_t checkpoint_write_safetensors(const char *path, const checkpoint_tensor_t *tensors,
                                            int n, const char *const *metadata)
{
    if (!host_is_little_endian())
        return trainer_fail(IGRAD_E_UNSUPPORTED, "%s: safetensors needs a little-endian host",
                            path);
    igrad_status_t st = IGRAD_OK;
    afile_t af = {0};
    char *header = NULL;
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    if (!root || !meta) goto nomem;
    int have_format = 0;
    for (int i = 0; metadata && metadata[i] && metadata[i + 1]; i += 2) {
        if (!cJSON_AddStringToObject(meta, metadata[i], metadata[i + 1])) goto nomem;
        have_format |= !strcmp(metadata[i], "format");
    }
    if (!have_format && !cJSON_AddStringToObject(meta, "format", "pt")) goto nomem;
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        const checkpoint_tensor_t *t = &tensors[i];
        size_t esize = igrad_dtype_nbytes(t->dtype);
        if (esize == 0 || t->ndim < 0 || t->ndim > IGRAD_MAX_DIMS) {
            st = trainer_fail(IGRAD_E_INVALID, "%s: tensor '%s': bad dtype or ndim", path,
                              t->name);
            goto cleanup;
        }
        if (!strcmp(t->name, "__metadata__") || cJSON_GetObjectItemCaseSensitive(root, t->name)) {
            st = trainer_fail(IGRAD_E_INVALID, "%s: duplicate or reserved tensor name '%s'",
                              path, t->name);
            goto cleanup;
        }
        cJSON *obj = cJSON_AddObjectToObject(root, t->name);
        if (!obj || !cJSON_AddStringToObject(obj, "dtype", igrad_dtype_name(t->dtype)))
            goto nomem;
        cJSON *shape = cJSON_AddArrayToObject(obj, "shape");
        if (!shape) goto nomem;
        for (int d = 0; d < t->ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        uint64_t nbytes = (uint64_t)tensor_count(t) * esize;
        cJSON *offs = cJSON_AddArrayToObject(obj, "data_offsets");
        if (!offs) goto nomem;
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(offset + nbytes)));
        offset += nbytes;
    }
    header = cJSON_PrintUnformatted(root);
    if (!header) goto nomem;
    size_t hlen = strlen(header);
    size_t padded = (hlen + 7) / 8 * 8;
    unsigned char len_le[8];
    for (int i = 0; i < 8; i++) len_le[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    st = afile_open(&af, path);
    if (st != IGRAD_OK) goto cleanup;
    if ((st = write_bytes(&af, len_le, 8)) != IGRAD_OK) goto cleanup;
    if ((st = write_bytes(&af, header, hlen)) != IGRAD_OK) goto cleanup;
    if ((st = write_bytes(&af, "        ", padded - hlen)) != IGRAD_OK) goto cleanup;
    for (int i = 0; i < n; i++) {
        const checkpoint_tensor_t *t = &tensors[i];
        size_t nbytes = (size_t)tensor_count(t) * igrad_dtype_nbytes(t->dtype);
        if ((st = write_bytes(&af, t->data, nbytes)) != IGRAD_OK) goto cleanup;
    }
    st = afile_commit(&af);
    goto cleanup;
nomem:
    st = trainer_fail(IGRAD_E_NOMEM, "%s: out of memory building the header", path);
cleanup:
    if (af.fp) afile_abort(&af);
    cJSON_free(header);
    cJSON_Delete(root);
    return st;
}

/* ------------------------------------------------------------------------ */
/* safetensors reading                                                      */
/* ------------------------------------------------------------------------ */

typedef struct st_entry {
    const char *name;      /* points into the parsed header */
    igrad_dtype_t dtype;
    int ndim;
    int64_t shape[IGRAD_MAX_DIMS];
    uint64_t begin, end;   /* byte offsets within the data section */
} st_entry_t;

typedef struct st_file {
    const char *path;
    FILE *fp;
    uint64_t data_start;   /* 8 + header length */
    uint64_t data_nbytes;
    cJSON *root;
    cJSON *meta;           /* "__metadata__" or NULL */
    int n;
    st_entry_t *entries;
} st_file_t;

static void st_close(st_file_t *f)
{
    if (f->fp) fclose(f->fp);
    cJSON_Delete(f->root);
    free(f->entries);
    memset(f, 0, sizeof *f);
}

static int cmp_begin(const void *a, const void *b)
{
    const st_entry_t *x = *(const st_entry_t *const *)a, *y = *(const st_entry_t *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* A JSON number that is a non-negative integer below 2^53. */
static int json_u64(const cJSON *item, uint64_t *out)
{
    if (!cJSON_IsNumber(item)) return 0;
    double d = item->valuedouble;
    if (!(d >= 0.0) || d > 9007199254740992.0 || floor(d) != d) return 0;
    *out = (uint64_t)d;
    return 1;
}

static igrad_status_t st_open(st_file_t *f, const char *path)
{
    memset(f, 0, sizeof *f);
    f->path = path;
    igrad_status_t st = IGRAD_OK;
    char *header = NULL;
    st_entry_t **order = NULL;
    if (!host_is_little_endian())
        return trainer_fail(IGRAD_E_UNSUPPORTED, "%s: safetensors needs a little-endian host",
                            path);
    f->fp = fopen(path, "rb");
    if (!f->fp) return trainer_fail(IGRAD_E_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f->fp), &sb) != 0) {
        st = trainer_fail(IGRAD_E_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto cleanup;
    }
    uint64_t file_nbytes = (uint64_t)sb.st_size;
    unsigned char len_le[8];
    if (file_nbytes < 8 || fread(len_le, 1, 8, f->fp) != 8) {
        st = trainer_fail(IGRAD_E_FORMAT, "%s: truncated: %" PRIu64 " bytes, shorter than the "
                          "8-byte header length", path, file_nbytes);
        goto cleanup;
    }
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)len_le[i] << (8 * i);
    if (hlen > file_nbytes - 8) {
        st = trainer_fail(IGRAD_E_FORMAT, "%s: header length %" PRIu64 " is larger than the "
                          "file (%" PRIu64 " bytes): truncated or not safetensors", path, hlen,
                          file_nbytes);
        goto cleanup;
    }
    if (hlen < 2 || hlen > MAX_HEADER_NBYTES) {
        st = trainer_fail(IGRAD_E_FORMAT, "%s: header length %" PRIu64 " outside [2, %u]",
                          path, hlen, MAX_HEADER_NBYTES);
        goto cleanup;
    }
    header = malloc((size_t)hlen + 1);
    if (!header) {
        st = trainer_fail(IGRAD_E_NOMEM, "%s: out of memory for the header", path);
        goto cleanup;
    }
    if (fread(header, 1, (size_t)hlen, f->fp) != (size_t)hlen) {
        st = trainer_fail(IGRAD_E_IO, "%s: cannot read the header", path);
        goto cleanup;
    }
    header[hlen] = '\0';
    f->data_start = 8 + hlen;
    f->data_nbytes = file_nbytes - f->data_start;
    f->root = cJSON_ParseWithLength(header, (size_t)hlen);
    if (!f->root || !cJSON_IsObject(f->root)) {
        st = trainer_fail(IGRAD_E_FORMAT, "%s: header is not a JSON object", path);
        goto cleanup;
    }
    st = checkpoint_json_refuse_nul(path, "header", header, (size_t)hlen);
    if (st != IGRAD_OK) goto cleanup;
    int count = cJSON_GetArraySize(f->root);
    f->entries = calloc((size_t)(count > 0 ? count : 1), sizeof *f->entries);
    order = calloc((size_t)(count > 0 ? count : 1), sizeof *order);
    if (!f->entries || !order) {
        st = trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", path);
        goto cleanup;
    }
    const cJSON *item;
    cJSON_ArrayForEach(item, f->root)
    {
        if (!strcmp(item->string, "__metadata__")) {
            if (!cJSON_IsObject(item)) {
                st = trainer_fail(IGRAD_E_FORMAT, "%s: __metadata__ is not an object", path);
                goto cleanup;
            }
            f->meta = (cJSON *)item;
            continue;
        }
        st_entry_t *e = &f->entries[f->n];
        e->name = item->string;
        const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
        const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
        if (!cJSON_IsString(dtype) || igrad_dtype_from_name(dtype->valuestring, &e->dtype)) {
            st = trainer_fail(IGRAD_E_FORMAT, "%s: tensor '%s': missing or unknown dtype", path,
                              e->name);
            goto cleanup;
        }
        if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > IGRAD_MAX_DIMS) {
            st = trainer_fail(IGRAD_E_FORMAT, "%s: tensor '%s': missing shape or more than %d "
                              "dimensions", path, e->name, IGRAD_MAX_DIMS);
            goto cleanup;
        }
        e->ndim = cJSON_GetArraySize(shape);
        uint64_t numel = 1;
        for (int d = 0; d < e->ndim; d++) {
            uint64_t v;
            if (!json_u64(cJSON_GetArrayItem(shape, d), &v) || v > (1ull << 40)) {
                st = trainer_fail(IGRAD_E_FORMAT, "%s: tensor '%s': bad shape", path, e->name);
                goto cleanup;
            }
            e->shape[d] = (int64_t)v;
            numel *= v;
            if (numel > (1ull << 40)) {
                st = trainer_fail(IGRAD_E_FORMAT, "%s: tensor '%s': too large", path, e->name);
                goto cleanup;
            }
        }
        if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
            !json_u64(cJSON_GetArrayItem(offs, 0), &e->begin) ||
            !json_u64(cJSON_GetArrayItem(offs, 1), &e->end) || e->end < e->begin) {
            st = trainer_fail(IGRAD_E_FORMAT, "%s: tensor '%s': bad data_offsets", path,
                              e->name);
            goto cleanup;
        }
        if (e->end - e->begin != numel * igrad_dtype_nbytes(e->dtype)) {
            st = trainer_fail(IGRAD_E_FORMAT, "%s: tensor '%s': data_offsets [%" PRIu64
                              ", %" PRIu64 ") hold %" PRIu64 " bytes, its dtype and shape "
                              "need %" PRIu64, path, e->name, e->begin, e->end,
                              e->end - e->begin, numel * igrad_dtype_nbytes(e->dtype));
            goto cleanup;
        }
        if (e->end > f->data_nbytes) {
            st = trainer_fail(IGRAD_E_FORMAT, "%s: tensor '%s': data ends at byte %" PRIu64
                              " of the data section, which has only %" PRIu64 " bytes: file "
                              "truncated", path, e->name, e->end, f->data_nbytes);
            goto cleanup;
        }
        order[f->n] = e;
        f->n++;
    }
    /* cJSON keeps duplicate keys; safetensors forbids them. */
    for (int i = 0; i < f->n; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(f->entries[i].name, f->entries[j].name)) {
                st = trainer_fail(IGRAD_E_FORMAT, "%s: tensor '%s' appears twice in the header",
                                  path, f->entries[i].name);
                goto cleanup;
            }
    /* The data section must be exactly the tensors, back to back. */
    qsort(order, (size_t)f->n, sizeof *order, cmp_begin);
    uint64_t pos = 0;
    for (int i = 0; i < f->n; i++) {
        if (order[i]->begin != pos) {
            st = trainer_fail(IGRAD_E_FORMAT, "%s: tensor '%s' starts at byte %" PRIu64
                              " of the data, expected %" PRIu64 " (gap or overlap)", path,
                              order[i]->name, order[i]->begin, pos);
            goto cleanup;
        }
        pos = order[i]->end;
    }
    if (pos != f->data_nbytes) {
        st = trainer_fail(IGRAD_E_FORMAT, "%s: %" PRIu64 " bytes after the last tensor", path,
                          f->data_nbytes - pos);
        goto cleanup;
    }
cleanup:
    free(header);
    free(order);
    if (st != IGRAD_OK) st_close(f);
    return st;
}

static const st_entry_t *st_find(const st_file_t *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->entries[i].name, name)) return &f->entries[i];
    return NULL;
}

static igrad_status_t st_read(const st_file_t *f, const st_entry_t *e, void *dst)
{
    size_t nbytes = (size_t)(e->end - e->begin);
    if (fseeko(f->fp, (off_t)(f->data_start + e->begin), SEEK_SET) != 0 ||
        fread(dst, 1, nbytes, f->fp) != nbytes)
        return trainer_fail(IGRAD_E_IO, "%s: tensor '%s': cannot read its %zu bytes", f->path,
                            e->name, nbytes);
    return IGRAD_OK;
}

static const char *st_meta(const st_file_t *f, const char *key)
{
    const cJSON *v = f->meta ? cJSON_GetObjectItemCaseSensitive(f->meta, key) : NULL;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static void format_shape(char *buf, size_t size, int ndim, const int64_t *shape)
{
    size_t used = 0;
    used += (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < ndim && used < size; d++)
        used += (size_t)snprintf(buf + used, size - used, d ? ", %lld" : "%lld",
                                 (long long)shape[d]);
    if (used < size) snprintf(buf + used, size - used, "]");
}

/* ------------------------------------------------------------------------ */
/* config.json                                                              */
/* ------------------------------------------------------------------------ */

/* Adds a finite double as the shortest decimal that reads back to the same
 * bits (cJSON's own printing keeps 15 digits when they are within
 * DBL_EPSILON, which can change the last bit of rope_theta). */
static int add_exact_number(cJSON *obj, const char *key, double v)
{
    char buf[40];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
    }
    return cJSON_AddRawToObject(obj, key, buf) != NULL;
}

igrad_status_t checkpoint_write_config(const model_config_t *c, const char *path)
{
    igrad_status_t st = model_config_validate(c);
    if (st != IGRAD_OK) return st;
    cJSON *root = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(root, "architectures");
    char *text = NULL;
    afile_t af = {0};
    if (!root || !arch) goto nomem;
    cJSON_AddItemToArray(arch, cJSON_CreateString("LlamaForCausalLM"));
    cJSON_AddStringToObject(root, "model_type", "llama");
    cJSON_AddNumberToObject(root, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(root, "hidden_size", c->dim);
    cJSON_AddNumberToObject(root, "intermediate_size", c->ffn_dim);
    cJSON_AddNumberToObject(root, "num_hidden_layers", c->n_layer);
    cJSON_AddNumberToObject(root, "num_attention_heads", c->n_head);
    cJSON_AddNumberToObject(root, "num_key_value_heads", c->n_kv_head);
    cJSON_AddNumberToObject(root, "max_position_embeddings", c->max_seq_len);
    if (!add_exact_number(root, "rms_norm_eps", c->rms_norm_eps) ||
        !add_exact_number(root, "rope_theta", c->rope_theta))
        goto nomem;
    cJSON_AddBoolToObject(root, "tie_word_embeddings", c->tie_embeddings);
    cJSON_AddStringToObject(root, "hidden_act", "silu");
    cJSON_AddBoolToObject(root, "attention_bias", 0);
    cJSON_AddBoolToObject(root, "mlp_bias", 0);
    cJSON_AddNumberToObject(root, "initializer_range", 0.02);
    cJSON_AddNumberToObject(root, "bos_token_id", MODEL_EOT_TOKEN);
    cJSON_AddNumberToObject(root, "eos_token_id", MODEL_EOT_TOKEN);
    cJSON_AddStringToObject(root, "torch_dtype", "float32");
    text = cJSON_Print(root);
    if (!text) goto nomem;
    st = afile_open(&af, path);
    if (st == IGRAD_OK) st = write_bytes(&af, text, strlen(text));
    if (st == IGRAD_OK) st = write_bytes(&af, "\n", 1);
    if (st == IGRAD_OK) st = afile_commit(&af);
    goto cleanup;
nomem:
    st = trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", path);
cleanup:
    if (af.fp) afile_abort(&af);
    cJSON_free(text);
    cJSON_Delete(root);
    return st;
}

/* Integer key: required (dflt < 0 means required) or default. */
static igrad_status_t cfg_int(const cJSON *root, const char *path, const char *key, int dflt,
                              int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (dflt < 0) return trainer_fail(IGRAD_E_FORMAT, "%s: missing key \"%s\"", path, key);
        *out = dflt;
        return IGRAD_OK;
    }
    if (!cJSON_IsNumber(v) || floor(v->valuedouble) != v->valuedouble ||
        v->valuedouble < 0 || v->valuedouble > 2147483647.0)
        return trainer_fail(IGRAD_E_FORMAT, "%s: \"%s\" must be a non-negative integer", path,
                            key);
    *out = (int)v->valuedouble;
    return IGRAD_OK;
}

static igrad_status_t cfg_num(const cJSON *root, const char *path, const char *key, double dflt,
                              double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return IGRAD_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return trainer_fail(IGRAD_E_FORMAT, "%s: \"%s\" must be a number", path, key);
    *out = v->valuedouble;
    return IGRAD_OK;
}

static igrad_status_t parse_config(const cJSON *root, const char *path, model_config_t *c)
{
    if (!cJSON_IsObject(root))
        return trainer_fail(IGRAD_E_FORMAT, "%s: not a JSON object", path);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (mt && (!cJSON_IsString(mt) || strcmp(mt->valuestring, "llama") != 0))
        return trainer_fail(IGRAD_E_UNSUPPORTED, "%s: model_type %s is not \"llama\"", path,
                            cJSON_IsString(mt) ? mt->valuestring : "(not a string)");
    memset(c, 0, sizeof *c);
    igrad_status_t st;
    if ((st = cfg_int(root, path, "vocab_size", -1, &c->vocab_size)) ||
        (st = cfg_int(root, path, "hidden_size", -1, &c->dim)) ||
        (st = cfg_int(root, path, "intermediate_size", -1, &c->ffn_dim)) ||
        (st = cfg_int(root, path, "num_hidden_layers", -1, &c->n_layer)) ||
        (st = cfg_int(root, path, "num_attention_heads", -1, &c->n_head)) ||
        (st = cfg_int(root, path, "num_key_value_heads", c->n_head, &c->n_kv_head)) ||
        (st = cfg_int(root, path, "max_position_embeddings", -1, &c->max_seq_len)) ||
        (st = cfg_num(root, path, "rope_theta", 10000.0, &c->rope_theta)) ||
        (st = cfg_num(root, path, "rms_norm_eps", 1e-6, &c->rms_norm_eps)))
        return st;
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    if (tie && !cJSON_IsBool(tie))
        return trainer_fail(IGRAD_E_FORMAT, "%s: \"tie_word_embeddings\" must be true or false",
                            path);
    c->tie_embeddings = cJSON_IsTrue(tie);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu") != 0))
        return trainer_fail(IGRAD_E_UNSUPPORTED, "%s: hidden_act must be \"silu\"", path);
    static const char *const off[] = {"attention_bias", "mlp_bias"};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++)
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, off[i])))
            return trainer_fail(IGRAD_E_UNSUPPORTED, "%s: \"%s\": biases are not supported",
                                path, off[i]);
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (rs && !cJSON_IsNull(rs))
        return trainer_fail(IGRAD_E_UNSUPPORTED, "%s: \"rope_scaling\" is not supported", path);
    int head_dim = 0;
    if ((st = cfg_int(root, path, "head_dim", 0, &head_dim))) return st;
    if (head_dim && c->n_head && head_dim * c->n_head != c->dim)
        return trainer_fail(IGRAD_E_UNSUPPORTED, "%s: head_dim %d is not hidden_size / "
                            "num_attention_heads", path, head_dim);
    st = model_config_validate(c);
    if (st != IGRAD_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", trainer_last_error());
        return trainer_fail(st, "%s: %s", path, msg);
    }
    return IGRAD_OK;
}

static igrad_status_t read_text(const char *path, char **text, size_t *nbytes)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return trainer_fail(IGRAD_E_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            if (cap > (16u << 20)) {
                fclose(fp);
                free(buf);
                return trainer_fail(IGRAD_E_FORMAT, "%s: larger than 16 MiB", path);
            }
            char *nb = realloc(buf, cap);
            if (!nb) {
                fclose(fp);
                free(buf);
                return trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", path);
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, 4096, fp);
        n += got;
        if (got < 4096) break;
    }
    int err = ferror(fp);
    fclose(fp);
    if (err) {
        free(buf);
        return trainer_fail(IGRAD_E_IO, "%s: read error", path);
    }
    buf[n] = '\0';
    *text = buf;
    *nbytes = n;
    return IGRAD_OK;
}

igrad_status_t checkpoint_json_refuse_nul(const char *path, const char *what, const char *text,
                                          size_t nbytes)
{
    size_t line = 0, col = 0;
    /* cJSON skips a raw NUL as white space and ends a string at one */
    const char *raw = memchr(text, '\0', nbytes);
    if (raw) {
        igrad__text_line_col(text, (size_t)(raw - text), &line, &col);
        return trainer_fail(IGRAD_E_FORMAT, "%s: %s %zu:%zu: NUL byte, which a JSON text "
                            "cannot hold", path, what, line, col);
    }
    size_t str_at = 0, at = igrad__json_find_nul_escape(text, nbytes, &str_at);
    if (at == IGRAD__JSON_NO_NUL) return IGRAD_OK;
    char excerpt[96];
    igrad__text_line_col(text, at, &line, &col);
    igrad__json_nul_excerpt(text, at, str_at, excerpt, sizeof excerpt);
    return trainer_fail(IGRAD_E_FORMAT, "%s: %s %zu:%zu: string %s holds \\u0000 (a NUL "
                        "character), which names and values cannot contain",
                        path, what, line, col, excerpt);
}

igrad_status_t checkpoint_read_config(const char *path, model_config_t *cfg)
{
    char *text = NULL;
    size_t n = 0;
    igrad_status_t st = read_text(path, &text, &n);
    if (st != IGRAD_OK) return st;
    cJSON *root = cJSON_ParseWithLength(text, n);
    if (root) st = checkpoint_json_refuse_nul(path, "config", text, n);
    free(text);
    if (!root) return trainer_fail(IGRAD_E_FORMAT, "%s: not valid JSON", path);
    if (st != IGRAD_OK) {
        cJSON_Delete(root);
        return st;
    }
    st = parse_config(root, path, cfg);
    cJSON_Delete(root);
    return st;
}

/* ------------------------------------------------------------------------ */
/* model and optimizer files                                                */
/* ------------------------------------------------------------------------ */

igrad_status_t checkpoint_save_model(const model_t *m, const char *dir)
{
    igrad_status_t st = IGRAD_OK;
    char *cfg_path = path_join(dir, CHECKPOINT_CONFIG_FILE);
    char *st_path = path_join(dir, CHECKPOINT_MODEL_FILE);
    checkpoint_tensor_t *ts = calloc((size_t)m->n_tensors, sizeof *ts);
    if (!cfg_path || !st_path || !ts) {
        st = trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", dir);
        goto cleanup;
    }
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *t = &m->tensors[i];
        ts[i].name = t->name;
        ts[i].dtype = IGRAD_DTYPE_F32;
        ts[i].ndim = t->ndim;
        ts[i].shape[0] = t->shape[0];
        ts[i].shape[1] = t->shape[1];
        ts[i].data = m->params + t->offset;
    }
    static const char *const meta[] = {"format", "pt", NULL};
    st = checkpoint_write_safetensors(st_path, ts, m->n_tensors, meta);
    if (st == IGRAD_OK) st = checkpoint_write_config(&m->config, cfg_path);
cleanup:
    free(ts);
    free(cfg_path);
    free(st_path);
    return st;
}

igrad_status_t checkpoint_load_params(const char *path, model_t *m)
{
    st_file_t f;
    igrad_status_t st = st_open(&f, path);
    if (st != IGRAD_OK) return st;
    for (int i = 0; i < m->n_tensors && st == IGRAD_OK; i++) {
        const model_tensor_t *t = &m->tensors[i];
        const st_entry_t *e = st_find(&f, t->name);
        if (!e) {
            st = trainer_fail(IGRAD_E_FORMAT, "%s: missing tensor '%s' (the config has %d "
                              "layers%s)", path, t->name, m->config.n_layer,
                              m->config.tie_embeddings ? ", tied lm_head" : "");
            break;
        }
        if (e->dtype != IGRAD_DTYPE_F32) {
            st = trainer_fail(IGRAD_E_FORMAT, "%s: tensor '%s' has dtype %s, expected F32",
                              path, t->name, igrad_dtype_name(e->dtype));
            break;
        }
        if (e->ndim != t->ndim || e->shape[0] != t->shape[0] ||
            (t->ndim == 2 && e->shape[1] != t->shape[1])) {
            char have[96], want[96];
            format_shape(have, sizeof have, e->ndim, e->shape);
            format_shape(want, sizeof want, t->ndim, t->shape);
            st = trainer_fail(IGRAD_E_MISMATCH, "%s: tensor '%s' has shape %s, the config "
                              "(hidden_size %d, intermediate_size %d, heads %d/%d, vocab %d) "
                              "implies %s", path, t->name, have, m->config.dim,
                              m->config.ffn_dim, m->config.n_head, m->config.n_kv_head,
                              m->config.vocab_size, want);
            break;
        }
        st = st_read(&f, e, m->params + t->offset);
    }
    if (st == IGRAD_OK && f.n != m->n_tensors) {
        for (int i = 0; i < f.n; i++) {
            if (model_find_tensor(m, f.entries[i].name) < 0) {
                st = trainer_fail(IGRAD_E_MISMATCH, "%s: unexpected tensor '%s' (not in a model "
                                  "with %d layers%s)", path, f.entries[i].name,
                                  m->config.n_layer,
                                  m->config.tie_embeddings ? " and tied lm_head" : "");
                break;
            }
        }
    }
    st_close(&f);
    return st;
}

igrad_status_t checkpoint_load_model(const char *dir, model_t **out)
{
    *out = NULL;
    model_config_t cfg;
    model_t *m = NULL;
    char *cfg_path = path_join(dir, CHECKPOINT_CONFIG_FILE);
    char *st_path = path_join(dir, CHECKPOINT_MODEL_FILE);
    igrad_status_t st = IGRAD_OK;
    if (!cfg_path || !st_path) {
        st = trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", dir);
        goto cleanup;
    }
    if ((st = checkpoint_read_config(cfg_path, &cfg)) != IGRAD_OK) goto cleanup;
    if ((st = model_create(&cfg, &m)) != IGRAD_OK) goto cleanup;
    if ((st = checkpoint_load_params(st_path, m)) != IGRAD_OK) goto cleanup;
    *out = m;
    m = NULL;
cleanup:
    model_free(m);
    free(cfg_path);
    free(st_path);
    return st;
}

static igrad_status_t layout_hash_of(const model_t *m, uint64_t *hash)
{
    igrad_layout_t *layout = NULL;
    igrad_status_t st = model_layout(m, &layout);
    if (st != IGRAD_OK) return st;
    *hash = igrad_layout_hash(layout);
    igrad_layout_free(layout);
    return IGRAD_OK;
}

igrad_status_t checkpoint_save_optim(const optim_t *opt, const model_t *m, const char *path)
{
    if (opt->count != m->num_params)
        return trainer_fail(IGRAD_E_MISMATCH, "%s: optimizer has %lld parameters, model %lld",
                            path, (long long)opt->count, (long long)m->num_params);
    uint64_t hash = 0;
    igrad_status_t st = layout_hash_of(m, &hash);
    if (st != IGRAD_OK) return st;
    char step[32], count[32], hash_s[32], lr[32], b1[32], b2[32], eps[32], wd[32], params[32];
    /* The parameters the moments belong to (train_state.json's param_hash
     * of the same save): an optimizer file copied in from another run or
     * save is refused at resume even when every checksum was redone. */
    snprintf(params, sizeof params, "0x%016" PRIx64,
             igrad__hash_bytes(IGRAD__HASH_SEED, m->params, (size_t)m->num_params * sizeof(float)));
    snprintf(step, sizeof step, "%lld", (long long)opt->step);
    snprintf(count, sizeof count, "%lld", (long long)opt->count);
    snprintf(hash_s, sizeof hash_s, "0x%016" PRIx64, hash);
    snprintf(lr, sizeof lr, "%.17g", opt->config.lr);
    snprintf(b1, sizeof b1, "%.17g", opt->config.beta1);
    snprintf(b2, sizeof b2, "%.17g", opt->config.beta2);
    snprintf(eps, sizeof eps, "%.17g", opt->config.eps);
    snprintf(wd, sizeof wd, "%.17g", opt->config.weight_decay);
    const char *meta[] = {"format", "igrad-adamw", "step", step, "count", count,
                          "layout_hash", hash_s, "lr", lr, "beta1", b1, "beta2", b2,
                          "eps", eps, "weight_decay", wd, "param_hash", params, NULL};
    checkpoint_tensor_t ts[2] = {
        {"exp_avg", IGRAD_DTYPE_F32, 1, {opt->count}, opt->m},
        {"exp_avg_sq", IGRAD_DTYPE_F32, 1, {opt->count}, opt->v},
    };
    return checkpoint_write_safetensors(path, ts, 2, meta);
}

static int parse_i64_text(const char *s, int64_t *out)
{
    if (!s || !*s) return 0;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (errno || *end) return 0;
    *out = (int64_t)v;
    return 1;
}

igrad_status_t checkpoint_load_optim(const char *path, const model_t *m, optim_t *opt)
{
    uint64_t hash = 0;
    igrad_status_t st = layout_hash_of(m, &hash);
    if (st != IGRAD_OK) return st;
    st_file_t f;
    if ((st = st_open(&f, path)) != IGRAD_OK) return st;
    const char *format = st_meta(&f, "format");
    const char *hash_s = st_meta(&f, "layout_hash");
    const char *params_s = st_meta(&f, "param_hash");
    int64_t step = 0, count = 0;
    char want[32], want_params[32];
    snprintf(want, sizeof want, "0x%016" PRIx64, hash);
    snprintf(want_params, sizeof want_params, "0x%016" PRIx64,
             igrad__hash_bytes(IGRAD__HASH_SEED, m->params, (size_t)m->num_params * sizeof(float)));
    const st_entry_t *em = st_find(&f, "exp_avg"), *ev = st_find(&f, "exp_avg_sq");
    if (!format || strcmp(format, "igrad-adamw") != 0) {
        st = trainer_fail(IGRAD_E_FORMAT, "%s: __metadata__.format is not \"igrad-adamw\"", path);
    } else if (!parse_i64_text(st_meta(&f, "step"), &step) || step < 0 ||
               !parse_i64_text(st_meta(&f, "count"), &count)) {
        st = trainer_fail(IGRAD_E_FORMAT, "%s: __metadata__ lacks a valid step or count", path);
    } else if (!hash_s || strcmp(hash_s, want) != 0) {
        st = trainer_fail(IGRAD_E_MISMATCH, "%s: layout hash %s, this model's is %s", path,
                          hash_s ? hash_s : "(missing)", want);
    } else if (count != opt->count || count != m->num_params) {
        st = trainer_fail(IGRAD_E_MISMATCH, "%s: state for %lld parameters, optimizer has %lld",
                          path, (long long)count, (long long)opt->count);
    } else if (!params_s || strcmp(params_s, want_params) != 0) {
        st = trainer_fail(IGRAD_E_MISMATCH,
                          "%s: __metadata__.param_hash %s, but the model's parameters hash to "
                          "%s: the optimizer state was saved with other parameters (another "
                          "run or save%s)",
                          path, params_s ? params_s : "(missing)", want_params,
                          params_s ? "" : "; files written before the binding cannot be "
                                          "resumed: start from them with --init");
    } else if (!em || !ev) {
        st = trainer_fail(IGRAD_E_FORMAT, "%s: missing tensor '%s'", path,
                          em ? "exp_avg_sq" : "exp_avg");
    } else {
        const st_entry_t *es[2] = {em, ev};
        for (int i = 0; i < 2 && st == IGRAD_OK; i++) {
            if (es[i]->dtype != IGRAD_DTYPE_F32 || es[i]->ndim != 1 || es[i]->shape[0] != count)
                st = trainer_fail(IGRAD_E_FORMAT, "%s: tensor '%s' must be F32 [%lld]", path,
                                  es[i]->name, (long long)count);
        }
        if (st == IGRAD_OK) st = st_read(&f, em, opt->m);
        if (st == IGRAD_OK) st = st_read(&f, ev, opt->v);
        if (st == IGRAD_OK) opt->step = step;
    }
    st_close(&f);
    return st;
}

igrad_status_t checkpoint_save(const char *dir, const model_t *m, const optim_t *opt)
{
    char *tmp = NULL;
    igrad_status_t st = checkpoint_begin(dir, &tmp);
    if (st != IGRAD_OK) return st;
    st = checkpoint_save_model(m, tmp);
    if (st == IGRAD_OK && opt) {
        char *path = path_join(tmp, CHECKPOINT_OPTIM_FILE);
        st = path ? checkpoint_save_optim(opt, m, path)
                  : trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", dir);
        free(path);
    }
    if (st != IGRAD_OK) {
        checkpoint_abort(tmp);
        return st;
    }
    return checkpoint_commit(tmp, dir);
}
