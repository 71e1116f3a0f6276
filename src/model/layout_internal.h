/*
 * layout_internal.h — what the layout files (layout.c, layout_hf.c,
 * safetensors.c) share with each other and with tests/fuzz targets:
 * setting a layout's family, in-memory readers and the writers used to
 * re-serialise a layout for round-trip checks, the name-map helpers
 * (name_map.c, component.c). Not part of the public API.
 */
#ifndef IGRAD_LAYOUT_INTERNAL_H
#define IGRAD_LAYOUT_INTERNAL_H

#include "core/internal.h"

/* Largest safetensors header we accept (the format itself caps it at
 * 100 MB) and largest config / name list we read. */
#define IGRAD__SAFETENSORS_MAX_HEADER (100u * 1000u * 1000u)
#define IGRAD__TEXT_MAX_NBYTES (64u * 1024u * 1024u)

/* Replaces the family string reported by igrad_layout_family(). */
igrad_status_t igrad__layout_set_family(igrad_layout_t *layout, const char *family);

/* Name-list reader on a text in memory (may contain NULs, which are
 * rejected); `source` names it in messages ("source:LINE: ..."). */
igrad_status_t igrad__layout_from_name_list_text(const char *text, size_t nbytes,
                                                 const char *source, igrad_layout_t **out);

/* Writes a layout as a name list ("name d0 d1 ...", one per line).
 * *text is malloc'd and NUL-terminated. Fails with IGRAD_E_INVALID if a
 * name cannot be written in that format (whitespace, '#', control
 * characters). */
igrad_status_t igrad__layout_to_name_list(const igrad_layout_t *layout, char **text,
                                          size_t *nbytes);

/* Writes the first 8 + N bytes of a safetensors file holding the layout
 * (tensors packed in order); *data_nbytes receives the size of the data
 * region that must follow for the file to be complete. *bytes is malloc'd.
 * IGRAD_E_INVALID if the data would exceed 2^53 bytes (what the reader
 * accepts). */
igrad_status_t igrad__layout_to_safetensors_header(const igrad_layout_t *layout,
                                                   unsigned char **bytes, size_t *nbytes,
                                                   uint64_t *data_nbytes);

/* An empty layout with src's name map (the engine's copies of a layout). */
igrad_status_t igrad__layout_create_like(const igrad_layout_t *src, igrad_layout_t **out);

/* Adds rows [row0, row0 + nrows) of a tensor of shape `shape` (ndim >= 1)
 * as a tensor of that name with shape[0] = nrows (a piece of the two-level
 * sync's shard, engine_hier.c). Its component (from the name, as for
 * igrad_layout_add) counts comp_entries for it, so that a shard's
 * components can report the model's entries and its profile rows apply.
 * It hashes as a tensor of its own shape (shape[0] = nrows), so splits
 * into other row counts hash differently; row0 is not hashed (the
 * engine's layout copies re-add tensors by shape and must hash alike). */
igrad_status_t igrad__layout_add_rows(igrad_layout_t *layout, const char *name,
                                      igrad_dtype_t dtype, int ndim, const int64_t *shape,
                                      int64_t row0, int64_t nrows, int64_t comp_entries);

/* A copy of a name map (NULL stays NULL) and the map-file reader on a text
 * in memory ("source:LINE: ..." in messages). */
igrad_status_t igrad__name_map_copy(const igrad_name_map_t *src, igrad_name_map_t **out);
igrad_status_t igrad__name_map_from_text(const char *text, size_t nbytes, const char *source,
                                         igrad_name_map_t **out);

/* The index after a name's first numbered block marker (layers.N, h.N,
 * blocks.N, block.N, layer.N), -1 without one (component.c). */
int igrad__name_block_index(const char *name);
/* A layer number as the built-in rules read one: n decimal digits, no sign,
 * below one million; -1 otherwise. */
int igrad__parse_layer_index(const char *s, size_t n);

#endif /* IGRAD_LAYOUT_INTERNAL_H */
