/* safetensors.h - read-only access to a safetensors checkpoint directory.
 *
 * Lifecycle: md_ckpt_open -> md_ckpt_find / md_ckpt_get from any number of
 * threads -> md_ckpt_close.  An open checkpoint is immutable; tensor data
 * points straight into read-only mmaps of the files (no copy), and stays valid
 * until md_ckpt_close.  Data is aligned only as well as the file aligns it
 * (writers pad the header to 8 bytes, but nothing guarantees it).
 *
 * Names are normalized to the official V4 form (model-v4.md §6.4): a leading
 * "model." is stripped, "embed_tokens.weight" -> "embed.weight",
 * "hc_head.hc_{fn,base,scale}" -> "hc_head_{fn,base,scale}",
 * "lm_head.weight" -> "head.weight".  The raw name is kept for messages.
 * Every header is validated in full when opened (model-v4.md §6; see
 * md_st_parse); errors name the file and the tensor. */
#ifndef MODEL_SAFETENSORS_H
#define MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "model/dtype.h"

#define MD_MAX_DIMS 8
#define MD_ST_MAX_HEADER 100000000u /* bytes; the reference implementation's limit */

typedef struct {
    const char *name;     /* normalized (official) name */
    const char *raw_name; /* as stored in the file */
    const char *file;     /* path of the file holding it */
    md_dtype dtype;
    int ndim;
    int64_t shape[MD_MAX_DIMS];
    const void *data;
    size_t nbytes;
} md_tensor;

typedef struct md_ckpt md_ckpt;

/* Open a checkpoint: a directory holding model.safetensors, or
 * model.safetensors.index.json and its shards (model.safetensors wins when
 * both exist, as in transformers), or the path of one .safetensors file.
 * Prints nothing. */
int md_ckpt_open(const char *dir, md_ckpt **out, rc_err *err);
void md_ckpt_close(md_ckpt *c);

/* Tensors in file order (shards sorted by file name, then by data offset). */
size_t md_ckpt_count(const md_ckpt *c);
const md_tensor *md_ckpt_at(const md_ckpt *c, size_t i);
/* O(1) lookup by normalized name; NULL if absent. */
const md_tensor *md_ckpt_find(const md_ckpt *c, const char *normalized_name);
/* Find and check: dtype must be in `allowed` (a mask of MD_DT(dtype); 0 = any),
 * and, unless ndim < 0, the shape must be shape[0..ndim).  The error names the
 * tensor and its file, expected vs actual.  out may be NULL. */
int md_ckpt_get(const md_ckpt *c, const char *name, unsigned allowed, int ndim, const int64_t *shape,
                const md_tensor **out, rc_err *err);
uint64_t md_ckpt_total_bytes(const md_ckpt *c); /* sum of tensor nbytes */

/* Pre-fault every page of every file (reads one byte per 4 KiB) so later
 * access does not stall on disk; progress (may be NULL) is called about every
 * GiB and once at the end with done == total (bytes of the files). */
void md_ckpt_touch(const md_ckpt *c, void (*progress)(void *arg, uint64_t done, uint64_t total),
                   void *arg);

/* Parse and validate one file's header; buf is the whole file.  On success
 * *tensors is one allocation (names included) of *n entries sorted by data
 * offset, with data pointing into buf; free it with md_st_free.  fname is
 * only used in messages and copied into the entries' `file`.  Rejected:
 * file < 8 bytes; header length beyond the file or MD_ST_MAX_HEADER; header
 * not a JSON object (or with duplicate keys); an entry without dtype, shape
 * or data_offsets; an unknown dtype (RC_EUNSUP); negative or non-integer
 * numbers; more than MD_MAX_DIMS dims; begin > end; end beyond the data
 * section; shape product * dtype size != end - begin (packed FP4 is stored as
 * I8 whose shape counts bytes, so the plain rule holds); overlapping tensors;
 * two names equal after normalization.  "__metadata__" may hold string
 * values. */
int md_st_parse(const uint8_t *buf, size_t len, const char *fname, md_tensor **tensors, size_t *n,
                rc_err *err);
void md_st_free(md_tensor *tensors);

/* Write the normalized form of raw into out (cap bytes); returns its length,
 * or -1 when it does not fit. */
int md_st_normalize(const char *raw, char *out, size_t cap);

#endif
