/* crc32c.h - CRC32C (Castagnoli), the checksum of every byte format we
 * persist (state snapshots, KV store files).  Reflected polynomial
 * 0x82F63B78, init and final xor ~0: "123456789" -> 0xE3069283.  Table
 * driven (slicing by 8); thread-safe. */
#ifndef BASE_CRC32C_H
#define BASE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t rc_crc32c(const uint8_t *p, size_t n);

#endif
