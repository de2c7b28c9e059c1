/* crc32c.c - CRC32C for checksummed state and store files. */
#include <pthread.h>

#include "base/crc32c.h"

/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor
 * ~0), slicing by 8; "123456789" -> 0xE3069283. */
static uint32_t crc_tab[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_tab[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++) crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 255];
}

uint32_t rc_crc32c(const uint8_t *p, size_t n)
{
    pthread_once(&crc_once, crc_init);
    uint32_t c = 0xFFFFFFFFu;
    for (; n >= 8; p += 8, n -= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        c = crc_tab[7][lo & 255] ^ crc_tab[6][(lo >> 8) & 255] ^ crc_tab[5][(lo >> 16) & 255] ^ crc_tab[4][lo >> 24] ^
            crc_tab[3][p[4]] ^ crc_tab[2][p[5]] ^ crc_tab[1][p[6]] ^ crc_tab[0][p[7]];
    }
    for (; n; p++, n--) c = (c >> 8) ^ crc_tab[0][(c ^ *p) & 255];
    return c ^ 0xFFFFFFFFu;
}
