/* batch.h: B sequences decoded together, one step for all (batch.c). Each
 * sequence is a session of its own; the batch owns them once made and
 * runs their decode steps with one pass of the weights over B rows. */
#ifndef SKV_BATCH_H
#define SKV_BATCH_H

#include "session.h"

typedef struct skv_batch skv_batch;

/* A batch of the n sessions seqs (one model and backend; prefilled, or to be
 * prefilled before the first step). Its forward state (n rows of
 * activations) borrows the weights the sessions use: one copy in the
 * process (forward.h), so a batch's memory is the weights once and, per
 * sequence, its session's KV and activations and its row of the batch's. The step's events go to sequence 0's
 * bus, which the others share (session_set_bus), one lane a sequence. Takes ownership of the sessions on
 * success; on an error they stay the caller's. */
int batch_new(skv_session **seqs, int n, skv_batch **out);
void batch_free(skv_batch *b);

skv_session *batch_seq(skv_batch *b, int i);   /* sequence i (NULL out of range) */
int batch_steps(const skv_batch *b);           /* steps done */
double batch_t_decode(const skv_batch *b);     /* seconds in batch_decode */

/* One decode step: tokens[i] fed to sequence i at its next position. Each
 * session's logits (session_logits) are then its own, as after
 * session_decode: sample from them for the next step. */
int batch_decode(skv_batch *b, const int32_t *tokens);

/* batch_decode for the sequences with live[i] set (NULL: all): a sequence
 * that has ended (end of text) is fed nothing, so its steps, events and
 * logits stay as they were and the step's rows are the live ones only.
 * With no live sequence, nothing runs. */
int batch_decode_live(skv_batch *b, const int32_t *tokens, const unsigned char *live);
long batch_rows_fed(const skv_batch *b);        /* tokens fed over every step */

/* Sequence i's last generated token, which no step feeds: its token event
 * in its lane (session_emit_last). */
void batch_emit_last(skv_batch *b, int i, int32_t token);

/* The largest batch whose sequences fit two pools of memory: the batch
 * takes once_a bytes of pool a whatever its size (the weights: every
 * sequence borrows the process's one copy, forward_weights; 0 when avail_a
 * was read with them already loaded) and each sequence per_a more (its
 * resident KV and activations), of avail_a free; each sequence takes per_b
 * of pool b (avail_b free; per_b 0: none). So B fits when once_a + B per_a
 * <= avail_a and B per_b <= avail_b. On a device, a is its memory and b the
 * host's (ShadowKV's offloaded values, pinned); on the CPU, one pool (and
 * the disk for the file tier). *bound gets the pool that limits it: 0 a,
 * 1 b. At most 4096; 0 when not one fits. */
int batch_fit(double once_a, double per_a, double avail_a, double per_b, double avail_b, int *bound);

#endif
