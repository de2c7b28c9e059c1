/* sampler.h - one token from one row of logits.
 *
 *   temperature < 1e-5 (0 included)  greedy: the argmax, ties to the lowest id
 *   otherwise                        z = logits / T, then the filters in the
 *                                    order vLLM v1 applies them (min_p, top_k,
 *                                    top_p), then one draw
 *
 * Off values: top_k <= 0 or >= the candidates, top_p <= 0 or >= 1, min_p <= 0
 * (a zero-initialised eng_sampling with a temperature samples unfiltered).
 *
 * The draw uses a per-request splitmix64 stream: *rng_state is advanced by
 * exactly one step per non-greedy call, so a request's tokens depend only on
 * its seed and its own logits, never on which requests share the batch.
 * eng_rng_init gives the starting state for a seed. */
#ifndef ENGINE_SAMPLER_H
#define ENGINE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

/* Work space for one vocabulary (3 x vocab candidates of 16 bytes: ~6 MB at
 * 129k; the candidates and a radix sort's buffers); reused across calls to
 * avoid a malloc per token.  Zero-initialise, free with eng_sample_scratch_free.
 * One per thread that samples. */
typedef struct eng_sample_scratch {
    void *buf;
    size_t cap;  /* entries */
} eng_sample_scratch;

void eng_sample_scratch_free(eng_sample_scratch *ws);

/* The token id (>= 0), or RC_EINVAL (vocab <= 0, logits NULL) / RC_ENOMEM.
 * NaN logits count as -inf; a row with no finite logit yields id 0. */
int eng_sample(const float *logits, int vocab, const eng_sampling *s, uint64_t *rng_state);
int eng_sample_ws(const float *logits, int vocab, const eng_sampling *s, uint64_t *rng_state,
                  eng_sample_scratch *ws);

/* The uniform in [0, 1) a draw takes from the request's stream, which it advances by one step ((next >> 11) 2^-53). */
double eng_sample_uniform(uint64_t *rng_state);
/* eng_sample_ws with the draw's uniform given: the token eng_sample_ws gives where eng_sample_uniform would yield
 * u01 (for a draw whose uniform was taken before its logits existed: engine.h's forward_draw).  Greedy settings
 * ignore u01. */
int eng_sample_u01(const float *logits, int vocab, const eng_sampling *s, double u01, eng_sample_scratch *ws);

/* Whether s draws nothing: temperature below 1e-5 (vLLM's _SAMPLING_EPS; 0 and NaN too), the token is the
 * greedy one (base/greedy.h) and the rng stream does not move. */
static inline int eng_sampling_greedy(const eng_sampling *s) { return !(s->temperature >= 1e-5); }

/* The fast path's bound (sampler.c): tokens of weight below 2^-bits of the argmax's are skipped wherever the draw
 * can be certified without them (bits ENG_SAMPLE_PRUNE_BITS by default; 1..60; 0 turns the fast paths off, for tests
 * and benchmarks).  The token drawn is the same either way.  Process-wide; returns 0 or RC_EINVAL. */
#define ENG_SAMPLE_PRUNE_BITS 24
int eng_sample_set_prune(int bits);
/* Draws so far in this process that the fast path certified, and that ran the full computation (greedy ones and
 * those with nothing to weigh count in neither). */
void eng_sample_counts(uint64_t *fast, uint64_t *full);

uint64_t eng_rng_init(uint64_t seed);
/* The next 64 random bits of the stream (splitmix64). */
uint64_t eng_rng_next(uint64_t *state);

#endif
