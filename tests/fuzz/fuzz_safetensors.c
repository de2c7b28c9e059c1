/* fuzz_safetensors.c - libFuzzer harness for safetensors headers.
 *
 * The input is a whole file.  Properties: md_st_parse never crashes, leaks
 * or reads outside the buffer; a rejection comes with a message naming the
 * file; an acceptance yields tensors inside the data section, sorted by
 * offset, pairwise disjoint, with nbytes = product(shape) * dtype size and
 * non-empty, pairwise distinct normalized names. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    md_tensor *t = NULL;
    size_t n = 0;
    rc_err err = {0};
    int rc = md_st_parse(data, size, "fuzz.safetensors", &t, &n, &err);
    if (rc) {
        if (t || n || !strstr(err.msg, "fuzz.safetensors")) abort();
        return 0;
    }
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)data[i] << (8 * i);
    const uint8_t *lo = data + 8 + hlen, *hi = data + size;
    const uint8_t *end = lo;
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *b = t[i].data;
        if (b < lo || b > hi || t[i].nbytes > (size_t)(hi - b)) abort();
        uint64_t count = 1;
        for (int d = 0; d < t[i].ndim; d++) count *= (uint64_t)t[i].shape[d];
        if (count * md_dtype_size(t[i].dtype) != t[i].nbytes) abort();
        if (t[i].nbytes) {
            if (b < end) abort(); /* overlap */
            end = b + t[i].nbytes;
            sink ^= b[0] ^ b[t[i].nbytes - 1];
        }
        if (!t[i].name[0] || strcmp(t[i].file, "fuzz.safetensors")) abort();
        for (size_t j = 0; j < i; j++)
            if (!strcmp(t[i].name, t[j].name)) abort();
    }
    (void)sink;
    md_st_free(t);
    return 0;
}
