/* kv_mirror.h - the bookkeeping of a backend's device copies of full KV blocks, and of its per-sequence cache of
 * their addresses.
 *
 * Full blocks never change and block ids are never reused (md_block_new), so a backend may keep a copy of a full
 * block, by id, in one of nslot slots of a device array (slot i at base + i * stride) and give its kernels the
 * slot's address.  Per attention call (kvm_begin, with the caller's call number):
 *   kvm_get        the slot of block id: kept (a hit), or taken for it (*miss = 1: the caller uploads the block
 *                  there, and calls kvm_forget if that fails), or -1 when every slot holds a block this call uses.
 *                  A slot never used is taken first, then the clock hand's next slot this call does not use.  Each
 *                  block the call gets is stamped with the call, so a later miss in the same call cannot take it.
 *   kvm_pc_find    a sequence's cached addresses of its full blocks, keyed by (first id, last id, count): a hit
 *                  (valid while no block has left the mirror since it was stored: m->gen), an entry to fill (*fill:
 *                  the caller resolves the blocks through kvm_get, then kvm_pc_store), or NULL (no room).
 *   kvm_pc_served  the call takes a hit's addresses.  Its blocks are not stamped one by one (at 256 sequences of
 *                  1,024 blocks a layer that was most of the call's host work): the entry is recorded instead, the
 *                  call's first eviction stamps the recorded entries' blocks before it picks a victim, and from
 *                  then on each hit is stamped as it is served.
 * Any eviction bumps m->gen, which voids every cached entry.  An entry this call used is never refilled within it,
 * so a recorded entry's addresses stay put until the call ends.
 *
 * Used by the CUDA backend (cuda.cu); test_kv_mirror checks the rules on the host, among them that no address
 * handed out in a call loses its block before the call ends. */
#ifndef BACKEND_KV_MIRROR_H
#define BACKEND_KV_MIRROR_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/part_slots.h" /* bps_mix */

enum { KVM_PC_SLOTS = 4096, KVM_PC_PROBE = 8 };

typedef struct kvm_slot {
    uint64_t id;   /* the block it holds; 0: none */
    uint64_t call; /* the last call that got it: never evicted during that call */
    int32_t next;  /* bucket chain */
} kvm_slot;

typedef struct kvm_entry {
    uint64_t id0, idl, gen, used; /* key (first id, last id, n); valid while gen == the mirror's; last call */
    size_t n, cap;
    const void **p;               /* the n blocks' addresses */
} kvm_entry;

typedef struct kv_mirror {
    uintptr_t base;
    size_t stride;                /* bytes from one slot to the next */
    size_t nslot, nbucket, hand, fresh; /* slots [fresh, nslot) were never used */
    kvm_slot *s;
    int32_t *head;                /* nbucket chains */
    uint64_t call, gen;
    kvm_entry *pc;                /* KVM_PC_SLOTS entries, from the first kvm_pc_find */
    kvm_entry **pend;             /* entries served this call, not stamped yet */
    size_t npend, pcap;
    int stamped;                  /* this call has evicted: every block it gets is stamped as it gets it */
    size_t hits, uploads, pc_hits, pc_fills;
} kv_mirror;

static inline void kvm_free(kv_mirror *m)
{
    if (m->pc)
        for (size_t i = 0; i < KVM_PC_SLOTS; i++) free(m->pc[i].p);
    free(m->pc);
    free(m->pend);
    free(m->s);
    free(m->head);
    const size_t hits = m->hits, uploads = m->uploads, pch = m->pc_hits, pcf = m->pc_fills;
    memset(m, 0, sizeof *m);
    m->hits = hits; /* the counts are the backend's lifetime's */
    m->uploads = uploads;
    m->pc_hits = pch;
    m->pc_fills = pcf;
}

/* nslot slots at base, stride bytes apart: 0, or -1 out of memory (m then holds none) */
static inline int kvm_init(kv_mirror *m, size_t nslot, uintptr_t base, size_t stride)
{
    kvm_free(m);
    size_t nb = 1;
    while (nb < nslot) nb <<= 1;
    m->s = (kvm_slot *)calloc(nslot ? nslot : 1, sizeof *m->s);
    m->head = (int32_t *)malloc(nb * sizeof *m->head);
    if (!m->s || !m->head || nslot > INT32_MAX) {
        kvm_free(m);
        return -1;
    }
    for (size_t i = 0; i < nb; i++) m->head[i] = -1;
    m->base = base;
    m->stride = stride;
    m->nslot = nslot;
    m->nbucket = nb;
    return 0;
}

static inline void kvm_begin(kv_mirror *m, uint64_t call)
{
    m->call = call;
    m->npend = 0;
    m->stamped = 0;
}

static inline const void *kvm_addr(const kv_mirror *m, size_t slot) { return (const void *)(m->base + slot * m->stride); }
static inline size_t kvm_slot_of(const kv_mirror *m, const void *addr) { return ((uintptr_t)addr - m->base) / m->stride; }

static inline void kvm_stamp_entry(kv_mirror *m, const kvm_entry *e)
{
    for (size_t i = 0; i < e->n; i++) m->s[kvm_slot_of(m, e->p[i])].call = m->call;
}

/* the slot of block id (see the top); *miss = 1 when it was just taken for id */
static inline long kvm_get(kv_mirror *m, uint64_t id, int *miss)
{
    *miss = 0;
    const size_t b = bps_mix(id) & (m->nbucket - 1);
    for (int32_t i = m->head[b]; i >= 0; i = m->s[i].next)
        if (m->s[i].id == id) {
            m->s[i].call = m->call;
            m->hits++;
            return i;
        }
    size_t v = m->nslot;
    if (m->fresh < m->nslot) {
        v = m->fresh++;
    } else {
        if (!m->stamped) { /* the blocks served from the cache so far are this call's too */
            for (size_t r = 0; r < m->npend; r++) kvm_stamp_entry(m, m->pend[r]);
            m->npend = 0;
            m->stamped = 1;
        }
        for (size_t k = 0; k < m->nslot; k++) {
            const size_t i = (m->hand + k) % m->nslot;
            if (!m->s[i].id || m->s[i].call != m->call) {
                v = i;
                break;
            }
        }
        if (v == m->nslot) return -1;
        m->hand = (v + 1) % m->nslot;
    }
    if (m->s[v].id) { /* unlink the old block; every cached entry may hold it */
        m->gen++;
        int32_t *pp = &m->head[bps_mix(m->s[v].id) & (m->nbucket - 1)];
        while (*pp != (int32_t)v) pp = &m->s[*pp].next;
        *pp = m->s[v].next;
    }
    m->s[v].id = id;
    m->s[v].call = m->call;
    m->s[v].next = m->head[b];
    m->head[b] = (int32_t)v;
    m->uploads++;
    *miss = 1;
    return (long)v;
}

/* the upload into slot failed: it holds no block (it stays chained, matching nothing) */
static inline void kvm_forget(kv_mirror *m, long slot)
{
    m->s[slot].id = 0;
    m->uploads--;
}

/* see the top; NULL when out of memory or when every probed entry is in use by this call */
static inline kvm_entry *kvm_pc_find(kv_mirror *m, uint64_t id0, uint64_t idl, size_t n, int *fill)
{
    *fill = 0;
    if (!m->pc && !(m->pc = (kvm_entry *)calloc(KVM_PC_SLOTS, sizeof *m->pc))) return NULL;
    const size_t h = (size_t)bps_mix(id0 * 0x9E3779B97F4A7C15ull ^ idl ^ ((uint64_t)n << 40));
    kvm_entry *v = NULL;
    for (int k = 0; k < KVM_PC_PROBE; k++) {
        kvm_entry *e = &m->pc[(h + (size_t)k) & (KVM_PC_SLOTS - 1)];
        if (e->n == n && e->id0 == id0 && e->idl == idl) {
            if (e->gen == m->gen) {
                e->used = m->call;
                return e;
            }
            if (e->used == m->call) return NULL; /* stored this call, voided since: not refilled within it */
            v = e;
            break;
        }
        if (e->used != m->call && (!v || e->used < v->used)) v = e;
    }
    if (!v) return NULL;
    if (v->cap < n) {
        const void **np = (const void **)realloc(v->p, n * sizeof *np);
        if (!np) return NULL;
        v->p = np;
        v->cap = n;
    }
    v->id0 = id0;
    v->idl = idl;
    v->n = n;
    v->gen = m->gen - 1; /* not valid until stored */
    v->used = m->call;
    *fill = 1;
    return v;
}

/* the call takes hit e's addresses: 0, or -1 out of memory */
static inline int kvm_pc_served(kv_mirror *m, kvm_entry *e)
{
    m->pc_hits++;
    if (m->stamped) {
        kvm_stamp_entry(m, e);
        return 0;
    }
    if (m->npend == m->pcap) {
        const size_t nc = m->pcap ? 2 * m->pcap : 64;
        kvm_entry **np = (kvm_entry **)realloc(m->pend, nc * sizeof *np);
        if (!np) return -1;
        m->pend = np;
        m->pcap = nc;
    }
    m->pend[m->npend++] = e;
    return 0;
}

/* entry e (from kvm_pc_find with *fill) gets its blocks' addresses, e->n of them at src (each got by kvm_get in
 * this call, so stamped) */
static inline void kvm_pc_store(kv_mirror *m, kvm_entry *e, const void *src)
{
    memcpy(e->p, src, e->n * sizeof *e->p);
    e->gen = m->gen;
    m->pc_fills++;
}

#endif
