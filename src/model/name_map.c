/*
 * name_map.c — user rules for parameter names (igrad_name_map_t): an
 * ordered list of (pattern -> kind, how the layer is found), tried before
 * the built-in rules of component.c; the map-file reader (docs/formats.md
 * §1a); the report of tensors inside numbered blocks that map to no
 * component. Patterns are POSIX extended regular expressions matched
 * against the whole name (with \d accepted for [0-9]), or fnmatch globs
 * with a "glob:" prefix. How a layout uses a map (set before tensors are
 * added, folded into its hash) is in layout.c.
 */
#define _POSIX_C_SOURCE 200809L
#include "core/internal.h"
#include "model/layout_internal.h"

#include <ctype.h>
#include <fnmatch.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Capture groups a rule may take its layer from (1..9). */
#define MAX_GROUP 9

/* Bounds on a rule's pattern, so that a map file cannot make regcomp or
 * matching take unbounded memory or time (both found by `make fuzz`):
 * regcomp copies an interval's atom once per count ("a{3}" is "aaa") and
 * nested intervals multiply ("((a{99}){99}){99}" is a million nodes,
 * gigabytes), so a regex's length times the product of all its interval
 * counts stays within MAX_PATTERN_WEIGHT; glibc's matcher is exponential in
 * unbounded repetition of what already repeats (".**...*", "(.?)*(.?)*..."
 * take seconds to hours), so '*', '+' and "{m,}" may not apply to an atom
 * that holds a repetition ('?' and "{m,n}" may: they are copies, weighed);
 * back-references (exponential too) are refused; a glob has at most
 * MAX_GLOB_STARS '*' (fnmatch backtracks per star). Names need none of
 * these: "layers\.(\d{1,3})\." weighs 3 x its length. */
#define MAX_PATTERN_LEN 512
#define MAX_PATTERN_WEIGHT 8192
#define MAX_GLOB_STARS 4
/* Bounds on a whole map (docs/formats.md §3a): every tensor is matched
 * against the rules in order, so the time of a layout is tensors x the
 * rules' summed weight; the sum stays within MAX_MAP_COST and the count
 * within MAX_MAP_RULES (a family needs a few dozen rules). */
#define MAX_MAP_RULES 256
#define MAX_MAP_COST 16384UL

typedef struct rule {
    char *pattern; /* as given (with "glob:" for globs) */
    int is_glob;
    regex_t re; /* "^(" + pattern + ")$": the user's group g is group g + 1 */
    igrad_kind_t kind;
    int layer; /* IGRAD_NAME_LAYER_BLOCK, IGRAD_NAME_LAYER_NONE or a group */
} rule_t;

struct igrad_name_map {
    rule_t *rules;
    size_t count, cap;
    unsigned long cost; /* the rules' weights summed (at most MAX_MAP_COST) */
};

igrad_status_t igrad_name_map_create(igrad_name_map_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_name_map_create: NULL out");
    *out = calloc(1, sizeof **out);
    IGRAD_FAIL_IF(!*out, IGRAD_E_NOMEM, "name map: out of memory");
    return IGRAD_OK;
}

void igrad_name_map_free(igrad_name_map_t *map)
{
    if (!map) return;
    for (size_t i = 0; i < map->count; i++) {
        if (!map->rules[i].is_glob) regfree(&map->rules[i].re);
        free(map->rules[i].pattern);
    }
    free(map->rules);
    free(map);
}

size_t igrad_name_map_count(const igrad_name_map_t *map) { return map ? map->count : 0; }

/* "\d" (Python's digit class, which POSIX lacks) -> "[0-9]" outside
 * bracket expressions; everything else is left to regcomp. */
static char *posix_pattern(const char *pattern)
{
    size_t n = strlen(pattern);
    char *out = malloc(5 * n + 7);
    if (!out) return NULL;
    char *p = out;
    p += sprintf(p, "^(");
    int in_bracket = 0;
    for (size_t i = 0; i < n; i++) {
        char c = pattern[i];
        if (!in_bracket && c == '\\' && pattern[i + 1] == 'd') {
            p += sprintf(p, "[0-9]");
            i++;
        } else if (!in_bracket && c == '\\' && pattern[i + 1] != '\0') {
            *p++ = c;
            *p++ = pattern[++i];
        } else {
            if (!in_bracket && c == '[') {
                in_bracket = 1;
                *p++ = c;
                /* "[]...]" and "[^]...]": a leading ']' is a member. */
                if (pattern[i + 1] == '^') *p++ = pattern[++i];
                if (pattern[i + 1] == ']') *p++ = pattern[++i];
                continue;
            }
            if (in_bracket && c == ']') in_bracket = 0;
            *p++ = c;
        }
    }
    sprintf(p, ")$");
    return out;
}

/* Why a pattern is refused by the bounds above, or NULL. */
static const char *pattern_refusal(const char *pattern, int is_glob, unsigned long *cost)
{
    *cost = strlen(pattern);
    if (strlen(pattern) > MAX_PATTERN_LEN) return "longer than 512 characters";
    if (is_glob) {
        int stars = 0;
        for (const char *c = pattern; *c; c++) stars += *c == '*';
        *cost *= (unsigned long)stars + 1;
        return stars > MAX_GLOB_STARS ? "a glob with more than 4 '*'" : NULL;
    }
    /* group_rep[d] / group_opt[d]: the open group at depth d holds a
     * repetition / an optional part ('?', '*', "{m,n}" with m < n, '|');
     * atom_rep / atom_opt: the same for the last atom; depth is bounded by
     * the length. */
    unsigned char group_rep[MAX_PATTERN_LEN + 2] = {0};
    unsigned char group_opt[MAX_PATTERN_LEN + 2] = {0};
    size_t depth = 0;
    int atom_rep = 0, atom_opt = 0;
    unsigned long weight = strlen(pattern);
    for (const char *c = pattern; *c; c++) {
        if (*c == '\\' && c[1] != '\0') {
            if (isdigit((unsigned char)c[1]) && c[1] != '0') return "a back-reference";
            c++;
            atom_rep = atom_opt = 0;
        } else if (*c == '[') {
            /* a bracket expression is one atom: skip to its ']' */
            c++;
            if (*c == '^') c++;
            if (*c == ']') c++;
            while (*c && *c != ']') c++;
            if (!*c) break;
            atom_rep = atom_opt = 0;
        } else if (*c == '(') {
            depth++;
            group_rep[depth] = group_opt[depth] = 0;
            atom_rep = atom_opt = 0;
        } else if (*c == ')' && depth > 0) {
            atom_rep = group_rep[depth];
            atom_opt = group_opt[depth];
            depth--;
            group_rep[depth] |= (unsigned char)atom_rep;
            group_opt[depth] |= (unsigned char)atom_opt;
        } else if (*c == '|') {
            group_opt[depth] = 1;
            atom_rep = atom_opt = 0;
        } else if (*c == '*' || *c == '+' || *c == '?' || *c == '{') {
            int unbounded = *c == '*' || *c == '+';
            int optional = *c != '+';
            if (*c == '{') {
                /* "{m}", "{m,}", "{m,n}": counts max(m, n, 1), saturated.
                 * An optional part repeated this way is weighed count^2:
                 * each copy may match or not, and glibc's matcher tracks
                 * every way the copies can split the text. */
                unsigned long count = 1, num = 0, first = 0;
                int nums = 0, comma = 0;
                for (c++; *c && *c != '}'; c++) {
                    unbounded = *c == ',' && c[1] == '}';
                    if (*c == ',') comma = 1;
                    if (!isdigit((unsigned char)*c)) {
                        num = 0;
                        continue;
                    }
                    if (num <= MAX_PATTERN_WEIGHT) num = 10 * num + (unsigned long)(*c - '0');
                    if (!comma) first = num, nums = 1;
                    if (num > count) count = num;
                }
                optional = comma && (!nums || first < count || unbounded);
                unsigned long factor = atom_opt ? count * count : count;
                if (count > MAX_PATTERN_WEIGHT || factor > MAX_PATTERN_WEIGHT ||
                    weight * factor > MAX_PATTERN_WEIGHT)
                    return atom_opt
                               ? "an optional part repeated by an interval {m,n} weighs "
                                 "length x count^2, over 8192 (glibc's matcher tries every "
                                 "way the copies can match)"
                               : "interval counts {m,n} too large (length x product of "
                                 "counts over 8192; regcomp copies the pattern that many "
                                 "times)";
                weight *= factor;
            }
            if (unbounded && atom_rep)
                return "nested repetition (a '*', '+' or '{m,}' applied to what already "
                       "repeats; glibc's matcher is exponential in it)";
            if (!*c) break;
            atom_rep = 1;
            atom_opt |= optional;
            group_rep[depth] = 1;
            group_opt[depth] |= (unsigned char)atom_opt;
        } else {
            atom_rep = atom_opt = 0;
        }
    }
    *cost = weight;
    return NULL;
}

static int kind_is_projection(igrad_kind_t kind)
{
    return kind != IGRAD_KIND_OTHER && !igrad__kind_is_outer(kind);
}

igrad_status_t igrad_name_map_add(igrad_name_map_t *map, const char *pattern, igrad_kind_t kind,
                                  int layer)
{
    IGRAD_FAIL_IF(!map || !pattern, IGRAD_E_INVALID, "igrad_name_map_add: NULL argument");
    IGRAD_FAIL_IF((int)kind < 0 || kind >= IGRAD_KIND_COUNT, IGRAD_E_INVALID,
                  "name map: rule '%s': invalid kind %d", pattern, (int)kind);
    IGRAD_FAIL_IF(layer != IGRAD_NAME_LAYER_BLOCK && layer != IGRAD_NAME_LAYER_NONE &&
                      (layer < 1 || layer > MAX_GROUP),
                  IGRAD_E_INVALID,
                  "name map: rule '%s': layer %d (expected block, none or a capture group "
                  "1..%d)",
                  pattern, layer, MAX_GROUP);
    IGRAD_FAIL_IF(kind_is_projection(kind) && layer == IGRAD_NAME_LAYER_NONE, IGRAD_E_INVALID,
                  "name map: rule '%s': kind %s needs a layer (block or a capture group)",
                  pattern, igrad_kind_name(kind));
    IGRAD_FAIL_IF((kind == IGRAD_KIND_OTHER || kind == IGRAD_KIND_EMB ||
                   kind == IGRAD_KIND_HEAD) && layer != IGRAD_NAME_LAYER_NONE,
                  IGRAD_E_INVALID,
                  "name map: rule '%s': kind %s has no layer (use none)", pattern,
                  igrad_kind_name(kind));

    rule_t r = {.kind = kind, .layer = layer};
    r.is_glob = strncmp(pattern, "glob:", 5) == 0;
    IGRAD_FAIL_IF(pattern[r.is_glob ? 5 : 0] == '\0', IGRAD_E_INVALID,
                  "name map: empty pattern");
    IGRAD_FAIL_IF(r.is_glob && layer >= 1, IGRAD_E_INVALID,
                  "name map: rule '%s': a glob has no capture groups (layer block or none)",
                  pattern);
    unsigned long cost = 0;
    const char *refusal = pattern_refusal(pattern, r.is_glob, &cost);
    IGRAD_FAIL_IF(refusal, IGRAD_E_INVALID, "name map: rule '%.64s%s': %s", pattern,
                  strlen(pattern) > 64 ? "..." : "", refusal);
    IGRAD_FAIL_IF(map->count >= MAX_MAP_RULES, IGRAD_E_INVALID,
                  "name map: more than %d rules (a map names a family's modules in a few "
                  "dozen)", MAX_MAP_RULES);
    IGRAD_FAIL_IF(map->cost + cost > MAX_MAP_COST, IGRAD_E_INVALID,
                  "name map: rule '%.64s%s' brings the rules' total weight to %lu, over %lu "
                  "(weight: length x interval counts; matching costs tensors x weight)",
                  pattern, strlen(pattern) > 64 ? "..." : "", map->cost + cost, MAX_MAP_COST);
    if (!r.is_glob) {
        /* The pattern alone must compile, so that wrapping it cannot turn
         * an unbalanced "a)|(b" into a different valid expression. */
        regex_t alone;
        int rc = regcomp(&alone, pattern, REG_EXTENDED);
        char msg[160] = "";
        if (rc != 0) {
            regerror(rc, &alone, msg, sizeof msg);
            return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                               "name map: rule '%s': not a POSIX extended regex: %s", pattern,
                               msg);
        }
        size_t groups = alone.re_nsub;
        regfree(&alone);
        IGRAD_FAIL_IF(layer >= 1 && (size_t)layer > groups, IGRAD_E_INVALID,
                      "name map: rule '%s': layer from group %d, but the pattern has %zu "
                      "group(s)",
                      pattern, layer, groups);
        char *wrapped = posix_pattern(pattern);
        IGRAD_FAIL_IF(!wrapped, IGRAD_E_NOMEM, "name map: out of memory");
        rc = regcomp(&r.re, wrapped, REG_EXTENDED);
        free(wrapped);
        IGRAD_FAIL_IF(rc != 0, IGRAD_E_INVALID, "name map: rule '%s': pattern does not compile",
                      pattern);
    }
    if (map->count == map->cap) {
        size_t cap = map->cap ? 2 * map->cap : 8;
        rule_t *rules = realloc(map->rules, cap * sizeof *rules);
        if (!rules) {
            if (!r.is_glob) regfree(&r.re);
            return igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__, "name map: out of memory");
        }
        map->rules = rules;
        map->cap = cap;
    }
    r.pattern = igrad__strdup(pattern);
    if (!r.pattern) {
        if (!r.is_glob) regfree(&r.re);
        return igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__, "name map: out of memory");
    }
    map->rules[map->count++] = r;
    map->cost += cost;
    return IGRAD_OK;
}

igrad_status_t igrad__name_map_copy(const igrad_name_map_t *src, igrad_name_map_t **out)
{
    *out = NULL;
    if (!src) return IGRAD_OK;
    igrad_name_map_t *m = NULL;
    IGRAD_CHECK(igrad_name_map_create(&m));
    for (size_t i = 0; i < src->count; i++) {
        const rule_t *r = &src->rules[i];
        igrad_status_t st = igrad_name_map_add(m, r->pattern, r->kind, r->layer);
        if (st != IGRAD_OK) {
            igrad_name_map_free(m);
            return st;
        }
    }
    *out = m;
    return IGRAD_OK;
}

igrad_status_t igrad_name_map_component_of(const igrad_name_map_t *map, const char *name,
                                           igrad_kind_t *kind, int *layer)
{
    IGRAD_FAIL_IF(!name || !kind || !layer, IGRAD_E_INVALID,
                  "igrad_name_map_component_of: NULL argument");
    for (size_t i = 0; map && i < map->count; i++) {
        const rule_t *r = &map->rules[i];
        regmatch_t m[MAX_GROUP + 2];
        if (r->is_glob) {
            if (fnmatch(r->pattern + 5, name, 0) != 0) continue;
        } else if (regexec(&r->re, name, MAX_GROUP + 2, m, 0) != 0) {
            continue;
        }
        *kind = r->kind;
        *layer = -1;
        if (r->layer == IGRAD_NAME_LAYER_BLOCK) {
            *layer = igrad__name_block_index(name);
            IGRAD_FAIL_IF(*layer < 0, IGRAD_E_INVALID,
                          "name map: tensor '%s' matches rule %zu ('%s'), whose layer is the "
                          "block's, but the name has no numbered block (layers.N, h.N, "
                          "blocks.N, block.N, layer.N); take it from a capture group",
                          name, i + 1, r->pattern);
        } else if (r->layer >= 1) {
            const regmatch_t *g = &m[r->layer + 1];
            size_t n = g->rm_so < 0 ? 0 : (size_t)(g->rm_eo - g->rm_so);
            *layer = g->rm_so < 0 ? -1 : igrad__parse_layer_index(name + g->rm_so, n);
            IGRAD_FAIL_IF(*layer < 0, IGRAD_E_INVALID,
                          "name map: tensor '%s' matches rule %zu ('%s'), whose layer is "
                          "group %d, but that group captured '%.*s', not a layer number "
                          "(0..999999)",
                          name, i + 1, r->pattern, r->layer, (int)n,
                          g->rm_so < 0 ? "" : name + g->rm_so);
        }
        return IGRAD_OK;
    }
    *kind = igrad_component_of(name, layer);
    return IGRAD_OK;
}

/* ---- the map file -------------------------------------------------------- */

static int parse_layer_spec(const char *s, int *layer)
{
    if (strcmp(s, "block") == 0) {
        *layer = IGRAD_NAME_LAYER_BLOCK;
    } else if (strcmp(s, "none") == 0 || strcmp(s, "-") == 0) {
        *layer = IGRAD_NAME_LAYER_NONE;
    } else if (s[0] >= '1' && s[0] <= '9' && s[1] == '\0') {
        *layer = s[0] - '0';
    } else {
        return 0;
    }
    return 1;
}

/* The last error again, prefixed "source:LINE: " (copied first: the
 * message buffer is the one being written). */
static igrad_status_t fail_at_line(const char *source, int lineno)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", igrad_last_error());
    return igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__, "%s:%d: %s", source, lineno, msg);
}

igrad_status_t igrad__name_map_from_text(const char *text, size_t nbytes, const char *source,
                                         igrad_name_map_t **out)
{
    *out = NULL;
    IGRAD_FAIL_IF(memchr(text, '\0', nbytes) != NULL, IGRAD_E_FORMAT,
                  "%s: contains a NUL byte (a map file is text)", source);
    igrad_name_map_t *m = NULL;
    IGRAD_CHECK(igrad_name_map_create(&m));
    igrad_status_t st = IGRAD_OK;
    const char *p = text, *end = text + nbytes;
    /* A UTF-8 byte order mark (some editors write one) is not part of the
     * first rule's pattern. */
    if (nbytes >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0) p += 3;
    char *line = NULL;
    for (int lineno = 1; p < end; lineno++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        free(line);
        line = malloc(n + 1);
        IGRAD_FAIL_GOTO(!line, IGRAD_E_NOMEM, "%s: out of memory", source);
        memcpy(line, p, n);
        line[n] = '\0';
        p = nl ? nl + 1 : end;
        char *hash = strchr(line, '#');
        /* '#' starts a comment only at the start of a field: a regex may
         * hold one inside. */
        while (hash && hash != line && !isspace((unsigned char)hash[-1]))
            hash = strchr(hash + 1, '#');
        if (hash) *hash = '\0';
        char *fields[4];
        int nf = 0;
        for (char *tok = strtok(line, " \t\r\f\v"); tok; tok = strtok(NULL, " \t\r\f\v")) {
            if (nf < 4) fields[nf] = tok;
            nf++;
        }
        if (nf == 0) continue;
        IGRAD_FAIL_GOTO(nf != 3, IGRAD_E_FORMAT,
                        "%s:%d: %d field(s); a rule is 'PATTERN KIND LAYER' (LAYER: block, "
                        "none or a capture group 1..9)",
                        source, lineno, nf);
        igrad_kind_t kind;
        st = igrad_kind_from_name(fields[1], &kind);
        if (st != IGRAD_OK) {
            st = fail_at_line(source, lineno);
            goto cleanup;
        }
        int layer;
        IGRAD_FAIL_GOTO(!parse_layer_spec(fields[2], &layer), IGRAD_E_FORMAT,
                        "%s:%d: layer '%s' (expected block, none or a capture group 1..9)",
                        source, lineno, fields[2]);
        st = igrad_name_map_add(m, fields[0], kind, layer);
        if (st != IGRAD_OK) {
            st = fail_at_line(source, lineno);
            goto cleanup;
        }
    }
    free(line);
    *out = m;
    return IGRAD_OK;
cleanup:
    free(line);
    igrad_name_map_free(m);
    return st;
}

igrad_status_t igrad_name_map_load(const char *path, igrad_name_map_t **out)
{
    IGRAD_FAIL_IF(!path || !out, IGRAD_E_INVALID, "igrad_name_map_load: NULL argument");
    *out = NULL;
    char *text = NULL;
    size_t nbytes = 0;
    IGRAD_CHECK(igrad__read_file(path, IGRAD__TEXT_MAX_NBYTES, &text, &nbytes));
    igrad_status_t st = igrad__name_map_from_text(text, nbytes, path, out);
    free(text);
    return st;
}
