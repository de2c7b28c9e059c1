/* pyjson.h - JSON text the way Python's json.dumps(v, ensure_ascii=False)
 * writes it, which is how tool schemas and arguments appear in prompts:
 * ", " and ": " separators, key order as received, raw UTF-8, floats in
 * repr() form (shortest round-trip digits, 1e-05, 1e+16, 2.0). */
#ifndef RECIPE_PYJSON_H
#define RECIPE_PYJSON_H

#include <jansson.h>

#include "base/vec.h"

int rc_pyjson(const json_t *v, rc_bytes *out);
/* Python repr() of a finite double */
int rc_pyfloat(double x, rc_bytes *out);
/* a JSON string literal (quotes included) with Python's escapes */
int rc_pyjson_string(const char *s, size_t n, rc_bytes *out);

#endif
