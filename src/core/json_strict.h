/*
 * json_strict.h — checks on a JSON text that cJSON does not make, shared by
 * the library's JSON readers (config.json, safetensors headers, profiles)
 * and the trainer's JSONL reader. Not part of the public API.
 */
#ifndef IGRAD_JSON_STRICT_H
#define IGRAD_JSON_STRICT_H

#include <stddef.h>

/* Returned by igrad__json_find_nul_escape when there is none. */
#define IGRAD__JSON_NO_NUL ((size_t)-1)

/* Finds the first "\u0000" escape inside a string of the JSON text
 * text[0, nbytes). cJSON decodes it to a NUL byte and hands out C strings,
 * so a tensor name, dtype or document would silently end there; readers
 * refuse it instead. Returns the byte offset of the escape's backslash
 * (and, in *string_at if not NULL, the offset of the string's opening
 * quote), or IGRAD__JSON_NO_NUL.
 *
 * The scan follows string boundaries and escapes exactly as JSON defines
 * them, so "\\u0000" (an escaped backslash, then "u0000") is not a NUL and
 * "\u0000" in a key counts like one in a value. The result is meaningful
 * for a text that parses as JSON; call it after cJSON accepted the text. */
size_t igrad__json_find_nul_escape(const char *text, size_t nbytes, size_t *string_at);

/* Writes the string holding a NUL escape found at byte `at` (its opening
 * quote at `string_at`) into buf, always NUL-terminated, as a quoted
 * excerpt: "<up to 40 bytes of its raw text>\u0000...". */
void igrad__json_nul_excerpt(const char *text, size_t at, size_t string_at, char *buf,
                             size_t size);

/* Line and column (both from 1, columns in bytes) of byte `pos` of text. */
void igrad__text_line_col(const char *text, size_t pos, size_t *line, size_t *col);

#endif /* IGRAD_JSON_STRICT_H */
