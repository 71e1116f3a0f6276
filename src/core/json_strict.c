/*
 * json_strict.c — what the JSON readers check beyond cJSON (see
 * json_strict.h): today, strings holding the escape \u0000, which cJSON
 * turns into a NUL that silently truncates the C string it returns.
 * Parsing itself is cJSON's; the readers live with their formats.
 */
#include "core/json_strict.h"

#include <stdio.h>
#include <string.h>

size_t igrad__json_find_nul_escape(const char *text, size_t nbytes, size_t *string_at)
{
    int in_string = 0;
    size_t open = 0;
    for (size_t i = 0; i < nbytes; i++) {
        char c = text[i];
        if (!in_string) {
            if (c == '"') {
                in_string = 1;
                open = i;
            }
            continue;
        }
        if (c == '"') {
            in_string = 0;
        } else if (c == '\\') {
            if (i + 1 >= nbytes) break;
            if (text[i + 1] == 'u' && i + 5 < nbytes && memcmp(text + i + 2, "0000", 4) == 0) {
                if (string_at) *string_at = open;
                return i;
            }
            /* Skip the escaped character, so the second backslash of "\\"
             * never starts an escape. \uXXXX's digits need no skipping:
             * they are neither '"' nor '\'. */
            i++;
        }
    }
    return IGRAD__JSON_NO_NUL;
}

void igrad__text_line_col(const char *text, size_t pos, size_t *line, size_t *col)
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

void igrad__json_nul_excerpt(const char *text, size_t at, size_t string_at, char *buf,
                             size_t size)
{
    /* The string's raw text before the escape, control bytes as '?'
     * so the message stays on one line. */
    char head[41];
    size_t n = at - string_at - 1;
    const char *more = "";
    if (n > sizeof head - 1) {
        n = sizeof head - 1;
        more = "...";
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)text[string_at + 1 + i];
        head[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    head[n] = '\0';
    snprintf(buf, size, "\"%s%s\\u0000...\"", head, more);
}
