/*
 * common.c — version, status strings, per-thread error messages, hashing,
 * file reading and crash-safe writing used by every other source file.
 * Nothing model- or algorithm-specific lives here.
 */
#define _POSIX_C_SOURCE 200809L
#include "core/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define IGRAD__STR2(x) #x
#define IGRAD__STR(x) IGRAD__STR2(x)

static _Thread_local char last_error[1024];

unsigned igrad_version(void) { return IGRAD_VERSION_NUMBER; }

double igrad__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

const char *igrad_version_string(void)
{
    return IGRAD__STR(IGRAD_VERSION_MAJOR) "." IGRAD__STR(IGRAD_VERSION_MINOR) "."
        IGRAD__STR(IGRAD_VERSION_PATCH);
}

const char *igrad_status_str(igrad_status_t status)
{
    switch (status) {
    case IGRAD_OK: return "ok";
    case IGRAD_E_INVALID: return "invalid argument";
    case IGRAD_E_NOMEM: return "out of memory";
    case IGRAD_E_IO: return "i/o error";
    case IGRAD_E_FORMAT: return "malformed input";
    case IGRAD_E_UNSUPPORTED: return "unsupported";
    case IGRAD_E_NONFINITE: return "non-finite gradient";
    case IGRAD_E_MISMATCH: return "mismatch";
    case IGRAD_E_COMM: return "communication error";
    case IGRAD_E_STATE: return "call out of order";
    case IGRAD_E_TIMEOUT: return "timed out";
    }
    return "unknown status";
}

const char *igrad_last_error(void) { return last_error; }

void igrad_free(void *ptr) { free(ptr); }

igrad_status_t igrad__fail(igrad_status_t status, const char *file, int line,
                           const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n < sizeof last_error) {
        const char *base = strrchr(file, '/');
        base = base ? base + 1 : file;
        snprintf(last_error + n, sizeof last_error - (size_t)n, " [%s:%d]", base, line);
    }
    return status;
}

uint64_t igrad__hash_bytes(uint64_t h, const void *data, size_t nbytes)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < nbytes; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t igrad__hash_str(uint64_t h, const char *s)
{
    return igrad__hash_bytes(h, s ? s : "", (s ? strlen(s) : 0) + 1);
}

uint64_t igrad__hash_i64(uint64_t h, int64_t v)
{
    unsigned char b[8];
    uint64_t u = (uint64_t)v;
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(u >> (8 * i));
    return igrad__hash_bytes(h, b, 8);
}

uint64_t igrad__hash_f64(uint64_t h, double v)
{
    int64_t bits;
    if (v == 0.0) v = 0.0; /* -0 and +0 hash alike */
    memcpy(&bits, &v, sizeof bits);
    return igrad__hash_i64(h, bits);
}

igrad_status_t igrad__open_regular(const char *path, FILE **fp, uint64_t *nbytes)
{
    *fp = NULL;
    /* O_NONBLOCK: opening a FIFO with no writer would block forever; the
     * regular-file check below refuses it (and devices, directories). */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    IGRAD_FAIL_IF(fd < 0, IGRAD_E_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    int flags = -1;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (flags = fcntl(fd, F_GETFL)) < 0 ||
        fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        close(fd);
        return igrad__fail(IGRAD_E_IO, __FILE__, __LINE__, "%s: not a regular file", path);
    }
    *fp = fdopen(fd, "rb");
    if (!*fp) {
        int err = errno;
        close(fd);
        return igrad__fail(IGRAD_E_IO, __FILE__, __LINE__, "%s: cannot open: %s", path,
                           strerror(err));
    }
    if (nbytes) *nbytes = (uint64_t)sb.st_size;
    return IGRAD_OK;
}

igrad_status_t igrad__read_file(const char *path, size_t max_nbytes, char **data,
                                size_t *nbytes)
{
    *data = NULL;
    *nbytes = 0;
    FILE *fp;
    uint64_t file_nbytes;
    IGRAD_CHECK(igrad__open_regular(path, &fp, &file_nbytes));
    if (file_nbytes > (uint64_t)max_nbytes) {
        fclose(fp);
        return igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__,
                           "%s: file is %llu bytes, more than the %zu allowed", path,
                           (unsigned long long)file_nbytes, max_nbytes);
    }
    size_t size = (size_t)file_nbytes;
    char *buf = malloc(size + 1);
    if (!buf) {
        fclose(fp);
        return igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__, "%s: out of memory", path);
    }
    size_t got = fread(buf, 1, size, fp);
    int err = ferror(fp);
    fclose(fp);
    if (got != size || err) {
        free(buf);
        return igrad__fail(IGRAD_E_IO, __FILE__, __LINE__, "%s: read failed", path);
    }
    buf[size] = '\0';
    *data = buf;
    *nbytes = size;
    return IGRAD_OK;
}

int igrad__name_equal(const char *a, const char *b)
{
    for (;; a++, b++) {
        int ca = (unsigned char)*a, cb = (unsigned char)*b;
        if (ca >= 'A' && ca <= 'Z') ca += 'a' - 'A';
        if (cb >= 'A' && cb <= 'Z') cb += 'a' - 'A';
        if (ca != cb) return 0;
        if (ca == 0) return 1;
    }
}

char *igrad__strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

char *igrad__strprintf(const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s) vsnprintf(s, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return s;
}

int igrad__create_private(const char *path, char **tmp_path)
{
    static unsigned counter;
    *tmp_path = NULL;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t h = igrad__hash_i64(IGRAD__HASH_SEED, (int64_t)ts.tv_nsec);
    h = igrad__hash_i64(h, (int64_t)ts.tv_sec);
    h = igrad__hash_i64(h, (int64_t)getpid());
    h = igrad__hash_i64(h, (int64_t)(uintptr_t)&ts);
    for (int attempt = 0; attempt < 64; attempt++) {
        h = igrad__hash_i64(h, (int64_t)++counter);
        char *tmp = igrad__strprintf("%s.tmp.%016llx", path, (unsigned long long)h);
        if (!tmp) {
            errno = ENOMEM;
            return -1;
        }
        /* O_EXCL: never an existing file or link (a planted symlink fails
         * with EEXIST, and another name is tried); O_NOFOLLOW says so twice. */
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd >= 0) {
            *tmp_path = tmp;
            return fd;
        }
        int err = errno;
        free(tmp);
        if (err != EEXIST) {
            errno = err;
            return -1;
        }
    }
    errno = EEXIST;
    return -1;
}

igrad_status_t igrad__atomic_open(igrad__atomic_file_t *af, const char *path)
{
    memset(af, 0, sizeof *af);
    af->final_path = igrad__strdup(path);
    if (!af->final_path) return igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__, "%s: out of memory", path);
    int fd = igrad__create_private(path, &af->tmp_path);
    if (fd >= 0 && !(af->fp = fdopen(fd, "wb"))) close(fd);
    if (!af->fp) {
        igrad_status_t st = igrad__fail(IGRAD_E_IO, __FILE__, __LINE__,
                                        "%s: cannot create: %s", path, strerror(errno));
        igrad__atomic_abort(af);
        return st;
    }
    return IGRAD_OK;
}

igrad_status_t igrad__atomic_commit(igrad__atomic_file_t *af)
{
    igrad_status_t st = IGRAD_OK;
    int bad = ferror(af->fp) != 0;
    bad |= fflush(af->fp) != 0;
    bad |= fsync(fileno(af->fp)) != 0;
    bad |= fclose(af->fp) != 0;
    af->fp = NULL;
    if (bad) {
        st = igrad__fail(IGRAD_E_IO, __FILE__, __LINE__, "%s: write failed: %s",
                         af->final_path, strerror(errno));
    } else if (rename(af->tmp_path, af->final_path) != 0) {
        st = igrad__fail(IGRAD_E_IO, __FILE__, __LINE__, "%s: cannot rename into place: %s",
                         af->final_path, strerror(errno));
    }
    if (st != IGRAD_OK) {
        igrad__atomic_abort(af);
        return st;
    }
    free(af->final_path);
    free(af->tmp_path);
    af->final_path = af->tmp_path = NULL;
    return IGRAD_OK;
}

void igrad__atomic_abort(igrad__atomic_file_t *af)
{
    if (af->fp) fclose(af->fp);
    if (af->tmp_path) remove(af->tmp_path);
    free(af->final_path);
    free(af->tmp_path);
    memset(af, 0, sizeof *af);
}
