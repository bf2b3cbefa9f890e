/* lanes.h: the stores of a compare run, one per lane (policy).
 *
 * Compare mode runs several KV policies in lockstep and emits all their
 * events on one bus, each lane's events after a PROBE_LANE event naming it.
 * probe_lanes routes a stream (a ring drained live, or a trace) into one
 * probe_store per lane; a stream without lane events is lane 0 alone, so
 * single runs and their traces load the same way. */
#ifndef SKV_LANES_H
#define SKV_LANES_H

#include "store.h"

#define PROBE_MAX_LANES 8

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
 * teacher the lanes were fed from ("" for a single run). */
int probe_lanes_count(const probe_lanes *L);
probe_store *probe_lanes_store(const probe_lanes *L, int i);
const char *probe_lanes_policy(const probe_lanes *L, int i);
const char *probe_lanes_teacher(const probe_lanes *L);

#endif
