/* main.c: the skv command line: dispatches subcommands. */
#include "cli.h"
#include "needle.h"
#include "trace.h"

#include <stdio.h>
#include <string.h>

#ifndef SKV_VERSION_STRING
#define SKV_VERSION_STRING "0.1.0-dev"
#endif

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"inspect", cmd_inspect, "step through decoding and watch ShadowKV in the terminal (or replay a trace)"},
    {"run", cmd_run, "generate text from a prompt"},
    {"logits", cmd_logits, "print prompt tokens, last logits and greedy tokens as JSON"},
    {"info", cmd_info, "print a model's config, tensors, dtypes and memory"},
    {"synth", cmd_synth, "write a random-weight model of a real shape (for benchmarks)"},
    {"convert", cmd_convert, "write any model skv loads (HF directory or GGUF) as a llama.cpp GGUF"},
    {"needle", cmd_needle, "needle in a haystack: dense vs shadowkv retrieval, NIAH heatmap, why a needle was missed"},
    {"eval", cmd_eval, "a suite of tasks x lengths x policies x budgets: leaderboard, CSV, figures (resumable)"},
    {"export", cmd_export, "draw one view of a trace into a PNG or SVG figure"},
    {"dump", cmd_dump, "write one layer's K, V, query and ShadowKV tensors as .npy"},
    {"trace", cmd_trace, "summarise a recorded trace (skv trace info FILE)"},
    {"bench", cmd_bench, "time prefill and decode on a synthetic prompt"},
};

static void usage(FILE *o) {
    fprintf(o, "usage: skv COMMAND [options]   (skv COMMAND --help for each)\n\n"
               "skv: a ShadowKV inference engine for Llama-family models.\n"
               "skv --version prints the version. Exit status: 0 success, 2 a bad command line, 1 anything else.\n"
#ifdef SKV_HAVE_CUDA
               "This build has the CUDA backend (--backend cuda): built, not yet verified on hardware.\n"
#endif
               "\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(o, "  %-8s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2) { cli_msg("no command given; usage: skv COMMAND [options] (see skv --help)\n"); return 2; }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) { usage(stdout); return 0; }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
        printf("skv %s (trace format %d)\n", SKV_VERSION_STRING, TRACE_VERSION);
        return 0;
    }
    cli_signals_own_thread();
    needle_diag_set_amend(needle_trace_floor); /* every diagnosis (--diagnose, the Needle view) names a floor */
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            cli_command = commands[i].name;
            return commands[i].fn(argc - 1, argv + 1);
        }
    cli_msg("unknown command '%s' (see skv --help)\n", argv[1]);
    return 2;
}
