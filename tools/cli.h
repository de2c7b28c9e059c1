/* cli.h - shared helpers of the deepinfer subcommands. */
#ifndef TOOLS_CLI_H
#define TOOLS_CLI_H

#include <stdio.h>

#include "base/vec.h"

/* read all of a stream; returns 0 or prints an error and returns 1 */
int cli_read_all(FILE *f, rc_bytes *out, const char *what);
/* the tokenizer used when --tokenizer is not given */
const char *cli_default_tokenizer(void);

int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_recipe(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_make_model(int argc, char **argv);
int cmd_serve(int argc, char **argv);

#endif
