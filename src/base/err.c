/* err.c - formatting of rc_err; see err.h for the convention. */
#include "base/err.h"

#include <stdio.h>

int rc_errf(rc_err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

const char *rc_strerror(int code) {
    switch (code) {
    case RC_OK: return "ok";
    case RC_EINVAL: return "invalid input";
    case RC_ENOMEM: return "out of memory";
    case RC_EIO: return "i/o error";
    case RC_EUNSUP: return "unsupported";
    case RC_ERANGE: return "out of range";
    default: return "unknown error";
    }
}
