/* err.h - the error convention of the whole tree.
 *
 * Library functions return int: 0 on success, a negative RC_E* code on
 * failure, and (when the caller passes one) fill an rc_err with a message a
 * human can act on.  Libraries never print and never exit. */
#ifndef BASE_ERR_H
#define BASE_ERR_H

#include <stdarg.h>

enum {
    RC_OK = 0,
    RC_EINVAL = -1,   /* bad argument or malformed input */
    RC_ENOMEM = -2,   /* allocation failed */
    RC_EIO = -3,      /* file could not be read */
    RC_EUNSUP = -4,   /* well-formed input we deliberately do not support */
    RC_ERANGE = -5,   /* a value out of its allowed range (e.g. token id) */
};

typedef struct rc_err {
    int code;
    char msg[512];
} rc_err;

/* Record an error (printf-style) and return code, so callers can write
 * `return rc_errf(err, RC_EINVAL, "...", ...);`.  err may be NULL. */
int rc_errf(rc_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

const char *rc_strerror(int code);

#endif
