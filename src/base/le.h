/* le.h - little-endian integers in byte buffers: the one encoding of every
 * format we persist (state snapshots, KV store files), independent of the
 * host's byte order. */
#ifndef BASE_LE_H
#define BASE_LE_H

#include <stdint.h>

static inline void rc_put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline void rc_put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t rc_get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t rc_get_le64(const uint8_t *p)
{
    return (uint64_t)rc_get_le32(p) | (uint64_t)rc_get_le32(p + 4) << 32;
}

#endif
