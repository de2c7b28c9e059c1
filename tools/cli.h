/* cli.h - shared helpers of the deepinfer subcommands. */
#ifndef TOOLS_CLI_H
#define TOOLS_CLI_H

#include <stdio.h>

#include "base/vec.h"

/* read all of a stream; returns 0 or prints an error and returns 1 */
int cli_read_all(FILE *f, rc_bytes *out, const char *what);
/* an integer flag value in [lo, hi]; 0, or prints "<flag> expects ..." and returns -1 */
int cli_int(const char *flag, const char *v, long lo, long hi, long *out);
/* the tokenizer used when --tokenizer is not given */
const char *cli_default_tokenizer(void);

/* the CUDA backend, loaded as a module on demand (cmd_model.c); NULL + msg
 * when this build or machine has none */
struct be_backend;
struct be_backend *cli_load_cuda(int threads, char *msg, size_t cap);
/* its sticky error (NULL if none, or for other backends) */
const char *cli_cuda_error(const struct be_backend *be);

int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_recipe(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_make_model(int argc, char **argv);
int cmd_serve(int argc, char **argv);

#endif
