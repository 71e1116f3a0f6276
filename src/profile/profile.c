/*
 * profile.c — the importance profile: scores of a trace's components over a
 * window (magnitude, persistence, score), the threshold by a partition
 * method (partition.c) and the profile files (JSON via cJSON, reference CSV
 * export) with their strict reader. The trace itself (recording, CSV) lives
 * in trace.c.
 *
 * A profile made from a trace without a "# igrad-trace" line has layout
 * hash 0 (unknown); its JSON says so in a "note" and igrad_profile_load()
 * then checks only the components against a layout, not the hash.
 *
 * Profiles from before EMB, HEAD and NORM were components (or any profile
 * without some of those rows) still load: a layout's EMB/HEAD/NORM
 * component that the profile lacks is important, i.e. sent every step as
 * it always was. A missing projection component is still an error.
 */
#include "core/json_strict.h"
#include "profile/profile_internal.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct igrad_profile {
    uint64_t layout_hash; /* 0 = unknown */
    char sparsifier[32];
    double density;
    double alpha;
    char *method;
    double tau;
    int64_t window_begin, window_end; /* [begin, end) as resolved */
    size_t steps;                     /* trace steps inside the window */
    size_t count;
    igrad_profile_entry_t *entries;   /* (count) by layer, then kind */
};

static const char UNKNOWN_HASH_NOTE[] =
    "layout hash unknown: the trace had no '# igrad-trace' line, so this profile cannot be "
    "checked against a model's layout hash (only its components are checked)";

void igrad_profile_free(igrad_profile_t *profile)
{
    if (!profile) return;
    free(profile->method);
    free(profile->entries);
    free(profile);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int entry_cmp(const void *a, const void *b)
{
    const igrad_profile_entry_t *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return (x->kind > y->kind) - (x->kind < y->kind);
}

/* ---- building ------------------------------------------------------------- */

igrad_status_t igrad_profile_build(const igrad_trace_t *trace,
                                   const igrad_profile_options_t *opts, igrad_profile_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_profile_build: out is NULL");
    *out = NULL;
    IGRAD_FAIL_IF(!trace || !opts, IGRAD_E_INVALID, "igrad_profile_build: NULL argument");
    IGRAD_FAIL_IF(opts->size < sizeof *opts, IGRAD_E_INVALID,
                  "igrad_profile_build: opts->size is %zu, expected %zu (initialise with "
                  "IGRAD_PROFILE_OPTIONS_INIT)",
                  opts->size, sizeof *opts);
    IGRAD_FAIL_IF(!(opts->alpha >= 0.0 && opts->alpha <= 1.0), IGRAD_E_INVALID,
                  "profile: alpha %g is outside [0, 1]", opts->alpha);
    const char *method = opts->method ? opts->method : "knee";
    igrad__partition_method_t pm;
    IGRAD_CHECK(igrad__partition_parse(method, &pm));
    IGRAD_FAIL_IF(trace->ncomp == 0, IGRAD_E_INVALID,
                  "profile: the trace has no components: none of its layout's %zu tensors "
                  "maps to one%s",
                  trace->ntensors, IGRAD__TRACE_NO_ROWS_HINT);
    int64_t b = opts->window_begin, e = opts->window_end;
    IGRAD_FAIL_IF(b < 0 || e < -1 || (e != -1 && e <= b), IGRAD_E_INVALID,
                  "profile: window [%lld, %lld) is empty or invalid (begin >= 0, end > begin "
                  "or -1 for the end of the trace)",
                  (long long)b, (long long)e);
    if (trace->nsteps == 0) {
        /* a recorded trace (a loaded one has steps): igrad_trace_record
         * adds nothing for a tensor that maps to no component */
        size_t mapped = 0;
        for (size_t i = 0; i < trace->ntensors; i++) mapped += trace->tensor_comp[i] >= 0;
        return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                           "profile: the trace has no steps: nothing was recorded for the %zu "
                           "of its layout's %zu tensors that map to a component%s",
                           mapped, trace->ntensors,
                           mapped < trace->ntensors
                               ? " (igrad_trace_record skips the others; `igrad layout "
                                 "--unmapped MODEL` lists them, user rules map them: --map "
                                 "FILE, IgradState(name_map=...) or Profiler(name_map=...))"
                               : "");
    }
    size_t s0 = 0, s1 = 0; /* window step indices [s0, s1) */
    while (s0 < trace->nsteps && trace->steps[s0] < b) s0++;
    s1 = s0;
    while (s1 < trace->nsteps && (e == -1 || trace->steps[s1] < e)) s1++;
    if (s1 == s0) {
        char end_text[32];
        if (e == -1) snprintf(end_text, sizeof end_text, "end");
        else snprintf(end_text, sizeof end_text, "%lld", (long long)e);
        return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                           "profile: window [%lld, %s) holds no step of the trace (its %zu "
                           "steps run from %lld to %lld)",
                           (long long)b, end_text, trace->nsteps, (long long)trace->steps[0],
                           (long long)trace->steps[trace->nsteps - 1]);
    }
    size_t nc = trace->ncomp, ns = s1 - s0;

    igrad_status_t st = IGRAD_OK;
    double *tmp = malloc(nc * sizeof *tmp);
    double *scores = malloc(nc * sizeof *scores);
    igrad_profile_t *p = calloc(1, sizeof *p);
    if (p) {
        p->entries = calloc(nc, sizeof *p->entries);
        p->method = igrad__strdup(method);
    }
    IGRAD_FAIL_GOTO(!tmp || !scores || !p || !p->entries || !p->method, IGRAD_E_NOMEM,
                    "profile: out of memory for %zu components", nc);
    p->layout_hash = trace->layout_hash;
    snprintf(p->sparsifier, sizeof p->sparsifier, "%s", trace->sparsifier);
    p->density = trace->density;
    p->alpha = opts->alpha;
    p->window_begin = b;
    p->window_end = e == -1 ? trace->steps[trace->nsteps - 1] + 1 : e;
    p->steps = ns;
    p->count = nc;

    size_t *above = calloc(nc, sizeof *above);
    IGRAD_FAIL_GOTO(!above, IGRAD_E_NOMEM, "profile: out of memory");
    for (size_t c = 0; c < nc; c++) p->entries[c].mean_activity = 0.0;
    for (size_t s = s0; s < s1; s++) {
        const double *a = trace->activity + s * nc;
        memcpy(tmp, a, nc * sizeof *tmp);
        qsort(tmp, nc, sizeof *tmp, cmp_double);
        double median = nc % 2 ? tmp[nc / 2] : 0.5 * (tmp[nc / 2 - 1] + tmp[nc / 2]);
        for (size_t c = 0; c < nc; c++) {
            p->entries[c].mean_activity += a[c];
            if (a[c] > median) above[c]++;
        }
    }
    double lo = INFINITY, hi = -INFINITY;
    for (size_t c = 0; c < nc; c++) {
        double m = p->entries[c].mean_activity / (double)ns;
        p->entries[c].mean_activity = m;
        if (m < lo) lo = m;
        if (m > hi) hi = m;
    }
    for (size_t c = 0; c < nc; c++) {
        igrad_profile_entry_t *en = &p->entries[c];
        en->layer = trace->comp_layer[c];
        en->kind = trace->comp_kind[c];
        en->count = trace->comp_count[c];
        en->magnitude = hi > lo ? (en->mean_activity - lo) / (hi - lo) : 1.0;
        en->persistence = (double)above[c] / (double)ns;
        en->score = p->alpha * en->magnitude + (1.0 - p->alpha) * en->persistence;
        scores[c] = en->score;
    }
    free(above);
    IGRAD_CHECK_GOTO(igrad_partition(scores, nc, method, &p->tau));
    for (size_t c = 0; c < nc; c++) p->entries[c].important = p->entries[c].score >= p->tau;
    *out = p;
    p = NULL;
cleanup:
    igrad_profile_free(p);
    free(tmp);
    free(scores);
    return st;
}

/* ---- accessors ------------------------------------------------------------ */

size_t igrad_profile_count(const igrad_profile_t *profile) { return profile ? profile->count : 0; }

igrad_status_t igrad_profile_entry(const igrad_profile_t *profile, size_t i,
                                   igrad_profile_entry_t *out)
{
    IGRAD_FAIL_IF(!profile || !out, IGRAD_E_INVALID, "igrad_profile_entry: NULL argument");
    IGRAD_FAIL_IF(i >= profile->count, IGRAD_E_INVALID,
                  "igrad_profile_entry: index %zu out of range (%zu components)", i,
                  profile->count);
    *out = profile->entries[i];
    return IGRAD_OK;
}

double igrad_profile_threshold(const igrad_profile_t *profile)
{
    return profile ? profile->tau : NAN;
}

uint64_t igrad_profile_layout_hash(const igrad_profile_t *profile)
{
    return profile ? profile->layout_hash : 0;
}

const char *igrad_profile_method(const igrad_profile_t *profile)
{
    return profile ? profile->method : "";
}

const char *igrad_profile_sparsifier(const igrad_profile_t *profile)
{
    return profile ? profile->sparsifier : "";
}

double igrad_profile_density(const igrad_profile_t *profile)
{
    return profile ? profile->density : 0.0;
}

double igrad_profile_alpha(const igrad_profile_t *profile)
{
    return profile ? profile->alpha : NAN;
}

void igrad_profile_window(const igrad_profile_t *profile, int64_t *begin, int64_t *end,
                          size_t *steps)
{
    if (begin) *begin = profile ? profile->window_begin : 0;
    if (end) *end = profile ? profile->window_end : 0;
    if (steps) *steps = profile ? profile->steps : 0;
}

int igrad_profile_is_important(const igrad_profile_t *profile, int layer, igrad_kind_t kind)
{
    if (!profile) return -1;
    size_t lo = 0, hi = profile->count;
    igrad_profile_entry_t key = {.layer = layer, .kind = kind};
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = entry_cmp(&profile->entries[mid], &key);
        if (c == 0) return profile->entries[mid].important ? 1 : 0;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

igrad_status_t igrad_profile_set_threshold(igrad_profile_t *profile, double tau)
{
    IGRAD_FAIL_IF(!profile, IGRAD_E_INVALID, "igrad_profile_set_threshold: NULL profile");
    IGRAD_FAIL_IF(!isfinite(tau), IGRAD_E_INVALID,
                  "igrad_profile_set_threshold: tau %g is not finite", tau);
    profile->tau = tau;
    for (size_t i = 0; i < profile->count; i++)
        profile->entries[i].important = profile->entries[i].score >= tau;
    return IGRAD_OK;
}

igrad_status_t igrad__profile_set_classes(igrad_profile_t *profile, double tau,
                                          const unsigned char *important)
{
    IGRAD_FAIL_IF(!profile || !important || !isfinite(tau), IGRAD_E_INVALID,
                  "profile: set classes: NULL argument or tau %g", tau);
    int low = 0;
    for (size_t i = 0; i < profile->count; i++) low |= !important[i];
    if (tau > 1.0) tau = 1.0;                         /* scores stay in [0, 1] */
    if (low && tau <= 0.0) tau = nextafter(0.0, 1.0); /* room for a score below it */
    profile->tau = tau;
    for (size_t i = 0; i < profile->count; i++) {
        igrad_profile_entry_t *en = &profile->entries[i];
        if (important[i] && en->score < tau) en->score = tau;
        if (!important[i] && en->score >= tau) en->score = nextafter(tau, 0.0);
        en->important = important[i];
    }
    return IGRAD_OK;
}

/* ---- writers -------------------------------------------------------------- */

/* cJSON prints doubles with 15 digits whenever they compare equal within an
 * epsilon, which does not round-trip; numbers are therefore added as raw
 * text: the shortest of %.15g..%.17g that reads back exactly. */
void igrad__format_exact_double(char *buf, size_t nbytes, double v)
{
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, nbytes, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
}

static int add_double(cJSON *obj, const char *key, double v)
{
    char buf[40];
    igrad__format_exact_double(buf, sizeof buf, v);
    return cJSON_AddRawToObject(obj, key, buf) != NULL;
}

static int add_int(cJSON *obj, const char *key, long long v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", v);
    return cJSON_AddRawToObject(obj, key, buf) != NULL;
}

igrad_status_t igrad__profile_to_json_text(const igrad_profile_t *p, char **text)
{
    IGRAD_FAIL_IF(!p || !text, IGRAD_E_INVALID, "profile: NULL argument");
    *text = NULL;
    char hash[24];
    snprintf(hash, sizeof hash, "0x%016llx", (unsigned long long)p->layout_hash);
    cJSON *root = cJSON_CreateObject();
    cJSON *window = cJSON_CreateArray();
    cJSON *comps = cJSON_CreateArray();
    int ok = root && window && comps;
    if (ok) {
        ok &= cJSON_AddStringToObject(root, "schema", "igrad-profile") != NULL;
        ok &= add_int(root, "version", 1);
        ok &= cJSON_AddStringToObject(root, "layout_hash", hash) != NULL;
        if (p->layout_hash == 0) {
            ok &= cJSON_AddStringToObject(root, "note", UNKNOWN_HASH_NOTE) != NULL;
        }
        ok &= cJSON_AddStringToObject(root, "sparsifier", p->sparsifier) != NULL;
        ok &= add_double(root, "density", p->density);
        ok &= add_double(root, "alpha", p->alpha);
        ok &= cJSON_AddStringToObject(root, "method", p->method) != NULL;
        ok &= add_double(root, "tau", p->tau);
        char wtext[2][32];
        snprintf(wtext[0], sizeof wtext[0], "%lld", (long long)p->window_begin);
        snprintf(wtext[1], sizeof wtext[1], "%lld", (long long)p->window_end);
        cJSON *wb = cJSON_CreateRaw(wtext[0]);
        cJSON *we = cJSON_CreateRaw(wtext[1]);
        ok &= wb && we;
        if (wb) cJSON_AddItemToArray(window, wb);
        if (we) cJSON_AddItemToArray(window, we);
        cJSON_AddItemToObject(root, "window", window);
        window = NULL;
        ok &= add_int(root, "steps", (long long)p->steps);
        cJSON_AddItemToObject(root, "components", comps);
        cJSON *arr = comps;
        comps = NULL;
        for (size_t i = 0; ok && i < p->count; i++) {
            const igrad_profile_entry_t *en = &p->entries[i];
            cJSON *o = cJSON_CreateObject();
            if (!o) {
                ok = 0;
                break;
            }
            cJSON_AddItemToArray(arr, o);
            ok &= add_int(o, "layer", en->layer);
            ok &= cJSON_AddStringToObject(o, "kind", igrad_kind_name(en->kind)) != NULL;
            ok &= add_int(o, "numel", (long long)en->count);
            ok &= add_double(o, "mean_activity", en->mean_activity);
            ok &= add_double(o, "magnitude", en->magnitude);
            ok &= add_double(o, "persistence", en->persistence);
            ok &= add_double(o, "score", en->score);
            ok &= cJSON_AddBoolToObject(o, "important", en->important) != NULL;
        }
    }
    char *s = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    cJSON_Delete(window);
    cJSON_Delete(comps);
    IGRAD_FAIL_IF(!s, IGRAD_E_NOMEM, "profile: out of memory writing JSON");
    /* cJSON allocates with malloc by default; copy anyway so the caller can
     * free() it whatever hooks cJSON was built with, and end with a newline. */
    *text = igrad__strprintf("%s\n", s);
    cJSON_free(s);
    IGRAD_FAIL_IF(!*text, IGRAD_E_NOMEM, "profile: out of memory writing JSON");
    return IGRAD_OK;
}

static igrad_status_t write_text(const char *path, const char *text)
{
    igrad__atomic_file_t af;
    IGRAD_CHECK(igrad__atomic_open(&af, path));
    fputs(text, af.fp);
    return igrad__atomic_commit(&af);
}

igrad_status_t igrad_profile_save_json(const igrad_profile_t *profile, const char *path)
{
    IGRAD_FAIL_IF(!profile || !path, IGRAD_E_INVALID, "igrad_profile_save_json: NULL argument");
    char *text = NULL;
    IGRAD_CHECK(igrad__profile_to_json_text(profile, &text));
    igrad_status_t st = write_text(path, text);
    free(text);
    return st;
}

igrad_status_t igrad_profile_save_csv(const igrad_profile_t *profile, const char *path)
{
    IGRAD_FAIL_IF(!profile || !path, IGRAD_E_INVALID, "igrad_profile_save_csv: NULL argument");
    igrad__atomic_file_t af;
    IGRAD_CHECK(igrad__atomic_open(&af, path));
    /* %.17g: a reader that recomputes final_score >= global_tau must agree
     * with is_important, which 9 digits could not promise. */
    fprintf(af.fp, "layer,component,final_score,global_tau,is_important\n");
    for (size_t i = 0; i < profile->count; i++) {
        const igrad_profile_entry_t *en = &profile->entries[i];
        fprintf(af.fp, "%d,%s,%.17g,%.17g,%d\n", en->layer, igrad_kind_name(en->kind), en->score,
                profile->tau, en->important ? 1 : 0);
    }
    return igrad__atomic_commit(&af);
}

/* ---- reader --------------------------------------------------------------- */

typedef struct json_ctx {
    const char *source;
    char where[96]; /* "components[3] (layer 1 K)" or "" at the top level */
} json_ctx_t;

static const char *where_prefix(const json_ctx_t *cx, char *buf, size_t n)
{
    if (cx->where[0]) snprintf(buf, n, "%s: ", cx->where);
    else buf[0] = '\0';
    return buf;
}

#define JSON_FAIL(cx, ...)                                                                 \
    do {                                                                                   \
        char wp_[112];                                                                     \
        char msg_[512];                                                                    \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);                                          \
        return igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__, "%s: %s%s", (cx)->source,    \
                           where_prefix((cx), wp_, sizeof wp_), msg_);                     \
    } while (0)

static igrad_status_t get_item(const json_ctx_t *cx, const cJSON *obj, const char *key,
                               const cJSON **out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it) JSON_FAIL(cx, "key '%s' is missing", key);
    *out = it;
    return IGRAD_OK;
}

static igrad_status_t get_string(const json_ctx_t *cx, const cJSON *obj, const char *key,
                                 const char **out)
{
    const cJSON *it = NULL;
    IGRAD_CHECK(get_item(cx, obj, key, &it));
    if (!cJSON_IsString(it) || !it->valuestring) JSON_FAIL(cx, "key '%s' must be a string", key);
    *out = it->valuestring;
    return IGRAD_OK;
}

static igrad_status_t get_number(const json_ctx_t *cx, const cJSON *obj, const char *key,
                                 double lo, double hi, double *out)
{
    const cJSON *it = NULL;
    IGRAD_CHECK(get_item(cx, obj, key, &it));
    if (!cJSON_IsNumber(it)) JSON_FAIL(cx, "key '%s' must be a number", key);
    double v = it->valuedouble;
    if (!isfinite(v) || v < lo || v > hi) {
        JSON_FAIL(cx, "key '%s' is %.17g, outside [%g, %g]", key, v, lo, hi);
    }
    *out = v;
    return IGRAD_OK;
}

static igrad_status_t check_integer(const json_ctx_t *cx, const char *key, double v)
{
    if (v != floor(v)) JSON_FAIL(cx, "key '%s' must be an integer, found %.17g", key, v);
    return IGRAD_OK;
}

#define MAX_EXACT_INT ((double)IGRAD__MAX_EXACT_INT)

static igrad_status_t read_component(json_ctx_t *cx, const cJSON *o, double tau,
                                     igrad_profile_entry_t *en)
{
    if (!cJSON_IsObject(o)) JSON_FAIL(cx, "must be an object");
    double layer = 0, numel = 0, v = 0;
    IGRAD_CHECK(get_number(cx, o, "layer", -1, 2147483647.0, &layer));
    IGRAD_CHECK(check_integer(cx, "layer", layer));
    const char *kind_name = NULL;
    IGRAD_CHECK(get_string(cx, o, "kind", &kind_name));
    igrad_kind_t kind = IGRAD_KIND_OTHER;
    if (igrad_kind_from_name(kind_name, &kind) != IGRAD_OK || kind == IGRAD_KIND_OTHER) {
        JSON_FAIL(cx, "kind '%s' is not one of Q, K, V, QKV, O, FC1, FC2, EMB, HEAD, NORM",
                  kind_name);
    }
    if (layer < 0 && !igrad__kind_is_outer(kind)) {
        JSON_FAIL(cx, "layer -1 is only for EMB, HEAD and NORM, not %s", kind_name);
    }
    size_t wl = strlen(cx->where);
    snprintf(cx->where + wl, sizeof cx->where - wl, " (layer %d %s)", (int)layer,
             igrad_kind_name(kind));
    en->layer = (int)layer;
    en->kind = kind;
    IGRAD_CHECK(get_number(cx, o, "numel", 1, MAX_EXACT_INT, &numel));
    IGRAD_CHECK(check_integer(cx, "numel", numel));
    en->count = (int64_t)numel;
    IGRAD_CHECK(get_number(cx, o, "mean_activity", 0, HUGE_VAL, &en->mean_activity));
    IGRAD_CHECK(get_number(cx, o, "magnitude", 0, 1, &en->magnitude));
    IGRAD_CHECK(get_number(cx, o, "persistence", 0, 1, &en->persistence));
    IGRAD_CHECK(get_number(cx, o, "score", 0, 1, &v));
    en->score = v;
    const cJSON *imp = NULL;
    IGRAD_CHECK(get_item(cx, o, "important", &imp));
    if (!cJSON_IsBool(imp)) JSON_FAIL(cx, "key 'important' must be true or false");
    en->important = cJSON_IsTrue(imp) ? 1 : 0;
    if (en->important != (en->score >= tau)) {
        JSON_FAIL(cx, "important is %s but score %.17g is %s tau %.17g",
                  en->important ? "true" : "false", en->score,
                  en->score >= tau ? ">=" : "<", tau);
    }
    return IGRAD_OK;
}

static igrad_status_t parse_hash(const json_ctx_t *cx, const char *s, uint64_t *out)
{
    size_t n = strlen(s);
    int ok = n > 2 && n <= 18 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
    for (size_t i = 2; ok && i < n; i++) ok = isxdigit((unsigned char)s[i]) != 0;
    if (!ok) JSON_FAIL(cx, "key 'layout_hash' is '%.40s', not 0x<hex>", s);
    *out = (uint64_t)strtoull(s + 2, NULL, 16);
    return IGRAD_OK;
}

static igrad_status_t read_profile(json_ctx_t *cx, const cJSON *root, igrad_profile_t *p)
{
    if (!cJSON_IsObject(root)) JSON_FAIL(cx, "the top level is not a JSON object");
    const char *s = NULL;
    double v = 0;
    IGRAD_CHECK(get_string(cx, root, "schema", &s));
    if (strcmp(s, "igrad-profile") != 0) {
        JSON_FAIL(cx, "key 'schema' is '%.40s', not 'igrad-profile'", s);
    }
    IGRAD_CHECK(get_number(cx, root, "version", -HUGE_VAL, HUGE_VAL, &v));
    if (v != 1) JSON_FAIL(cx, "key 'version' is %g; this reader knows version 1", v);
    IGRAD_CHECK(get_string(cx, root, "layout_hash", &s));
    IGRAD_CHECK(parse_hash(cx, s, &p->layout_hash));
    IGRAD_CHECK(get_string(cx, root, "sparsifier", &s));
    if (s[0] == '\0' || strlen(s) >= sizeof p->sparsifier) {
        JSON_FAIL(cx, "key 'sparsifier' must be a name of 1 to %zu characters",
                  sizeof p->sparsifier - 1);
    }
    snprintf(p->sparsifier, sizeof p->sparsifier, "%s", s);
    IGRAD_CHECK(get_number(cx, root, "density", 0, 1, &p->density));
    IGRAD_CHECK(get_number(cx, root, "alpha", 0, 1, &p->alpha));
    IGRAD_CHECK(get_string(cx, root, "method", &s));
    igrad__partition_method_t pm;
    if (igrad__partition_parse(s, &pm) != IGRAD_OK) {
        JSON_FAIL(cx, "key 'method': %s", igrad_last_error());
    }
    p->method = igrad__strdup(s);
    IGRAD_FAIL_IF(!p->method, IGRAD_E_NOMEM, "%s: out of memory", cx->source);
    IGRAD_CHECK(get_number(cx, root, "tau", -HUGE_VAL, HUGE_VAL, &p->tau));
    const cJSON *w = NULL;
    IGRAD_CHECK(get_item(cx, root, "window", &w));
    if (!cJSON_IsArray(w) || cJSON_GetArraySize(w) != 2 || !cJSON_IsNumber(w->child) ||
        !cJSON_IsNumber(w->child->next)) {
        JSON_FAIL(cx, "key 'window' must be an array of two step numbers [begin, end]");
    }
    double wb = w->child->valuedouble, we = w->child->next->valuedouble;
    if (!(wb >= 0 && wb < we && we <= MAX_EXACT_INT) || wb != floor(wb) || we != floor(we)) {
        JSON_FAIL(cx, "key 'window' [%.17g, %.17g] is not a non-empty range of steps", wb, we);
    }
    p->window_begin = (int64_t)wb;
    p->window_end = (int64_t)we;
    IGRAD_CHECK(get_number(cx, root, "steps", 1, we - wb, &v));
    IGRAD_CHECK(check_integer(cx, "steps", v));
    p->steps = (size_t)v;
    const cJSON *comps = NULL;
    IGRAD_CHECK(get_item(cx, root, "components", &comps));
    if (!cJSON_IsArray(comps)) JSON_FAIL(cx, "key 'components' must be an array");
    int n = cJSON_GetArraySize(comps);
    if (n <= 0) JSON_FAIL(cx, "key 'components' is empty");
    p->entries = calloc((size_t)n, sizeof *p->entries);
    IGRAD_FAIL_IF(!p->entries, IGRAD_E_NOMEM, "%s: out of memory", cx->source);
    int i = 0;
    for (const cJSON *o = comps->child; o; o = o->next, i++) {
        snprintf(cx->where, sizeof cx->where, "components[%d]", i);
        IGRAD_CHECK(read_component(cx, o, p->tau, &p->entries[i]));
    }
    cx->where[0] = '\0';
    p->count = (size_t)n;
    qsort(p->entries, p->count, sizeof *p->entries, entry_cmp);
    for (size_t k = 1; k < p->count; k++) {
        if (entry_cmp(&p->entries[k - 1], &p->entries[k]) == 0) {
            JSON_FAIL(cx, "component layer %d %s is listed twice", p->entries[k].layer,
                      igrad_kind_name(p->entries[k].kind));
        }
    }
    return IGRAD_OK;
}

static igrad_status_t check_layout(const char *source, const igrad_profile_t *p,
                                   const igrad_layout_t *layout)
{
    uint64_t lh = igrad_layout_hash(layout);
    IGRAD_FAIL_IF(p->layout_hash != 0 && p->layout_hash != lh, IGRAD_E_MISMATCH,
                  "%s was made for layout 0x%016llx but this layout is 0x%016llx", source,
                  (unsigned long long)p->layout_hash, (unsigned long long)lh);
    size_t nc = igrad_layout_component_count(layout);
    size_t i = 0, j = 0;
    while (i < p->count || j < nc) {
        igrad_component_info_t ci = {0};
        if (j < nc) IGRAD_CHECK(igrad_layout_component(layout, j, &ci));
        const igrad_profile_entry_t *en = i < p->count ? &p->entries[i] : NULL;
        igrad_profile_entry_t key = {.layer = ci.layer, .kind = ci.kind};
        int c = !en ? 1 : j >= nc ? -1 : entry_cmp(en, &key);
        if (c > 0 && igrad__kind_is_outer(ci.kind)) {
            /* a profile from before EMB/HEAD/NORM were components: the
             * missing one counts as important (see igrad_profile_is_important) */
            j++;
            continue;
        }
        IGRAD_FAIL_IF(c < 0, IGRAD_E_MISMATCH,
                      "%s has component layer %d %s, which this layout does not", source,
                      en->layer, igrad_kind_name(en->kind));
        IGRAD_FAIL_IF(c > 0, IGRAD_E_MISMATCH,
                      "%s lacks component layer %d %s of this layout", source, ci.layer,
                      igrad_kind_name(ci.kind));
        IGRAD_FAIL_IF(en->count != ci.count, IGRAD_E_MISMATCH,
                      "%s: component layer %d %s has %lld entries, but %lld in this layout",
                      source, en->layer, igrad_kind_name(en->kind), (long long)en->count,
                      (long long)ci.count);
        i++;
        j++;
    }
    return IGRAD_OK;
}

/* Line and column of byte offset `pos`, for parse-error messages. */
static void line_col(const char *text, size_t pos, size_t *line, size_t *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < pos; i++) {
        if (text[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

igrad_status_t igrad__profile_from_json_text(const char *text, size_t nbytes,
                                             const char *source, const igrad_layout_t *layout,
                                             igrad_profile_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "profile: out is NULL");
    *out = NULL;
    IGRAD_FAIL_IF(!text && nbytes, IGRAD_E_INVALID, "profile: text is NULL");
    if (!source) source = "profile";
    IGRAD_FAIL_IF(nbytes && memchr(text, '\0', nbytes), IGRAD_E_FORMAT,
                  "%s: contains a NUL byte (not a JSON text)", source);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text ? text : "", nbytes, &end, 0);
    if (!root) {
        size_t pos = end && end >= text && end <= text + nbytes ? (size_t)(end - text) : 0;
        size_t line = 1, col = 1;
        if (text) line_col(text, pos, &line, &col);
        return igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__,
                           "%s:%zu:%zu: malformed JSON", source, line, col);
    }
    /* Anything but whitespace after the value is an error, as in every
     * strict JSON reader. */
    if (end) {
        const char *q = end;
        while (q < text + nbytes && isspace((unsigned char)*q)) q++;
        if (q < text + nbytes) {
            size_t line = 1, col = 1;
            line_col(text, (size_t)(q - text), &line, &col);
            cJSON_Delete(root);
            return igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__,
                               "%s:%zu:%zu: unexpected text after the JSON value", source,
                               line, col);
        }
    }
    size_t str_at = 0, nul = igrad__json_find_nul_escape(text, nbytes, &str_at);
    if (nul != IGRAD__JSON_NO_NUL) {
        char excerpt[64];
        size_t line = 1, col = 1;
        igrad__json_nul_excerpt(text, nul, str_at, excerpt, sizeof excerpt);
        line_col(text, nul, &line, &col);
        cJSON_Delete(root);
        return igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__,
                           "%s:%zu:%zu: string %s holds \\u0000 (a NUL character), which igrad "
                           "does not accept in JSON strings", source, line, col, excerpt);
    }
    igrad_status_t st = IGRAD_OK;
    igrad_profile_t *p = calloc(1, sizeof *p);
    IGRAD_FAIL_GOTO(!p, IGRAD_E_NOMEM, "%s: out of memory", source);
    json_ctx_t cx = {.source = source};
    IGRAD_CHECK_GOTO(read_profile(&cx, root, p));
    if (layout) IGRAD_CHECK_GOTO(check_layout(source, p, layout));
    *out = p;
    p = NULL;
cleanup:
    igrad_profile_free(p);
    cJSON_Delete(root);
    return st;
}

igrad_status_t igrad_profile_load(const char *path, const igrad_layout_t *layout,
                                  igrad_profile_t **out)
{
    IGRAD_FAIL_IF(!out || !path, IGRAD_E_INVALID, "igrad_profile_load: NULL argument");
    *out = NULL;
    char *text = NULL;
    size_t nbytes = 0;
    IGRAD_CHECK(igrad__read_file(path, IGRAD__PROFILE_MAX_NBYTES, &text, &nbytes));
    igrad_status_t st = igrad__profile_from_json_text(text, nbytes, path, layout, out);
    free(text);
    return st;
}
