/*
 * trace.c — the activity trace: recording each tensor's retained sum of
 * squares into its (layer, kind) component per step, and the trace CSV
 * (writer and strict reader, DESIGN.md §5). Scores, thresholds and profile
 * files live in profile.c and partition.c; selection itself in select.c.
 *
 * CSV layout (docs/formats.md §5): an optional first comment line
 *   # igrad-trace v2 layout_hash=0x<16 hex> sparsifier=<name> density=<g>
 * then the header step,layer,component,raw_activity,d_activity,numel,
 * retained_numel and one row per step and component. v2 columns mean what
 * the reference method's mean: raw_activity = sqrt(sum of retained v^2),
 * d_activity = raw_activity / sqrt(numel) = a[s,c], the scored quantity;
 * floats are written exactly (shortest of %.15g..%.17g), so a file read and
 * written again comes out byte-identical. The reader also takes
 *   - v1 files (the "# igrad-trace v1" line, or no igrad-trace line at all):
 *     raw_activity was already a[s,c], d_activity a step difference (checked
 *     finite, not kept);
 *   - the reference method's component_activity_trace.csv as it is written
 *     (header step,seed,model_name,workload_name,dataset_name,layer,
 *     component,raw_activity,d_activity,numel,retained_numel; its component
 *     names mapped to igrad's kinds; one run per file).
 */
#define _POSIX_C_SOURCE 200809L /* strtok_r */
#include "core/sparsifier.h"
#include "profile/profile_internal.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char CSV_HEADER[] = "step,layer,component,raw_activity,d_activity,numel,retained_numel";
#define CSV_FIELDS 7
static const char REF_HEADER[] = "step,seed,model_name,workload_name,dataset_name,layer,component,"
                                 "raw_activity,d_activity,numel,retained_numel";
#define REF_FIELDS 11
#define MAX_FIELDS REF_FIELDS

/* What the columns of the file being read mean. */
typedef enum trace_format {
    FORMAT_V1,        /* raw_activity = a[s,c]; d_activity a step difference */
    FORMAT_V2,        /* raw_activity = sqrt(sum v^2); d_activity = a[s,c] */
    FORMAT_REFERENCE, /* the reference method's file: v2's meanings, 11 columns */
} trace_format_t;

/* d_activity must be raw_activity / sqrt(numel) to this relative tolerance
 * (both printed with at least 9 digits by any writer that means them). */
#define D_ACTIVITY_RTOL 1e-6

/* ---- the trace object ---------------------------------------------------- */

static igrad_trace_t *trace_alloc(void)
{
    igrad_trace_t *t = calloc(1, sizeof *t);
    if (t) snprintf(t->sparsifier, sizeof t->sparsifier, "unknown");
    return t;
}

void igrad_trace_free(igrad_trace_t *trace)
{
    if (!trace) return;
    free(trace->comp_layer);
    free(trace->comp_kind);
    free(trace->comp_count);
    free(trace->comp_tensors);
    free(trace->tensor_comp);
    free(trace->steps);
    free(trace->activity);
    free(trace->raw);
    free(trace->retained);
    free(trace->sumsq);
    free(trace);
}

static igrad_status_t alloc_components(igrad_trace_t *t, size_t ncomp)
{
    size_t n = ncomp ? ncomp : 1;
    t->ncomp = ncomp;
    t->comp_layer = calloc(n, sizeof *t->comp_layer);
    t->comp_kind = calloc(n, sizeof *t->comp_kind);
    t->comp_count = calloc(n, sizeof *t->comp_count);
    t->comp_tensors = calloc(n, sizeof *t->comp_tensors);
    IGRAD_FAIL_IF(!t->comp_layer || !t->comp_kind || !t->comp_count || !t->comp_tensors,
                  IGRAD_E_NOMEM, "trace: out of memory for %zu components", ncomp);
    return IGRAD_OK;
}

/* Makes room for one more step row (zeroed). */
static igrad_status_t append_step(igrad_trace_t *t, int64_t step)
{
    if (t->nsteps == t->cap_steps) {
        size_t cap = t->cap_steps ? 2 * t->cap_steps : 64;
        size_t row = t->ncomp ? t->ncomp : 1;
        IGRAD_FAIL_IF(cap > SIZE_MAX / row / sizeof(double), IGRAD_E_NOMEM,
                      "trace: too many steps (%zu)", cap);
        int64_t *steps = realloc(t->steps, cap * sizeof *steps);
        if (steps) t->steps = steps;
        double *act = realloc(t->activity, cap * row * sizeof *act);
        if (act) t->activity = act;
        double *raw = realloc(t->raw, cap * row * sizeof *raw);
        if (raw) t->raw = raw;
        int64_t *ret = realloc(t->retained, cap * row * sizeof *ret);
        if (ret) t->retained = ret;
        double *ss = t->sumsq;
        if (t->sumsq) {
            ss = realloc(t->sumsq, cap * row * sizeof *ss);
            if (ss) t->sumsq = ss;
        }
        IGRAD_FAIL_IF(!steps || !act || !raw || !ret || (t->sumsq && !ss), IGRAD_E_NOMEM,
                      "trace: out of memory for %zu steps of %zu components", cap, t->ncomp);
        t->cap_steps = cap;
    }
    size_t base = t->nsteps * t->ncomp;
    t->steps[t->nsteps] = step;
    for (size_t c = 0; c < t->ncomp; c++) {
        t->activity[base + c] = 0.0;
        t->raw[base + c] = 0.0;
        t->retained[base + c] = 0;
        if (t->sumsq) t->sumsq[base + c] = 0.0;
    }
    t->nsteps++;
    return IGRAD_OK;
}

igrad_status_t igrad_trace_create(const igrad_layout_t *layout, igrad_trace_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_trace_create: out is NULL");
    *out = NULL;
    IGRAD_FAIL_IF(!layout, IGRAD_E_INVALID, "igrad_trace_create: layout is NULL");
    igrad_status_t st = IGRAD_OK;
    igrad_trace_t *t = trace_alloc();
    IGRAD_FAIL_IF(!t, IGRAD_E_NOMEM, "igrad_trace_create: out of memory");
    t->layout_hash = igrad_layout_hash(layout);
    IGRAD_CHECK_GOTO(alloc_components(t, igrad_layout_component_count(layout)));
    for (size_t c = 0; c < t->ncomp; c++) {
        igrad_component_info_t ci;
        IGRAD_CHECK_GOTO(igrad_layout_component(layout, c, &ci));
        t->comp_layer[c] = ci.layer;
        t->comp_kind[c] = ci.kind;
        t->comp_count[c] = ci.count;
        t->comp_tensors[c] = ci.tensors;
    }
    t->ntensors = igrad_layout_count(layout);
    t->tensor_comp = malloc((t->ntensors ? t->ntensors : 1) * sizeof *t->tensor_comp);
    /* A recorded trace keeps sums of squares; allocate the pointer now so
     * append_step() grows it alongside the other arrays. */
    t->sumsq = malloc(sizeof *t->sumsq);
    IGRAD_FAIL_GOTO(!t->tensor_comp || !t->sumsq, IGRAD_E_NOMEM,
                    "igrad_trace_create: out of memory");
    for (size_t i = 0; i < t->ntensors; i++) {
        igrad_tensor_info_t ti;
        IGRAD_CHECK_GOTO(igrad_layout_tensor(layout, i, &ti));
        IGRAD_FAIL_GOTO(ti.component >= (int)t->ncomp, IGRAD_E_INVALID,
                        "igrad_trace_create: tensor '%s' names component %d of %zu", ti.name,
                        ti.component, t->ncomp);
        t->tensor_comp[i] = ti.component;
    }
    *out = t;
    return IGRAD_OK;
cleanup:
    igrad_trace_free(t);
    return st;
}

igrad_status_t igrad_trace_set_sparsifier(igrad_trace_t *trace, igrad_sparsifier_t sp,
                                          double density)
{
    IGRAD_FAIL_IF(!trace, IGRAD_E_INVALID, "igrad_trace_set_sparsifier: trace is NULL");
    IGRAD_FAIL_IF(!igrad__sparsifier(sp), IGRAD_E_INVALID,
                  "igrad_trace_set_sparsifier: unknown sparsifier %d", (int)sp);
    IGRAD_FAIL_IF(!(density > 0.0 && density <= 1.0), IGRAD_E_INVALID,
                  "igrad_trace_set_sparsifier: density %g is outside (0, 1]", density);
    snprintf(trace->sparsifier, sizeof trace->sparsifier, "%s", igrad_sparsifier_name(sp));
    trace->density = density;
    return IGRAD_OK;
}

igrad_status_t igrad_trace_record(igrad_trace_t *trace, int64_t step, size_t tensor,
                                  double sumsq, int64_t retained)
{
    IGRAD_FAIL_IF(!trace, IGRAD_E_INVALID, "igrad_trace_record: trace is NULL");
    IGRAD_FAIL_IF(!trace->tensor_comp, IGRAD_E_INVALID,
                  "igrad_trace_record: this trace was read from a file and has no layout "
                  "to record into");
    IGRAD_FAIL_IF(tensor >= trace->ntensors, IGRAD_E_INVALID,
                  "igrad_trace_record: tensor %zu out of range (layout has %zu)", tensor,
                  trace->ntensors);
    IGRAD_FAIL_IF(step < 0 || step >= IGRAD__MAX_EXACT_INT, IGRAD_E_INVALID,
                  "igrad_trace_record: step %lld is outside [0, 2^53)", (long long)step);
    IGRAD_FAIL_IF(trace->nsteps && step < trace->steps[trace->nsteps - 1], IGRAD_E_INVALID,
                  "igrad_trace_record: step %lld after step %lld (steps must not decrease)",
                  (long long)step, (long long)trace->steps[trace->nsteps - 1]);
    IGRAD_FAIL_IF(!isfinite(sumsq) || sumsq < 0.0, IGRAD_E_INVALID,
                  "igrad_trace_record: tensor %zu at step %lld: sum of squares %g is not a "
                  "finite non-negative number",
                  tensor, (long long)step, sumsq);
    IGRAD_FAIL_IF(retained < 0, IGRAD_E_INVALID,
                  "igrad_trace_record: tensor %zu: negative retained count %lld", tensor,
                  (long long)retained);
    int c = trace->tensor_comp[tensor];
    if (c < 0) return IGRAD_OK; /* OTHER: always synchronized, never profiled */
    int new_step = trace->nsteps == 0 || step > trace->steps[trace->nsteps - 1];
    int64_t before = new_step ? 0 : trace->retained[(trace->nsteps - 1) * trace->ncomp + (size_t)c];
    IGRAD_FAIL_IF(retained > trace->comp_count[c] - before, IGRAD_E_INVALID,
                  "igrad_trace_record: step %lld: layer %d %s would retain %lld + %lld of its "
                  "%lld entries (was a tensor recorded twice?)",
                  (long long)step, trace->comp_layer[c], igrad_kind_name(trace->comp_kind[c]),
                  (long long)before, (long long)retained, (long long)trace->comp_count[c]);
    if (new_step) IGRAD_CHECK(append_step(trace, step));
    size_t idx = (trace->nsteps - 1) * trace->ncomp + (size_t)c;
    trace->sumsq[idx] += sumsq;
    trace->retained[idx] += retained;
    trace->activity[idx] = sqrt(trace->sumsq[idx] / (double)trace->comp_count[c]);
    trace->raw[idx] = sqrt(trace->sumsq[idx]);
    return IGRAD_OK;
}

/* ---- accessors ------------------------------------------------------------ */

size_t igrad_trace_step_count(const igrad_trace_t *trace) { return trace ? trace->nsteps : 0; }

size_t igrad_trace_component_count(const igrad_trace_t *trace)
{
    return trace ? trace->ncomp : 0;
}

uint64_t igrad_trace_layout_hash(const igrad_trace_t *trace)
{
    return trace ? trace->layout_hash : 0;
}

const char *igrad_trace_sparsifier(const igrad_trace_t *trace)
{
    return trace ? trace->sparsifier : "unknown";
}

double igrad_trace_density(const igrad_trace_t *trace) { return trace ? trace->density : 0.0; }

igrad_status_t igrad_trace_component(const igrad_trace_t *trace, size_t i,
                                     igrad_component_info_t *out)
{
    IGRAD_FAIL_IF(!trace || !out, IGRAD_E_INVALID, "igrad_trace_component: NULL argument");
    IGRAD_FAIL_IF(i >= trace->ncomp, IGRAD_E_INVALID,
                  "igrad_trace_component: index %zu out of range (%zu components)", i,
                  trace->ncomp);
    out->layer = trace->comp_layer[i];
    out->kind = trace->comp_kind[i];
    out->count = trace->comp_count[i];
    out->tensors = trace->comp_tensors[i];
    return IGRAD_OK;
}

int64_t igrad_trace_step(const igrad_trace_t *trace, size_t i)
{
    return trace && i < trace->nsteps ? trace->steps[i] : -1;
}

igrad_status_t igrad_trace_value(const igrad_trace_t *trace, size_t step_index,
                                 size_t component, double *activity, int64_t *retained)
{
    IGRAD_FAIL_IF(!trace, IGRAD_E_INVALID, "igrad_trace_value: trace is NULL");
    IGRAD_FAIL_IF(step_index >= trace->nsteps || component >= trace->ncomp, IGRAD_E_INVALID,
                  "igrad_trace_value: (%zu, %zu) out of range (%zu steps, %zu components)",
                  step_index, component, trace->nsteps, trace->ncomp);
    size_t idx = step_index * trace->ncomp + component;
    if (activity) *activity = trace->activity[idx];
    if (retained) *retained = trace->retained[idx];
    return IGRAD_OK;
}

/* ---- writer --------------------------------------------------------------- */

typedef struct text_buf {
    char *data;
    size_t len, cap;
    int oom;
} text_buf_t;

static void buf_printf(text_buf_t *b, const char *fmt, ...) IGRAD__PRINTF(2, 3);
static void buf_printf(text_buf_t *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->data ? b->data + b->len : NULL, b->data ? b->cap - b->len : 0,
                          fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->data && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->len <= (size_t)n) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) {
            b->oom = 1;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
}

igrad_status_t igrad__trace_to_text(const igrad_trace_t *trace, char **text, size_t *nbytes)
{
    IGRAD_FAIL_IF(!trace || !text || !nbytes, IGRAD_E_INVALID, "trace: NULL argument");
    *text = NULL;
    *nbytes = 0;
    text_buf_t b = {0};
    buf_printf(&b, "# igrad-trace v2 layout_hash=0x%016llx sparsifier=%s density=%.9g\n",
               (unsigned long long)trace->layout_hash, trace->sparsifier, trace->density);
    buf_printf(&b, "%s\n", CSV_HEADER);
    for (size_t s = 0; s < trace->nsteps; s++) {
        for (size_t c = 0; c < trace->ncomp; c++) {
            size_t idx = s * trace->ncomp + c;
            char raw[40], d[40];
            igrad__format_exact_double(raw, sizeof raw, trace->raw[idx]);
            igrad__format_exact_double(d, sizeof d, trace->activity[idx]);
            buf_printf(&b, "%lld,%d,%s,%s,%s,%lld,%lld\n", (long long)trace->steps[s],
                       trace->comp_layer[c], igrad_kind_name(trace->comp_kind[c]), raw, d,
                       (long long)trace->comp_count[c], (long long)trace->retained[idx]);
        }
    }
    if (b.oom) {
        free(b.data);
        return igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__, "trace: out of memory writing CSV");
    }
    *text = b.data;
    *nbytes = b.len;
    return IGRAD_OK;
}

igrad_status_t igrad_trace_save(const igrad_trace_t *trace, const char *path)
{
    IGRAD_FAIL_IF(!trace || !path, IGRAD_E_INVALID, "igrad_trace_save: NULL argument");
    char *text = NULL;
    size_t nbytes = 0;
    IGRAD_CHECK(igrad__trace_to_text(trace, &text, &nbytes));
    igrad__atomic_file_t af;
    igrad_status_t st = igrad__atomic_open(&af, path);
    if (st == IGRAD_OK) {
        fwrite(text, 1, nbytes, af.fp);
        st = igrad__atomic_commit(&af);
    }
    free(text);
    return st;
}

/* ---- reader --------------------------------------------------------------- */

typedef struct row {
    int layer;
    igrad_kind_t kind;
    double activity, raw;
    int64_t numel, retained;
    size_t line;
} row_t;

typedef struct reader {
    const char *source;
    igrad_trace_t *t;
    trace_format_t format; /* known once the header is read */
    int meta_version;      /* 1 or 2 from "# igrad-trace vN", 0 without it */
    char *run[4];          /* reference files: seed, model, workload, dataset of row 1 */
    int have_rows;       /* a data row was read */
    int components_known; /* the first step is complete */
    int64_t step;        /* step of the rows being read */
    int64_t first_step;
    row_t *group;        /* rows of the first step, until it is complete */
    size_t ngroup, cap_group;
    size_t *seen;        /* (ncomp) 1 + index of the step row that last saw it */
    size_t rows_in_step; /* rows of the current (later) step */
    size_t last_line;
} reader_t;

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = '\0';
    return s;
}

static int parse_i64_field(const char *s, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end != '\0') return 0;
    *out = (int64_t)v;
    return 1;
}

static int parse_f64_field(const char *s, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    /* ERANGE on underflow still gives a usable (tiny) value; overflow gives
     * inf, which the callers reject as non-finite. */
    if (end == s || *end != '\0') return 0;
    *out = v;
    return 1;
}

static int row_cmp(const void *a, const void *b)
{
    const row_t *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
    return (x->line > y->line) - (x->line < y->line);
}

/* Index of (layer, kind) among the sorted components, or -1. */
static long find_component(const igrad_trace_t *t, int layer, igrad_kind_t kind)
{
    size_t lo = 0, hi = t->ncomp;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int ml = t->comp_layer[mid];
        igrad_kind_t mk = t->comp_kind[mid];
        if (ml == layer && mk == kind) return (long)mid;
        if (ml < layer || (ml == layer && mk < kind)) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

static const char *format_msg(const char *fmt, ...) IGRAD__PRINTF(1, 2);
static const char *format_msg(const char *fmt, ...)
{
    static _Thread_local char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return msg;
}

/* IGRAD_E_FORMAT with "source:LINE: message". */
#define FORMAT_FAIL(r, line, ...)                                                  \
    igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__, "%s:%zu: %s", (r)->source,     \
                (size_t)(line), format_msg(__VA_ARGS__))

/* The rows of the first step define the component set (sorted by layer,
 * then kind); every later step must list exactly that set, same numel. */
static igrad_status_t define_components(reader_t *r)
{
    igrad_trace_t *t = r->t;
    qsort(r->group, r->ngroup, sizeof *r->group, row_cmp);
    for (size_t i = 1; i < r->ngroup; i++) {
        const row_t *p = &r->group[i - 1], *q = &r->group[i];
        if (p->layer == q->layer && p->kind == q->kind) {
            return FORMAT_FAIL(r, q->line,
                               "duplicate row for step %lld, layer %d, component %s (first at "
                               "line %zu)",
                               (long long)r->step, q->layer, igrad_kind_name(q->kind), p->line);
        }
    }
    IGRAD_CHECK(alloc_components(t, r->ngroup));
    for (size_t i = 0; i < r->ngroup; i++) {
        t->comp_layer[i] = r->group[i].layer;
        t->comp_kind[i] = r->group[i].kind;
        t->comp_count[i] = r->group[i].numel;
    }
    r->seen = calloc(t->ncomp, sizeof *r->seen);
    IGRAD_FAIL_IF(!r->seen, IGRAD_E_NOMEM, "%s: out of memory", r->source);
    IGRAD_CHECK(append_step(t, r->step));
    for (size_t i = 0; i < r->ngroup; i++) {
        t->activity[i] = r->group[i].activity;
        t->raw[i] = r->group[i].raw;
        t->retained[i] = r->group[i].retained;
    }
    r->first_step = r->step;
    r->components_known = 1;
    return IGRAD_OK;
}

/* Called when the rows of r->step are over. */
static igrad_status_t finish_step(reader_t *r)
{
    igrad_trace_t *t = r->t;
    if (!r->components_known) return define_components(r);
    if (r->rows_in_step == t->ncomp) return IGRAD_OK;
    for (size_t c = 0; c < t->ncomp; c++) {
        if (r->seen[c] != t->nsteps) {
            return FORMAT_FAIL(r, r->last_line,
                               "step %lld has no row for layer %d component %s (every step "
                               "must list the same components)",
                               (long long)r->step, t->comp_layer[c],
                               igrad_kind_name(t->comp_kind[c]));
        }
    }
    return IGRAD_OK;
}

/* One validated row of a step after the first. */
static igrad_status_t store_row(reader_t *r, const row_t *w, int new_step)
{
    igrad_trace_t *t = r->t;
    long c = find_component(t, w->layer, w->kind);
    if (c < 0) {
        return FORMAT_FAIL(r, w->line,
                           "step %lld lists layer %d component %s, which step %lld does not "
                           "(every step must list the same components)",
                           (long long)r->step, w->layer, igrad_kind_name(w->kind),
                           (long long)r->first_step);
    }
    if (!new_step && r->seen[c] == t->nsteps) {
        return FORMAT_FAIL(r, w->line, "duplicate row for step %lld, layer %d, component %s",
                           (long long)r->step, w->layer, igrad_kind_name(w->kind));
    }
    if (w->numel != t->comp_count[c]) {
        return FORMAT_FAIL(r, w->line,
                           "layer %d component %s has numel %lld here but %lld at step %lld",
                           w->layer, igrad_kind_name(w->kind), (long long)w->numel,
                           (long long)t->comp_count[c], (long long)r->first_step);
    }
    if (new_step) {
        IGRAD_CHECK(append_step(t, r->step));
        r->rows_in_step = 0;
    }
    size_t idx = (t->nsteps - 1) * t->ncomp + (size_t)c;
    t->activity[idx] = w->activity;
    t->raw[idx] = w->raw;
    t->retained[idx] = w->retained;
    r->seen[c] = t->nsteps;
    r->rows_in_step++;
    return IGRAD_OK;
}

static int valid_sparsifier_token(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= sizeof(((igrad_trace_t *)0)->sparsifier)) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (!isalnum(ch) && ch != '_' && ch != '-' && ch != '.' && ch != ':') return 0;
    }
    return 1;
}

/* "# igrad-trace v1 layout_hash=0x... sparsifier=... density=..." (unknown
 * keys are ignored so later versions can add some). */
static igrad_status_t parse_meta(reader_t *r, char *line, size_t line_no)
{
    igrad_trace_t *t = r->t;
    char *save = NULL;
    char *tok = strtok_r(line, " \t", &save); /* "#" */
    tok = strtok_r(NULL, " \t", &save);       /* "igrad-trace" */
    tok = strtok_r(NULL, " \t", &save);
    if (!tok || (strcmp(tok, "v1") != 0 && strcmp(tok, "v2") != 0)) {
        return FORMAT_FAIL(r, line_no,
                           "unsupported trace version '%s' (this reader knows v1 and v2)",
                           tok ? tok : "");
    }
    r->meta_version = tok[1] - '0';
    while ((tok = strtok_r(NULL, " \t", &save)) != NULL) {
        char *eq = strchr(tok, '=');
        if (!eq) return FORMAT_FAIL(r, line_no, "'%s' in the trace comment is not key=value", tok);
        *eq = '\0';
        const char *key = tok, *val = eq + 1;
        if (!strcmp(key, "layout_hash")) {
            size_t n = strlen(val);
            int ok = n > 2 && n <= 18 && val[0] == '0' && (val[1] == 'x' || val[1] == 'X');
            for (size_t i = 2; ok && i < n; i++) ok = isxdigit((unsigned char)val[i]) != 0;
            if (!ok) return FORMAT_FAIL(r, line_no, "layout_hash '%s' is not 0x<hex>", val);
            t->layout_hash = (uint64_t)strtoull(val + 2, NULL, 16);
        } else if (!strcmp(key, "sparsifier")) {
            if (!valid_sparsifier_token(val)) {
                return FORMAT_FAIL(r, line_no, "sparsifier '%s' is not a valid name", val);
            }
            snprintf(t->sparsifier, sizeof t->sparsifier, "%s", val);
        } else if (!strcmp(key, "density")) {
            double d = 0;
            if (!parse_f64_field(val, &d) || !isfinite(d) || d < 0.0 || d > 1.0) {
                return FORMAT_FAIL(r, line_no, "density '%s' is not a number in [0, 1]", val);
            }
            t->density = d;
        }
    }
    return IGRAD_OK;
}

/* The reference method's columns; igrad's are the same names less 1..4. */
static const char *const FIELD_NAMES[REF_FIELDS] = {
    "step",      "seed",         "model_name", "workload_name", "dataset_name",  "layer",
    "component", "raw_activity", "d_activity", "numel",         "retained_numel"};
/* Where step, layer, component, raw_activity, d_activity, numel and
 * retained_numel sit: in igrad's 7 columns, in the reference's 11. */
static const int COLUMN[2][CSV_FIELDS] = {{0, 1, 2, 3, 4, 5, 6}, {0, 5, 6, 7, 8, 9, 10}};
static const int IGRAD_NAME[CSV_FIELDS] = {0, 5, 6, 7, 8, 9, 10}; /* into FIELD_NAMES */

/* The reference method's component names (its _COMPONENT_ORDER): its
 * parser writes Q K V QKV O FC1 FC2 (gate_proj and up_proj both into FC1,
 * down_proj into FC2); GATE, UP and DOWN are in its order table too and
 * mean igrad's FC1 and FC2. */
static const struct {
    const char *name;
    igrad_kind_t kind;
} REFERENCE_KINDS[] = {
    {"Q", IGRAD_KIND_Q},     {"K", IGRAD_KIND_K},       {"V", IGRAD_KIND_V},
    {"QKV", IGRAD_KIND_QKV}, {"O", IGRAD_KIND_O},       {"FC1", IGRAD_KIND_FC1},
    {"FC2", IGRAD_KIND_FC2}, {"GATE", IGRAD_KIND_FC1}, {"UP", IGRAD_KIND_FC1},
    {"DOWN", IGRAD_KIND_FC2},
};

static int reference_kind(const char *name, igrad_kind_t *kind)
{
    for (size_t i = 0; i < sizeof REFERENCE_KINDS / sizeof *REFERENCE_KINDS; i++) {
        if (!strcmp(name, REFERENCE_KINDS[i].name)) {
            *kind = REFERENCE_KINDS[i].kind;
            return 1;
        }
    }
    return 0;
}

/* Splits a line at commas into at most `max` stored fields. With `quotes`
 * (reference files come from Python's csv module, which quotes a field
 * holding a comma or a quote: "a ""b"",c") a field may be quoted; quotes
 * are removed in place. @return the number of fields (more than max means
 * too many), or 0 for an unterminated or stray quote. */
static size_t split_fields(char *line, char **field, size_t max, int quotes)
{
    size_t nf = 0;
    char *p = line;
    for (;;) {
        while (quotes && (*p == ' ' || *p == '\t')) p++;
        char *start = p;
        if (quotes && *p == '"') {
            char *w = p; /* the unquoted text overwrites the field */
            for (p++;; p++) {
                if (*p == '\0') return 0;
                if (*p == '"' && p[1] != '"') break;
                if (*p == '"') p++; /* "" stands for one quote */
                *w++ = *p;
            }
            for (p++; *p == ' ' || *p == '\t'; p++) continue;
            if (*p != ',' && *p != '\0') return 0;
            int more = *p == ',';
            *w = '\0';
            if (nf < max) field[nf] = start;
            nf++;
            if (!more) break;
            p++;
            continue;
        }
        char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (quotes && memchr(p, '"', len)) return 0;
        if (nf < max) field[nf] = start;
        nf++;
        if (!comma) break;
        *comma = '\0';
        p = comma + 1;
    }
    return nf;
}

/* A reference file holds one run: seed, model_name, workload_name and
 * dataset_name are those of its first row on every row. */
static igrad_status_t check_same_run(reader_t *r, char *const *field, size_t line_no)
{
    int64_t seed = 0;
    if (!parse_i64_field(field[1], &seed)) {
        return FORMAT_FAIL(r, line_no, "seed '%s' is not an integer", field[1]);
    }
    for (size_t i = 0; i < 4; i++) {
        if (!r->run[i]) {
            r->run[i] = igrad__strprintf("%s", field[1 + i]);
            IGRAD_FAIL_IF(!r->run[i], IGRAD_E_NOMEM, "%s: out of memory", r->source);
        } else if (strcmp(r->run[i], field[1 + i]) != 0) {
            return FORMAT_FAIL(r, line_no,
                               "%s '%.80s' differs from '%.80s' on the first row (a trace file "
                               "holds one run)",
                               FIELD_NAMES[1 + i], field[1 + i], r->run[i]);
        }
    }
    return IGRAD_OK;
}

static igrad_status_t parse_row(reader_t *r, char *line, size_t line_no)
{
    int ref = r->format == FORMAT_REFERENCE;
    size_t want = ref ? REF_FIELDS : CSV_FIELDS;
    const char *header = ref ? REF_HEADER : CSV_HEADER;
    char *all[MAX_FIELDS];
    size_t nf = split_fields(line, all, want, ref);
    if (nf == 0) return FORMAT_FAIL(r, line_no, "unterminated or stray '\"' in a field");
    if (nf != want) {
        return FORMAT_FAIL(r, line_no, "expected %zu fields (%s), found %zu", want, header, nf);
    }
    for (size_t i = 0; i < want; i++) {
        all[i] = trim(all[i]);
        if (all[i][0] == '\0') {
            return FORMAT_FAIL(r, line_no, "empty %s field",
                               FIELD_NAMES[ref ? i : (size_t)IGRAD_NAME[i]]);
        }
    }
    if (ref) IGRAD_CHECK(check_same_run(r, all, line_no));
    char *field[CSV_FIELDS];
    for (size_t i = 0; i < CSV_FIELDS; i++) field[i] = all[COLUMN[ref][i]];
    int64_t step = 0, layer = 0, numel = 0, retained = 0;
    double raw = 0, d = 0;
    if (!parse_i64_field(field[0], &step) || step < 0 || step >= IGRAD__MAX_EXACT_INT) {
        return FORMAT_FAIL(r, line_no, "step '%s' is not an integer in [0, 2^53)", field[0]);
    }
    if (!parse_i64_field(field[1], &layer) || layer < -1 || layer > INT_MAX) {
        return FORMAT_FAIL(r, line_no, "layer '%s' is not an integer >= -1", field[1]);
    }
    igrad_kind_t kind = IGRAD_KIND_OTHER;
    if (ref && !reference_kind(field[2], &kind)) {
        return FORMAT_FAIL(r, line_no,
                           "unknown component '%s' (the reference method's names: Q, K, V, "
                           "QKV, O, FC1, FC2, GATE, UP, DOWN)",
                           field[2]);
    }
    if (!ref && (igrad_kind_from_name(field[2], &kind) != IGRAD_OK || kind == IGRAD_KIND_OTHER)) {
        return FORMAT_FAIL(r, line_no,
                           "unknown component kind '%s' (Q, K, V, QKV, O, FC1, FC2, EMB, HEAD "
                           "or NORM)",
                           field[2]);
    }
    if (layer < 0 && !igrad__kind_is_outer(kind)) {
        return FORMAT_FAIL(r, line_no, "layer -1 is only for EMB, HEAD and NORM, not %s",
                           field[2]);
    }
    if (!parse_f64_field(field[3], &raw) || !isfinite(raw) || raw < 0.0) {
        return FORMAT_FAIL(r, line_no, "raw_activity '%s' is not a finite non-negative number",
                           field[3]);
    }
    if (!parse_f64_field(field[4], &d) || !isfinite(d)) {
        return FORMAT_FAIL(r, line_no, "d_activity '%s' is not a finite number", field[4]);
    }
    if (!parse_i64_field(field[5], &numel) || numel < 1 || numel > IGRAD__MAX_EXACT_INT) {
        return FORMAT_FAIL(r, line_no, "numel '%s' is not an integer in [1, 2^53]", field[5]);
    }
    if (!parse_i64_field(field[6], &retained) || retained < 0) {
        return FORMAT_FAIL(r, line_no, "retained_numel '%s' is not a non-negative integer",
                           field[6]);
    }
    if (retained > numel) {
        return FORMAT_FAIL(r, line_no, "retained_numel %lld is more than numel %lld",
                           (long long)retained, (long long)numel);
    }
    double activity = 0.0, raw_sum = 0.0; /* a[s,c] and sqrt(sum of retained v^2) */
    if (r->format == FORMAT_V1) {
        activity = raw;
        raw_sum = raw * sqrt((double)numel);
        if (!isfinite(raw_sum)) {
            return FORMAT_FAIL(r, line_no, "raw_activity '%s' times sqrt(numel %lld) is not finite",
                               field[3], (long long)numel);
        }
    } else {
        /* The check that keeps a file whose columns mean something else
         * (a v1 file under a v2 line, a raw column already divided by
         * sqrt(numel)) from being scored wrongly without an error. */
        double expect = raw / sqrt((double)numel);
        if (d < 0.0 || !(fabs(d - expect) <= D_ACTIVITY_RTOL * fmax(d, expect) + 1e-300)) {
            return FORMAT_FAIL(r, line_no,
                               "d_activity %s is not raw_activity / sqrt(numel) = %s / sqrt(%lld) "
                               "= %.9g (%s columns: raw_activity = sqrt(sum of retained v^2), "
                               "d_activity = raw_activity / sqrt(numel))",
                               field[4], field[3], (long long)numel, expect,
                               ref ? "the reference method's" : "v2");
        }
        activity = d;
        raw_sum = raw;
    }
    row_t w = {(int)layer, kind, activity, raw_sum, numel, retained, line_no};
    int new_step = !r->have_rows;
    if (r->have_rows && step != r->step) {
        if (step < r->step) {
            return FORMAT_FAIL(r, line_no, "step %lld after step %lld (steps must not decrease)",
                               (long long)step, (long long)r->step);
        }
        IGRAD_CHECK(finish_step(r));
        new_step = 1;
    }
    r->have_rows = 1;
    r->step = step;
    r->last_line = line_no;
    if (r->components_known) return store_row(r, &w, new_step);
    if (r->ngroup == r->cap_group) {
        size_t cap = r->cap_group ? 2 * r->cap_group : 64;
        row_t *g = realloc(r->group, cap * sizeof *g);
        IGRAD_FAIL_IF(!g, IGRAD_E_NOMEM, "%s: out of memory", r->source);
        r->group = g;
        r->cap_group = cap;
    }
    r->group[r->ngroup++] = w;
    return IGRAD_OK;
}

igrad_status_t igrad__trace_from_text(const char *text, size_t nbytes, const char *source,
                                      igrad_trace_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "trace: out is NULL");
    *out = NULL;
    IGRAD_FAIL_IF(!text && nbytes, IGRAD_E_INVALID, "trace: text is NULL");
    if (!source) source = "trace";
    IGRAD_FAIL_IF(nbytes && memchr(text, '\0', nbytes), IGRAD_E_FORMAT,
                  "%s: contains a NUL byte (not a text file)", source);
    igrad_status_t st = IGRAD_OK;
    reader_t r = {.source = source};
    char *buf = malloc(nbytes + 1);
    r.t = trace_alloc();
    IGRAD_FAIL_GOTO(!buf || !r.t, IGRAD_E_NOMEM, "%s: out of memory", source);
    if (nbytes) memcpy(buf, text, nbytes);
    buf[nbytes] = '\0';

    int header_seen = 0, meta_allowed = 1;
    size_t line_no = 0;
    char *p = buf, *end = buf + nbytes;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *next = nl ? nl + 1 : end;
        if (nl) *nl = '\0';
        line_no++;
        size_t len = strlen(p);
        if (len && p[len - 1] == '\r') p[--len] = '\0';
        char *line = trim(p);
        p = next;
        if (line[0] == '\0') continue;
        if (line[0] == '#') {
            if (meta_allowed && !strncmp(line, "# igrad-trace", 13) &&
                (line[13] == '\0' || line[13] == ' ' || line[13] == '\t')) {
                IGRAD_CHECK_GOTO(parse_meta(&r, line, line_no));
            }
            meta_allowed = 0;
            continue;
        }
        meta_allowed = 0;
        if (!header_seen) {
            if (!strcmp(line, CSV_HEADER)) {
                r.format = r.meta_version == 2 ? FORMAT_V2 : FORMAT_V1;
            } else if (!strcmp(line, REF_HEADER)) {
                IGRAD_FAIL_GOTO(r.meta_version != 0, IGRAD_E_FORMAT,
                                "%s:%zu: the reference method's header after a '# igrad-trace "
                                "v%d' line (its files have no such line)",
                                source, line_no, r.meta_version);
                r.format = FORMAT_REFERENCE;
            } else {
                st = FORMAT_FAIL(&r, line_no,
                                 "expected the header '%s' (or the reference method's '%s'), "
                                 "found '%.80s'",
                                 CSV_HEADER, REF_HEADER, line);
                goto cleanup;
            }
            header_seen = 1;
            continue;
        }
        IGRAD_CHECK_GOTO(parse_row(&r, line, line_no));
    }
    IGRAD_FAIL_GOTO(!header_seen, IGRAD_E_FORMAT, "%s: no header line (expected '%s')", source,
                    CSV_HEADER);
    /* igrad's own traces have rows only for tensors that map to a
     * component: a model whose names all map to none (a custom model, PEFT
     * adapters the rules do not know) saves a header and nothing else. */
    const char *hint = r.format == FORMAT_REFERENCE ? "" : IGRAD__TRACE_NO_ROWS_HINT;
    IGRAD_FAIL_GOTO(!r.have_rows, IGRAD_E_FORMAT, "%s: no data rows after the header%s", source,
                    hint);
    IGRAD_CHECK_GOTO(finish_step(&r));
    IGRAD_FAIL_GOTO(r.t->nsteps == 0, IGRAD_E_FORMAT, "%s: no data rows after the header%s",
                    source, hint);
    *out = r.t;
    r.t = NULL;
cleanup:
    igrad_trace_free(r.t);
    free(r.group);
    free(r.seen);
    for (size_t i = 0; i < 4; i++) free(r.run[i]);
    free(buf);
    return st;
}

igrad_status_t igrad_trace_load(const char *path, igrad_trace_t **out)
{
    IGRAD_FAIL_IF(!out || !path, IGRAD_E_INVALID, "igrad_trace_load: NULL argument");
    *out = NULL;
    char *text = NULL;
    size_t nbytes = 0;
    IGRAD_CHECK(igrad__read_file(path, IGRAD__TRACE_MAX_NBYTES, &text, &nbytes));
    igrad_status_t st = igrad__trace_from_text(text, nbytes, path, out);
    free(text);
    return st;
}
