/* lanes.h: the stores of a compare run, one per lane (policy), or of a
 * batched run, one per sequence.
 *
 * Compare mode runs several KV policies in lockstep and emits all their
 * events on one bus, each lane's events after a PROBE_LANE event naming it.
 * A batched run (skv run --parallel) does the same with one lane per
 * sequence, all of one policy, teacher "". probe_lanes routes a stream (a
 * ring drained live, or a trace) into one probe_store per lane; a stream
 * without lane events is lane 0 alone, so single runs and their traces load
 * the same way. A batch's sequences share the prompt: the prefill's events,
 * which come before the first lane event, go to every sequence's store. */
#ifndef SKV_LANES_H
#define SKV_LANES_H

#include "store.h"

#define PROBE_MAX_LANES 64   /* compare mode runs at most 8 policies; a traced batch up to 64 sequences */

typedef struct probe_lanes probe_lanes;

int probe_lanes_new(probe_lanes **out);
void probe_lanes_free(probe_lanes *L);

/* Routes ev: a PROBE_LANE event selects the lane that takes what follows
 * (creating its store); anything else goes to the current lane's store.
 * Errors as probe_store_add; a lane index out of range is SKV_ERANGE. */
int probe_lanes_add(probe_lanes *L, const probe_event *ev);

/* As probe_store_drain, into the lanes. */
int probe_lanes_drain(probe_lanes *L, probe_sub *ring, int max);

/* Lanes seen (at least 1), lane i's store (NULL out of range), its policy
 * name from its lane event or its run event ("" when unknown), and the
 * teacher the lanes were fed from ("" for a single run or a batch). */
int probe_lanes_count(const probe_lanes *L);
probe_store *probe_lanes_store(const probe_lanes *L, int i);
const char *probe_lanes_policy(const probe_lanes *L, int i);
const char *probe_lanes_teacher(const probe_lanes *L);

/* 1 when the lanes are a batch's sequences (lane events with teacher ""). */
int probe_lanes_batched(const probe_lanes *L);

/* Lane i's name for a view: its policy in compare mode and a single run,
 * "seq i" in a batch ("" out of range). */
const char *probe_lanes_label(const probe_lanes *L, int i);

#endif
