/* pyjson.h - JSON text the way Python's json.dumps(v, ensure_ascii=False)
 * writes it, which is how tool schemas and arguments appear in prompts:
 * ", " and ": " separators, key order as received, raw UTF-8, floats in
 * repr() form (shortest round-trip digits, 1e-05, 1e+16, 2.0). */
#ifndef RECIPE_PYJSON_H
#define RECIPE_PYJSON_H

#include <jansson.h>

#include "base/vec.h"

/* Float layout.  PY: Python repr (fixed for 1e-4 <= |x| < 1e16, else
 * d.ddde-05 / e+16).  V4: what deepseek-recipe 0.2.0's V4 encoding writes:
 * fixed down to 1e-5, below that an exponent without zero padding (1e-6),
 * e+16 above. */
typedef enum { RC_FLOAT_PY = 0, RC_FLOAT_V4 = 1 } rc_float_style;

int rc_pyjson(const json_t *v, rc_bytes *out);
int rc_pyjson_style(const json_t *v, rc_float_style st, rc_bytes *out);
/* Python repr() of a finite double */
int rc_pyfloat(double x, rc_bytes *out);
int rc_pyfloat_style(double x, rc_float_style st, rc_bytes *out);
/* a JSON string literal (quotes included) with Python's escapes */
int rc_pyjson_string(const char *s, size_t n, rc_bytes *out);


/* json_loadb that accepts integers beyond 64 bits, as the reference does:
 * such literals are read as floats (1.8446744073709552e+19).  Known gap:
 * the reference prints integers in (2^63, 2^64) as integers; we print them
 * as floats.  flags as for json_loadb. */
/* 1 if v is such a kept u64 literal (a marked string, not a real string) */
int rc_json_is_u64(const json_t *v);
/* 1 and a serde_json-worded message ("EOF while parsing an object at line
 * 1 column 1") if s is not one well-formed JSON value, else 0 */
int rc_json_syntax_error(const char *s, size_t n, char *msg, size_t cap);
json_t *rc_json_loadb(const char *text, size_t n, size_t flags, json_error_t *je);

#endif
