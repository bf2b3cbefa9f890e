/* needle_out.h: what skv needle and skv eval both say about a case: its
 * JSON object, the note on a distractor answer, and the --task /
 * --task-file choice. */
#ifndef SKV_NEEDLE_OUT_H
#define SKV_NEEDLE_OUT_H

#include "cli.h"
#include "needle.h"

#include <cjson/cJSON.h>
#include <stddef.h>

/* Case c as a JSON object: index, length, depth, run, task, value, the
 * asked fact's span, every fact (key, value, tokens), and per method its
 * answer, hit, distractor and (with the oracle) per-step agreement. NULL
 * when out of memory. */
cJSON *needle_case_json(const needle_opts *o, const needle_case *c);

/* "answered heron's value 4821735 (a distractor)" when method m of c
 * answered a distractor's value, else "". */
void needle_answer_note(const needle_case *c, int m, char *buf, size_t n);

/* The tasks named by --task (a comma list; NULL: all of the file's, or
 * "single") and --task-file (NULL: the built-ins) into *out (malloc'd,
 * needle_tasks_free). 0, or prints "skv CMD: ..." and returns 2 (a bad
 * name, a bad file line). */
int needle_tasks_choose(const char *cmd, const char *names, const char *file, needle_task **out, int *n);

/* cli_check_policy_flags against the methods of o (skv needle, skv eval). */
int needle_check_flags(const cli_gen *g, const char *cmd, const needle_opts *o);

#endif
