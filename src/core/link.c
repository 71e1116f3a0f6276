/*
 * link.c — the named links (per GPU, one direction) that `igrad plan`
 * prices and that `collective = auto` can be given (config.link_*): the one
 * preset table, parsing "NAME" or "GBITS,LAT_US", and the rounding of a
 * link to the config's integers. The figures are assumptions, each named
 * with what it assumes (docs/plan.md §1); the time model itself is the
 * CLI's (tools/plan_cost.c) and the engine's (route.c).
 */
#include "core/internal.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* What a parsed link may be: what the config's integers hold exactly
 * (link_bandwidth_mbps in [1, 1e9], link_latency_ns in [1, 1e9]). */
#define IGRAD__LINK_MIN_GBITS 0.001
#define IGRAD__LINK_MAX_GBITS 1e6
#define IGRAD__LINK_MIN_LAT_US 0.001
#define IGRAD__LINK_MAX_LAT_US 1e6

static const igrad_link_preset_t presets[] = {
    {"nvlink", 3600.0, 3.0, "H100 SXM NVLink 4: 450 GB/s per direction per GPU"},
    {"pcie4", 200.0, 5.0, "PCIe 4.0 x16: 25 GB/s usable of 32 GB/s"},
    {"400g", 400.0, 5.0, "one 400 Gbit/s NIC per GPU (NDR InfiniBand, DGX H100)"},
    {"200g", 200.0, 5.0, "one 200 Gbit/s NIC per GPU (HDR InfiniBand)"},
    {"100g", 100.0, 8.0, "100 Gbit/s per GPU (EDR InfiniBand / RoCE)"},
    {"25g", 25.0, 15.0, "25 Gbit/s Ethernet per GPU (TCP)"},
    {"10g", 10.0, 25.0, "10 Gbit/s Ethernet per GPU (TCP)"},
};
#define NPRESETS (sizeof presets / sizeof presets[0])

size_t igrad_link_preset_count(void) { return NPRESETS; }

const igrad_link_preset_t *igrad_link_preset(size_t i) { return i < NPRESETS ? &presets[i] : NULL; }

/* A plain decimal number at s ("100", "2.5", "1e3"; no sign, hex, inf or
 * nan): its end, or NULL when s holds none. */
static const char *decimal_end(const char *s)
{
    const char *c = s;
    int digits = 0;
    while (isdigit((unsigned char)*c)) c++, digits++;
    if (*c == '.')
        for (c++; isdigit((unsigned char)*c); c++) digits++;
    if (!digits) return NULL;
    if (*c == 'e' || *c == 'E') {
        const char *e = c + 1;
        if (*e == '+' || *e == '-') e++;
        if (!isdigit((unsigned char)*e)) return NULL;
        while (isdigit((unsigned char)*e)) e++;
        c = e;
    }
    return c;
}

igrad_status_t igrad_link_parse(const char *spec, double *gbit_per_s, double *latency_us)
{
    IGRAD_FAIL_IF(!spec || !gbit_per_s || !latency_us, IGRAD_E_INVALID,
                  "igrad_link_parse: NULL argument");
    for (size_t i = 0; i < NPRESETS; i++)
        if (!strcmp(spec, presets[i].name)) {
            *gbit_per_s = presets[i].gbit_per_s;
            *latency_us = presets[i].latency_us;
            return IGRAD_OK;
        }
    const char *comma = decimal_end(spec), *end = NULL;
    double bw = -1.0, lat = -1.0;
    if (comma && *comma == ',' && (end = decimal_end(comma + 1)) != NULL && *end == '\0') {
        bw = strtod(spec, NULL);
        lat = strtod(comma + 1, NULL);
    }
    IGRAD_FAIL_IF(bw < 0.0, IGRAD_E_INVALID,
                  "'%s' is neither a preset (nvlink, pcie4, 400g, 200g, 100g, 25g, 10g) nor "
                  "GBITS,LAT_US in decimals (e.g. 100,8)",
                  spec);
    /* The config's integers (igrad_link_to_config) hold 1 Mbit/s to
     * 1 Pbit/s and 1 ns to 1 s: a link outside is refused, not clamped. */
    IGRAD_FAIL_IF(!(bw >= IGRAD__LINK_MIN_GBITS && bw <= IGRAD__LINK_MAX_GBITS), IGRAD_E_INVALID,
                  "'%s': bandwidth %g Gbit/s is outside [%g, %g]", spec, bw,
                  IGRAD__LINK_MIN_GBITS, IGRAD__LINK_MAX_GBITS);
    IGRAD_FAIL_IF(!(lat >= IGRAD__LINK_MIN_LAT_US && lat <= IGRAD__LINK_MAX_LAT_US),
                  IGRAD_E_INVALID, "'%s': latency %g us is outside [%g, %g]", spec, lat,
                  IGRAD__LINK_MIN_LAT_US, IGRAD__LINK_MAX_LAT_US);
    *gbit_per_s = bw;
    *latency_us = lat;
    return IGRAD_OK;
}

void igrad_link_to_config(double gbit_per_s, double latency_us, int64_t *latency_ns,
                          int64_t *bandwidth_mbps)
{
    double ns = latency_us * 1e3, mbps = gbit_per_s * 1e3;
    *latency_ns = !(ns > 0.0) ? 0 : ns >= 1e9 ? 1000000000LL : (int64_t)llround(ns);
    *bandwidth_mbps = !(mbps >= 1.0) ? 1 : mbps >= 1e9 ? 1000000000LL : (int64_t)llround(mbps);
}
