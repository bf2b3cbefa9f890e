/* trace.h: recording a run's probe events to a file and replaying them.
 *
 * A trace is a header, then packed little-endian binary records, one per
 * event, each with its own CRC-32, appended as the run goes, and at close a
 * JSON metadata record (run, creation, counts) and a footer with the record
 * count and a CRC-32 of the whole file; docs/TRACE.md has the byte layout.
 * A new file is written in place and flushed at every decode step, so a run
 * that is killed (or a full disk) leaves a trace that loads up to its last
 * complete step; an existing file is replaced only when the new one closes.
 * The reader checks everything (magic, version, checksums, JSON, every
 * record's length and array sizes); damage is one line naming the file, or,
 * for a trace cut short, a notice (trace_last_notice) saying what loaded.
 * Kinds it does not know are skipped. Version 2 traces still load. */
#ifndef SKV_TRACE_H
#define SKV_TRACE_H

#include "probe.h"
#include "lanes.h"
#include "store.h"

#include <stdint.h>
#include <stdio.h>

#define TRACE_VERSION 3

typedef struct trace_writer trace_writer;
typedef struct trace_reader trace_reader;

/* Starts a trace at path. With a bus, subscribes a callback for every kind
 * and records what is emitted; with bus NULL, events come only through
 * trace_writer_write. A new path is written as the run goes; an existing
 * file stays as it is until trace_writer_close replaces it. */
int trace_writer_open(const char *path, probe_bus *bus, trace_writer **out);
/* Records one event (not to be mixed with a bus subscription on another thread). */
int trace_writer_write(trace_writer *w, const probe_event *ev);
/* Unsubscribes, writes the metadata record and the footer (and renames the
 * file into place when it replaces one). Frees w. On any error returns it,
 * with a message naming the file. After an error met while recording (a
 * full disk) a new file is kept, cut short at its last complete step;
 * otherwise what was written is removed (an existing file at path is kept). */
int trace_writer_close(trace_writer *w);
/* A string to write in the metadata record as key (a producer's note: skv
 * needle names the command that replays the traced case, "replay"); a copy
 * is kept. Keys the writer fills itself are not replaced. 0 or SKV_ENOMEM. */
int trace_writer_note(trace_writer *w, const char *key, const char *value);
/* Unsubscribes, removes what was written and frees w. */
void trace_writer_abort(trace_writer *w);

/* Opens and validates a trace (header, checksums, metadata, record framing).
 * A trace cut short opens with what is intact up to its last complete step,
 * and trace_last_notice() says so. */
int trace_open(const char *path, trace_reader **out);
/* After trace_open or a load on this thread: "" for a complete trace, else
 * one line naming the file, why it was cut short and what was loaded. */
const char *trace_last_notice(void);
/* The next event: 1 and *ev set (valid until the next call or trace_close),
 * 0 at the end, or a negative SKV_E* for a damaged record. Skips kinds this
 * build does not know. */
int trace_next(trace_reader *r, const probe_event **ev);
/* The metadata block as JSON text (NUL-terminated, owned by r). */
const char *trace_meta_json(const trace_reader *r);
/* Who wrote the trace, from its metadata: "skv 0.1.0-dev", or for a trace
 * from another writer (the metadata's "writer", as probes/python/skvtrace
 * writes it) "skvtrace (Python 3.11) 1.0, producer P". Returns 1 for another
 * writer, 0 for skv (or no metadata: "skv"). */
int trace_writer_label(const trace_reader *r, char *buf, size_t n);
/* Records in the file (known and unknown kinds). */
uint64_t trace_n_records(const trace_reader *r);
void trace_close(trace_reader *r);

/* Replays every event of the trace at path into st; of a compare trace
 * (several lanes), lane 0's. */
int trace_load_store(const char *path, probe_store *st);
/* Replays a trace into one store per lane (a single run is lane 0). */
int trace_load_lanes(const char *path, probe_lanes *L);
/* The same, and who wrote it (trace_writer_label into who, *foreign its result). */
int trace_load_lanes_writer(const char *path, probe_lanes *L, char *who, size_t n, int *foreign);

/* Writes the trace at path as tidy CSV tables into dir (made if missing):
 * KIND.csv per record kind, KIND__FIELD.csv per array field (long: record,
 * lane, step/layer/head, i, value) and meta.json (docs/TRACE.md). An
 * existing table is replaced only with force. A trace cut short or damaged
 * is refused (SKV_EFORMAT, the reader's notice) unless partial, which
 * exports what is intact. *n_tables gets the tables written. */
int trace_export_csv(const char *path, const char *dir, int force, int partial, int *n_tables);

/* Prints a human summary (format version, model, KV policy, counts per kind,
 * steps, layers, file size) for `skv trace info FILE`. */
int trace_info(const char *path, FILE *out);

/* CRC-32 (IEEE 802.3, as in zlib): pass 0 first, then the previous result. */
uint32_t trace_crc32(uint32_t crc, const void *data, size_t n);

/* Length of the well-formed UTF-8 sequence at s (n bytes left: no overlong
 * forms, surrogates or code points past U+10FFFF), 0 when there is none:
 * the exports copy such sequences and escape every other byte. */
int trace_utf8_len(const unsigned char *s, size_t n);

#endif
