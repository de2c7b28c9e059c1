/* part_slots.h - the bookkeeping of device copies of partial KV blocks.
 *
 * An attention call reads, per sequence, the layer's rows of its KV blocks (v4.h layout: a block of
 * MD_BLOCK_TOKENS tokens holds epb = 128 / ratio compressed entries of the layer, then, on a CSA layer, as many
 * indexer keys).  Full blocks never change.  A partial block changes only by appending: an entry (and its key)
 * is written once, when the tokens that complete it arrive, and block ids are never reused (md_block_new).  So a
 * backend may keep a copy of a partial block's layer rows by (block id, layer) and, at each call, bring over only
 * the rows the host holds that the copy lacks; in a steady decode with the compressors on the device that is
 * nothing, since last call's device-made rows went into the copy.
 *
 * A slot records how many rows of each region (0: entries, 1: indexer keys) it holds.  Per call and partial block
 * i of a sequence:
 *   bps_get        the slot of (id, layer), kept or newly taken (then empty), or -1;
 *   bps_host_rows  the rows the host holds now: those before the rows the device made this call (be_attn_seq
 *                  ent0 / key0), or, without such rows, all the call reads;
 *   bps_begin      a slot holding more than the host starts over (a state rebuilt under the same block id, which
 *                  nothing does today; a guard, not a path);
 *                  the caller then copies rows [slot's, host's) of each region from the host block;
 *   bps_after      what the slot holds once the device-made rows are patched in: the caller stores it in the
 *                  slot only when the call's copies are queued (a call that declines must not claim rows).
 * Used by the CUDA backend and by the device graph's host emulation (v4.c, md_model_set_host_dev_graph), so the
 * emulation's bit-exact tests check the same rules. */
#ifndef BACKEND_PART_SLOTS_H
#define BACKEND_PART_SLOTS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

typedef struct bps_slot {
    uint64_t id;      /* md_block id; 0: free */
    int layer;
    int32_t have[2];  /* rows held: entries, indexer keys */
    uint64_t call;    /* the last call that used it */
} bps_slot;

static inline uint64_t bps_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The slot of (id, layer) among n: 8 probes from its hash; a victim is a free slot or the oldest one that call
 * does not use.  -1 when all 8 are this call's. */
static inline long bps_get(bps_slot *s, size_t n, uint64_t id, int layer, uint64_t call)
{
    if (!n) return -1;
    const size_t h = (size_t)(bps_mix(id * 0x9E3779B97F4A7C15ull + (uint64_t)layer) % n);
    size_t v = n;
    for (size_t k = 0; k < 8 && k < n; k++) {
        const size_t i = (h + k) % n;
        if (s[i].id == id && s[i].layer == layer) {
            v = i;
            break;
        }
        if (s[i].call != call && (v == n || !s[i].id || s[i].call < s[v].call)) v = i;
    }
    if (v == n) return -1;
    if (s[v].id != id || s[v].layer != layer) {
        s[v].id = id;
        s[v].layer = layer;
        s[v].have[0] = s[v].have[1] = 0;
    }
    s[v].call = call;
    return (long)v;
}

static inline int32_t bps_clamp(int64_t n, int epb) { return (int32_t)(n < 0 ? 0 : n > epb ? epb : n); }

/* rows of block i (entries, keys) the host holds at this call; keys: the layer has indexer keys */
static inline void bps_host_rows(const be_attn_seq *q, size_t i, int epb, int ratio, int keys, int32_t host[2])
{
    const int64_t eb = (int64_t)i * epb;
    for (int k = 0; k < 2; k++) {
        const int64_t e0 = k ? q->key0 : q->ent0, ne = k ? q->nkey : q->nent;
        host[k] = k && !keys ? 0 : bps_clamp((ne > 0 ? e0 : (q->p0 + q->T) / ratio) - eb, epb);
    }
}

static inline void bps_begin(bps_slot *s, const int32_t host[2])
{
    if (s->have[0] > host[0] || s->have[1] > host[1]) s->have[0] = s->have[1] = 0;
}

/* rows of block i held once the call's device-made rows [e0, e0 + ne) are in */
static inline void bps_after(const be_attn_seq *q, size_t i, int epb, const int32_t host[2], int32_t after[2])
{
    const int64_t eb = (int64_t)i * epb;
    for (int k = 0; k < 2; k++) {
        const int64_t e0 = k ? q->key0 : q->ent0, ne = k ? q->nkey : q->nent;
        const int32_t end = ne > 0 && e0 < eb + epb && e0 + ne > eb ? bps_clamp(e0 + ne - eb, epb) : 0;
        after[k] = end > host[k] ? end : host[k];
    }
}

#endif
