/* scratch.h - per-thread growable scratch buffers that are freed when their
 * thread exits (pool workers included), so hot loops can reuse memory
 * without leaking it.  A few numbered slots let independent users coexist. */
#ifndef BASE_SCRATCH_H
#define BASE_SCRATCH_H

#include <stddef.h>

enum { RC_SCRATCH_BACKEND = 0, RC_SCRATCH_ATTN = 1, RC_SCRATCH_HC = 2, RC_SCRATCH_COMP = 3, RC_SCRATCH_SLOTS = 4 };

/* At least `bytes` bytes, valid until the next call with the same slot on
 * this thread; NULL when out of memory. */
void *rc_scratch(int slot, size_t bytes);

#endif
