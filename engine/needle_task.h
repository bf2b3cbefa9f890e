/* needle_task.h: what a needle case plants and asks.
 *
 * A task is one or more facts planted in a haystack and a question about one
 * of them. The facts share one template with {key} and {value}; each case
 * draws its keys from the task's key list and a fresh value per fact. The
 * asked fact goes at the case's depth, the others (distractors, as in
 * RULER's niah_multikey) at sentence boundaries drawn from the case's seed.
 * The built-in tasks are the four retrieval kinds the demo model was trained
 * on (samples/train/train.py, make_task): the same sentences, and the same
 * pieces tokenized apart with a leading space. --task-file reads more from
 * JSON Lines (docs/EVAL.md gives the fields). */
#ifndef SKV_NEEDLE_TASK_H
#define SKV_NEEDLE_TASK_H

#define NEEDLE_MAX_FACTS 8
#define NEEDLE_TASK_NAME_MAX 48
#define NEEDLE_KEY_MAX 24          /* a key's bytes + 1 */

typedef struct {
    char name[NEEDLE_TASK_NAME_MAX];
    char *haystack;            /* the task's own haystack text (owned), or NULL: the sweep's */
    char *haystack_path;       /* where it came from (owned), or NULL */
    char *fact;                /* template of every fact: {value}, and {key} when keys are given */
    char *question;            /* the block after the haystack that the answer continues; {key}: the asked key */
    char *answer;              /* the expected answer; {value}: the asked fact's value (default "{value}") */
    int facts_min, facts_max;  /* facts planted per case, the asked one included */
    int n_keys;
    char **keys;               /* (n_keys) keys drawn without replacement, or none */
} needle_task;

/* Names of the built-in tasks, NULL-terminated: single, passkey, multikey, multikey-alt. */
extern const char *const needle_task_names[];

/* Fills t with built-in task name (needle_task_free it). SKV_EINVAL with a
 * message listing the names when there is no such task. */
int needle_task_builtin(const char *name, needle_task *t);

/* A single-fact task from a needle with {value}, a question and the text the
 * answer continues (NULL: the needle's text before {value}); the old
 * --needle/--question/--answer-prefix flags. Named "custom", or the built-in
 * task's name when it is the same text (the defaults are "single"). */
int needle_task_custom(const char *needle, const char *question, const char *answer_prefix, needle_task *t);

/* Reads tasks from a JSON Lines file: one object per non-blank line. A bad
 * line is SKV_EINVAL with "FILE:LINE: field 'F': what is wrong". A relative
 * haystack path is taken from the file's folder. *out is a malloc'd array. */
int needle_task_load(const char *path, needle_task **out, int *n);

void needle_task_free(needle_task *t);
void needle_tasks_free(needle_task *t, int n);

/* 1 when the task's facts carry keys ({key} in the template). */
int needle_task_keyed(const needle_task *t);

/* tmpl with every {key} and {value} replaced, into a malloc'd string (NULL
 * when out of memory). key or value may be NULL when tmpl lacks them. */
char *needle_fill(const char *tmpl, const char *key, const char *value);

#endif
