/* batch.h: B sequences decoded together, one step for all (batch.c). Each
 * sequence is a session of its own; the batch owns them once made and
 * runs their decode steps with one pass of the weights over B rows. */
#ifndef SKV_BATCH_H
#define SKV_BATCH_H

#include "session.h"

typedef struct skv_batch skv_batch;

/* A batch of the n sessions seqs (one model and backend; prefilled, or to be
 * prefilled before the first step). The step's events go to sequence 0's
 * bus, which the others share (session_set_bus), one lane a sequence. Takes ownership of the sessions on
 * success; on an error they stay the caller's. */
int batch_new(skv_session **seqs, int n, skv_batch **out);
void batch_free(skv_batch *b);

int batch_size(const skv_batch *b);
skv_session *batch_seq(skv_batch *b, int i);   /* sequence i (NULL out of range) */
int batch_steps(const skv_batch *b);           /* steps done */
double batch_t_decode(const skv_batch *b);     /* seconds in batch_decode */

/* One decode step: tokens[i] fed to sequence i at its next position. Each
 * session's logits (session_logits) are then its own, as after
 * session_decode: sample from them for the next step. */
int batch_decode(skv_batch *b, const int32_t *tokens);

#endif
