/* deepinfer.c - the one binary: `deepinfer <subcommand> ...`.
 *
 * This file only dispatches; each subcommand lives in tools/cmd_*.c and
 * owns its flags and its --help. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#ifndef DEEPINFER_VERSION
#define DEEPINFER_VERSION "0.0.0-dev"
#endif

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"tokenize", cmd_tokenize, "text on stdin -> token ids (content mode unless --template)"},
    {"detokenize", cmd_detokenize, "JSON array of ids on stdin -> text on stdout, byte-exact"},
    {"recipe", cmd_recipe, "recipe render|tokens|parse: API request -> prompt / ids; output -> events"},
    {"logits", cmd_logits, "prefill logits of a token sequence (checks a checkpoint against a reference)"},
    {"serve", cmd_serve, "HTTP API server: Chat Completions, Responses, Anthropic Messages"},
    {"make-tiny-model", cmd_make_model, "write a V4-architecture checkpoint with deterministic random weights"},
    {"generate", cmd_generate, "continue a prompt with the model (greedy or sampled), token by token"},
};

static void usage(FILE *f) {
    fprintf(f,
            "deepinfer %s - inference server and tools for DeepSeek V4-family models\n\n"
            "usage: deepinfer <command> [options]   (deepinfer <command> --help for details)\n\n"
            "commands:\n",
            DEEPINFER_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-16s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "  %-16s %s\n", "version", "print the version");
    fprintf(f,
            "\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
        printf("deepinfer %s\n", DEEPINFER_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "deepinfer: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
