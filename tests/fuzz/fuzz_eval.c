/* fuzz_eval.c: a cases.jsonl through skv eval's resume reader (every line a
 * case record of the suite, or a one-line error; a cut last line dropped),
 * then the leaderboard, the CSV and the figures made from what it kept
 * (eval_resume_check, tui/cmd_eval.c), with no model. */
#include "cli.h"
#include "fuzz.h"

static void fuzz_eval_init(void) {}

static int fuzz_eval(const uint8_t *data, size_t size) {
    char path[512], dir[512];
    snprintf(dir, sizeof dir, "%s/eval", fuzz_dir());
    mkdir(dir, 0700);
    if (!fuzz_put("eval/cases.jsonl", data, size, path, sizeof path)) return 0;
    eval_resume_check(dir);
    return 0;
}

FUZZ_MAIN(eval)
