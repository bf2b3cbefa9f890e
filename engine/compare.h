/* compare.h: compare mode: several KV policies in lockstep on one prompt.
 *
 * One session per policy (a lane), all on the same model, fed the same
 * prompt and, at every decode step, the same token: the teacher's. The
 * teacher is dense when it is in the list, else the first policy; every
 * lane's own argmax is compared with the teacher's token at each step. With
 * a bus, every lane's events follow a PROBE_LANE event naming it, so
 * probes/lanes.h routes them to one store per lane (live or from a trace). */
#ifndef SKV_COMPARE_H
#define SKV_COMPARE_H

#include "session.h"

#define COMPARE_MAX 8

typedef struct {
    int n;                          /* lanes */
    int teacher;                    /* the lane whose tokens everyone is fed */
    char policy[COMPARE_MAX][32];
    skv_session *s[COMPARE_MAX];
    probe_bus *bus;                 /* borrowed; may be NULL */
    int steps;
    int agree[COMPARE_MAX];         /* steps where the lane's argmax equals the teacher's token */
} compare_run;

/* Parses "dense,shadowkv,..." (registered names, no repeats, at most
 * COMPARE_MAX) into names; returns the count or a negative SKV_E* with a
 * message. */
int compare_parse(const char *list, char names[][32], int max);

/* Creates one session per policy in names with base's options (a --kv-opt
 * must belong to some lane's policy; each lane takes the options it has). */
int compare_new(skv_model *m, const session_opts *base, char names[][32], int n, compare_run **out);
void compare_free(compare_run *c);

/* Prefills every lane with the prompt. progress as session_prefill's, over
 * all lanes (done and total summed). */
int compare_prefill(compare_run *c, const int32_t *ids, int n, int (*progress)(void *, int, int), void *user);

/* The teacher's next token (sampled from its logits). */
int compare_next(compare_run *c);

/* Feeds token to every lane (one decode step each) and counts agreement. */
int compare_decode(compare_run *c, int32_t token);

/* The last generated token, fed to no lane: each lane's token event
 * (session_emit_last). */
void compare_emit_last(compare_run *c, int32_t token);

#endif
