/* cli.h: option parsing shared by the commands that load a model and
 * generate (run, logits, inspect, needle, bench, dump), and small helpers. */
#ifndef SKV_CLI_H
#define SKV_CLI_H

#include "session.h"
#include <stdio.h>

typedef struct {
    const char *model;       /* -m */
    const char *prompt;      /* -p */
    const char *prompt_file; /* -f */
    char *prompt_buf;        /* owned text read from -f */
    int n_predict;           /* -n */
    int no_bos;
    int threads;
    int json;
    const char *trace;       /* --trace FILE */
    int force;               /* --force: replace an existing output file */
    struct probe_bus *bus;   /* owned, when tracing */
    struct trace_writer *tw; /* owned, when tracing */
    session_opts s;
    /* --kv a,b,...: the policies to compare (n_kv > 1); s.kv.policy is the first */
    int n_kv;
    char kv_list[8][32];
    /* the policy flags given (--rank, --page, ...), to check they apply */
    const char *flags_given[32];
    int n_flags_given;
} cli_gen;

/* 0 when every policy flag given (--rank, --page, ...) is an option of at
 * least one of the n policies named; else prints which policies it belongs
 * to and returns 2. policies NULL: those of --kv (its list, or the one).
 * --oracle with dense alone is taken, with one line saying it scores nothing. */
int cli_check_policy_flags(const cli_gen *g, const char *cmd, const char *const *policies, int n);
/* Forgets the policy flags seen so far: a command's preset sets them, and
 * only the user's own are checked. */
void cli_gen_forget_flags(cli_gen *g);

void cli_gen_default(cli_gen *g);

/* Tries argv[*i] (and its value) as a generation option; returns 1 if it was
 * one (advancing *i past its value), 0 if not, -1 on a bad value (message
 * printed), CLI_DONE when it printed what was asked (--kv help) and the
 * command should exit 0. */
#define CLI_DONE 2
int cli_gen_option(cli_gen *g, int argc, char **argv, int *i);

/* 0 when --kv named one policy; else prints that cmd takes one (a list
 * compares policies in skv run and skv inspect) and returns 2. */
int cli_single_policy(const cli_gen *g, const char *cmd);

/* Prints the generation options' help lines; flags: CLI_HELP_SAMPLING adds
 * the sampling options, CLI_HELP_TRACE the --trace/--force pair (commands
 * that record one). */
enum { CLI_HELP_SAMPLING = 1, CLI_HELP_TRACE = 2 };
void cli_gen_help(FILE *o, int flags);

/* A usage error (returned, 2) when --trace was given to a command that does
 * not record one; 0 otherwise. */
int cli_no_trace(const cli_gen *g, const char *cmd);

/* The prompt text from -p or -f (reading the file); NULL with a message printed. */
const char *cli_prompt_text(cli_gen *g);

void cli_gen_free(cli_gen *g);

/* 0 when path may be written: not a directory, in a writable folder that
 * exists, and new unless force. Else prints which (an existing file: use
 * --force to replace it) and returns 1. The one rule for every output a
 * command writes, checked before any work starts. */
int cli_check_output(const char *cmd, const char *path, int force);

/* The folder holding path ("." for a bare name, "/" at the root) into dir. */
void cli_dir_of(const char *path, char *dir, size_t cap);

/* --seq N of a trace loaded into lanes (path): 0 when N names one of its
 * batch's sequences, else 1 after one line saying which it has or that it is
 * not a batched run. */
struct probe_lanes;
int cli_check_seq(const char *cmd, const struct probe_lanes *lanes, const char *path, int seq);

/* Warns (stderr, one line) when -c asks for more positions than the model
 * was trained on. */
struct skv_model;
void cli_ctx_warning(const cli_gen *g, const struct skv_model *m);
/* 0, or prints that a length of the sweep is more than twice the model's
 * trained context (its cases would take long and cannot retrieve) and
 * returns 2; force lets it run. */
int cli_check_lengths(const char *cmd, const struct skv_model *m, const int *lengths, int n, int force);

/* Ctrl-C (SIGINT or SIGTERM) while a command works: cli_stop_catch() makes
 * the first one set a flag that cli_stop_requested() reports and say at once
 * "stopping after the UNIT in flight (Ctrl-C again to quit now)" (the
 * command finishes that unit, a step or a case, and keeps what it made;
 * status 130), a second one exits at once; cli_stop_release() restores the
 * handlers. */
#define CLI_STOPPED 130
void cli_stop_catch(const char *unit);
/* Called first in main: a thread of its own takes the quit signals, so no
 * compute thread is ever interrupted by a handler (see cli.c). */
void cli_signals_own_thread(void);
int cli_stop_requested(void);
void cli_stop_release(void);

/* The first of rels (paths relative to the executable's directory, then to
 * the current directory) that exists, into out; -1 (with the first path
 * tried) if none. How commands find samples/ without a flag. */
int cli_find_near_exe(const char *const *rels, int n, char *out, size_t cap);

/* The demo model (samples/model/skv-demo.gguf, near the executable, then in
 * the current directory) into out: 0, or 1 with "skv CMD: no -m MODEL given
 * and the default model ... is missing" printed. What run, needle and eval
 * load without -m. */
int cli_demo_model(const char *cmd, char *out, size_t cap);

/* The command running ("run", "needle"), set by main; every message to
 * stderr starts "skv CMD: " (plain "skv: " before a command is known). */
extern const char *cli_command;
void cli_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Each line of text (newline-separated) as "skv CMD: warning: LINE". */
void cli_warn_lines(const char *text);

/* Why generation stopped at a full context of ctx positions (skv run, the
 * inspector): one line, into buf. */
void cli_context_full_text(char *buf, size_t n, int ctx);

/* "4k" for a multiple of 1024 tokens, else the number: how lengths are labelled. */
void cli_len_label(int v, char *buf, size_t n);
/* Bytes in binary units: "512 B", "3.1 KiB", "1.64 MiB", "2.00 GiB". */
void cli_bytes(char *buf, size_t cap, double n);

/* Prints "skv CMD: <last error>" to stderr and returns 1. */
int cli_fail(void);
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

int cmd_run(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_dump(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_needle(int argc, char **argv);
int cmd_eval(int argc, char **argv);
/* skv eval's resume path on DIR/cases.jsonl for a fixed small suite (two
 * tasks, two lengths, three depths, two seeds, a budget sweep), then what
 * the leaderboard, the CSV and the figures make of it (nothing written but
 * the file's cut last line): 0, or the error a user would see. For the fuzz
 * harness fuzz_eval. */
int eval_resume_check(const char *dir);

#endif
