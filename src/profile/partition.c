/*
 * partition.c — the threshold tau that splits component scores into
 * important (score >= tau) and low-importance: knee, otsu, kmeans2, gmm2,
 * percentile:P and fixed:F (DESIGN.md §3), plus the parser of method
 * strings. Pure functions on arrays of doubles; scores come from profile.c,
 * which owns everything about traces and profile files.
 *
 * Every method returns a tau that is either one of the scores (knee, otsu,
 * kmeans2, fixed) or a point between them (gmm2, percentile), so the
 * comparison score >= tau is exact for the former. When all scores are equal
 * (or there is one), every method returns that value: all are important.
 */
#include "profile/profile_internal.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define OTSU_BINS 256
#define GMM_MAX_ITER 1000
#define GMM_TOL 1e-10
#define LOG_2PI 1.8378770664093454836

/* Parses the whole of `text` as a finite double. */
static int parse_param(const char *text, double *out)
{
    char *end = NULL;
    if (*text == '\0') return 0;
    double v = strtod(text, &end);
    if (end == text || *end != '\0' || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

igrad_status_t igrad__partition_parse(const char *method, igrad__partition_method_t *out)
{
    IGRAD_FAIL_IF(!method || !out, IGRAD_E_INVALID, "partition method: NULL argument");
    memset(out, 0, sizeof *out);
    static const struct {
        const char *name;
        igrad__partition_kind_t kind;
    } plain[] = {{"knee", IGRAD__PARTITION_KNEE},
                 {"otsu", IGRAD__PARTITION_OTSU},
                 {"kmeans2", IGRAD__PARTITION_KMEANS2},
                 {"gmm2", IGRAD__PARTITION_GMM2}};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        if (!strcmp(method, plain[i].name)) {
            out->kind = plain[i].kind;
            return IGRAD_OK;
        }
    }
    if (!strncmp(method, "percentile:", 11)) {
        double p = 0;
        IGRAD_FAIL_IF(!parse_param(method + 11, &p) || p < 0.0 || p > 100.0, IGRAD_E_INVALID,
                      "partition method '%s': P must be a number in [0, 100]", method);
        out->kind = IGRAD__PARTITION_PERCENTILE;
        out->param = p;
        return IGRAD_OK;
    }
    if (!strncmp(method, "fixed:", 6)) {
        double f = 0;
        IGRAD_FAIL_IF(!parse_param(method + 6, &f) || !(f > 0.0) || f > 1.0, IGRAD_E_INVALID,
                      "partition method '%s': F must be a fraction in (0, 1]", method);
        out->kind = IGRAD__PARTITION_FIXED;
        out->param = f;
        return IGRAD_OK;
    }
    return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                       "unknown partition method '%s' (knee, otsu, kmeans2, gmm2, "
                       "percentile:P, fixed:F)",
                       method);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* x ascending, n >= 2, x[0] < x[n-1]. The curve is walked in descending
 * order (index i of the descending list is x[n-1-i]). The chord from
 * (0, 1) to (1, 0) is the line u + v = 1, so the perpendicular distance of
 * (u, v) is |u + v - 1| / sqrt(2); the constant factor does not change the
 * arg max. */
static double knee(const double *x, size_t n)
{
    double lo = x[0], range = x[n - 1] - x[0];
    double best = -1.0, tau = x[n - 1];
    for (size_t i = 0; i < n; i++) {
        double s = x[n - 1 - i];
        double u = (double)i / (double)(n - 1);
        double v = (s - lo) / range;
        double d = fabs(u + v - 1.0);
        if (d > best) { /* strict: ties keep the first (higher) point */
            best = d;
            tau = s;
        }
    }
    return tau;
}

/* Classic Otsu on a 256-bin histogram of [min, max], with the bin index as
 * the grey level: the boundary t (class 0 = bins < t) maximises the
 * between-class variance n0*n1*(mu0 - mu1)^2 (ties: the lowest t). tau is
 * the smallest score in a bin >= t. Unlike kmeans2 it sees the scores only
 * through their bins, so two scores in one bin can never be separated. */
static double otsu(const double *x, size_t n)
{
    double lo = x[0], range = x[n - 1] - x[0];
    size_t count[OTSU_BINS] = {0};
    int *bin = malloc(n * sizeof *bin);
    if (!bin) return NAN;
    for (size_t i = 0; i < n; i++) {
        double f = (x[i] - lo) / range * OTSU_BINS;
        int b = f >= OTSU_BINS ? OTSU_BINS - 1 : (int)f;
        if (b < 0) b = 0;
        bin[i] = b;
        count[b]++;
    }
    double total_sum = 0;
    for (int b = 0; b < OTSU_BINS; b++) total_sum += (double)b * (double)count[b];
    size_t n0 = 0;
    double sum0 = 0, best = -1.0;
    int best_t = 1;
    for (int t = 1; t < OTSU_BINS; t++) {
        n0 += count[t - 1];
        sum0 += (double)(t - 1) * (double)count[t - 1];
        size_t n1 = n - n0;
        if (n0 == 0 || n1 == 0) continue;
        double mu0 = sum0 / (double)n0, mu1 = (total_sum - sum0) / (double)n1;
        double between = (double)n0 * (double)n1 * (mu0 - mu1) * (mu0 - mu1);
        if (between > best) {
            best = between;
            best_t = t;
        }
    }
    double tau = x[n - 1];
    for (size_t i = 0; i < n; i++) {
        if (bin[i] >= best_t) { /* x ascending: the first one is the smallest */
            tau = x[i];
            break;
        }
    }
    free(bin);
    return tau;
}

/* Exact 1-D two-means: over the splits "first k | rest" of the sorted
 * scores, the one of minimum total within-cluster SSE, from prefix sums of
 * the centred values (centring keeps S2 - S1^2/k from cancelling). A split
 * between two equal scores is skipped: score >= tau could not honour it.
 * Ties: the smallest k. tau = x[k]. */
static double kmeans2(const double *x, size_t n)
{
    double mean = 0;
    for (size_t i = 0; i < n; i++) mean += x[i];
    mean /= (double)n;
    double s1n = 0, s2n = 0;
    for (size_t i = 0; i < n; i++) {
        double c = x[i] - mean;
        s1n += c;
        s2n += c * c;
    }
    double s1 = 0, s2 = 0, best = INFINITY, tau = x[n - 1];
    for (size_t k = 1; k < n; k++) {
        double c = x[k - 1] - mean;
        s1 += c;
        s2 += c * c;
        if (!(x[k - 1] < x[k])) continue;
        double lower = s2 - s1 * s1 / (double)k;
        double upper = (s2n - s2) - (s1n - s1) * (s1n - s1) / (double)(n - k);
        double sse = lower + upper;
        if (sse < best) {
            best = sse;
            tau = x[k];
        }
    }
    return tau;
}

/* Linear-interpolation percentile of ascending x (numpy's default). */
static double percentile(const double *x, size_t n, double p)
{
    double r = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(r);
    if (lo >= n - 1) return x[n - 1];
    double frac = r - (double)lo;
    return x[lo] + frac * (x[lo + 1] - x[lo]);
}

/* The top F fraction: m = max(1, ceil(F*n)) components, tau = the m-th
 * largest. F*n is computed in binary floating point (0.07*100 is
 * 7.000000000000001), so a relative slack of 1e-9 keeps ceil() from
 * adding a component for such rounding noise. */
static double fixed_fraction(const double *x, size_t n, double f)
{
    double fn = f * (double)n;
    double m = ceil(fn - 1e-9 * fn);
    if (m < 1) m = 1;
    if (m > (double)n) m = (double)n;
    return x[n - (size_t)m];
}

/* log of w * N(x; mean, var) */
static double log_weighted_normal(double x, double mean, double var, double w)
{
    double d = x - mean;
    return log(w) - 0.5 * (LOG_2PI + log(var)) - d * d / (2.0 * var);
}

igrad_status_t igrad__gmm2_fit(const double *x, size_t n, igrad__gmm2_fit_t *fit)
{
    IGRAD_FAIL_IF(!x || !fit || n < 2, IGRAD_E_INVALID, "gmm2: needs at least 2 values");
    double *sorted = malloc(n * sizeof *sorted);
    double *resp = malloc(n * sizeof *resp); /* posterior of component 1 */
    if (!sorted || !resp) {
        free(sorted);
        free(resp);
        return igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__, "gmm2: out of memory");
    }
    memcpy(sorted, x, n * sizeof *x);
    qsort(sorted, n, sizeof *sorted, cmp_double);
    double lo = sorted[0], hi = sorted[n - 1];
    if (!(hi > lo)) {
        free(sorted);
        free(resp);
        return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                           "gmm2: all values are equal, nothing to fit");
    }
    /* Deterministic start: means at the quartiles (the extremes if those
     * coincide), both variances the overall variance, equal weights. */
    double m0 = percentile(sorted, n, 25.0), m1 = percentile(sorted, n, 75.0);
    if (!(m1 > m0)) {
        m0 = lo;
        m1 = hi;
    }
    double mean = 0, var = 0;
    for (size_t i = 0; i < n; i++) mean += x[i];
    mean /= (double)n;
    for (size_t i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= (double)n;
    /* A tight cluster would drive its variance to 0 and the likelihood to
     * infinity; the floor keeps the fit finite and the boundary defined. */
    double floor_var = (1e-3 * (hi - lo)) * (1e-3 * (hi - lo));
    if (floor_var < DBL_MIN) floor_var = DBL_MIN;
    if (var < floor_var) var = floor_var;
    double mu[2] = {m0, m1}, v[2] = {var, var}, w[2] = {0.5, 0.5};
    double prev_ll = -INFINITY;
    int it = 0;
    for (it = 1; it <= GMM_MAX_ITER; it++) {
        double ll = 0;
        for (size_t i = 0; i < n; i++) {
            double l0 = log_weighted_normal(x[i], mu[0], v[0], w[0]);
            double l1 = log_weighted_normal(x[i], mu[1], v[1], w[1]);
            double big = l0 > l1 ? l0 : l1;
            resp[i] = 1.0 / (1.0 + exp(l0 - l1));
            ll += big + log1p(exp(-fabs(l0 - l1)));
        }
        double nk[2] = {0, 0}, sx[2] = {0, 0};
        for (size_t i = 0; i < n; i++) {
            nk[1] += resp[i];
            nk[0] += 1.0 - resp[i];
            sx[1] += resp[i] * x[i];
            sx[0] += (1.0 - resp[i]) * x[i];
        }
        /* A component that lost all its mass cannot be re-estimated; the
         * previous parameters are the fit. */
        if (!(nk[0] > 1e-12 * (double)n) || !(nk[1] > 1e-12 * (double)n)) break;
        double nmu[2] = {sx[0] / nk[0], sx[1] / nk[1]};
        double sv[2] = {0, 0};
        for (size_t i = 0; i < n; i++) {
            double d0 = x[i] - nmu[0], d1 = x[i] - nmu[1];
            sv[0] += (1.0 - resp[i]) * d0 * d0;
            sv[1] += resp[i] * d1 * d1;
        }
        for (int k = 0; k < 2; k++) {
            mu[k] = nmu[k];
            v[k] = sv[k] / nk[k];
            if (v[k] < floor_var) v[k] = floor_var;
            w[k] = nk[k] / (double)n;
        }
        if (fabs(ll - prev_ll) <= GMM_TOL * (1.0 + fabs(ll))) break;
        prev_ll = ll;
    }
    int a = mu[0] <= mu[1] ? 0 : 1, b = 1 - a;
    fit->mean[0] = mu[a];
    fit->mean[1] = mu[b];
    fit->var[0] = v[a];
    fit->var[1] = v[b];
    fit->weight[0] = w[a];
    fit->weight[1] = w[b];
    fit->iterations = it > GMM_MAX_ITER ? GMM_MAX_ITER : it;
    free(sorted);
    free(resp);
    return IGRAD_OK;
}

/* The point between the two means where w0 N(x; m0, v0) = w1 N(x; m1, v1).
 * In u = x - m0 and d = m1 - m0 the log-ratio is the quadratic
 *   a u^2 + b u + c = 0,  a = 1/(2 v1) - 1/(2 v0),  b = -d / v1,
 *   c = d^2 / (2 v1) + log(w0 / w1) + log(v1 / v0) / 2,
 * which stays well conditioned when the variances are tiny. If no root lies
 * in [m0, m1] (one component dominates everywhere), the midpoint of the
 * means is used. */
static double gmm2_boundary(const igrad__gmm2_fit_t *f)
{
    double m0 = f->mean[0], m1 = f->mean[1], v0 = f->var[0], v1 = f->var[1];
    double d = m1 - m0, mid = 0.5 * (m0 + m1);
    if (!(d > 0)) return mid;
    double a = 0.5 / v1 - 0.5 / v0, b = -d / v1;
    double c = 0.5 * d * d / v1 + log(f->weight[0] / f->weight[1]) + 0.5 * log(v1 / v0);
    double roots[2];
    int nroots = 0;
    if (fabs(a) <= 1e-12 * (0.5 / v1 + 0.5 / v0)) {
        roots[nroots++] = -c / b;
    } else {
        double disc = b * b - 4.0 * a * c;
        if (disc >= 0) {
            /* Stable pair of roots: q / a and c / q. */
            double q = -0.5 * (b + (b >= 0 ? 1.0 : -1.0) * sqrt(disc));
            roots[nroots++] = q / a;
            if (q != 0) roots[nroots++] = c / q;
        }
    }
    double best = mid;
    double best_dist = INFINITY;
    for (int i = 0; i < nroots; i++) {
        double xr = m0 + roots[i];
        if (!(xr >= m0 && xr <= m1)) continue;
        double dist = fabs(xr - mid);
        if (dist < best_dist) {
            best_dist = dist;
            best = xr;
        }
    }
    return best;
}

igrad_status_t igrad_partition(const double *scores, size_t n, const char *method, double *tau)
{
    IGRAD_FAIL_IF(!tau, IGRAD_E_INVALID, "igrad_partition: tau is NULL");
    igrad__partition_method_t pm;
    IGRAD_CHECK(igrad__partition_parse(method, &pm));
    IGRAD_FAIL_IF(!scores || n == 0, IGRAD_E_INVALID,
                  "partition '%s': no scores to split", method);
    for (size_t i = 0; i < n; i++) {
        IGRAD_FAIL_IF(!isfinite(scores[i]), IGRAD_E_INVALID,
                      "partition '%s': score %zu is not finite (%g)", method, i, scores[i]);
    }
    double *x = malloc(n * sizeof *x);
    IGRAD_FAIL_IF(!x, IGRAD_E_NOMEM, "partition: out of memory for %zu scores", n);
    memcpy(x, scores, n * sizeof *x);
    qsort(x, n, sizeof *x, cmp_double);
    igrad_status_t st = IGRAD_OK;
    double t = x[0];
    if (x[n - 1] > x[0]) {
        switch (pm.kind) {
        case IGRAD__PARTITION_KNEE: t = knee(x, n); break;
        case IGRAD__PARTITION_OTSU: t = otsu(x, n); break;
        case IGRAD__PARTITION_KMEANS2: t = kmeans2(x, n); break;
        case IGRAD__PARTITION_PERCENTILE: t = percentile(x, n, pm.param); break;
        case IGRAD__PARTITION_FIXED: t = fixed_fraction(x, n, pm.param); break;
        case IGRAD__PARTITION_GMM2: {
            igrad__gmm2_fit_t fit;
            st = igrad__gmm2_fit(x, n, &fit);
            if (st == IGRAD_OK) t = gmm2_boundary(&fit);
            break;
        }
        }
        if (st == IGRAD_OK && isnan(t)) {
            st = igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__,
                             "partition '%s': out of memory", method);
        }
        if (t < x[0]) t = x[0];
        if (t > x[n - 1]) t = x[n - 1];
    }
    free(x);
    if (st == IGRAD_OK) *tau = t;
    return st;
}
