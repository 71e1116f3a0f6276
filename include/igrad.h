/*
 * igrad.h — the one public header of libigrad.
 *
 * igrad makes data-parallel LLM post-training cheaper to synchronize. After
 * a sparsifier (Top-k, ADTopk) has dropped most of each gradient, igrad
 * profiles which Transformer components (layer x Q/K/V/QKV/O/FC1/FC2) carry
 * the important gradient, sends those every step, defers the rest into
 * residual buffers released every R steps (nothing is lost), packs each
 * step's payload into balanced buckets and exchanges it with real
 * collectives.
 *
 * Objects (opaque handles, each with a create/free pair; free(NULL) is a
 * no-op):
 *   igrad_layout_t    ordered table of a model's trainable tensors
 *   igrad_select_ws_t scratch space for selection (one per thread)
 *   igrad_trace_t     per-step, per-component activity of retained entries
 *   igrad_profile_t   component scores, threshold and important set
 *
 * Worked example (offline profiling, then reading the result):
 *
 *   igrad_layout_t *layout = NULL;
 *   igrad_trace_t *trace = NULL;
 *   igrad_select_ws_t *ws = NULL;
 *   if (igrad_layout_from_hf_config("config.json", &layout) != IGRAD_OK) {
 *       fprintf(stderr, "%s\n", igrad_last_error());
 *       return 1;
 *   }
 *   igrad_trace_create(layout, &trace);
 *   igrad_select_ws_create(&ws);
 *   for (int64_t step = 0; step < steps; step++) {
 *       compute_gradients(grads);                  // one float* per tensor
 *       for (size_t t = 0; t < igrad_layout_count(layout); t++) {
 *           igrad_tensor_info_t ti;
 *           igrad_select_spec_t spec;
 *           igrad_selection_t sel = {.index = idx, .value = val};
 *           igrad_layout_tensor(layout, t, &ti);
 *           igrad_select_spec(IGRAD_SPARSIFIER_ADTOPK, 0.01, 1.0, 0, step,
 *                             ti.ndim, ti.shape, &spec);
 *           igrad_select_ef(grads[t], residual[t], &spec, ti.name, ws, &sel);
 *           igrad_trace_record(trace, step, t, sel.sumsq, sel.count);
 *       }
 *   }
 *   igrad_trace_save(trace, "trace.csv");
 *
 *   igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
 *   igrad_profile_t *profile = NULL;
 *   igrad_profile_build(trace, &opts, &profile);
 *   igrad_profile_save_json(profile, "profile.json");
 *
 * Errors: every fallible call returns igrad_status_t (0 is IGRAD_OK) and
 * hands results back through pointers. igrad_last_error() explains the most
 * recent failure of the calling thread (file, key or line where it applies).
 * The library never calls exit() or abort() and never frees caller memory.
 */
#ifndef IGRAD_H
#define IGRAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#  define IGRAD_API __declspec(dllexport)
#elif defined(__GNUC__)
#  define IGRAD_API __attribute__((visibility("default")))
#else
#  define IGRAD_API
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                  */
/* ------------------------------------------------------------------------ */

#define IGRAD_VERSION_MAJOR 0
#define IGRAD_VERSION_MINOR 1
#define IGRAD_VERSION_PATCH 0
#define IGRAD_VERSION_NUMBER \
    (IGRAD_VERSION_MAJOR * 10000 + IGRAD_VERSION_MINOR * 100 + IGRAD_VERSION_PATCH)

/** @return IGRAD_VERSION_NUMBER of the library actually loaded (bindings
 *  compare it with the version they were written for). */
IGRAD_API unsigned igrad_version(void);

/** @return "MAJOR.MINOR.PATCH" of the loaded library (static string). */
IGRAD_API const char *igrad_version_string(void);

/* ------------------------------------------------------------------------ */
/* Status codes and errors                                                  */
/* ------------------------------------------------------------------------ */

/** Status of every fallible call. The numbers are stable (bindings use them). */
typedef enum igrad_status {
    IGRAD_OK = 0,
    IGRAD_E_INVALID = 1,     /**< bad argument or configuration value */
    IGRAD_E_NOMEM = 2,       /**< allocation failed */
    IGRAD_E_IO = 3,          /**< file could not be opened, read or written */
    IGRAD_E_FORMAT = 4,      /**< malformed, truncated or inconsistent input */
    IGRAD_E_UNSUPPORTED = 5, /**< e.g. an unknown model family */
    IGRAD_E_NONFINITE = 6,   /**< NaN or Inf in a gradient */
    IGRAD_E_MISMATCH = 7,    /**< layout/profile/config disagree (file or ranks) */
    IGRAD_E_COMM = 8,        /**< a collective failed */
    IGRAD_E_STATE = 9,       /**< call out of order (e.g. end before begin), or an
                                  engine/communicator made unusable by an earlier
                                  failure */
    IGRAD_E_TIMEOUT = 10     /**< a collective did not complete within its timeout
                                  (a rank stopped, wedged or out of step) */
} igrad_status_t;

/** @return a short constant description of a status code. */
IGRAD_API const char *igrad_status_str(igrad_status_t status);

/** @return the message of the calling thread's most recent failure
 *  ("" if none). Valid until the thread's next failing igrad call. */
IGRAD_API const char *igrad_last_error(void);

/** Frees memory the library allocated and handed to the caller (strings
 *  returned through char** out-parameters). NULL is a no-op. */
IGRAD_API void igrad_free(void *ptr);

/* ------------------------------------------------------------------------ */
/* Components                                                               */
/* ------------------------------------------------------------------------ */

/** Kind of a Transformer component. FC1 = up/gate projection, FC2 = down
 *  projection; QKV = fused query/key/value. EMB, HEAD and NORM (appended
 *  after OTHER, so older values keep their numbers) are the tensors outside
 *  the projections: they are components like any other, scored and
 *  deferred like projections. Names that match no rule are OTHER: not a
 *  component, sent every step. */
typedef enum igrad_kind {
    IGRAD_KIND_Q = 0,
    IGRAD_KIND_K = 1,
    IGRAD_KIND_V = 2,
    IGRAD_KIND_QKV = 3,
    IGRAD_KIND_O = 4,
    IGRAD_KIND_FC1 = 5,
    IGRAD_KIND_FC2 = 6,
    IGRAD_KIND_OTHER = 7, /**< unknown names: never a component, always sent */
    IGRAD_KIND_EMB = 8,   /**< token/position embeddings (a tied lm_head too), layer -1 */
    IGRAD_KIND_HEAD = 9,  /**< an untied lm_head, layer -1 */
    IGRAD_KIND_NORM = 10, /**< norms: (block, NORM), or (-1, NORM) outside blocks */
    IGRAD_KIND_COUNT = 11
} igrad_kind_t;

/** @return "Q", "K", "V", "QKV", "O", "FC1", "FC2", "OTHER", "EMB", "HEAD"
 *  or "NORM" ("?" out of range). */
IGRAD_API const char *igrad_kind_name(igrad_kind_t kind);

/** Parses a kind name (case-insensitive). @return IGRAD_E_INVALID if unknown. */
IGRAD_API igrad_status_t igrad_kind_from_name(const char *name, igrad_kind_t *kind);

/** Maps a parameter name of any supported family to its component.
 *  Examples: "model.layers.3.self_attn.q_proj.weight" -> (3, Q);
 *  "transformer.h.3.attn.c_attn.weight" -> (3, QKV);
 *  "model.layers.3.block_sparse_moe.experts.5.w1.weight" -> (3, FC1);
 *  "model.layers.3.input_layernorm.weight" -> (3, NORM);
 *  "model.norm.weight" -> (-1, NORM); "model.embed_tokens.weight" ->
 *  (-1, EMB); "lm_head.weight" -> (-1, HEAD); "model.layers.3.mlp.gate.
 *  weight" (a MoE router) -> (-1, OTHER). Biases map with their module.
 *  @param layer receives the block index, or -1 outside blocks and for
 *  OTHER (may be NULL).
 *  @return the kind. Never fails; unknown names are OTHER. Thread-safe. */
IGRAD_API igrad_kind_t igrad_component_of(const char *name, int *layer);

/* ------------------------------------------------------------------------ */
/* Parameter layout                                                         */
/* ------------------------------------------------------------------------ */

#define IGRAD_MAX_DIMS 4

/** Element type of a tensor (safetensors names: "F32", "BF16", ...). */
typedef enum igrad_dtype {
    IGRAD_DTYPE_F32 = 0,
    IGRAD_DTYPE_F16 = 1,
    IGRAD_DTYPE_BF16 = 2,
    IGRAD_DTYPE_F64 = 3,
    IGRAD_DTYPE_I8 = 4,
    IGRAD_DTYPE_I16 = 5,
    IGRAD_DTYPE_I32 = 6,
    IGRAD_DTYPE_I64 = 7,
    IGRAD_DTYPE_U8 = 8,
    IGRAD_DTYPE_U16 = 9,
    IGRAD_DTYPE_U32 = 10,
    IGRAD_DTYPE_U64 = 11,
    IGRAD_DTYPE_BOOL = 12,
    IGRAD_DTYPE_F8_E4M3 = 13,
    IGRAD_DTYPE_F8_E5M2 = 14,
    IGRAD_DTYPE_COUNT = 15
} igrad_dtype_t;

/** @return the safetensors name of a dtype ("F32", ...). */
IGRAD_API const char *igrad_dtype_name(igrad_dtype_t dtype);
/** @return the size of one element in bytes (0 for an invalid dtype). */
IGRAD_API size_t igrad_dtype_nbytes(igrad_dtype_t dtype);
/** Parses a safetensors dtype name. @return IGRAD_E_INVALID if unknown. */
IGRAD_API igrad_status_t igrad_dtype_from_name(const char *name, igrad_dtype_t *dtype);

/** Converts `count` elements from src_dtype to dst_dtype: F32 to F16 or
 *  BF16 with round-to-nearest-even (the conversion of the engine's 16-bit
 *  wire values and of PyTorch's .half() / .to(torch.bfloat16): a finite
 *  F32 of magnitude >= 65520 becomes an F16 Inf, NaN a quiet NaN), F16 or
 *  BF16 to F32 (exact), or a copy when the dtypes are equal. src and dst
 *  may not overlap unless equal with equal dtypes.
 *  @return IGRAD_E_INVALID for NULL buffers (count > 0) or another pair
 *  of dtypes (naming both). */
IGRAD_API igrad_status_t igrad_convert(const void *src, igrad_dtype_t src_dtype, void *dst,
                                       igrad_dtype_t dst_dtype, size_t count);

/** An ordered table of trainable tensors. Immutable once built, so one
 *  layout may be shared by several threads and engines. */
typedef struct igrad_layout igrad_layout_t;

/** One row of a layout. Pointers stay valid while the layout lives. */
typedef struct igrad_tensor_info {
    const char *name;              /**< full parameter name */
    igrad_dtype_t dtype;           /**< element type of the stored weights */
    int ndim;                      /**< 0..IGRAD_MAX_DIMS */
    int64_t shape[IGRAD_MAX_DIMS]; /**< unused dims are 1 */
    int64_t count;                 /**< entries (product of shape) */
    int64_t offset;                /**< entries before it in a flat buffer */
    int layer;                     /**< block index, -1 for OTHER */
    igrad_kind_t kind;             /**< component kind */
    int is_bias;                   /**< 1 for bias vectors (name ends "bias") */
    int component;                 /**< index into the layout's component
                                        list, -1 for OTHER */
} igrad_tensor_info_t;

/** One (layer, kind) component: the tensors that map to it together. */
typedef struct igrad_component_info {
    int layer;
    igrad_kind_t kind;
    int64_t count;   /**< entries over all its tensors */
    int tensors;     /**< number of tensors (weights and biases) */
} igrad_component_info_t;

/** Creates an empty layout to fill with igrad_layout_add(). */
IGRAD_API igrad_status_t igrad_layout_create(igrad_layout_t **out);

/** Appends a tensor. Its component is derived from the name.
 *  @return IGRAD_E_INVALID for a duplicate name, ndim outside 0..4, a
 *  non-positive dimension or an entry count that overflows int64. */
IGRAD_API igrad_status_t igrad_layout_add(igrad_layout_t *layout, const char *name,
                                          igrad_dtype_t dtype, int ndim,
                                          const int64_t *shape);

/** Builds the exact parameter table that the Hugging Face implementation of
 *  the config's family creates (model_type llama, mistral, qwen2, gemma,
 *  opt, gpt2, gpt_neox, bloom, falcon, gptj, phi, mixtral).
 *  @return IGRAD_E_IO, IGRAD_E_FORMAT (names the key) or
 *  IGRAD_E_UNSUPPORTED (unknown model_type). */
IGRAD_API igrad_status_t igrad_layout_from_hf_config(const char *path,
                                                     igrad_layout_t **out);

/** Same from a JSON text in memory; `source` names it in messages. */
IGRAD_API igrad_status_t igrad_layout_from_hf_config_string(const char *json, size_t nbytes,
                                                            const char *source,
                                                            igrad_layout_t **out);

/** Reads only the header of a .safetensors file (never the weights), so the
 *  layout of a large checkpoint loads in milliseconds. Tensors keep the
 *  header's order (sorted by data offset), "__metadata__" is skipped, and
 *  so are tensors with a zero dimension (no entries, nothing to sync).
 *  @return IGRAD_E_IO, or IGRAD_E_FORMAT naming the file and the tensor or
 *  key (bad length, JSON, dtype, shape, offsets, duplicate names). */
IGRAD_API igrad_status_t igrad_layout_from_safetensors(const char *path,
                                                       igrad_layout_t **out);

/** Same from the bytes of a safetensors file (at least its header); `source`
 *  names it in messages. `file_nbytes` is the size of the whole file (the
 *  header's data offsets are checked against it). */
IGRAD_API igrad_status_t igrad_layout_from_safetensors_bytes(const void *bytes, size_t nbytes,
                                                             uint64_t file_nbytes,
                                                             const char *source,
                                                             igrad_layout_t **out);

/** Reads a text file of "name dim0 dim1 ...", "name [d0, d1]" or
 *  "name (d0, d1)" lines ('#' starts a comment, "name []" is a scalar).
 *  dtype is F32. @return IGRAD_E_FORMAT naming the file and line. */
IGRAD_API igrad_status_t igrad_layout_from_name_list(const char *path,
                                                     igrad_layout_t **out);

/** Picks the reader by extension (".safetensors", ".json", case ignored),
 *  else by content: a safetensors header, a JSON config, or a name list.
 *  A directory is read as a checkpoint: model.safetensors if present, else
 *  config.json. */
IGRAD_API igrad_status_t igrad_layout_load(const char *path, igrad_layout_t **out);

/** Frees a layout. NULL is a no-op. */
IGRAD_API void igrad_layout_free(igrad_layout_t *layout);

/** @return number of tensors. */
IGRAD_API size_t igrad_layout_count(const igrad_layout_t *layout);
/** @return total entries over all tensors. */
IGRAD_API int64_t igrad_layout_total_count(const igrad_layout_t *layout);
/** @return the model family ("llama", ...; "safetensors" or "names" when it
 *  was not built from a config, "custom" when built with igrad_layout_add). */
IGRAD_API const char *igrad_layout_family(const igrad_layout_t *layout);
/** Copies row i into *out. @return IGRAD_E_INVALID if i is out of range. */
IGRAD_API igrad_status_t igrad_layout_tensor(const igrad_layout_t *layout, size_t i,
                                             igrad_tensor_info_t *out);
/** @return index of the tensor with this name, or -1. */
IGRAD_API int igrad_layout_find(const igrad_layout_t *layout, const char *name);
/** @return number of (layer, kind) components (OTHER is not one). */
IGRAD_API size_t igrad_layout_component_count(const igrad_layout_t *layout);
/** Copies component i (ordered by layer, then kind). */
IGRAD_API igrad_status_t igrad_layout_component(const igrad_layout_t *layout, size_t i,
                                                igrad_component_info_t *out);
/** @return a 64-bit hash of (names, dtypes, shapes) in order, and, when a
 *  name map changed any tensor's component, of every (layer, kind) too. Profiles and saved state
 *  carry it so a file made for another model is refused. */
IGRAD_API uint64_t igrad_layout_hash(const igrad_layout_t *layout);

/* Name rules. The built-in rules map every supported family's names to
 * (layer, kind) (igrad_component_of). A name map is an ordered list of user
 * rules tried first: the first rule whose pattern matches the whole name
 * decides; a name no rule matches falls back to the built-in rules. A
 * pattern is a POSIX extended regular expression (\d is accepted for
 * [0-9]) or, prefixed "glob:", an fnmatch(3) glob in which '*' matches
 * dots too. The map file (one "PATTERN KIND LAYER" rule per line) is in
 * docs/formats.md. */

/** An ordered list of name rules; igrad_name_map_free() releases it. */
typedef struct igrad_name_map igrad_name_map_t;

/** Layer of a rule's tensors: the index after the name's first numbered
 *  block marker (layers.N, h.N, blocks.N, block.N, layer.N). */
#define IGRAD_NAME_LAYER_BLOCK (-2)
/** Layer of a rule's tensors: none (-1; EMB, HEAD, OTHER and outer NORM).
 *  A positive value g (1..9) takes the layer from regex capture group g. */
#define IGRAD_NAME_LAYER_NONE (-1)

/** Creates an empty name map. */
IGRAD_API igrad_status_t igrad_name_map_create(igrad_name_map_t **out);
/** Appends a rule: names matching `pattern` are (layer, kind). Q..FC2 need
 *  a layer (block or a group), EMB, HEAD and OTHER take none, NORM either.
 *  @return IGRAD_E_INVALID naming the rule for a pattern that does not
 *  compile, a group the pattern lacks, or a kind/layer that do not fit. */
IGRAD_API igrad_status_t igrad_name_map_add(igrad_name_map_t *map, const char *pattern,
                                            igrad_kind_t kind, int layer);
/** Reads a map file (docs/formats.md). @return IGRAD_E_FORMAT naming the
 *  file and line, IGRAD_E_IO if it cannot be read. */
IGRAD_API igrad_status_t igrad_name_map_load(const char *path, igrad_name_map_t **out);
/** Frees a name map. NULL is a no-op. */
IGRAD_API void igrad_name_map_free(igrad_name_map_t *map);
/** @return the number of rules (0 for NULL). */
IGRAD_API size_t igrad_name_map_count(const igrad_name_map_t *map);
/** The (layer, kind) of a name under the map's rules, then the built-in
 *  ones (map may be NULL: the built-in rules alone). @return
 *  IGRAD_E_INVALID when the matching rule's layer cannot be read from the
 *  name (no numbered block, or a group that captured no number). */
IGRAD_API igrad_status_t igrad_name_map_component_of(const igrad_name_map_t *map,
                                                     const char *name, igrad_kind_t *kind,
                                                     int *layer);
/** Gives an empty layout a name map (copied; NULL removes it): every
 *  tensor added afterwards is mapped by it. When the map assigns any tensor
 *  another (layer, kind) than the built-in rules, the layout hashes every
 *  tensor's (layer, kind) too (igrad_layout_hash), so ranks and files with
 *  different assignments disagree by the layout hash.
 *  @return IGRAD_E_INVALID if the layout already has tensors. */
IGRAD_API igrad_status_t igrad_layout_set_name_map(igrad_layout_t *layout,
                                                   const igrad_name_map_t *map);
/** A new layout with the tensors, order and family of `layout`, mapped by
 *  `map` (NULL: the built-in rules). Use it on a loaded layout. */
IGRAD_API igrad_status_t igrad_layout_remap(const igrad_layout_t *layout,
                                            const igrad_name_map_t *map, igrad_layout_t **out);
/** @return 1 if tensor i lies inside a numbered block but maps to OTHER
 *  (no rule knew its name: it is sent every step, never profiled or
 *  deferred), 0 otherwise or out of range. */
IGRAD_API int igrad_layout_is_unmapped(const igrad_layout_t *layout, size_t i);
/** The warning for a layout's unmapped tensors (igrad_layout_is_unmapped):
 *  their number and share of the entries, then at most `max_names` of
 *  them with their shares, and how to map them. *text is NULL when there
 *  are none, else a string to release with igrad_free(). The library
 *  never prints it: the trainer and the Python binding do. */
IGRAD_API igrad_status_t igrad_layout_unmapped_report(const igrad_layout_t *layout,
                                                      size_t max_names, char **text);

/** Renders the layout as the JSON object printed by `igrad layout --json`:
 *  {"family", "total_numel", "tensors": [{"name","shape","numel","layer",
 *  "kind"}...], "kinds": {"Q": weight tensors of kind Q, ...}}.
 *  @param json_out receives a string to release with igrad_free(). */
IGRAD_API igrad_status_t igrad_layout_to_json(const igrad_layout_t *layout, char **json_out);

/* ------------------------------------------------------------------------ */
/* Selection with error feedback                                            */
/* ------------------------------------------------------------------------ */

/** Sparsifier applied to the error-feedback-corrected gradient a = g + e. */
typedef enum igrad_sparsifier {
    IGRAD_SPARSIFIER_NONE = 0,   /**< dense: every entry is kept */
    IGRAD_SPARSIFIER_TOPK = 1,   /**< exact top-k of |a| over the flat tensor */
    IGRAD_SPARSIFIER_ADTOPK = 2  /**< row-wise top-k for 2-D tensors (ADTopk) */
} igrad_sparsifier_t;

/** @return "none", "topk" or "adtopk". */
IGRAD_API const char *igrad_sparsifier_name(igrad_sparsifier_t sp);
/** Parses a sparsifier name. @return IGRAD_E_INVALID if unknown. */
IGRAD_API igrad_status_t igrad_sparsifier_from_name(const char *name, igrad_sparsifier_t *sp);

/** @return the per-step budget of a tensor with n entries:
 *  ceil(density * n), at least 1 and at most n (0 when n <= 0). The product
 *  is evaluated in double as written, so math.ceil(density * n) in Python
 *  agrees (ceil(0.07 * 100) is 8). */
IGRAD_API int64_t igrad_budget(int64_t n, double density);

/** What a selection keeps for one tensor at one step. A pure function of
 *  (sparsifier, density, scale, interleave, step, shape), so every rank
 *  computes the same spec. */
typedef struct igrad_select_spec {
    int row_wise;    /**< 1: per_row entries from each row, column indices */
    int64_t rows;    /**< row_wise: shape[0]; else 1 */
    int64_t cols;    /**< row_wise: entries per row; else n */
    int64_t per_row; /**< row_wise: entries kept per row; else = count */
    int64_t count;   /**< total entries kept (rows * per_row when row_wise) */
    int64_t n;       /**< entries of the tensor */
} igrad_select_spec_t;

/** Computes a spec.
 *  topk: count = min(n, ceil(scale * budget(n, density))), flat.
 *  adtopk on a tensor with ndim >= 2 (rows = shape[0], cols = the rest):
 *  per_row = min(cols, ceil(scale * max(1, ceil(density * cols)))),
 *  row-wise; on 1-D tensors as topk. With interleave, odd steps select
 *  the same count flat (row_wise = 0), even steps row-wise.
 *  none: count = n, flat.
 *  `scale` (>= 1 normally 1.0) lets a release send ceil(kappa*R*k).
 *  @return IGRAD_E_INVALID for density outside (0, 1], scale <= 0 or a bad
 *  shape. */
IGRAD_API igrad_status_t igrad_select_spec(igrad_sparsifier_t sp, double density, double scale,
                                           int interleave, int64_t step, int ndim,
                                           const int64_t *shape, igrad_select_spec_t *out);

/** Scratch space for igrad_select_ef(); grows as needed. Not thread-safe:
 *  use one per thread. */
typedef struct igrad_select_ws igrad_select_ws_t;
IGRAD_API igrad_status_t igrad_select_ws_create(igrad_select_ws_t **out);
IGRAD_API void igrad_select_ws_free(igrad_select_ws_t *ws);
/** @return bytes currently held by the workspace. */
IGRAD_API size_t igrad_select_ws_nbytes(const igrad_select_ws_t *ws);

/** Output of one selection. The caller provides index and value arrays with
 *  room for spec->count entries (index may be NULL for a dense spec). */
typedef struct igrad_selection {
    uint32_t *index; /**< ascending: flat index, or (row_wise) per row the
                          column indices of that row, rows in order */
    float *value;    /**< a at those positions */
    int64_t count;   /**< entries written (= spec->count) */
    int row_wise;    /**< copy of spec->row_wise */
    double sumsq;    /**< sum of value^2 (for the activity trace) */
} igrad_selection_t;

/** Fused error feedback + selection + residual update, O(n):
 *  a = grad + residual; keep the spec's entries of largest |a| (ties: the
 *  lower index wins); residual = a with the kept entries set to 0.
 *  grad and residual have spec->n floats and must not overlap; residual is
 *  updated in place. The result is exact and deterministic. Tensors of
 *  2^21 entries or more are split over OpenMP threads (up to
 *  omp_get_max_threads(); one thread when called inside a parallel region),
 *  which changes only the time taken.
 *  @param name names the tensor in error messages (may be NULL).
 *  @return IGRAD_E_NONFINITE if a has a NaN or Inf (the message names the
 *  tensor and the first bad flat index); the residual is then untouched,
 *  out's arrays may have been written. IGRAD_E_INVALID for an inconsistent
 *  spec (count outside 1..n; row-wise: rows * cols != n or count !=
 *  rows * per_row) or a NULL index array with a sparse spec. */
IGRAD_API igrad_status_t igrad_select_ef(const float *grad, float *residual,
                                         const igrad_select_spec_t *spec, const char *name,
                                         igrad_select_ws_t *ws, igrad_selection_t *out);

/** Error feedback for a tensor that is not sent this step: residual += grad.
 *  @return IGRAD_E_NONFINITE (residual untouched, the message names the
 *  tensor and the first bad index) on NaN/Inf. */
IGRAD_API igrad_status_t igrad_residual_accumulate(const float *grad, float *residual,
                                                   int64_t n, const char *name);

/* ------------------------------------------------------------------------ */
/* Activity trace and importance profile                                    */
/* ------------------------------------------------------------------------ */

/** Activity of retained gradient per step and component:
 *  a[s,c] = sqrt(sum of retained v^2) / sqrt(n_c). */
typedef struct igrad_trace igrad_trace_t;

/** Creates an empty trace for a layout's components. */
IGRAD_API igrad_status_t igrad_trace_create(const igrad_layout_t *layout, igrad_trace_t **out);
/** Adds one tensor's selection at `step`: sumsq (sum of the retained
 *  values squared) and the retained count accumulate into the tensor's
 *  component at that step; OTHER tensors are ignored. Components not
 *  recorded at a step have activity 0 and retained 0 there.
 *  @return IGRAD_E_INVALID if the step decreases or is outside [0, 2^53),
 *  sumsq is negative or not finite, the component would retain more than
 *  its entries (a tensor recorded twice), or the trace was loaded from a
 *  file. A failed call changes nothing. */
IGRAD_API igrad_status_t igrad_trace_record(igrad_trace_t *trace, int64_t step, size_t tensor,
                                            double sumsq, int64_t retained);
/** Writes the trace CSV v2: the comment line "# igrad-trace v2
 *  layout_hash=0x<16 hex> sparsifier=<name> density=<g>" (pandas:
 *  comment='#'), then `step,layer,component,raw_activity,d_activity,numel,
 *  retained_numel`, one row per step and component (layer, then kind).
 *  The columns mean what the reference method's mean: raw_activity =
 *  sqrt(sum of retained v^2) of the component, d_activity = a[s,c] =
 *  raw_activity / sqrt(numel), the quantity profiles score. Floats are
 *  printed exactly (the shortest of %.15g..%.17g that reads back).
 *  Written to a temporary name and renamed. */
IGRAD_API igrad_status_t igrad_trace_save(const igrad_trace_t *trace, const char *path);
/** Reads a trace CSV: v2 (as igrad_trace_save writes it), v1 (files
 *  written before v2: raw_activity was a[s,c], d_activity a step
 *  difference, checked finite and not kept; a file without the
 *  "# igrad-trace" line is read as v1), or the reference method's component_activity_trace.csv as
 *  its profiling script writes it (`step,seed,model_name,workload_name,
 *  dataset_name,layer,component,raw_activity,d_activity,numel,
 *  retained_numel`; components Q K V QKV O FC1 FC2, GATE and UP as FC1,
 *  DOWN as FC2; one run: seed and names equal on every row). In v2 and the
 *  reference format d_activity must equal raw_activity / sqrt(numel) (to
 *  1e-6) and is the activity. The comment line is optional (without it the
 *  layout hash is 0 = unknown); other '#' lines and blank lines are
 *  skipped. The first step's rows define the components; every step must
 *  list the same ones with the same numel.
 *  @return IGRAD_E_FORMAT naming the file and line for a wrong header,
 *  missing or extra columns, an empty, non-numeric, negative or
 *  non-finite field, an unknown kind or reference component name, a
 *  d_activity that is not raw_activity / sqrt(numel) (v2, reference), a
 *  second run in a reference file, decreasing steps, a duplicate or
 *  missing component, numel changing, retained > numel, or no rows. */
IGRAD_API igrad_status_t igrad_trace_load(const char *path, igrad_trace_t **out);
IGRAD_API void igrad_trace_free(igrad_trace_t *trace);
/** @return number of distinct steps recorded. */
IGRAD_API size_t igrad_trace_step_count(const igrad_trace_t *trace);
/** Tells the trace which sparsifier and density produced the selections it
 *  records; both go into the CSV comment line and into profiles built from
 *  it. Until set they are "unknown" and 0.
 *  @return IGRAD_E_INVALID for an unknown sparsifier or density outside
 *  (0, 1]. */
IGRAD_API igrad_status_t igrad_trace_set_sparsifier(igrad_trace_t *trace, igrad_sparsifier_t sp,
                                                    double density);
/** @return the hash of the layout the trace was made for; 0 = unknown (a
 *  CSV read without its "# igrad-trace" line). */
IGRAD_API uint64_t igrad_trace_layout_hash(const igrad_trace_t *trace);
/** @return the sparsifier name ("adtopk", ...; "unknown" if never set). */
IGRAD_API const char *igrad_trace_sparsifier(const igrad_trace_t *trace);
/** @return the density (0 if unknown). */
IGRAD_API double igrad_trace_density(const igrad_trace_t *trace);
/** @return number of components (columns) of the trace. */
IGRAD_API size_t igrad_trace_component_count(const igrad_trace_t *trace);
/** Copies component i (ordered by layer, then kind). `tensors` is 0 for a
 *  trace read from a file (the CSV does not carry it). */
IGRAD_API igrad_status_t igrad_trace_component(const igrad_trace_t *trace, size_t i,
                                               igrad_component_info_t *out);
/** @return the step number of the i-th recorded step, -1 if out of range. */
IGRAD_API int64_t igrad_trace_step(const igrad_trace_t *trace, size_t i);
/** Activity a[s,c] and retained entries of component c at the s-th step
 *  (indices, not step numbers). Either output may be NULL. */
IGRAD_API igrad_status_t igrad_trace_value(const igrad_trace_t *trace, size_t step_index,
                                           size_t component, double *activity,
                                           int64_t *retained);

/** Options of igrad_profile_build(). Initialise with the macro. */
typedef struct igrad_profile_options {
    size_t size;          /**< sizeof(igrad_profile_options_t) */
    double alpha;         /**< weight of magnitude in the score (0.7) */
    const char *method;   /**< "knee", "otsu", "kmeans2", "gmm2",
                               "percentile:P", "fixed:F" */
    int64_t window_begin; /**< first step of the window (inclusive) */
    int64_t window_end;   /**< end of the window (exclusive); -1 = to the end */
} igrad_profile_options_t;

#define IGRAD_PROFILE_OPTIONS_INIT \
    { sizeof(igrad_profile_options_t), 0.7, "knee", 0, -1 }

/** Scores, threshold and important set of a model's components. */
typedef struct igrad_profile igrad_profile_t;

/** One component of a profile. */
typedef struct igrad_profile_entry {
    int layer;
    igrad_kind_t kind;
    int64_t count;        /**< n_c */
    double mean_activity; /**< mean of a[s,c] over the window */
    double magnitude;     /**< min-max normalised mean activity */
    double persistence;   /**< share of steps above the per-step median */
    double score;         /**< alpha*magnitude + (1-alpha)*persistence */
    int important;        /**< score >= threshold */
} igrad_profile_entry_t;

/** Computes the profile of a trace over the window: the trace's steps s
 *  with window_begin <= s < window_end.
 *  magnitude = min-max normalised mean activity (1 for all if all equal);
 *  persistence = share of window steps where a[s,c] is strictly above the
 *  median over components of a[s,.] (mean of the middle two for an even
 *  count); score = alpha*magnitude + (1-alpha)*persistence; tau by
 *  opts->method (NULL = "knee"), see igrad_partition().
 *  @return IGRAD_E_INVALID for an empty window (the message names the
 *  trace's step range), an unknown method, alpha outside [0, 1] or a trace
 *  without components. */
IGRAD_API igrad_status_t igrad_profile_build(const igrad_trace_t *trace,
                                             const igrad_profile_options_t *opts,
                                             igrad_profile_t **out);
/** Threshold tau over a set of scores by a partition method; a component
 *  is important when score >= tau. Exposed for tests and analysis.
 *  - "knee": scores sorted descending, index and score normalised to
 *    [0, 1]; tau = the score of the point farthest from the chord between
 *    the first and last point (ties: the first). The knee point itself is
 *    important: on a two-level set with fewer high than low scores, it is
 *    the highest low score.
 *  - "otsu": 256-bin histogram over [min, max]; the bin boundary that
 *    maximises the between-class variance; tau = the smallest score at or
 *    above it. Differs from kmeans2 only through the binning.
 *  - "kmeans2": exact two-cluster split of the sorted scores with minimum
 *    within-cluster SSE; tau = the smallest score of the upper cluster.
 *  - "gmm2": two Gaussians fitted by EM (start: means at the 25th/75th
 *    percentiles, overall variance, equal weights; variance floor
 *    (1e-3 (max - min))^2; at most 1000 iterations, relative log-likelihood
 *    tolerance 1e-10); tau = the point between the means where the
 *    posteriors are equal (the midpoint of the means if there is none).
 *  - "percentile:P": P in [0, 100], linear interpolation (numpy's default).
 *  - "fixed:F": F in (0, 1]; the m = max(1, ceil(F n)) highest scores are
 *    important, tau = the m-th largest (ceil with 1e-9 relative slack, so
 *    that 0.07 * 100 counts as 7).
 *  tau is clamped into [min, max]. All scores equal (or n = 1): tau = that
 *  value for every method, all are important.
 *  @return IGRAD_E_INVALID for an unknown method, a malformed parameter,
 *  n = 0 or a non-finite score. */
IGRAD_API igrad_status_t igrad_partition(const double *scores, size_t n, const char *method,
                                         double *tau);
/** Writes the profile JSON (schema version, layout hash, method, alpha,
 *  tau, window, components). Temporary name + rename. */
IGRAD_API igrad_status_t igrad_profile_save_json(const igrad_profile_t *profile,
                                                 const char *path);
/** Writes the reference method's CSV: layer,component,final_score,
 *  global_tau,is_important (is_important is 1 or 0; scores and tau with 17
 *  significant digits so that final_score >= global_tau reproduces it). */
IGRAD_API igrad_status_t igrad_profile_save_csv(const igrad_profile_t *profile,
                                                const char *path);
/** Reads a profile JSON and checks all of it (schema, version, types,
 *  ranges, kinds, duplicate components, important == (score >= tau));
 *  IGRAD_E_FORMAT names the file and the key or component.
 *  If `layout` is not NULL its hash and components (layer, kind, numel)
 *  must match the profile's (IGRAD_E_MISMATCH otherwise); a profile whose
 *  layout hash is unknown (0x0000000000000000, made from a trace without
 *  its comment line) is checked on the components only. A layout's EMB,
 *  HEAD or NORM component that the profile lacks (a profile from before
 *  those kinds existed) is accepted and treated as important by the
 *  engine; a missing projection component is IGRAD_E_MISMATCH. */
IGRAD_API igrad_status_t igrad_profile_load(const char *path, const igrad_layout_t *layout,
                                            igrad_profile_t **out);
IGRAD_API void igrad_profile_free(igrad_profile_t *profile);
IGRAD_API size_t igrad_profile_count(const igrad_profile_t *profile);
/** Copies entry i (ordered by layer, then kind). */
IGRAD_API igrad_status_t igrad_profile_entry(const igrad_profile_t *profile, size_t i,
                                             igrad_profile_entry_t *out);
IGRAD_API double igrad_profile_threshold(const igrad_profile_t *profile);
IGRAD_API uint64_t igrad_profile_layout_hash(const igrad_profile_t *profile);
IGRAD_API const char *igrad_profile_method(const igrad_profile_t *profile);
/** @return 1 if (layer, kind) is important, 0 if low-importance, -1 if the
 *  profile has no such component (the engine reads -1 on an EMB, HEAD or
 *  NORM component as important). */
IGRAD_API int igrad_profile_is_important(const igrad_profile_t *profile, int layer,
                                         igrad_kind_t kind);
/** Re-marks the important set: important = (score >= tau), for every
 *  entry; the profile's threshold becomes tau (saved files stay
 *  consistent). Used by the budget-driven plan (igrad_target_fit).
 *  @return IGRAD_E_INVALID for a NULL profile or a non-finite tau. */
IGRAD_API igrad_status_t igrad_profile_set_threshold(igrad_profile_t *profile, double tau);

/** @return the sparsifier the trace was made with ("unknown" if not said). */
IGRAD_API const char *igrad_profile_sparsifier(const igrad_profile_t *profile);
/** @return the sparsifier's density (0 if unknown). */
IGRAD_API double igrad_profile_density(const igrad_profile_t *profile);
/** @return alpha, the weight of magnitude in the score. */
IGRAD_API double igrad_profile_alpha(const igrad_profile_t *profile);
/** The window [begin, end) the profile was built over (end resolved when
 *  it was -1: last step + 1) and the number of trace steps inside it. Any
 *  output may be NULL. */
IGRAD_API void igrad_profile_window(const igrad_profile_t *profile, int64_t *begin,
                                    int64_t *end, size_t *steps);

/* ------------------------------------------------------------------------ */
/* Communicators                                                            */
/* ------------------------------------------------------------------------ */

/* A communicator runs the collectives of one group of ranks. The engine
 * never calls MPI itself: it talks to an igrad_comm_t, whose backend is
 *   "self"    one rank, no MPI needed (collectives are copies),
 *   "mpi"     a duplicate of a caller's MPI communicator,
 *   "custom"  the caller's callbacks (igrad_comm_ops_t), e.g. the Python
 *             binding running collectives through torch.distributed.
 *
 * Collective calls must be made by every rank of the comm in the same order
 * with the same sizes, dtypes and roots (as in MPI). Arguments are checked
 * locally: an invalid argument on one rank returns IGRAD_E_INVALID there
 * and leaves the other ranks waiting, so agree on arguments first.
 * A comm may be used by one thread at a time.
 *
 *   igrad_comm_t *comm = NULL;
 *   igrad_comm_create_mpi(NULL, &comm);              // MPI_COMM_WORLD
 *   igrad_comm_request_t *req[2];
 *   igrad_comm_iallgather(comm, idx, m * 4, all_idx, &req[0]);
 *   igrad_comm_iallreduce(comm, dense, dense, n, IGRAD_DTYPE_F32,
 *                         IGRAD_REDUCE_SUM, &req[1]); // in place
 *   ... pack the next bucket ...
 *   igrad_comm_wait(comm, req[1]);
 *   igrad_comm_wait(comm, req[0]);
 *   igrad_comm_free(comm);                            // before MPI_Finalize
 */
typedef struct igrad_comm igrad_comm_t;

/** A non-blocking collective in flight. Every request must be passed to
 *  igrad_comm_wait() exactly once; wait releases it. */
typedef struct igrad_comm_request igrad_comm_request_t;

/** Reduction of igrad_comm_allreduce(). MAX over I64 flags agrees on "did
 *  any rank fail"; MAX == MIN over a hash agrees on "all ranks equal". */
typedef enum igrad_reduce_op {
    IGRAD_REDUCE_SUM = 0,
    IGRAD_REDUCE_MAX = 1,
    IGRAD_REDUCE_MIN = 2
} igrad_reduce_op_t;

/** Where a custom communicator's non-blocking collectives take their
 *  buffers (igrad_comm_ops_t.memory). */
typedef enum igrad_memory {
    IGRAD_MEMORY_HOST = 0, /**< host memory (every engine of igrad_engine_create) */
    IGRAD_MEMORY_CUDA = 1  /**< CUDA device memory (igrad_engine_create_cuda, igrad_cuda.h) */
} igrad_memory_t;

/** Callbacks of a custom backend. `user` is the pointer given to
 *  igrad_comm_create_custom(). Each returns IGRAD_OK or a failure status
 *  (a value that is not an igrad_status_t is reported as IGRAD_E_COMM).
 *  Buffers are as described at the igrad_comm_* wrappers below; send may
 *  equal recv (in place) and must then be handled. Sizes are never above
 *  what the wrapper was given; when nbytes or count is 0 the buffers may
 *  point to a dummy byte. */
typedef struct igrad_comm_ops {
    /** sizeof(igrad_comm_ops_t) as the caller compiled it. A table that
     *  ends before group_start (the first version's) is refused; the
     *  fields a smaller, older table lacks are taken as NULL, and a larger
     *  (newer) table is accepted with its unknown trailing fields ignored. */
    size_t size;
    /* Required. */
    igrad_status_t (*allgather)(void *user, const void *send, size_t nbytes, void *recv);
    igrad_status_t (*allreduce)(void *user, const void *send, void *recv, size_t count,
                                igrad_dtype_t dtype, igrad_reduce_op_t op);
    igrad_status_t (*bcast)(void *user, void *buf, size_t nbytes, int root);
    igrad_status_t (*barrier)(void *user);
    /* Optional non-blocking variants. Each stores an opaque handle of the
     * caller's in *handle (left NULL: the operation already completed, and
     * test/wait are not called for it). When a variant is NULL, the
     * blocking callback runs at issue time and waiting is a no-op. `wait`
     * is required if either exists. */
    igrad_status_t (*iallgather)(void *user, const void *send, size_t nbytes, void *recv,
                                 void **handle);
    igrad_status_t (*iallreduce)(void *user, const void *send, void *recv, size_t count,
                                 igrad_dtype_t dtype, igrad_reduce_op_t op, void **handle);
    /** Completes the operation and releases the handle. Called exactly once
     *  per non-NULL handle, also after test reported it done, also when it
     *  fails. */
    igrad_status_t (*wait)(void *user, void *handle);
    /** Optional: sets *done (0/1) without blocking. */
    igrad_status_t (*test)(void *user, void *handle, int *done);
    /** Optional: text explaining the last failing callback, copied into
     *  igrad_last_error() (may return NULL). */
    const char *(*error_message)(void *user);
    /** Optional: called once by igrad_comm_free() to release `user`. */
    void (*destroy)(void *user);
    /** Optional, both or neither (added after the fields above; older
     *  tables go without): an engine step's non-blocking collectives are
     *  issued between group_start and group_end, so a backend can batch
     *  them (e.g. torch.distributed's coalescing). While a group is open,
     *  test is not called on its handles (they read as not done), wait is
     *  refused and so are blocking collectives; after a failing group_end,
     *  wait must still release the group's handles. */
    igrad_status_t (*group_start)(void *user);
    igrad_status_t (*group_end)(void *user);
    /** Optional (added after group_end; a table without it means
     *  IGRAD_MEMORY_HOST): where the buffers of iallgather and iallreduce
     *  (and of ireduce, ibcast and alltoallv below) live.
     *  IGRAD_MEMORY_CUDA: device memory of the engine's CUDA device
     *  (the bucket buffers of an igrad_engine_create_cuda engine, which
     *  refuses a host comm, as igrad_engine_create refuses a CUDA one);
     *  iallgather, iallreduce and wait are then required. The blocking
     *  callbacks allgather, allreduce, bcast and barrier (the engine's
     *  agreement, the igrad_comm_* wrappers) take host buffers either way;
     *  alltoallv, blocking too, takes buffers in this memory. */
    igrad_memory_t memory;
    /** Optional, with IGRAD_MEMORY_CUDA: called before each iallgather /
     *  iallreduce (and ireduce, ibcast, alltoallv) with the cudaStream_t
     *  the engine's data plane runs on (NULL: the default stream); the
     *  collective must start after the work queued there so far (the
     *  bucket was packed there) and work queued there after wait returns
     *  (alltoallv: after it returns) must see its result. */
    igrad_status_t (*set_stream)(void *user, void *stream);
    /** Optional, all three or none (added after set_stream): what an engine
     *  with config.topology hier needs, on buffers in the table's memory
     *  (host; with IGRAD_MEMORY_CUDA device memory, set_stream called
     *  before each as before iallgather); without them it refuses the comm. `split`: collective over this comm; makes the comm
     *  of the ranks with the same color (>= 0; -1: the ranks on this
     *  rank's node, as the backend knows them), ordered by key, then rank:
     *  its table in *ops_out (it must outlive that comm; its destroy, if
     *  any, releases *user_out when that comm is freed), its user and this
     *  rank's place (*rank_out of *size_out). `ireduce`: non-blocking
     *  reduction of count elements of every rank's send into root's recv
     *  (recv is NULL on the other ranks; send is only read). `ibcast`:
     *  non-blocking broadcast of nbytes from root's buf into every rank's
     *  buf. Both store a handle as iallgather does (wait required). */
    igrad_status_t (*split)(void *user, int color, int key,
                            const struct igrad_comm_ops **ops_out, void **user_out,
                            int *rank_out, int *size_out);
    igrad_status_t (*ireduce)(void *user, const void *send, void *recv, size_t count,
                              igrad_dtype_t dtype, igrad_reduce_op_t op, int root,
                              void **handle);
    igrad_status_t (*ibcast)(void *user, void *buf, size_t nbytes, int root, void **handle);
    /** Optional (added after ibcast; without it the comm has no sparse
     *  all-reduce: config.collective sparse_reduce is refused and
     *  collective auto never chooses it): blocking variable all-to-all of
     *  bytes, collective over the comm. send + send_displs[j]
     *  (send_nbytes[j] bytes) goes to rank j; rank j's block for this rank
     *  lands at recv + recv_displs[j] (recv_nbytes[j] bytes, which equals
     *  what rank j sends here). The four arrays have `size` entries and are
     *  host memory; the blocks lie inside their buffers and send does not
     *  overlap recv. The buffers are host memory with IGRAD_MEMORY_HOST;
     *  with IGRAD_MEMORY_CUDA they are device memory of the engine's CUDA
     *  device and set_stream is called before each, as before iallgather.
     *  Either way the call is blocking: it returns when the bytes have
     *  landed (on a device, when the host may copy them out and work queued
     *  on that stream afterwards sees them). */
    igrad_status_t (*alltoallv)(void *user, const void *send, const size_t *send_nbytes,
                                const size_t *send_displs, void *recv,
                                const size_t *recv_nbytes, const size_t *recv_displs);
} igrad_comm_ops_t;

/** Creates a one-rank communicator (rank 0 of 1). Needs no MPI. */
IGRAD_API igrad_status_t igrad_comm_create_self(igrad_comm_t **out);

/** Wraps an MPI communicator. Collective over its ranks: it MPI_Comm_dup's
 *  the communicator (igrad's traffic never mixes with the caller's) and
 *  sets MPI_ERRORS_RETURN on the duplicate, so a failing MPI call returns
 *  IGRAD_E_COMM with MPI's error text and the operation's name instead of
 *  aborting the process. The caller's communicator is not modified.
 *  @param mpi_comm points to an MPI_Comm (passed by pointer so that igrad.h
 *  needs no mpi.h); NULL means MPI_COMM_WORLD.
 *  @return IGRAD_E_STATE if MPI is not initialized or already finalized,
 *  IGRAD_E_INVALID for MPI_COMM_NULL, IGRAD_E_UNSUPPORTED if the MPI
 *  plugin libigrad_mpi.so cannot be loaded (a build without MPI, or no MPI
 *  library on this machine; the message says which file and why):
 *  libigrad.so itself links no MPI library and loads it on first use. */
IGRAD_API igrad_status_t igrad_comm_create_mpi(const void *mpi_comm, igrad_comm_t **out);

/** Creates a communicator whose collectives are the caller's callbacks.
 *  The table is copied; `user` is borrowed (see ops->destroy).
 *  @param rank, size this process's rank in [0, size) and the group size.
 *  @return IGRAD_E_INVALID (naming the field) for a table that is too
 *  small, lacks a required callback, has i* callbacks without wait or
 *  only one of group_start/group_end, an unknown memory, IGRAD_MEMORY_CUDA
 *  without iallgather/iallreduce, set_stream with host memory, or for a
 *  bad rank/size. */
IGRAD_API igrad_status_t igrad_comm_create_custom(const igrad_comm_ops_t *ops, void *user,
                                                  int rank, int size, igrad_comm_t **out);

/** Frees a communicator; NULL is a no-op. For "mpi" it frees the duplicate
 *  communicator, which MPI requires to happen before MPI_Finalize (after
 *  MPI_Finalize only igrad's memory is released). Wait for every request
 *  first: requests still pending are leaked, not cancelled. */
IGRAD_API void igrad_comm_free(igrad_comm_t *comm);

/** @return this process's rank (-1 for a NULL comm). */
IGRAD_API int igrad_comm_rank(const igrad_comm_t *comm);
/** @return the number of ranks (0 for a NULL comm). */
IGRAD_API int igrad_comm_size(const igrad_comm_t *comm);
/** @return "self", "mpi" or "custom" ("" for a NULL comm). */
IGRAD_API const char *igrad_comm_backend(const igrad_comm_t *comm);

/** Sets how long each later collective on `comm` may take (seconds; 0, the
 *  default of a new comm, waits forever). The engine sets its own
 *  config.timeout_s for the duration of each of its calls and restores this
 *  value afterwards.
 *
 *  "mpi": every operation, blocking ones included, runs as non-blocking MPI
 *  calls (always: MPI never matches a blocking collective with a
 *  non-blocking one, so ranks with and without a timeout stay compatible);
 *  with a timeout they are polled with MPI_Testall (spinning for the first
 *  0.2 s, then sleeping with a backoff of at most 1 ms), so a stopped or
 *  wedged rank makes the others return IGRAD_E_TIMEOUT within about
 *  `seconds`. A timed-out MPI operation
 *  cannot be cancelled portably: it is left pending, its buffers may still
 *  be written if the missing rank ever joins (keep them allocated; the
 *  engine leaks its own on purpose), and the comm is unusable from then on
 *  (every later call fails fast with IGRAD_E_STATE quoting the timeout;
 *  igrad_comm_free() then releases only igrad's memory). The job must be
 *  aborted (MPI_Abort), which the library itself never calls.
 *  "self": collectives complete at once; the value is stored, never used.
 *  "custom": the callbacks own their timeouts (the value is stored for the
 *  caller's information only; a callback that gives up returns
 *  IGRAD_E_TIMEOUT, which igrad passes on as it is).
 *  @return IGRAD_E_INVALID for a NULL comm or a value that is not a finite
 *  number >= 0. */
IGRAD_API igrad_status_t igrad_comm_set_timeout(igrad_comm_t *comm, double seconds);

/** @return the comm's timeout in seconds (0: none; 0 for a NULL comm). */
IGRAD_API double igrad_comm_timeout(const igrad_comm_t *comm);

/** Every rank contributes `nbytes` bytes from `send`; `recv` receives
 *  size * nbytes bytes: rank r's block at recv + r * nbytes. In place:
 *  send == recv + rank * nbytes (this rank's block already there); any
 *  other overlap of send and recv is IGRAD_E_INVALID. Buffers may be NULL
 *  when nbytes is 0. Messages above INT_MAX bytes are split internally.
 *  @return IGRAD_E_COMM (with the backend's message) if the collective
 *  failed. */
IGRAD_API igrad_status_t igrad_comm_allgather(igrad_comm_t *comm, const void *send,
                                              size_t nbytes, void *recv);

/** Element-wise reduction of `count` elements over all ranks into `recv`
 *  on every rank. dtype is IGRAD_DTYPE_F32, F64 or I64 (others:
 *  IGRAD_E_INVALID). In place: send == recv; any other overlap is
 *  IGRAD_E_INVALID. Floating-point sums may differ in the last bits
 *  between backends (the summation order is the backend's). */
IGRAD_API igrad_status_t igrad_comm_allreduce(igrad_comm_t *comm, const void *send,
                                              void *recv, size_t count, igrad_dtype_t dtype,
                                              igrad_reduce_op_t op);

/** Copies `nbytes` bytes of `buf` on rank `root` into `buf` on every rank.
 *  @return IGRAD_E_INVALID for a root outside [0, size). */
IGRAD_API igrad_status_t igrad_comm_bcast(igrad_comm_t *comm, void *buf, size_t nbytes,
                                          int root);

/** Returns once every rank has entered the barrier. */
IGRAD_API igrad_status_t igrad_comm_barrier(igrad_comm_t *comm);

/** Non-blocking igrad_comm_allgather(): starts it and returns a request in
 *  *req. `send` must stay unchanged and `recv` untouched until the request
 *  is waited. Several requests may be in flight and waited in any order
 *  (issue order must be the same on every rank). With MPI, an operation
 *  advances while the process is inside MPI calls (igrad_comm_test(),
 *  igrad_comm_wait(), other collectives). On failure *req is NULL. */
IGRAD_API igrad_status_t igrad_comm_iallgather(igrad_comm_t *comm, const void *send,
                                               size_t nbytes, void *recv,
                                               igrad_comm_request_t **req);

/** Non-blocking igrad_comm_allreduce() (same buffer rules as iallgather). */
IGRAD_API igrad_status_t igrad_comm_iallreduce(igrad_comm_t *comm, const void *send,
                                               void *recv, size_t count,
                                               igrad_dtype_t dtype, igrad_reduce_op_t op,
                                               igrad_comm_request_t **req);

/** Completes a request and releases it (also when it failed: do not wait
 *  it again). NULL is a no-op returning IGRAD_OK.
 *  @return IGRAD_E_INVALID if req was issued by another comm (it is then
 *  not released), IGRAD_E_COMM if the operation failed. */
IGRAD_API igrad_status_t igrad_comm_wait(igrad_comm_t *comm, igrad_comm_request_t *req);

/** Sets *done to 1 if the request has completed, 0 otherwise, without
 *  releasing it (igrad_comm_wait() is still required). Backends that
 *  cannot test without blocking complete the operation here, so a loop
 *  on test always terminates. */
IGRAD_API igrad_status_t igrad_comm_test(igrad_comm_t *comm, igrad_comm_request_t *req,
                                         int *done);

/* ------------------------------------------------------------------------ */
/* Schedule and packing policies                                            */
/* ------------------------------------------------------------------------ */

/** Defaults of the release schedule (DESIGN.md §3). */
#define IGRAD_DEFAULT_RELEASE_PERIOD 4    /**< R: a low component is released every R steps */
#define IGRAD_DEFAULT_RELEASE_KEEP 0.25   /**< kappa: a release sends ceil(kappa*R*k) entries */
/** Default of igrad_config_t.dense_below: tensors of fewer than 64 entries go
 *  whole. Chosen by measurement (docs/results/dense_below.md): the budget of
 *  such a tensor rounds to an entry or two, so it hardly trains (sending
 *  them whole: -0.12 to -0.16 val loss on the tiny model, every seed, for
 *  +13-15 % bytes), while larger norms gain 0.02 % for +7-12 % bytes (the
 *  demo's 256-entry norms), so they stay sparse, as do every tensor of
 *  real LLMs (LLaMA-2-7B's smallest has 4,096 entries). */
#define IGRAD_DEFAULT_DENSE_BELOW 64

/** When a low-importance component is released. Each gets a phase
 *  phi in [0, R) and is sent at the steps where step mod R == phi;
 *  important components and OTHER tensors are sent every step. */
typedef enum igrad_schedule {
    IGRAD_SCHEDULE_ALIGNED = 0,  /**< phi = R-1 for all: releases at steps R-1, 2R-1, ... */
    IGRAD_SCHEDULE_STAGGERED = 1 /**< phases balance the release bytes over the R steps
                                      (longest-processing-time); the default */
} igrad_schedule_t;

/** @return "aligned" or "staggered" ("unknown" for other values). */
IGRAD_API const char *igrad_schedule_name(igrad_schedule_t schedule);
/** Parses a schedule name (case-insensitive). @return IGRAD_E_INVALID if
 *  unknown. */
IGRAD_API igrad_status_t igrad_schedule_from_name(const char *name,
                                                  igrad_schedule_t *schedule);

/** How a step's payload blocks (a tensor's selection cut at block_entries)
 *  are assigned to buckets. Every policy is deterministic and depends only
 *  on block sizes and keys (never on timings), so all ranks agree. */
typedef enum igrad_pack_policy {
    IGRAD_PACK_DIRECT = 0,     /**< buckets fixed once on the full layout; deferred
                                    blocks leave holes (naive baseline) */
    IGRAD_PACK_SEQUENTIAL = 1, /**< blocks in readiness order; a bucket closes once
                                    its load reaches total/B */
    IGRAD_PACK_GREEDY = 2,     /**< largest block first into the lightest bucket (LPT) */
    IGRAD_PACK_RISK = 3,       /**< greedy on mean + std of each block's
                                    observed size history */
    IGRAD_PACK_CONTIGUOUS = 4  /**< optimal contiguous split of the readiness order
                                    (smallest largest bucket), so buckets can
                                    launch during backward */
} igrad_pack_policy_t;

/** @return "direct", "sequential", "greedy", "risk" or "contiguous"
 *  ("unknown" for other values). */
IGRAD_API const char *igrad_pack_policy_name(igrad_pack_policy_t policy);
/** Parses a packing policy name (case-insensitive). @return
 *  IGRAD_E_INVALID if unknown. */
IGRAD_API igrad_status_t igrad_pack_policy_from_name(const char *name,
                                                     igrad_pack_policy_t *policy);

/** Balance of one step's buckets, computed from their loads (bytes). */
typedef struct igrad_pack_metrics {
    double imbalance;   /**< max/min load; +inf when some bucket is empty while
                             another is not; 1.0 when all are empty */
    double cv;          /**< coefficient of variation: population std / mean
                             over all buckets (0 when the mean is 0) */
    int overflow;       /**< buckets with load > 1.05 * mean */
    int empty;          /**< buckets with load 0 (they issue no collective) */
    double max_nbytes;  /**< largest load */
    double min_nbytes;  /**< smallest load */
    double mean_nbytes; /**< mean load over all buckets */
} igrad_pack_metrics_t;

/** Computes the metrics of `nbuckets` bucket loads (bytes, finite, >= 0).
 *  @return IGRAD_E_INVALID for nbuckets < 1, NULL pointers or a negative or
 *  non-finite load. Thread-safe. */
IGRAD_API igrad_status_t igrad_pack_metrics_compute(const double *loads, int nbuckets,
                                                    igrad_pack_metrics_t *out);

/* ------------------------------------------------------------------------ */
/* Sync engine                                                              */
/* ------------------------------------------------------------------------ */

/* The engine runs one synchronization step on every rank (DESIGN.md §2):
 * error feedback, the importance gate and release schedule, selection,
 * balanced bucket packing, the collectives and the averaged result, with
 * per-step statistics. Every rank creates its engine with the same layout,
 * profile and config; the engine checks that they agree.
 *
 *   igrad_config_t cfg = IGRAD_CONFIG_INIT;          // method ig, rho 1%
 *   igrad_engine_t *eng = NULL;
 *   igrad_comm_create_mpi(NULL, &comm);
 *   if (igrad_engine_create(layout, profile, &cfg, comm, &eng) != IGRAD_OK)
 *       fail(igrad_last_error());                    // same status on every rank
 *   for (int64_t step = 0; step < steps; step++) {
 *       backward(grads);                             // grads[t]: float* per tensor
 *       igrad_status_t st = igrad_engine_sync(eng, step, grads);
 *       if (st == IGRAD_E_NONFINITE) continue;       // every rank skips it
 *       optimizer_step(grads);                       // grads = mean over ranks
 *   }
 *   igrad_engine_save_state(eng, "state.rank3.bin");
 *   igrad_engine_free(eng);
 *
 * Two-phase use (the caller runs the collectives, e.g. through NCCL or
 * torch.distributed):
 *   const igrad_bucket_t *b; size_t nb;
 *   igrad_engine_begin(eng, step, grads, &b, &nb);
 *   for (i < nb) b[i].kind == IGRAD_BUCKET_GATHER
 *                    ? allgather(b[i].send, b[i].send_nbytes, b[i].recv)
 *                    : allreduce_sum_in_place((float *)b[i].recv, b[i].count);
 *   igrad_engine_end(eng, step, grads);
 *
 * Streamed use (overlap with backward: the same step, bit for bit, given
 * tensor by tensor as their gradients become final):
 *   igrad_engine_open(eng, step);
 *   on each finished group of tensors idx[0..n) with gradients g[0..n):
 *       igrad_engine_ready(eng, step, idx, n, g, &b, &nb);
 *       issue b[0..nb) at once (non-blocking), in that order;
 *   wait every issued collective;
 *   igrad_engine_close(eng, step);     // agreement, residuals, results
 *
 * Wire format. A gather bucket is one allgather of send_nbytes per rank;
 * recv holds every rank's bytes in rank order (size * send_nbytes). Its
 * bytes are [values (value_dtype: F32, BF16/F16 codes, or per block an
 * F32 scale and F8_E4M3 codes) of every block][32-bit indices][16-bit
 * indices] (compact index codes: docs/formats.md §8);
 * every rank's block of a bucket has the same size because budgets are
 * known to all ranks. Row-wise (adtopk) selections send column indices,
 * 16-bit when the row has at most 65536 entries and index_dtype allows.
 * A reduce bucket is an in-place SUM all-reduce of `count` F32 values
 * (send == recv): the selected entries scattered into zeros over the dense
 * range of the bucket's tensors (or rows) — the same average as the sparse
 * path at a different wire cost (sums may differ in the last bits, as the
 * summation order is the backend's). The engine scales by 1/P exactly
 * once, when it unpacks (a product: the exact quotient for P a power of 2),
 * adding the ranks' contributions in bucket order and rank order, so every
 * rank computes bit-identical results.
 */

/** What a run synchronizes (DESIGN.md §3, "Methods"). */
typedef enum igrad_method {
    IGRAD_METHOD_DENSE = 0,       /**< all-reduce of the full gradient; no residuals */
    IGRAD_METHOD_TOPK_SYNC = 1,   /**< every tensor's top-k every step */
    IGRAD_METHOD_ADTOPK_SYNC = 2, /**< every tensor's ADTopk every step */
    IGRAD_METHOD_IAD = 3,         /**< importance-aware deferral: important components
                                       and OTHER every step, low components at their
                                       release step with the sparsifier's normal
                                       budget k; one collective per sent tensor */
    IGRAD_METHOD_IG = 4           /**< iad + release budget ceil(kappa*R*k) + balanced
                                       bucket packing (the full system) */
} igrad_method_t;

/** @return "dense", "topk_sync", "adtopk_sync", "iad" or "ig" ("unknown"
 *  for other values). */
IGRAD_API const char *igrad_method_name(igrad_method_t method);
/** Parses a method name (case-insensitive). @return IGRAD_E_INVALID if
 *  unknown. */
IGRAD_API igrad_status_t igrad_method_from_name(const char *name, igrad_method_t *method);

/** What happens to the gradient of a low-importance component at a step
 *  where it is not sent. */
typedef enum igrad_residual_policy {
    IGRAD_RESIDUAL_ON = 0,  /**< accumulate it in the residual (nothing is lost) */
    IGRAD_RESIDUAL_DROP = 1 /**< ablation: discard grad + residual (the residual
                                 becomes 0); stats report the discarded mass */
} igrad_residual_policy_t;

/** @return "on" or "drop" ("unknown" for other values). */
IGRAD_API const char *igrad_residual_policy_name(igrad_residual_policy_t policy);
/** Parses "on" or "drop" (case-insensitive). */
IGRAD_API igrad_status_t igrad_residual_policy_from_name(const char *name,
                                                         igrad_residual_policy_t *policy);

/** How a gather bucket codes its indices (config.index_code). */
typedef enum igrad_index_code {
    IGRAD_INDEX_CODE_FIXED = 0,  /**< index_dtype's fixed widths (16 or 32 bits) */
    IGRAD_INDEX_CODE_COMPACT = 1 /**< per row: Elias-Fano, a bitmap or the fixed
                                      width, whichever is smallest (formats.md §8) */
} igrad_index_code_t;

/** @return "fixed" or "compact" ("unknown" for other values). */
IGRAD_API const char *igrad_index_code_name(igrad_index_code_t code);
/** Parses "fixed" or "compact" (case-insensitive). */
IGRAD_API igrad_status_t igrad_index_code_from_name(const char *name, igrad_index_code_t *code);

/** How method ig spends a payload target (config.allocation). */
typedef enum igrad_allocation {
    IGRAD_ALLOCATION_PARTITION = 0, /**< the profile's partition (knee, otsu, ...)
                                         or igrad_target_fit's prefix of the score
                                         order: important components every step,
                                         every other one deferred at one kappa */
    IGRAD_ALLOCATION_BUDGET = 1     /**< the target's bytes allocated across
                                         components: each one every step or
                                         deferred at its own kappa_c in
                                         {1, 1/2, ..., 1/(3R)}, chosen by a
                                         knapsack on score x entries delivered
                                         (decision 0059) */
} igrad_allocation_t;

/** Which collective carries a bucket of a sparse method. */
typedef enum igrad_collective {
    IGRAD_COLLECTIVE_AUTO = 0,   /**< per bucket and step, the smaller modelled wire
                                      cost: allgather (P-1)*m*(index+value bytes)
                                      vs all-reduce 2(P-1)/P*n*4 (ties: gather) */
    IGRAD_COLLECTIVE_GATHER = 1, /**< always allgather of (index, value) */
    IGRAD_COLLECTIVE_REDUCE = 2, /**< always all-reduce of the dense range */
    IGRAD_COLLECTIVE_SPARSE_REDUCE = 3 /**< always the sparse all-reduce
                                      (split by index range, reduce and
                                      re-sparsify to ceil(k/P) per range at
                                      its owner, all-gather): per-rank bytes
                                      about 16 per entry whatever P; the
                                      result is the top of the summed
                                      selections and the rest goes into the
                                      range owner's residual. Only
                                      igrad_engine_sync, F32 gradients, and a
                                      communicator with an all-to-all in the
                                      data plane's memory (CPU: self, MPI,
                                      self_cuda, custom with ops->alltoallv;
                                      CUDA: NCCL, self_cuda, a custom CUDA
                                      one); auto takes it only with
                                      config.auto_sparse_reduce */
} igrad_collective_t;

/** @return "auto", "gather", "reduce" or "sparse_reduce" ("unknown" for
 *  other values). */
IGRAD_API const char *igrad_collective_name(igrad_collective_t collective);
/** Parses a collective name (case-insensitive). */
IGRAD_API igrad_status_t igrad_collective_from_name(const char *name,
                                                    igrad_collective_t *collective);

/** A named link, per GPU and one direction: what `igrad plan` prices a
 *  level with and what config.link_latency_ns / link_bandwidth_mbps can be
 *  set from (docs/plan.md §1: the figures are assumptions, named). */
typedef struct igrad_link_preset {
    const char *name;    /**< "nvlink", "pcie4", "400g", "200g", "100g", "25g", "10g" */
    double gbit_per_s;   /**< bandwidth */
    double latency_us;   /**< latency of one message (alpha) */
    const char *assumes; /**< what the figures assume */
} igrad_link_preset_t;

/** The number of presets; igrad_link_preset(i) for i below it, else NULL. */
IGRAD_API size_t igrad_link_preset_count(void);
IGRAD_API const igrad_link_preset_t *igrad_link_preset(size_t i);
/** Parses a preset name or "GBITS,LAT_US" in plain decimals (no sign, hex,
 *  inf or nan): bandwidth in [0.001, 1e6] Gbit/s, latency in [0.001, 1e6]
 *  us, what the config's integers hold. IGRAD_E_INVALID names the text and
 *  the presets, or the value out of range. */
IGRAD_API igrad_status_t igrad_link_parse(const char *spec, double *gbit_per_s,
                                          double *latency_us);
/** A link as config.link_latency_ns and link_bandwidth_mbps take it: the
 *  nearest integers, clamped to their valid ranges (a latency under 0.5 ns
 *  is 0: auto by bytes alone). */
IGRAD_API void igrad_link_to_config(double gbit_per_s, double latency_us, int64_t *latency_ns,
                                    int64_t *bandwidth_mbps);

/** How the ranks exchange (config.topology). */
typedef enum igrad_topology {
    IGRAD_TOPOLOGY_FLAT = 0, /**< one level: every bucket's collective over all
                                  P ranks */
    IGRAD_TOPOLOGY_HIER = 1  /**< two levels (nodes of L ranks, N = P / L nodes):
                                  each tensor is summed onto its owner inside the
                                  node, the owner runs error feedback, gate and
                                  selection on that node sum and exchanges the
                                  sparse payload with the N owners of the same
                                  shard on the other nodes, then broadcasts the
                                  result inside the node. Residuals live with the
                                  owner. igrad_engine_sync only; MPI (or one-rank)
                                  communicators */
} igrad_topology_t;

/** @return "flat" or "hier" ("unknown" for other values). */
IGRAD_API const char *igrad_topology_name(igrad_topology_t topology);
/** Parses a topology name (case-insensitive). */
IGRAD_API igrad_status_t igrad_topology_from_name(const char *name, igrad_topology_t *topology);

/** Engine configuration. Initialise with IGRAD_CONFIG_INIT, then change
 *  fields. Every rank must use the same values (checked, except threads). */
typedef struct igrad_config {
    size_t size;                      /**< sizeof(igrad_config_t) as compiled */
    igrad_method_t method;            /**< IGRAD_METHOD_IG */
    igrad_sparsifier_t sparsifier;    /**< iad/ig: TOPK or ADTOPK (ADTOPK). topk_sync
                                           and adtopk_sync imply theirs, dense none;
                                           the field is then ignored */
    int interleave;                   /**< adtopk: odd steps flat (0) */
    double density;                   /**< rho in (0, 1] (0.01) */
    int release_period;               /**< R >= 1 (4) */
    double release_keep;              /**< kappa in (0, 1] (0.25); ig only */
    igrad_schedule_t schedule;        /**< release phases (STAGGERED) */
    igrad_residual_policy_t residual; /**< ON; DROP is an ablation */
    igrad_pack_policy_t pack;         /**< CONTIGUOUS: optimal among splits that keep
                                           backward-readiness order, so a bucket can
                                           launch as soon as its gradients exist;
                                           GREEDY balances slightly better but mixes
                                           early and late tensors */
    int buckets;                      /**< B >= 1 (4); iad ignores it */
    int64_t block_entries;            /**< a tensor's selection is cut into blocks of
                                           at most this many entries (whole rows for
                                           row-wise selections) (16384: ~96 KiB blocks,
                                           fine enough that contiguous packing of a
                                           125M model's 1% payload into 4 buckets
                                           stays within 10% of even) */
    int64_t verify_every;             /**< agreement check every this many steps
                                           (100); 0 = only at create and load */
    igrad_dtype_t value_dtype;        /**< values of gather buckets on the wire:
                                           F32, BF16 or F16 (2 bytes each), or
                                           F8_E4M3 (1 byte each after a 4-byte
                                           power-of-two scale per block). A
                                           16-bit value is the selected value
                                           rounded to nearest even (F16: clamped
                                           to +-65504 instead of Inf), an FP8
                                           one its block-scaled E4M3 rounding
                                           (docs/formats.md §8); the rounding
                                           error stays in the residual. The CUDA
                                           engine takes F32 only.
                                           Reduce buckets sum F32 (of the rounded
                                           values); method dense needs F32
                                           (IGRAD_E_UNSUPPORTED) (F32) */
    igrad_dtype_t index_dtype;        /**< U16: 16-bit indices wherever they fit
                                           (column indices of rows of <= 65536
                                           entries, flat indices of tensors of
                                           <= 65536 entries), 32-bit elsewhere;
                                           U32: always 32-bit (U16) */
    igrad_collective_t collective;    /**< AUTO; dense always all-reduces;
                                           SPARSE_REDUCE only by name (see
                                           igrad_collective_t) */
    int threads;                      /**< OpenMP threads for selection; 0 = the
                                           OpenMP default. Results never depend on it */
    double timeout_s;                 /**< seconds each of the engine's collectives
                                           (the per-step agreement and every bucket)
                                           may take before the call returns
                                           IGRAD_E_TIMEOUT; finite, >= 0; 0 = wait
                                           forever (IGRAD_DEFAULT_TIMEOUT_S). Applies
                                           to the built-in MPI communicator; see
                                           igrad_comm_set_timeout() for the others */
    /* Online profiling (iad/ig without a profile): the engine profiles the
     * first profile_steps steps of the run itself, then re-plans. */
    int64_t profile_steps;            /**< W: iad/ig with a NULL profile send every
                                           component every step (as the
                                           sparsifier's *_sync method) for the
                                           first W completed steps, recording
                                           their selections; at the next begin
                                           the engine builds the profile from the
                                           ranks' summed records (the same code
                                           as igrad_profile_build) and re-plans
                                           (igrad_engine_set_profile). 0 = off
                                           (a profile must be given) */
    double profile_alpha;             /**< alpha of the built profile (0.7) */
    const char *profile_partition;    /**< partition method of the built profile;
                                           NULL = "knee". Copied at create */
    /* Offered by peers (DGC, PowerSGD); docs/results/remedies.md measured
     * neither beating AdamW beta1 = 0. momentum is ignored by method dense
     * (no residual). */
    double momentum;                  /**< m in [0, 1): DGC momentum correction; per
                                           tensor a velocity u = m*u + g is kept and
                                           a = residual + u is what error feedback
                                           selects from (u replaces g), and the
                                           entries sent at a step have u set to 0
                                           (DGC's momentum factor masking). 0 = off
                                           (0.0).
                                           Costs one float per parameter. Use it with
                                           an optimizer without its own momentum
                                           (AdamW beta1 = 0, SGD momentum 0) */
    int64_t start_iter;               /**< >= 0: steps below it are plain dense
                                           averages (what method dense does: one
                                           all-reduce of every gradient); residuals
                                           and velocities stay 0 and the engine's
                                           step count does not advance, as with
                                           igrad.torch.IgradState(start_iter=) (0) */
    double target_ratio;              /**< ig, X in (0, 1]: whenever the engine
                                           plans with a profile it built online
                                           (profile_steps) or was given by
                                           igrad_engine_set_profile, it first
                                           chooses the important set and kappa
                                           with igrad_target_fit() so that the
                                           payload is X times *_sync's (the
                                           plan's release_keep becomes the
                                           chosen kappa); 0 = off: the profile's
                                           set and release_keep (0). A profile
                                           given at create is used as it is
                                           (fit it first, as igrad train does) */
    /* Periodic re-profiling (online profiling only, profile_steps > 0). */
    int64_t reprofile_every;          /**< W': after the first switch, every W'
                                           completed steps (at the next begin on
                                           a phase boundary, step mod
                                           release_period == 0) the engine builds
                                           a profile from the window's records
                                           (each tensor's last selection energy
                                           per accumulated step, so deferred and
                                           important components score alike),
                                           moves a component to the other class
                                           only when its score is beyond tau by
                                           reprofile_margin in two consecutive
                                           windows, and re-plans only if a class
                                           changed (residuals carried over, the
                                           ranks agreeing). 0 = off (0) */
    double reprofile_margin;          /**< m in [0, 1]: the hysteresis margin on the
                                           score (scores are in [0, 1]) (0.05) */
    igrad_dtype_t grad_dtype;         /**< the gradients' element type: F32, or
                                           BF16/F16, whose grads[t] then point at
                                           16-bit codes (uint16_t, cast to float *
                                           for the grads argument). Read as F32
                                           (upcast, exact), the result summed in
                                           F32 and rounded once to nearest even
                                           into them; residuals and velocities
                                           stay F32. CPU data plane only
                                           (IGRAD_E_UNSUPPORTED on CUDA), not with
                                           igrad_engine_open (F32) */
    /* Topology (issue 12): appended after grad_dtype. */
    igrad_topology_t topology;        /**< FLAT, or HIER: the two-level sync (see
                                           igrad_topology_t) (FLAT) */
    int ranks_per_node;               /**< L >= 0: ranks [k*L, (k+1)*L) of the comm
                                           form node k (P must be a multiple of L);
                                           0 = the nodes MPI reports
                                           (MPI_COMM_TYPE_SHARED, equal sizes
                                           required; a non-MPI comm is one node).
                                           Flat engines use it only to split
                                           wire bytes into intra- and inter-node
                                           in the statistics (0) */
    int64_t dense_below;              /**< >= 0: a tensor of fewer entries is sent
                                           whole whenever it is sent (its every
                                           entry, through the method's buckets;
                                           the sparsifiers' budgets apply to the
                                           others), as PowerSGD leaves small
                                           tensors uncompressed; the gate still
                                           defers it with its component. 0 = off
                                           (IGRAD_DEFAULT_DENSE_BELOW, 64) */
    /* The link `collective = auto` prices (issue 12 part 2): appended after
     * dense_below. Integers, so every rank's choice is exact. */
    int64_t link_latency_ns;          /**< alpha of one message in ns, in [0, 1e9]:
                                           auto's cost per bucket is message steps
                                           x alpha + wire bytes x beta (see
                                           docs/architecture.md §5.7). For
                                           topology hier the inter-node link (the
                                           shard engines' buckets cross it). 0 =
                                           bytes only: gather vs reduce as before
                                           (reduce iff 8d < P s) (0) */
    int64_t link_bandwidth_mbps;      /**< per-rank bandwidth, one direction, in
                                           Mbit/s, in [1, 1e9]: beta = 8000 /
                                           link_bandwidth_mbps ns per byte
                                           (100000: the `100g` preset of igrad
                                           plan) */
    int auto_sparse_reduce;           /**< 1: auto also prices the sparse
                                           all-reduce and takes it where it is
                                           cheapest (under igrad_engine_sync with
                                           the CPU data plane, a comm with a
                                           variable all-to-all and F32 gradients;
                                           elsewhere auto compares gather and
                                           reduce only). Opt-in because its
                                           result is not the mean of what the
                                           ranks selected (§5.7a) (0) */
    igrad_index_code_t index_code;    /**< how gather buckets code their indices:
                                           COMPACT (each row, or flat block, in
                                           the fewest bytes of Elias-Fano, a
                                           bitmap or index_dtype's fixed width,
                                           chosen from its size alone;
                                           formats.md §8) or FIXED (index_dtype
                                           widths, the wire before 0.2). Lossless
                                           either way: results are the same bits
                                           (COMPACT) */
    igrad_allocation_t allocation;    /**< ig with target_ratio > 0 and a profile
                                           (online, set, or given at create):
                                           PARTITION (the important set and one
                                           kappa of igrad_target_fit, or the
                                           profile's as given) or BUDGET (the
                                           plan allocates the target's bytes
                                           across components, every step or
                                           deferred at a kappa of its own; the
                                           profile's threshold and release_keep
                                           are then not used; topology flat
                                           only) (PARTITION) */
} igrad_config_t;

/** Default of igrad_config_t.timeout_s: generous enough for a slow rank or a
 *  checkpoint written by one rank while the others wait, short enough that a
 *  stopped rank does not hold the job for hours. */
#define IGRAD_DEFAULT_TIMEOUT_S 300.0

#define IGRAD_CONFIG_INIT                                                          \
    { sizeof(igrad_config_t), IGRAD_METHOD_IG, IGRAD_SPARSIFIER_ADTOPK, 0, 0.01,     \
      IGRAD_DEFAULT_RELEASE_PERIOD, IGRAD_DEFAULT_RELEASE_KEEP,                     \
      IGRAD_SCHEDULE_STAGGERED, IGRAD_RESIDUAL_ON, IGRAD_PACK_CONTIGUOUS, 4, 16384, \
      100, IGRAD_DTYPE_F32, IGRAD_DTYPE_U16,                                        \
      IGRAD_COLLECTIVE_AUTO, 0, IGRAD_DEFAULT_TIMEOUT_S, 0, 0.7, NULL, 0.0, 0, 0.0,  \
      0, 0.05, IGRAD_DTYPE_F32, IGRAD_TOPOLOGY_FLAT, 0, IGRAD_DEFAULT_DENSE_BELOW,         \
      0, 100000, 0, IGRAD_INDEX_CODE_COMPACT, IGRAD_ALLOCATION_PARTITION }

/** Checks every field. @return IGRAD_E_INVALID with a message naming the
 *  field and its value ("config.density is 0 (must be in (0, 1])"), or
 *  IGRAD_E_UNSUPPORTED for a 16-bit or FP8 value_dtype with method dense.
 *  A size smaller than this version's struct is IGRAD_E_INVALID; a larger
 *  (newer) one is accepted and its trailing fields ignored. */
IGRAD_API igrad_status_t igrad_config_validate(const igrad_config_t *config);

/** Writes IGRAD_CONFIG_INIT into *out: the defaults for bindings that
 *  cannot expand the macro. @param size sizeof(igrad_config_t) as the
 *  caller knows it. @return IGRAD_E_INVALID for a NULL out or a size that is
 *  not this library's (a binding made for another igrad.h). */
IGRAD_API igrad_status_t igrad_config_default(igrad_config_t *out, size_t size);

/** The target_ratio that method "ig" uses when its user gives none (0.25: at
 *  most a quarter of its sparsifier's *_sync payload): `igrad train`'s
 *  --target-ratio default and the Python binding's, read from here by both.
 *  IGRAD_CONFIG_INIT keeps target_ratio 0 (off), as a plain config asks
 *  for no target. */
IGRAD_API double igrad_ig_default_target_ratio(void);

/** One synchronization engine per rank. Not thread-safe: one thread calls
 *  it at a time (selection itself runs on `threads` OpenMP threads). */
typedef struct igrad_engine igrad_engine_t;

/** Builds the plan and allocates everything a step needs: per tensor
 *  whether it is sent every step (important components and OTHER
 *  tensors) or released at its phase, its budgets, the bucket map, zeroed
 *  residuals and the workspaces. Then checks, on every rank, that all
 *  ranks agree on layout, profile (important set), config and plan.
 *  Collective over `comm`: every rank calls it; when one rank fails (bad
 *  config, mismatched profile, out of memory) every rank fails, and no
 *  rank hangs.
 *  @param layout copied (it may be freed afterwards).
 *  @param profile required for iad and ig, ignored otherwise (may be
 *  NULL); copied. Its components must be the layout's.
 *  @param comm borrowed: it must outlive the engine.
 *  @return IGRAD_E_INVALID (config, NULL argument; the message names the
 *  field), IGRAD_E_UNSUPPORTED (among others a comm whose collectives
 *  cannot take the engine's buffers: "igrad_engine_create (data plane
 *  'cpu'): communicator 'x' cannot take host buffers (it takes device
 *  buffers)"; self and MPI take host memory, a custom comm what its
 *  table's `memory` says), IGRAD_E_MISMATCH
 *  (profile vs layout, or ranks disagree: the message names the first
 *  differing item, e.g.
 *  "config.density differs: rank 0 has 0.01, rank 1 has 0.02"),
 *  IGRAD_E_NOMEM, IGRAD_E_COMM, IGRAD_E_TIMEOUT (the agreement did not
 *  complete within config.timeout_s). On failure *out is NULL and nothing
 *  leaks, except after a timeout: the exchange buffer stays allocated for
 *  the MPI operation left pending on it. */
IGRAD_API igrad_status_t igrad_engine_create(const igrad_layout_t *layout,
                                             const igrad_profile_t *profile,
                                             const igrad_config_t *config, igrad_comm_t *comm,
                                             igrad_engine_t **out);

/** Frees an engine (not its comm or trace). NULL is a no-op. An engine
 *  broken by a timeout keeps its bucket and exchange buffers allocated (a
 *  pending MPI operation may still write them): they are leaked on
 *  purpose. */
IGRAD_API void igrad_engine_free(igrad_engine_t *engine);

/** Collective of a bucket (see the wire format above). */
typedef enum igrad_bucket_kind {
    IGRAD_BUCKET_GATHER = 0, /**< allgather send_nbytes from every rank into recv */
    IGRAD_BUCKET_REDUCE = 1, /**< in-place SUM all-reduce of count F32 at recv */
    IGRAD_BUCKET_SPARSE_REDUCE = 2 /**< the engine's own sparse all-reduce
                                        (collective sparse_reduce); never
                                        handed to a caller: begin refuses it */
} igrad_bucket_kind_t;

/** One collective of a step, as returned by igrad_engine_begin(). The
 *  buffers belong to the engine and stay valid until igrad_engine_end(). */
typedef struct igrad_bucket {
    igrad_bucket_kind_t kind;
    int index;           /**< bucket number in the plan (iad: position of the
                              tensor in the step's readiness order) */
    const void *send;    /**< this rank's bytes (reduce: == recv) */
    size_t send_nbytes;
    void *recv;          /**< gather: size * send_nbytes bytes; reduce: count F32 */
    size_t recv_nbytes;
    igrad_dtype_t dtype; /**< gather: U8 (count = send_nbytes); reduce: F32 */
    size_t count;
} igrad_bucket_t;

/** Statistics of the most recent step. */
typedef struct igrad_step_stats {
    int64_t step;
    int skipped;              /**< 1: the step failed at the agreement (non-finite
                                   value, argument error or mismatch on some rank);
                                   residuals are unchanged. A failure after the
                                   agreement breaks the engine instead (see
                                   igrad_engine_begin()) */
    int64_t tensors_sent;     /**< tensors selected and sent this step */
    int64_t entries_sent;     /**< entries this rank sent (dense: all) */
    int deferred_components;  /**< low-importance components not sent this step */
    int released_components;  /**< low-importance components released this step */
    int64_t payload_nbytes;   /**< bytes this rank contributes: sum of send_nbytes */
    double wire_nbytes;       /**< modelled bytes moved per rank: allgather
                                   (P-1)*send_nbytes, all-reduce 2(P-1)/P*count*4 */
    double select_ms;         /**< finiteness check, error feedback, selection */
    double pack_ms;           /**< planning and copying into buckets */
    double comm_ms;           /**< agreement and collectives (sync only; the two-
                                   phase API counts only the engine's own) */
    double unpack_ms;         /**< averaging into the caller's gradients */
    double total_ms;          /**< the whole step inside the engine */
    int buckets;              /**< collectives issued (non-empty buckets) */
    int gather_buckets;       /**< of which allgather */
    int reduce_buckets;       /**< of which all-reduce */
    int bucket_count;         /**< planned buckets, empty ones included (B; iad:
                                   tensors sent) */
    const int64_t *bucket_loads; /**< [bucket_count] planned bytes per bucket; valid
                                      until the next step or free */
    double imbalance;         /**< max/min bucket load (igrad_pack_metrics_t) */
    double cv;                /**< coefficient of variation of the loads */
    int overflow;             /**< buckets above 1.05 x mean */
    double residual_norm;     /**< L2 norm over all residuals after the step */
    double dropped_sumsq;     /**< residual=drop: sum of squares discarded this step */
    /* Memory (appended after dropped_sumsq; filled on skipped steps too). */
    int64_t dataplane_nbytes; /**< bytes this rank's engine holds in the data
                                   plane's memory (the gradients' memory: host
                                   for the CPU backend, the device for a GPU
                                   one): residuals (4 B per parameter),
                                   velocities (4 B per parameter with
                                   momentum), the staged selection, the bucket
                                   arenas, the dense warm-up engine's
                                   (start_iter) and, from the first
                                   igrad_engine_open(), the streamed step's
                                   selection scratch (threads x the largest
                                   tensor); with a 16-bit grad_dtype the
                                   F32 copy it reads them through (threads
                                   x the largest tensor); the O(parameters) part is the
                                   residual. Host-only control state
                                   (plans, scratch) is not counted: see
                                   igrad_engine_workspace_nbytes() */
    double dataplane_nbytes_per_param; /**< dataplane_nbytes / the layout's
                                   parameters */
    /* Levels (appended after dataplane_nbytes_per_param): wire_nbytes split
     * into the bytes this rank moves to or from ranks of its own node and
     * of other nodes. Flat engines: allgather (L-1) and (P-L) times
     * send_nbytes, all-reduce in the same proportion (L = ranks_per_node;
     * with 0, or one node, everything is intra). Hierarchical engines:
     * intra = the node sum and broadcast of every parameter,
     * 2(L-1)/L*4 bytes per parameter; inter = the shard's collectives among
     * the N owners, wire_nbytes = intra + inter. */
    double intra_wire_nbytes;
    double inter_wire_nbytes;
    /* Appended after inter_wire_nbytes (C callers rebuild; the struct has
     * no size field). */
    int sparse_reduce_buckets; /**< buckets of the sparse all-reduce (counted
                                    in buckets); their payload is 8 bytes per
                                    entry, their wire bytes what the exchanges
                                    moved for this rank: the split's counts
                                    and entries sent, the status records and
                                    the reduced blocks received */
    int64_t dense_small_tensors; /**< tensors sent whole this step because they
                                    have fewer than config.dense_below entries */
    /* Appended after dense_small_tensors: the step's exchanges as windows
     * of this rank's CLOCK_MONOTONIC (ms), igrad_engine_sync() only (0
     * elsewhere and where a window has no collective): [0] the issue of
     * the first bucket (after the agreement and selection), [1] the
     * completion of the last (hier: the shard's buckets); [2], [3] the
     * node sums and [4], [5] the node broadcasts (hier). Ranks on one
     * host share the clock, so per window max over ranks of the end minus
     * max of the start is the exchange's own time once the last rank
     * joined, without the wait for ranks still selecting (`igrad bench
     * sync`'s comm_window_ms). */
    double comm_window_ms[6];
    /* Appended after comm_window_ms: the owners' load in the step's
     * sparse all-reduce buckets (0 without any; from the headers every
     * rank receives, so the same on every rank). */
    int64_t sar_busiest_entries; /**< Σ over the buckets of the busiest
                                    owner's entries received in its split
                                    (its own included) */
    int64_t sar_entries;         /**< Σ over the buckets of every owner's
                                    (P x the entries each rank sent) */
    double sar_busiest_over_mean; /**< sar_busiest_entries over the mean,
                                    sar_entries / P: 1 when every owner
                                    received as much; each bucket waits for
                                    its busiest owner */
} igrad_step_stats_t;

/** First half of a step: agrees with the other ranks that every gradient
 *  is finite (and, every verify_every steps, that plans still agree), then
 *  error feedback + selection for the tensors sent at `step` (the others
 *  accumulate into their residual, or are dropped), packs the payload and
 *  returns the step's collectives (empty buckets are left out).
 *  Collective: every rank calls it with the same step.
 *  @param grads one pointer per tensor, layout order, each to count floats;
 *  read only (until igrad_engine_end() writes the result).
 *  @param buckets receives an array valid until igrad_engine_end().
 *  @return IGRAD_E_NONFINITE on every rank when any rank's grad + residual
 *  has a NaN or Inf (the message names the tensor on that rank and the
 *  rank elsewhere); IGRAD_E_INVALID on every rank for a NULL pointer on
 *  any rank (naming the tensor); IGRAD_E_MISMATCH on every rank when the
 *  ranks' steps, begin-call counts or risk histories differ (compared at
 *  every call: "step differs: rank 0 has 9, rank 1 has 10") or, every
 *  verify_every calls, any other agreement item; IGRAD_E_STATE after a
 *  begin without end, or for a broken engine; IGRAD_E_UNSUPPORTED for
 *  config.collective sparse_reduce (its three exchanges are the engine's
 *  own: use igrad_engine_sync), before anything is read or exchanged.
 *
 *  Failures found before or at the agreement (those above) happen on every
 *  rank alike: residuals are bit-identical to before, no end is needed and
 *  the step may be retried. Failures after it — selection or planning
 *  failing on this rank (out of memory), a collective failing
 *  (IGRAD_E_COMM) or timing out (IGRAD_E_TIMEOUT, after config.timeout_s;
 *  also possible in the agreement itself), a peer's bytes failing the
 *  checks in igrad_engine_end() — leave residuals and gradients undefined
 *  and the engine *broken*: every later begin, end, sync, save_state and
 *  load_state fails at once with IGRAD_E_STATE quoting the first error,
 *  without talking to the other ranks; only the accessors and
 *  igrad_engine_free() remain. Other ranks may be waiting in collectives
 *  this rank will never join (they time out after config.timeout_s): abort
 *  the job. */
IGRAD_API igrad_status_t igrad_engine_begin(igrad_engine_t *engine, int64_t step,
                                            float *const *grads,
                                            const igrad_bucket_t **buckets, size_t *nbuckets);

/** Second half: unpacks the buckets (whose collectives the caller ran)
 *  into grads: grads[t] = (1/P) sum over ranks of what they sent of t,
 *  zero where nothing arrived (including tensors not sent this step).
 *  Received bytes are not trusted: every index is checked against its
 *  tensor (flat) or row (row-wise) before use.
 *  @return IGRAD_E_STATE without a matching begin (same step) or for a
 *  broken engine, IGRAD_E_INVALID for a NULL pointer (the step stays
 *  open), IGRAD_E_COMM for an index out of range, naming the rank whose
 *  bytes are bad, the bucket and the tensor (every rank that received the
 *  same bytes fails alike; the engine is then broken, see
 *  igrad_engine_begin()). */
IGRAD_API igrad_status_t igrad_engine_end(igrad_engine_t *engine, int64_t step,
                                          float *const *grads);

/** begin + the engine's communicator + end, pipelined: bucket i+1 is
 *  packed while bucket i is in flight (non-blocking collectives), and each
 *  bucket is unpacked as it completes, in bucket order (so every rank ends
 *  with bit-identical gradients). Each collective, the agreement included,
 *  runs under config.timeout_s.
 *  @return errors as begin and end, plus IGRAD_E_COMM for a failed
 *  collective and IGRAD_E_TIMEOUT when one did not complete in time (the
 *  message names the step and the bucket, or the agreement); both break
 *  the engine. A bucket with bad bytes is not unpacked, nor any after it,
 *  but every bucket is still exchanged, so every rank makes the same
 *  collectives. */
IGRAD_API igrad_status_t igrad_engine_sync(igrad_engine_t *engine, int64_t step,
                                           float *const *grads);

/* ---- Streamed step (overlap with backward) ------------------------------- */

/** Opens a streamed step: the same step as igrad_engine_sync(), given tensor
 *  by tensor as their gradients become final (e.g. from a DDP hook during
 *  backward), whose collectives the caller issues bucket by bucket as
 *  igrad_engine_ready() hands them out. Plans the step (which tensors are
 *  sent, the buckets; with online profiling a completed window is gathered
 *  and re-planned here, as at the whole step's start). Results — gradients,
 *  residuals, velocities, statistics — equal igrad_engine_sync()'s bit for
 *  bit. Collective when online profiling switches; call it on every rank
 *  with the same step.
 *  @return IGRAD_E_STATE when a step is open or the engine is broken,
 *  IGRAD_E_UNSUPPORTED for an engine whose data plane has no streamed step
 *  (a CUDA engine: use begin/end or sync) and for config.collective
 *  sparse_reduce (use igrad_engine_sync). */
IGRAD_API igrad_status_t igrad_engine_open(igrad_engine_t *engine, int64_t step);

/** The gradients of `n` tensors (layout indices tensors[i], gradient
 *  grads[i], count floats each) are final: checks them and selects the sent
 *  ones into the engine's staged selection, writing no residual, velocity
 *  or gradient, then packs every bucket whose tensors have all been given,
 *  in bucket order (bucket j only after every bucket before it), and
 *  returns those in *buckets (valid until igrad_engine_close()). Issue their
 *  collectives at once, in the order returned, as for igrad_engine_begin();
 *  the issue order is then the same on every rank whatever order and
 *  chunks each rank gives its tensors in. Every rank must give every tensor
 *  exactly once per step. The gradients must stay valid and unchanged until
 *  close, which writes the result into them. A NaN/Inf or a NULL gradient
 *  is not an error here: the buckets are still handed out (the other ranks
 *  wait in those collectives) and close fails the step on every rank.
 *  @return IGRAD_E_STATE without an open streamed step or for another step;
 *  IGRAD_E_INVALID for an index out of range or a tensor already given (the
 *  call changes nothing; the step stays open). */
IGRAD_API igrad_status_t igrad_engine_ready(igrad_engine_t *engine, int64_t step,
                                            const size_t *tensors, size_t n,
                                            float *const *grads,
                                            const igrad_bucket_t **buckets,
                                            size_t *nbuckets);

/** Closes the streamed step once every tensor was given and every bucket's
 *  collective has completed: the step's agreement (as igrad_engine_begin():
 *  IGRAD_E_NONFINITE, IGRAD_E_INVALID for a NULL gradient, IGRAD_E_MISMATCH,
 *  the same messages, on every rank alike, residuals and velocities
 *  bit-identical to before, stats.skipped = 1, the step closed), then the
 *  residuals and velocities (one more pass over each gradient and its
 *  residual), zeroed gradients and every bucket unpacked into the gradients
 *  given to ready, as igrad_engine_end().
 *  @return IGRAD_E_STATE without an open streamed step, for another step, or
 *  when some tensor was not given (naming it; the step stays open); after
 *  the agreement, errors as igrad_engine_end(). */
IGRAD_API igrad_status_t igrad_engine_close(igrad_engine_t *engine, int64_t step);

/** Copies the statistics of the most recent step (zeros before the first). */
IGRAD_API igrad_status_t igrad_engine_last_stats(const igrad_engine_t *engine,
                                                 igrad_step_stats_t *out);

/** The plan of one tensor. */
typedef struct igrad_tensor_plan {
    int every_step;        /**< 1: sent every step (important component or OTHER) */
    int important;         /**< component judged important (OTHER: 1; methods
                                without a profile: 1) */
    int component;         /**< layout component index, -1 for OTHER */
    int phase;             /**< release phase in [0, R), -1 when every_step */
    int64_t count;         /**< entries sent at a normal step (dense: all) */
    int64_t release_count; /**< entries sent at a release step (0 if every_step) */
    int row_wise;          /**< 1 if even steps select row-wise (adtopk, 2-D) */
    int index_nbytes;      /**< index bytes per entry at even steps (0 dense) */
    int64_t step_nbytes;   /**< payload bytes at a normal even step */
    int64_t release_nbytes;/**< payload bytes at an even release step */
} igrad_tensor_plan_t;

/** Copies tensor t's plan. @return IGRAD_E_INVALID if t is out of range. */
IGRAD_API igrad_status_t igrad_engine_tensor_plan(const igrad_engine_t *engine, size_t t,
                                                  igrad_tensor_plan_t *out);

/** @return the payload bytes a step will send (sum of the sent tensors'
 *  entries x wire bytes per entry, as if every bucket were a gather),
 *  a pure function of the plan and step; -1 for a NULL engine. */
IGRAD_API int64_t igrad_engine_predict_payload(const igrad_engine_t *engine, int64_t step);

/** A plan-only engine: the plan igrad_engine_create() would build for
 *  `nranks` ranks (phases, budgets, block cuts, bucket map), made without a
 *  communicator and without data-plane memory (no residuals, no bucket
 *  arenas), so any model can be planned for any number of ranks. It only
 *  answers igrad_engine_plan_step() and the accessors (tensor_plan,
 *  predict_payload, config, workspace_nbytes); begin, end, sync, save_state,
 *  load_state and set_profile fail with IGRAD_E_STATE. Free it with
 *  igrad_engine_free(). Not collective.
 *  @return as igrad_engine_create for layout, profile and config, plus
 *  IGRAD_E_INVALID for nranks < 1, config.profile_steps > 0 (a plan needs
 *  its profile now) or config.start_iter > 0 (the warm-up is not planned). */
IGRAD_API igrad_status_t igrad_engine_create_plan(const igrad_layout_t *layout,
                                                  const igrad_profile_t *profile,
                                                  const igrad_config_t *config, int nranks,
                                                  igrad_engine_t **out);

/** One collective of a planned step (igrad_engine_plan_step). */
typedef struct igrad_planned_bucket {
    igrad_bucket_kind_t kind;
    int index;              /**< bucket number in the plan */
    int64_t payload_nbytes; /**< bytes this rank contributes (gather: its send
                                 bytes; reduce: 4 x dense_count) */
    double wire_nbytes;     /**< modelled bytes per rank, as in igrad_step_stats_t */
    int64_t dense_count;    /**< F32 values of the bucket's dense segments (what
                                 a reduce bucket all-reduces) */
    int local_rank;         /**< topology hier: the rank of the node whose shard
                                 it carries (its collective runs among the N
                                 ranks of that local rank); 0 when flat */
} igrad_planned_bucket_t;

/** Plans `step` on a plan-only engine exactly as a real engine plans it
 *  (which tensors are sent, blocks, buckets, each bucket's route) and
 *  fills the plan's part of its statistics: tensors_sent, entries_sent,
 *  deferred/released_components, payload_nbytes, wire_nbytes, the bucket
 *  counts, bucket_loads (valid until the next call) and the load metrics;
 *  times, norms and memory are 0. Plan steps in the order a run would
 *  make them: the pack policy `risk` learns from the steps planned before.
 *  @param buckets receives the first min(capacity, *nbuckets) non-empty
 *  buckets (at most config.buckets; iad: tensors); may be NULL when
 *  capacity is 0. @param nbuckets receives the number of non-empty buckets.
 *  @return IGRAD_E_INVALID for a NULL argument, IGRAD_E_STATE for an engine
 *  that is not plan-only. */
IGRAD_API igrad_status_t igrad_engine_plan_step(igrad_engine_t *engine, int64_t step,
                                                igrad_step_stats_t *stats,
                                                igrad_planned_bucket_t *buckets,
                                                size_t capacity, size_t *nbuckets);

/** The smallest kappa igrad_target_fit() chooses unless told otherwise:
 *  below it a deferred component is hardly ever refreshed. */
#define IGRAD_TARGET_MIN_KEEP 0.05

/** What igrad_target_fit() chose and what it plans to send. */
typedef struct igrad_target_fit {
    double tau;          /**< threshold: gated components with score >= tau are
                              important (igrad_profile_set_threshold) */
    double release_keep; /**< kappa */
    size_t n_important;  /**< gated components marked important */
    size_t n_gated;      /**< components under the gate (scored, not forced) */
    double f_imp;        /**< share of the *_sync payload sent every step */
    double ratio;        /**< planned mean payload per step / *_sync's (the
                              engine's budgets, rounding included) */
    double model_ratio;  /**< f_imp + kappa (1 - f_imp), for comparison */
    int met;             /**< 1 if ratio <= target */
} igrad_target_fit_t;

/** Budget-driven plan for method ig: chooses the important set and kappa
 *  so that the mean payload per step is at most `target_ratio` times the
 *  *_sync payload of config->sparsifier at config->density. Algorithm:
 *  gated components (every projection; EMB/HEAD/NORM with a profile row)
 *  by score, highest first; the longest prefix (ties kept
 *  together) whose plan at kappa = min_keep meets the target; then the
 *  largest kappa in [min_keep, 1] that still meets it (bisection on the
 *  planned bytes, which do not decrease with kappa). Forced tensors (OTHER,
 *  ungated components) always count as sent. When even no important
 *  component at min_keep meets the target, the result is that plan with
 *  met = 0. The plan counts per-row rounding (ADTopk rows of few entries
 *  release at least one entry per row per R steps) and index widths
 *  exactly as the engine plans them; steps are averaged over parities.
 *  Apply it with igrad_profile_set_threshold(profile, out->tau) and
 *  config->release_keep = out->release_keep. Thread-safe. */
IGRAD_API igrad_status_t igrad_target_fit(const igrad_layout_t *layout,
                                          const igrad_profile_t *profile,
                                          const igrad_config_t *config, double target_ratio,
                                          double min_keep, igrad_target_fit_t *out);

/** @return tensor t's residual (count floats; NULL for method dense or t
 *  out of range). Valid until the engine is freed; read-only. */
IGRAD_API const float *igrad_engine_residual(const igrad_engine_t *engine, size_t t);

/** @return tensor t's momentum-correction velocity u (count floats; NULL
 *  when config.momentum is 0, for method dense or t out of range). Valid
 *  until the engine is freed; read-only. */
IGRAD_API const float *igrad_engine_velocity(const igrad_engine_t *engine, size_t t);

/** Records every later selection into `trace` (igrad_trace_record with the
 *  selection's sumsq and count, once the step's result is in grads), so a
 *  run can profile itself; the method dense records nothing. The trace
 *  must be made for the same layout and outlive its use, and steps must
 *  not decrease (a refused record is returned by end/sync after the step
 *  itself completed). NULL stops recording. Also sets the trace's
 *  sparsifier and density to the engine's.
 *  @return IGRAD_E_MISMATCH for a trace of another layout. */
IGRAD_API igrad_status_t igrad_engine_set_trace(igrad_engine_t *engine, igrad_trace_t *trace);

/** Re-plans the engine for `profile` (iad/ig): phases, budgets, buckets
 *  and the agreement items are rebuilt as igrad_engine_create would build
 *  them, and every residual is kept as it is (nothing is sent or lost by
 *  the switch), as are the step, the call count and the trace. Stops
 *  online profiling if it is still recording. Collective: every rank calls
 *  it between steps with the same profile; the ranks agree on the new plan
 *  first, and if any rank fails every engine stays as it was.
 *  @param profile copied; its components must be the layout's.
 *  @return IGRAD_E_INVALID (another method, NULL profile), IGRAD_E_STATE (a
 *  step is open, broken engine), IGRAD_E_MISMATCH (profile vs layout, or
 *  the ranks' plans differ: the first differing item is named), as
 *  igrad_engine_create otherwise. */
IGRAD_API igrad_status_t igrad_engine_set_profile(igrad_engine_t *engine,
                                                  const igrad_profile_t *profile);

/** @return the profile the engine plans with when it was built online
 *  (config.profile_steps) or set by igrad_engine_set_profile; NULL while
 *  the window is still recording, for a profile given at create, or for
 *  methods without a profile. Owned by the engine; valid until the next
 *  re-plan or free. Save it with igrad_profile_save_json(). */
IGRAD_API const igrad_profile_t *igrad_engine_profile(const igrad_engine_t *engine);

/** Online profiling status (igrad_engine_online_info). */
typedef struct igrad_online_info {
    int profiling;          /**< 1 while the window is recording */
    int64_t profile_steps;  /**< W (config.profile_steps) */
    int64_t steps_recorded; /**< steps of the window recorded so far */
    int64_t switch_step;    /**< first step planned with the built/set profile
                                 (-1 before any re-plan; re-profiles leave it) */
    int64_t replans;        /**< re-plans so far (switch, set_profile and
                                 re-profiles that changed a class) */
    double gather_ms;       /**< last switch: exchange of the window */
    double build_ms;        /**< last re-plan: profile build + plan + agreement */
    int64_t reprofile_every;   /**< W' (config.reprofile_every) */
    int64_t reprofiles;        /**< periodic re-profiles so far */
    int64_t reprofile_replans; /**< of them, those that changed a class and
                                    re-planned */
    int64_t last_flips;        /**< components the last re-profile moved */
    double reprofile_ms;       /**< last re-profile: exchange + build +
                                    hysteresis + agreement (+ re-plan) */
} igrad_online_info_t;

/** Copies the online profiling status (zeros, switch_step -1, for engines
 *  without it). */
IGRAD_API igrad_status_t igrad_engine_online_info(const igrad_engine_t *engine,
                                                  igrad_online_info_t *out);

/** Copies the configuration the engine was created with. */
IGRAD_API igrad_status_t igrad_engine_config(const igrad_engine_t *engine,
                                             igrad_config_t *out);

/** @return the step of the most recent completed begin (-1 before the
 *  first; restored by igrad_engine_load_state()). */
IGRAD_API int64_t igrad_engine_step(const igrad_engine_t *engine);

/** @return bytes the engine holds: residuals, velocities, buffers, workspaces
 *  (and the dense warm-up engine of config.start_iter). */
IGRAD_API size_t igrad_engine_workspace_nbytes(const igrad_engine_t *engine);

/** Writes this rank's state: residuals, step, hashes and the risk policy's
 *  size history, so that a resumed run continues exactly. One file per
 *  rank (the caller picks names such as "state.rank3.bin"). Written to a
 *  temporary name and renamed, so a crash never leaves a partial file.
 *  Local (not collective). Format (host byte order, little-endian on
 *  every supported platform):
 *    "IGRADST\0" magic, u32 version (4), u32 rank, u32 size, u32 nitems,
 *    nitems x (u64 value) — the agreement items (layout, profile, config
 *    fields, plan) in the engine's fixed order,
 *    i64 step, i64 steps begun, u64 ntensors, u64 residual count,
 *    f32 residuals (layout order),
 *    u64 velocity count (the residual count with config.momentum > 0,
 *    else 0), f32 velocities (layout order),
 *    u64 history count, then u64 keys, i64 n, f64 mean, f64 m2 arrays,
 *    the online profiling section (docs/formats.md §7: the window being
 *    recorded, or the profile of the last re-plan followed, with
 *    config.reprofile_every, by the re-profiling window and hysteresis
 *    state), u64 checksum: FNV-1a over the file's little-endian 64-bit words before
 *    it (h ^= w; h *= 0x100000001b3; every section is padded to 8 bytes). */
IGRAD_API igrad_status_t igrad_engine_save_state(const igrad_engine_t *engine,
                                                 const char *path);

/** Reads a state written by igrad_engine_save_state() into an engine built
 *  the same way. Collective: every rank loads its own file; if any rank
 *  fails, every rank fails and no engine changes. The file is read once
 *  and verified whole before the ranks agree; only then are residuals and
 *  history copied in, from the same bytes.
 *  @return IGRAD_E_IO, IGRAD_E_FORMAT (truncated or trailing bytes,
 *  corrupt: bad magic, version, sizes or checksum, duplicated fields that
 *  disagree — step and call count against their items, the history hash
 *  against the history —, non-zero padding), IGRAD_E_MISMATCH (another layout, profile,
 *  config or plan: the message names the first differing item, or a
 *  saved rank/size that is not this rank's; or the ranks' files are from
 *  different steps); IGRAD_E_STATE, without any exchange, for a broken
 *  engine. */
IGRAD_API igrad_status_t igrad_engine_load_state(igrad_engine_t *engine, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* IGRAD_H */
