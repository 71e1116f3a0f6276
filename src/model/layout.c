/*
 * layout.c — the parameter table: an ordered list of tensors with their
 * flat-buffer offsets and components, dtype helpers, lookup by name, the
 * layout hash, JSON rendering, the name-list reader/writer and the
 * content-sniffing loader (igrad_layout_load).
 *
 * Not here: the name -> component rules (component.c), the Hugging Face
 * config builders (layout_hf.c) and the safetensors header reader
 * (safetensors.c).
 *
 * A layout is filled by igrad_layout_add() and immutable afterwards, so
 * everything the accessors return (components, hash, name index) is kept
 * up to date on every add rather than computed lazily: readers on several
 * threads never write.
 */
#define _POSIX_C_SOURCE 200809L
#include "model/layout_internal.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- dtypes ------------------------------------------------------------ */

static const struct {
    const char *name;
    size_t nbytes;
} dtypes[IGRAD_DTYPE_COUNT] = {
    [IGRAD_DTYPE_F32] = {"F32", 4},      [IGRAD_DTYPE_F16] = {"F16", 2},
    [IGRAD_DTYPE_BF16] = {"BF16", 2},    [IGRAD_DTYPE_F64] = {"F64", 8},
    [IGRAD_DTYPE_I8] = {"I8", 1},        [IGRAD_DTYPE_I16] = {"I16", 2},
    [IGRAD_DTYPE_I32] = {"I32", 4},      [IGRAD_DTYPE_I64] = {"I64", 8},
    [IGRAD_DTYPE_U8] = {"U8", 1},        [IGRAD_DTYPE_U16] = {"U16", 2},
    [IGRAD_DTYPE_U32] = {"U32", 4},      [IGRAD_DTYPE_U64] = {"U64", 8},
    [IGRAD_DTYPE_BOOL] = {"BOOL", 1},    [IGRAD_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
    [IGRAD_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
};

const char *igrad_dtype_name(igrad_dtype_t dtype)
{
    if ((int)dtype < 0 || dtype >= IGRAD_DTYPE_COUNT) return "?";
    return dtypes[dtype].name;
}

size_t igrad_dtype_nbytes(igrad_dtype_t dtype)
{
    if ((int)dtype < 0 || dtype >= IGRAD_DTYPE_COUNT) return 0;
    return dtypes[dtype].nbytes;
}

igrad_status_t igrad_dtype_from_name(const char *name, igrad_dtype_t *dtype)
{
    IGRAD_FAIL_IF(!name || !dtype, IGRAD_E_INVALID, "igrad_dtype_from_name: NULL argument");
    /* Exact spelling: safetensors writes these upper-case names. */
    for (int d = 0; d < IGRAD_DTYPE_COUNT; d++) {
        if (strcmp(name, dtypes[d].name) == 0) {
            *dtype = (igrad_dtype_t)d;
            return IGRAD_OK;
        }
    }
    return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__, "unknown dtype '%s'", name);
}

/* ---- the table --------------------------------------------------------- */

typedef struct row {
    char *name;
    igrad_dtype_t dtype;
    int ndim;
    int64_t shape[IGRAD_MAX_DIMS];
    int64_t count;
    int64_t offset;
    int layer;
    igrad_kind_t kind;
    int is_bias;
    int in_block; /* the name has a numbered block (layers.N, h.N, ...) */
    int node;     /* its component's node in `nodes`, -1 for OTHER */
} row_t;

/* Components live in an order-statistic treap keyed by (layer, kind): a
 * binary search tree in key order that is also a max-heap on a priority
 * derived from the key. Subtree sizes give a component's index (its rank
 * in (layer, kind) order) and the i-th component in O(log n), so adding a
 * tensor never renumbers anything, whatever order tensors arrive in: a
 * safetensors header lists layers as 0, 1, 10, 100, ... and a sorted
 * array with renumbering made building quadratic (100k tensors took
 * 10 s). Nodes never move once created; rows refer to them by index. */
typedef struct comp_node {
    igrad_component_info_t info;
    uint64_t prio;
    int left, right, parent; /* node indices, -1 = none */
    size_t size;             /* nodes in this subtree */
} comp_node_t;

struct igrad_layout {
    char *family;
    row_t *rows;
    size_t nrows, rows_cap;
    comp_node_t *nodes; /* in creation order; the treap orders them */
    size_t ncomps, comps_cap;
    int root; /* -1 while there are no components */
    int64_t total;
    uint64_t hash; /* running hash over the rows added so far */
    igrad_name_map_t *map;  /* user rules before the built-in ones; NULL = none */
    uint64_t assign_hash;   /* with a map: running hash of each row's (layer, kind) */
    int departs;            /* with a map: some row's (layer, kind) is not the
                               built-in rules' */
    size_t *slots; /* open-addressing name index: row + 1, 0 = empty */
    size_t nslots; /* power of two, at least twice nrows */
};

igrad_status_t igrad_layout_create(igrad_layout_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_layout_create: NULL out");
    *out = NULL;
    igrad_layout_t *l = calloc(1, sizeof *l);
    IGRAD_FAIL_IF(!l, IGRAD_E_NOMEM, "layout: out of memory");
    l->family = igrad__strdup("custom");
    if (!l->family) {
        free(l);
        return igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__, "layout: out of memory");
    }
    l->hash = IGRAD__HASH_SEED;
    l->assign_hash = IGRAD__HASH_SEED;
    l->root = -1;
    *out = l;
    return IGRAD_OK;
}

void igrad_layout_free(igrad_layout_t *layout)
{
    if (!layout) return;
    for (size_t i = 0; i < layout->nrows; i++) free(layout->rows[i].name);
    free(layout->rows);
    free(layout->nodes);
    free(layout->slots);
    free(layout->family);
    igrad_name_map_free(layout->map);
    free(layout);
}

igrad_status_t igrad_layout_set_name_map(igrad_layout_t *layout, const igrad_name_map_t *map)
{
    IGRAD_FAIL_IF(!layout, IGRAD_E_INVALID, "igrad_layout_set_name_map: NULL layout");
    IGRAD_FAIL_IF(layout->nrows > 0, IGRAD_E_INVALID,
                  "igrad_layout_set_name_map: the layout already has %zu tensors; set the "
                  "name map before adding any (or use igrad_layout_remap)",
                  layout->nrows);
    igrad_name_map_t *copy = NULL;
    IGRAD_CHECK(igrad__name_map_copy(map, &copy));
    igrad_name_map_free(layout->map);
    layout->map = copy;
    return IGRAD_OK;
}

igrad_status_t igrad__layout_create_like(const igrad_layout_t *src, igrad_layout_t **out)
{
    IGRAD_CHECK(igrad_layout_create(out));
    igrad_status_t st = igrad_layout_set_name_map(*out, src->map);
    if (st != IGRAD_OK) {
        igrad_layout_free(*out);
        *out = NULL;
    }
    return st;
}

igrad_status_t igrad_layout_remap(const igrad_layout_t *layout, const igrad_name_map_t *map,
                                  igrad_layout_t **out)
{
    IGRAD_FAIL_IF(!layout || !out, IGRAD_E_INVALID, "igrad_layout_remap: NULL argument");
    *out = NULL;
    igrad_layout_t *l = NULL;
    IGRAD_CHECK(igrad_layout_create(&l));
    igrad_status_t st = igrad_layout_set_name_map(l, map);
    for (size_t i = 0; st == IGRAD_OK && i < layout->nrows; i++) {
        const row_t *r = &layout->rows[i];
        st = igrad_layout_add(l, r->name, r->dtype, r->ndim, r->shape);
    }
    if (st == IGRAD_OK) st = igrad__layout_set_family(l, layout->family);
    if (st != IGRAD_OK) {
        igrad_layout_free(l);
        return st;
    }
    *out = l;
    return IGRAD_OK;
}

igrad_status_t igrad__layout_set_family(igrad_layout_t *layout, const char *family)
{
    char *f = igrad__strdup(family);
    IGRAD_FAIL_IF(!f, IGRAD_E_NOMEM, "layout: out of memory");
    free(layout->family);
    layout->family = f;
    return IGRAD_OK;
}

static size_t slot_of(const igrad_layout_t *l, const char *name)
{
    size_t mask = l->nslots - 1;
    size_t s = (size_t)igrad__hash_str(IGRAD__HASH_SEED, name) & mask;
    while (l->slots[s] != 0 && strcmp(l->rows[l->slots[s] - 1].name, name) != 0)
        s = (s + 1) & mask;
    return s;
}

static igrad_status_t grow_index(igrad_layout_t *l)
{
    if (l->nslots >= 2 * (l->nrows + 1)) return IGRAD_OK;
    size_t n = l->nslots ? l->nslots * 2 : 64;
    while (n < 2 * (l->nrows + 1)) n *= 2;
    size_t *slots = calloc(n, sizeof *slots);
    IGRAD_FAIL_IF(!slots, IGRAD_E_NOMEM, "layout: out of memory");
    free(l->slots);
    l->slots = slots;
    l->nslots = n;
    for (size_t i = 0; i < l->nrows; i++) l->slots[slot_of(l, l->rows[i].name)] = i + 1;
    return IGRAD_OK;
}

static int comp_cmp(int layer_a, igrad_kind_t kind_a, int layer_b, igrad_kind_t kind_b)
{
    if (layer_a != layer_b) return layer_a < layer_b ? -1 : 1;
    if (kind_a != kind_b) return kind_a < kind_b ? -1 : 1;
    return 0;
}

static size_t node_size(const igrad_layout_t *l, int n) { return n < 0 ? 0 : l->nodes[n].size; }

static void node_fix_size(igrad_layout_t *l, int n)
{
    l->nodes[n].size = 1 + node_size(l, l->nodes[n].left) + node_size(l, l->nodes[n].right);
}

/* Priority of a key: a fixed mix (splitmix64's finaliser) of (layer,
 * kind), so the tree's shape, like everything else, depends only on the
 * tensors added. */
static uint64_t node_prio(int layer, igrad_kind_t kind)
{
    uint64_t z = ((uint64_t)(uint32_t)layer << 8 | (uint64_t)kind) + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Rotates node x above its parent, keeping key order. */
static void node_rotate_up(igrad_layout_t *l, int x)
{
    comp_node_t *nd = l->nodes;
    int p = nd[x].parent, g = nd[p].parent;
    if (nd[p].left == x) {
        nd[p].left = nd[x].right;
        if (nd[x].right >= 0) nd[nd[x].right].parent = p;
        nd[x].right = p;
    } else {
        nd[p].right = nd[x].left;
        if (nd[x].left >= 0) nd[nd[x].left].parent = p;
        nd[x].left = p;
    }
    nd[p].parent = x;
    nd[x].parent = g;
    if (g < 0) l->root = x;
    else if (nd[g].left == p) nd[g].left = x;
    else nd[g].right = x;
    node_fix_size(l, p);
    node_fix_size(l, x);
}

/* Index of node n in (layer, kind) order. */
static size_t node_rank(const igrad_layout_t *l, int n)
{
    size_t r = node_size(l, l->nodes[n].left);
    for (int p = l->nodes[n].parent; p >= 0; n = p, p = l->nodes[p].parent) {
        if (l->nodes[p].right == n) r += node_size(l, l->nodes[p].left) + 1;
    }
    return r;
}

/* The node at index i in (layer, kind) order; i < ncomps. */
static int node_select(const igrad_layout_t *l, size_t i)
{
    int n = l->root;
    for (;;) {
        size_t left = node_size(l, l->nodes[n].left);
        if (i == left) return n;
        if (i < left) {
            n = l->nodes[n].left;
        } else {
            i -= left + 1;
            n = l->nodes[n].right;
        }
    }
}

/* Adds row `r` (already appended) to its component, creating the
 * component if it is new; the component counts `entries` for it (the row's
 * own, or what igrad__layout_add_rows says). Fails only before changing
 * anything. */
static igrad_status_t attach_component(igrad_layout_t *l, row_t *r, int64_t entries)
{
    int parent = -1, n = l->root, c = 0;
    while (n >= 0) {
        c = comp_cmp(r->layer, r->kind, l->nodes[n].info.layer, l->nodes[n].info.kind);
        if (c == 0) {
            l->nodes[n].info.count += entries;
            l->nodes[n].info.tensors += 1;
            r->node = n;
            return IGRAD_OK;
        }
        parent = n;
        n = c < 0 ? l->nodes[n].left : l->nodes[n].right;
    }
    if (l->ncomps == l->comps_cap) {
        size_t cap = l->comps_cap ? l->comps_cap * 2 : 32;
        comp_node_t *nodes = realloc(l->nodes, cap * sizeof *nodes);
        IGRAD_FAIL_IF(!nodes, IGRAD_E_NOMEM, "layout: out of memory");
        l->nodes = nodes;
        l->comps_cap = cap;
    }
    int x = (int)l->ncomps++;
    l->nodes[x] = (comp_node_t){
        .info = {.layer = r->layer, .kind = r->kind, .count = entries, .tensors = 1},
        .prio = node_prio(r->layer, r->kind),
        .left = -1,
        .right = -1,
        .parent = parent,
        .size = 1,
    };
    if (parent < 0) l->root = x;
    else if (c < 0) l->nodes[parent].left = x;
    else l->nodes[parent].right = x;
    for (int p = parent; p >= 0; p = l->nodes[p].parent) l->nodes[p].size++;
    while (l->nodes[x].parent >= 0 && l->nodes[l->nodes[x].parent].prio < l->nodes[x].prio)
        node_rotate_up(l, x);
    r->node = x;
    return IGRAD_OK;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

/* igrad_layout_add, and with full_rows >= 0 a row range [row0, row0 +
 * shape[0]) of a tensor of full_rows rows (igrad__layout_add_rows). The
 * hash is a tensor's of the piece's shape: the engine's copies of a layout
 * (engine_online.c) re-add its tensors by shape and must hash alike. */
static igrad_status_t layout_add(igrad_layout_t *layout, const char *name, igrad_dtype_t dtype,
                                 int ndim, const int64_t *shape, int64_t full_rows,
                                 int64_t comp_entries)
{
    IGRAD_FAIL_IF(!layout || !name, IGRAD_E_INVALID, "igrad_layout_add: NULL argument");
    IGRAD_FAIL_IF(name[0] == '\0', IGRAD_E_INVALID, "layout: empty tensor name");
    /* A tensor of that name could not be written to safetensors and read
     * back: readers take the key for the file's metadata. */
    IGRAD_FAIL_IF(strcmp(name, "__metadata__") == 0, IGRAD_E_INVALID,
                  "layout: tensor name '__metadata__' is reserved (safetensors keeps the "
                  "file's metadata under that key)");
    IGRAD_FAIL_IF((int)dtype < 0 || dtype >= IGRAD_DTYPE_COUNT, IGRAD_E_INVALID,
                  "layout: tensor '%s': invalid dtype %d", name, (int)dtype);
    IGRAD_FAIL_IF(ndim < 0 || ndim > IGRAD_MAX_DIMS, IGRAD_E_INVALID,
                  "layout: tensor '%s': %d dimensions (at most %d supported)", name, ndim,
                  IGRAD_MAX_DIMS);
    IGRAD_FAIL_IF(ndim > 0 && !shape, IGRAD_E_INVALID, "layout: tensor '%s': NULL shape", name);
    IGRAD_FAIL_IF(layout->nrows >= (size_t)INT_MAX, IGRAD_E_INVALID,
                  "layout: too many tensors");

    row_t r = {.dtype = dtype, .ndim = ndim, .count = 1};
    for (int d = 0; d < IGRAD_MAX_DIMS; d++) r.shape[d] = 1;
    for (int d = 0; d < ndim; d++) {
        IGRAD_FAIL_IF(shape[d] <= 0, IGRAD_E_INVALID,
                      "layout: tensor '%s': dimension %d is %lld (must be positive)", name, d,
                      (long long)shape[d]);
        IGRAD_FAIL_IF(r.count > INT64_MAX / shape[d], IGRAD_E_INVALID,
                      "layout: tensor '%s': entry count overflows int64", name);
        r.shape[d] = shape[d];
        r.count *= shape[d];
    }
    IGRAD_FAIL_IF(layout->total > INT64_MAX - r.count, IGRAD_E_INVALID,
                  "layout: tensor '%s': total entry count overflows int64", name);

    IGRAD_CHECK(grow_index(layout));
    size_t slot = slot_of(layout, name);
    IGRAD_FAIL_IF(layout->slots[slot] != 0, IGRAD_E_INVALID,
                  "layout: duplicate tensor name '%s'", name);

    if (layout->nrows == layout->rows_cap) {
        size_t cap = layout->rows_cap ? layout->rows_cap * 2 : 64;
        row_t *rows = realloc(layout->rows, cap * sizeof *rows);
        IGRAD_FAIL_IF(!rows, IGRAD_E_NOMEM, "layout: out of memory");
        layout->rows = rows;
        layout->rows_cap = cap;
    }
    r.name = igrad__strdup(name);
    IGRAD_FAIL_IF(!r.name, IGRAD_E_NOMEM, "layout: out of memory");
    r.offset = layout->total;
    igrad_status_t mst = igrad_name_map_component_of(layout->map, name, &r.kind, &r.layer);
    if (mst != IGRAD_OK) {
        free(r.name);
        return mst;
    }
    r.in_block = igrad__name_block_index(name) >= 0;
    r.is_bias = ends_with(name, "bias");
    r.node = -1;

    layout->rows[layout->nrows++] = r;
    row_t *added = &layout->rows[layout->nrows - 1];
    if (r.kind != IGRAD_KIND_OTHER) {
        igrad_status_t st =
            attach_component(layout, added, full_rows >= 0 ? comp_entries : added->count);
        if (st != IGRAD_OK) {
            layout->nrows--;
            free(r.name);
            return st;
        }
    }
    layout->slots[slot] = layout->nrows;
    layout->total += r.count;

    uint64_t h = layout->hash;
    h = igrad__hash_str(h, name);
    h = igrad__hash_i64(h, (int64_t)dtype);
    h = igrad__hash_i64(h, ndim);
    for (int d = 0; d < ndim; d++) h = igrad__hash_i64(h, r.shape[d]);
    layout->hash = h;
    if (layout->map) {
        int builtin_layer;
        igrad_kind_t builtin = igrad_component_of(name, &builtin_layer);
        if (builtin != r.kind || builtin_layer != r.layer) layout->departs = 1;
        layout->assign_hash = igrad__hash_i64(layout->assign_hash, r.layer);
        layout->assign_hash = igrad__hash_i64(layout->assign_hash, (int64_t)r.kind);
    }
    return IGRAD_OK;
}

igrad_status_t igrad_layout_add(igrad_layout_t *layout, const char *name, igrad_dtype_t dtype,
                                int ndim, const int64_t *shape)
{
    return layout_add(layout, name, dtype, ndim, shape, -1, 0);
}

igrad_status_t igrad__layout_add_rows(igrad_layout_t *layout, const char *name,
                                      igrad_dtype_t dtype, int ndim, const int64_t *shape,
                                      int64_t row0, int64_t nrows, int64_t comp_entries)
{
    IGRAD_FAIL_IF(!layout || !name || !shape || ndim < 1 || ndim > IGRAD_MAX_DIMS,
                  IGRAD_E_INVALID, "igrad__layout_add_rows: invalid argument");
    IGRAD_FAIL_IF(row0 < 0 || nrows < 1 || row0 + nrows > shape[0] || comp_entries < 0,
                  IGRAD_E_INVALID,
                  "layout: tensor '%s': rows [%lld, %lld) of %lld (comp entries %lld) is not a "
                  "row range",
                  name, (long long)row0, (long long)(row0 + nrows), (long long)shape[0],
                  (long long)comp_entries);
    int64_t piece[IGRAD_MAX_DIMS];
    memcpy(piece, shape, (size_t)ndim * sizeof *piece);
    piece[0] = nrows;
    return layout_add(layout, name, dtype, ndim, piece, shape[0], comp_entries);
}

size_t igrad_layout_count(const igrad_layout_t *layout) { return layout ? layout->nrows : 0; }

int64_t igrad_layout_total_count(const igrad_layout_t *layout)
{
    return layout ? layout->total : 0;
}

const char *igrad_layout_family(const igrad_layout_t *layout)
{
    return layout ? layout->family : "";
}

igrad_status_t igrad_layout_tensor(const igrad_layout_t *layout, size_t i,
                                   igrad_tensor_info_t *out)
{
    IGRAD_FAIL_IF(!layout || !out, IGRAD_E_INVALID, "igrad_layout_tensor: NULL argument");
    IGRAD_FAIL_IF(i >= layout->nrows, IGRAD_E_INVALID,
                  "layout: tensor index %zu out of range (%zu tensors)", i, layout->nrows);
    const row_t *r = &layout->rows[i];
    out->name = r->name;
    out->dtype = r->dtype;
    out->ndim = r->ndim;
    memcpy(out->shape, r->shape, sizeof out->shape);
    out->count = r->count;
    out->offset = r->offset;
    out->layer = r->layer;
    out->kind = r->kind;
    out->is_bias = r->is_bias;
    out->component = r->node < 0 ? -1 : (int)node_rank(layout, r->node);
    return IGRAD_OK;
}

int igrad_layout_find(const igrad_layout_t *layout, const char *name)
{
    if (!layout || !name || layout->nslots == 0) return -1;
    size_t s = slot_of(layout, name);
    return layout->slots[s] ? (int)(layout->slots[s] - 1) : -1;
}

size_t igrad_layout_component_count(const igrad_layout_t *layout)
{
    return layout ? layout->ncomps : 0;
}

igrad_status_t igrad_layout_component(const igrad_layout_t *layout, size_t i,
                                      igrad_component_info_t *out)
{
    IGRAD_FAIL_IF(!layout || !out, IGRAD_E_INVALID, "igrad_layout_component: NULL argument");
    IGRAD_FAIL_IF(i >= layout->ncomps, IGRAD_E_INVALID,
                  "layout: component index %zu out of range (%zu components)", i,
                  layout->ncomps);
    *out = layout->nodes[node_select(layout, i)].info;
    return IGRAD_OK;
}

/* The hash covers names, dtypes and shapes; the built-in components follow
 * from the names. When a name map assigns any tensor another (layer,
 * kind), the hash goes on over every tensor's (layer, kind): ranks or files
 * with different assignments disagree on it, and a map that changes
 * nothing leaves the hash (and the profiles that carry it) as it was. */
uint64_t igrad_layout_hash(const igrad_layout_t *layout)
{
    if (!layout) return IGRAD__HASH_SEED;
    if (!layout->departs) return layout->hash;
    uint64_t h = igrad__hash_str(layout->hash, "name_map");
    return igrad__hash_i64(h, (int64_t)layout->assign_hash);
}

/* ---- tensors no rule knows ------------------------------------------------ */

int igrad_layout_is_unmapped(const igrad_layout_t *layout, size_t i)
{
    if (!layout || i >= layout->nrows) return 0;
    const row_t *r = &layout->rows[i];
    return r->kind == IGRAD_KIND_OTHER && r->in_block;
}

igrad_status_t igrad_layout_unmapped_report(const igrad_layout_t *layout, size_t max_names,
                                            char **text)
{
    IGRAD_FAIL_IF(!layout || !text, IGRAD_E_INVALID,
                  "igrad_layout_unmapped_report: NULL argument");
    *text = NULL;
    size_t n = 0;
    int64_t entries = 0;
    for (size_t i = 0; i < layout->nrows; i++) {
        if (!igrad_layout_is_unmapped(layout, i)) continue;
        n++;
        entries += layout->rows[i].count;
    }
    if (n == 0) return IGRAD_OK;
    double total = layout->total > 0 ? (double)layout->total : 1.0;
    char *s = igrad__strprintf(
        "%zu of %zu tensors inside numbered blocks (%.2f %% of the entries) match no name "
        "rule and are OTHER (sent every step, never profiled or deferred):",
        n, layout->nrows, 100.0 * (double)entries / total);
    size_t shown = 0;
    for (size_t i = 0; s && i < layout->nrows && shown < max_names; i++) {
        if (!igrad_layout_is_unmapped(layout, i)) continue;
        const row_t *r = &layout->rows[i];
        char *t = igrad__strprintf("%s%s %s (%.2f %%)", s, shown ? "," : "", r->name,
                                   100.0 * (double)r->count / total);
        free(s);
        s = t;
        shown++;
    }
    if (s) {
        char *t = igrad__strprintf(
            "%s%s; map them with name rules (igrad --map FILE, IgradState(name_map=...); "
            "docs/formats.md, the name map file) or see `igrad layout --unmapped`",
            s, shown < n ? ", ..." : "");
        free(s);
        s = t;
    }
    IGRAD_FAIL_IF(!s, IGRAD_E_NOMEM, "layout: out of memory");
    *text = s;
    return IGRAD_OK;
}

/* ---- JSON rendering ---------------------------------------------------- */

igrad_status_t igrad_layout_to_json(const igrad_layout_t *layout, char **json_out)
{
    IGRAD_FAIL_IF(!layout || !json_out, IGRAD_E_INVALID, "igrad_layout_to_json: NULL argument");
    *json_out = NULL;
    igrad_status_t st = IGRAD_OK;
    int64_t weights[IGRAD_KIND_COUNT] = {0};
    cJSON *root = cJSON_CreateObject();
    IGRAD_FAIL_GOTO(!root, IGRAD_E_NOMEM, "layout: out of memory");
    IGRAD_FAIL_GOTO(!cJSON_AddStringToObject(root, "family", layout->family) ||
                        !cJSON_AddNumberToObject(root, "total_numel", (double)layout->total),
                    IGRAD_E_NOMEM, "layout: out of memory");
    cJSON *tensors = cJSON_AddArrayToObject(root, "tensors");
    IGRAD_FAIL_GOTO(!tensors, IGRAD_E_NOMEM, "layout: out of memory");
    for (size_t i = 0; i < layout->nrows; i++) {
        const row_t *r = &layout->rows[i];
        cJSON *t = cJSON_CreateObject();
        IGRAD_FAIL_GOTO(!t, IGRAD_E_NOMEM, "layout: out of memory");
        cJSON_AddItemToArray(tensors, t);
        cJSON *shape = NULL;
        IGRAD_FAIL_GOTO(!cJSON_AddStringToObject(t, "name", r->name) ||
                            !(shape = cJSON_AddArrayToObject(t, "shape")),
                        IGRAD_E_NOMEM, "layout: out of memory");
        for (int d = 0; d < r->ndim; d++) {
            cJSON *v = cJSON_CreateNumber((double)r->shape[d]);
            IGRAD_FAIL_GOTO(!v, IGRAD_E_NOMEM, "layout: out of memory");
            cJSON_AddItemToArray(shape, v);
        }
        IGRAD_FAIL_GOTO(!cJSON_AddNumberToObject(t, "numel", (double)r->count) ||
                            !cJSON_AddNumberToObject(t, "layer", r->layer) ||
                            !cJSON_AddStringToObject(t, "kind", igrad_kind_name(r->kind)),
                        IGRAD_E_NOMEM, "layout: out of memory");
        if (!r->is_bias) weights[r->kind]++;
    }
    cJSON *kinds = cJSON_AddObjectToObject(root, "kinds");
    IGRAD_FAIL_GOTO(!kinds, IGRAD_E_NOMEM, "layout: out of memory");
    for (int k = 0; k < IGRAD_KIND_COUNT; k++) {
        IGRAD_FAIL_GOTO(!cJSON_AddNumberToObject(kinds, igrad_kind_name((igrad_kind_t)k),
                                                 (double)weights[k]),
                        IGRAD_E_NOMEM, "layout: out of memory");
    }
    char *text = cJSON_PrintUnformatted(root);
    IGRAD_FAIL_GOTO(!text, IGRAD_E_NOMEM, "layout: out of memory");
    /* Hand out memory that igrad_free() (plain free) may release. */
    *json_out = igrad__strdup(text);
    cJSON_free(text);
    IGRAD_FAIL_GOTO(!*json_out, IGRAD_E_NOMEM, "layout: out of memory");

cleanup:
    cJSON_Delete(root);
    return st;
}

/* ---- name lists -------------------------------------------------------- */

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

/* Parses a dimension at *p (digits only), advancing *p. */
static int parse_dim(const char **p, const char *end, int64_t *out)
{
    const char *s = *p;
    int64_t v = 0;
    if (s >= end || !isdigit((unsigned char)*s)) return -1;
    while (s < end && isdigit((unsigned char)*s)) {
        int digit = *s - '0';
        if (v > (INT64_MAX - digit) / 10) return -1;
        v = v * 10 + digit;
        s++;
    }
    *p = s;
    *out = v;
    return 0;
}

/* One non-empty, comment-stripped line: "name d0 d1", "name [d0, d1]" or
 * "name (d0, d1,)". Returns 0 and fills name/ndim/shape, or -1 with a
 * reason in *why. */
static int parse_line(const char *s, const char *end, char **name, int *ndim, int64_t *shape,
                      const char **why)
{
    const char *n0 = s;
    while (s < end && !is_space(*s) && *s != '[' && *s != '(') s++;
    size_t nlen = (size_t)(s - n0);
    while (s < end && is_space(*s)) s++;
    *ndim = 0;
    if (s == end) {
        *why = "no shape after the name";
        return -1;
    }
    char close = 0;
    if (*s == '[') close = ']';
    if (*s == '(') close = ')';
    if (close) s++;
    for (;;) {
        while (s < end && is_space(*s)) s++;
        if (s == end) break;
        if (close && *s == close) break;
        if (*ndim == IGRAD_MAX_DIMS) {
            *why = "more than 4 dimensions";
            return -1;
        }
        if (parse_dim(&s, end, &shape[*ndim]) != 0) {
            *why = "a dimension is not a non-negative integer";
            return -1;
        }
        if (shape[*ndim] == 0) {
            *why = "a dimension is 0";
            return -1;
        }
        (*ndim)++;
        while (s < end && is_space(*s)) s++;
        if (close && s < end && *s == ',') s++;
        else if (close && s < end && *s != close) {
            *why = "expected ',' between dimensions";
            return -1;
        }
    }
    if (close) {
        if (s == end) {
            *why = close == ']' ? "missing ']'" : "missing ')'";
            return -1;
        }
        s++;
        while (s < end && is_space(*s)) s++;
        if (s != end) {
            *why = "unexpected text after the shape";
            return -1;
        }
    } else if (*ndim == 0) {
        *why = "no shape after the name";
        return -1;
    }
    if (nlen == 0) {
        *why = "missing tensor name";
        return -1;
    }
    *name = malloc(nlen + 1);
    if (!*name) {
        *why = "out of memory";
        return -1;
    }
    memcpy(*name, n0, nlen);
    (*name)[nlen] = '\0';
    return 0;
}

igrad_status_t igrad__layout_from_name_list_text(const char *text, size_t nbytes,
                                                 const char *source, igrad_layout_t **out)
{
    *out = NULL;
    const char *src = source ? source : "<names>";
    igrad_layout_t *l = NULL;
    igrad_status_t st = IGRAD_OK;
    IGRAD_CHECK_GOTO(igrad_layout_create(&l));
    IGRAD_CHECK_GOTO(igrad__layout_set_family(l, "names"));
    const char *p = text, *end = text + nbytes;
    long line = 0;
    while (p < end) {
        line++;
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *le = eol ? eol : end;
        const char *hash = memchr(p, '#', (size_t)(le - p));
        const char *ce = hash ? hash : le;
        const char *s = p;
        p = eol ? eol + 1 : end;
        for (const char *c = s; c < ce; c++) {
            IGRAD_FAIL_GOTO((unsigned char)*c < 0x20 && !is_space(*c), IGRAD_E_FORMAT,
                            "%s:%ld: control character 0x%02x", src, line,
                            (unsigned)(unsigned char)*c);
        }
        while (s < ce && is_space(*s)) s++;
        while (ce > s && is_space(ce[-1])) ce--;
        if (s == ce) continue;
        char *name = NULL;
        int ndim = 0;
        int64_t shape[IGRAD_MAX_DIMS];
        const char *why = NULL;
        IGRAD_FAIL_GOTO(parse_line(s, ce, &name, &ndim, shape, &why) != 0, IGRAD_E_FORMAT,
                        "%s:%ld: %s", src, line, why);
        if (igrad_layout_find(l, name) >= 0) {
            st = igrad__fail(IGRAD_E_FORMAT, __FILE__, __LINE__,
                             "%s:%ld: duplicate tensor name '%s'", src, line, name);
            free(name);
            goto cleanup;
        }
        st = igrad_layout_add(l, name, IGRAD_DTYPE_F32, ndim, shape);
        free(name);
        if (st != IGRAD_OK) {
            char why_add[512];
            snprintf(why_add, sizeof why_add, "%s", igrad_last_error());
            st = igrad__fail(st == IGRAD_E_INVALID ? IGRAD_E_FORMAT : st, __FILE__, __LINE__,
                             "%s:%ld: %s", src, line, why_add);
            goto cleanup;
        }
    }
    IGRAD_FAIL_GOTO(l->nrows == 0, IGRAD_E_FORMAT, "%s: no tensors in the name list", src);

cleanup:
    if (st != IGRAD_OK) {
        igrad_layout_free(l);
        return st;
    }
    *out = l;
    return IGRAD_OK;
}

igrad_status_t igrad_layout_from_name_list(const char *path, igrad_layout_t **out)
{
    IGRAD_FAIL_IF(!out || !path, IGRAD_E_INVALID, "igrad_layout_from_name_list: NULL argument");
    *out = NULL;
    char *text = NULL;
    size_t n = 0;
    IGRAD_CHECK(igrad__read_file(path, IGRAD__TEXT_MAX_NBYTES, &text, &n));
    igrad_status_t st = igrad__layout_from_name_list_text(text, n, path, out);
    free(text);
    return st;
}

igrad_status_t igrad__layout_to_name_list(const igrad_layout_t *layout, char **text,
                                          size_t *nbytes)
{
    *text = NULL;
    *nbytes = 0;
    size_t cap = 64, len = 0;
    for (size_t i = 0; i < layout->nrows; i++) {
        const char *name = layout->rows[i].name;
        for (const char *c = name; *c; c++) {
            IGRAD_FAIL_IF((unsigned char)*c <= 0x20 || *c == '#' || *c == '[' || *c == '(' ||
                              *c == 0x7f,
                          IGRAD_E_INVALID,
                          "layout: tensor name '%s' cannot be written in a name list", name);
        }
        cap += strlen(name) + 2 + IGRAD_MAX_DIMS * 21;
    }
    char *buf = malloc(cap);
    IGRAD_FAIL_IF(!buf, IGRAD_E_NOMEM, "layout: out of memory");
    for (size_t i = 0; i < layout->nrows; i++) {
        const row_t *r = &layout->rows[i];
        len += (size_t)snprintf(buf + len, cap - len, "%s [", r->name);
        for (int d = 0; d < r->ndim; d++)
            len += (size_t)snprintf(buf + len, cap - len, "%s%lld", d ? ", " : "",
                                    (long long)r->shape[d]);
        len += (size_t)snprintf(buf + len, cap - len, "]\n");
    }
    *text = buf;
    *nbytes = len;
    return IGRAD_OK;
}

/* ---- loading by content ------------------------------------------------ */

/* 1 if path ends with suffix, ignoring ASCII case. */
static int has_suffix(const char *path, const char *suffix)
{
    size_t n = strlen(path), m = strlen(suffix);
    return n >= m && igrad__name_equal(path + n - m, suffix);
}

static int is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

igrad_status_t igrad_layout_load(const char *path, igrad_layout_t **out)
{
    IGRAD_FAIL_IF(!out || !path, IGRAD_E_INVALID, "igrad_layout_load: NULL argument");
    *out = NULL;
    if (is_dir(path)) {
        char *st_path = igrad__strprintf("%s/model.safetensors", path);
        char *cfg_path = igrad__strprintf("%s/config.json", path);
        igrad_status_t st;
        if (!st_path || !cfg_path)
            st = igrad__fail(IGRAD_E_NOMEM, __FILE__, __LINE__, "%s: out of memory", path);
        else if (is_file(st_path))
            st = igrad_layout_from_safetensors(st_path, out);
        else if (is_file(cfg_path))
            st = igrad_layout_from_hf_config(cfg_path, out);
        else
            st = igrad__fail(IGRAD_E_IO, __FILE__, __LINE__,
                             "%s: directory has neither model.safetensors nor config.json",
                             path);
        free(st_path);
        free(cfg_path);
        return st;
    }

    /* The extension is the user's statement of what the file is: a
     * .safetensors file with a damaged header must get the safetensors
     * reader's message, not a name-list complaint about its binary length
     * bytes. */
    if (has_suffix(path, ".safetensors")) return igrad_layout_from_safetensors(path, out);
    if (has_suffix(path, ".json")) return igrad_layout_from_hf_config(path, out);

    FILE *fp;
    uint64_t file_nbytes;
    IGRAD_CHECK(igrad__open_regular(path, &fp, &file_nbytes));
    unsigned char head[64];
    size_t got = fread(head, 1, sizeof head, fp);
    int err = ferror(fp);
    fclose(fp);
    IGRAD_FAIL_IF(err, IGRAD_E_IO, "%s: read failed", path);

    /* safetensors: a little-endian length that fits the file, then '{'.
     * A JSON text can have '{' at byte 8 too, but its first 8 bytes read
     * as a length far beyond any file. */
    if (got >= 9 && head[8] == '{') {
        uint64_t hlen = 0;
        for (int i = 0; i < 8; i++) hlen |= (uint64_t)head[i] << (8 * i);
        if (hlen + 8 <= file_nbytes && hlen <= IGRAD__SAFETENSORS_MAX_HEADER)
            return igrad_layout_from_safetensors(path, out);
    }
    size_t i = 0;
    if (got >= 3 && head[0] == 0xEF && head[1] == 0xBB && head[2] == 0xBF) i = 3;
    while (i < got && (head[i] == ' ' || head[i] == '\t' || head[i] == '\r' || head[i] == '\n'))
        i++;
    if (i < got && head[i] == '{') return igrad_layout_from_hf_config(path, out);
    /* '{' at byte 8 after binary bytes (which no name list may hold): a
     * safetensors file whose length is wrong; let its reader say how. */
    if (got >= 9 && head[8] == '{') {
        for (int b = 0; b < 8; b++) {
            if (head[b] < 0x20 && !is_space((char)head[b]) && head[b] != '\n')
                return igrad_layout_from_safetensors(path, out);
        }
    }
    return igrad_layout_from_name_list(path, out);
}
