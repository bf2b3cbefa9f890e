/* trace_chrome.h: a trace as a Chrome / Perfetto timeline (docs/TRACE.md,
 * "Timelines in Perfetto and chrome://tracing").
 *
 * `skv export TRACE --format chrome OUT.json` writes the Trace Event
 * Format's JSON object form, which ui.perfetto.dev, chrome://tracing,
 * speedscope and Chrome DevTools' Performance panel open: a process per lane
 * (a compare trace's policy, a batch's sequence), a thread per stream
 * (compute, fetch, rebuild) ordered as the Timeline view orders its rows,
 * every timed span of every step as a complete event, each decode step's
 * start as an instant event, per-step counters, and the trace's metadata. */
#ifndef SKV_TRACE_CHROME_H
#define SKV_TRACE_CHROME_H

#include <stdint.h>

/* What was written, for the command's summary line. */
typedef struct {
    int processes;      /* lanes (times runs, when a lane holds several) */
    int threads;        /* (process, stream) tracks, overflow tracks included */
    int steps;          /* decode steps, summed over processes */
    uint64_t spans;     /* complete events: every span record of the trace */
    uint64_t events;    /* every event in traceEvents */
    int overflow;       /* spans moved to an extra track because they overlapped
                           another on their stream without nesting in it */
} trace_chrome_stats;

/* Writes the trace at path as Trace Event Format JSON at out, through a
 * temporary file renamed into place; an existing out is replaced only with
 * force. A trace cut short or damaged is refused (SKV_EFORMAT, the reader's
 * notice) unless partial, which exports what is intact. A span that ends
 * before it starts, or whose times are not finite, is SKV_EFORMAT naming
 * the record. stats may be NULL. */
int trace_export_chrome(const char *path, const char *out, int force, int partial, trace_chrome_stats *stats);

#endif
