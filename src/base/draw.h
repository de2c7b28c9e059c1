/* draw.h - a sampled token's draw offered to the backend (engine.h's forward_draw, model/v4.h's md_segment): the
 * request's sampling parameters and the uniform the engine took from the request's stream, so that a backend that
 * holds the logits on a device can draw there (engine/sampler.h's rules) and send down one id instead of a
 * vocabulary of floats. */
#ifndef BASE_DRAW_H
#define BASE_DRAW_H

#include <stdint.h>

typedef struct rc_draw {
    double temperature; /* >= 1e-5 (greedy rows take the top1 path) */
    double top_p;       /* off unless in (0, 1) */
    double min_p;       /* <= 0: off */
    int top_k;          /* <= 0: off */
    double u01;         /* the draw's uniform in [0, 1) (eng_sample_uniform) */
    int32_t token;      /* out: the token drawn, or -1 (the caller's value): not drawn, the logits were written */
} rc_draw;

#endif
