/* app.h: the inspector behind `skv inspect`, in three layers that read from
 * the file names:
 *   tui_worker.c  the engine thread: owns the session, prefills, then decodes
 *                 on command (step, run, pause, quit) from a mutex/condvar queue;
 *   tui_blit.c    copies a cells canvas (views/canvas.h) onto the curses screen,
 *                 mapping RGB to 256, 8 or no colours and code points to glyphs;
 *   app.c         the curses application: tab bar, view area, status line,
 *                 keys, mouse, resize, signals, export and the help overlay.
 * cmd_inspect.c parses the command line, loads the model or the trace before
 * curses starts, and wires these together.
 *
 * Threads: the worker owns the session and emits probe events on the bus;
 * the UI thread owns curses, the probe_store and the ring subscriber, and
 * must keep draining the ring (the worker blocks while it is full). The
 * worker pokes a pipe whenever its status changes so the UI wakes at once. */
#ifndef SKV_APP_H
#define SKV_APP_H

#include "compare.h"
#include "lanes.h"
#include "probe.h"
#include "session.h"
#include "store.h"
#include "view.h"

#include <stddef.h>
#include <stdint.h>

/* ---- the engine worker (tui_worker.c) ---- */

typedef enum {
    TUI_W_PREFILL = 0,  /* running the prompt */
    TUI_W_IDLE,         /* prefilled, waiting for a command */
    TUI_W_RUNNING,      /* decoding until paused, -n tokens or end of generation */
    TUI_W_FAILED,       /* an engine error (message in error); only quit is left */
} tui_wstate;

typedef enum { TUI_CMD_STEP = 0, TUI_CMD_RUN, TUI_CMD_PAUSE, TUI_CMD_TOGGLE, TUI_CMD_QUIT } tui_wcmd;

/* A snapshot of the worker, copied out under its lock. */
typedef struct tui_worker_status {
    uint64_t version;           /* bumped on every change */
    tui_wstate state;
    int prefill_done, prefill_total; /* prompt tokens */
    int n_past, n_ctx;          /* positions used / available */
    int steps;                  /* decode steps done */
    int generated_target;       /* run stops when steps reach this (-n) */
    int eog;                    /* 1: the last sampled token ends generation */
    double t_prefill, t_decode; /* seconds */
    size_t kv_resident, kv_offloaded; /* bytes */
    uint64_t hits, misses;      /* the policy's block cache, cumulative (its "hits"/"misses" stats); 0 without */
    char notice[256];           /* the KV policy's notice, or "" */
    char in_force[600];         /* after the prefill: each lane's settings in force, or "" */
    char error[256];            /* the engine's last error when FAILED, or a stop reason */
} tui_worker_status;

typedef struct tui_worker tui_worker;

/* Starts the engine thread. It prefills ids (n_ids tokens), then waits for
 * commands; a run stops after n_predict tokens (then another n_predict on the
 * next run), at an end-of-generation token or when the context is full.
 * Takes ownership of the lanes c (one session, or several policies in
 * lockstep) and ids: tui_worker_free frees them. wake_fd (or -1)
 * gets one byte written, without blocking, whenever the status changes.
 * Blocks SIGINT/TERM/HUP/QUIT/WINCH in the new thread so that signals reach
 * the UI thread. */
int tui_worker_start(compare_run *c, int32_t *ids, int n_ids, int n_predict, int wake_fd, tui_worker **out);

/* Queues a command; never blocks on the engine. */
void tui_worker_send(tui_worker *w, tui_wcmd cmd);

void tui_worker_status_get(tui_worker *w, tui_worker_status *out);

/* Asks the worker to quit, joins it (a prefill in progress runs to its end
 * first), then frees the session, the tokens and w. NULL is ignored. */
void tui_worker_free(tui_worker *w);

/* ---- cells canvas -> curses (tui_blit.c); call only while curses is up ---- */

/* Sets up colours after the screen exists: 256 colours when the terminal
 * has them, else 8, else none. Returns the count used (256, 8 or 0). */
int tui_blit_init(void);
/* The curses colour pair for an RGB (or CANVAS_DEFAULT) pair; 0 without colour. */
int tui_blit_pair(canvas_color fg, canvas_color bg);
/* Copies the canvas's grid onto the screen with its top-left cell at (y, x),
 * clipped to the screen. utf8 = 0 writes only ASCII. */
void tui_blit(canvas *c, int y, int x, int utf8);
/* Writes a UTF-8 string at (y, x), at most w cells, with attributes and a pair. */
void tui_blit_text(int y, int x, int w, const char *utf8, int attr, int pair, int utf8_ok);

/* ---- the application (app.c) ---- */

typedef struct app_opts {
    probe_lanes *lanes;         /* borrowed; one store per policy (one for a single run); the UI thread owns
                                   them while app_run runs */
    probe_sub *ring;            /* live: drained into the lanes; NULL when replaying */
    tui_worker *worker;         /* live; NULL when replaying */
    int wake_fd;                /* read end of the worker's wake pipe, or -1 */
    const char *model_label;    /* model name for the status line (live) */
    int random_weights;         /* live: the model was made by skv synth */
    const char *replay_path;    /* the trace being replayed, or NULL */
    const char *notice;         /* shown at start (a trace cut short), or NULL */
    const char *trace_path;     /* live: the trace being recorded, or NULL */
    const char *export_dir;     /* where e writes figures (made at the first export); NULL: the current directory */
    const char *policy;         /* compare mode: the one lane shown at start (--policy NAME), or NULL for all */
    int has_seq, seq;           /* a batched trace: the sequence shown at start (--seq N) */
    unsigned hidden;            /* bit i: view_classes[i] has no tab (a foreign trace without its events) */
} app_opts;

/* Takes over the terminal: quit-signal handlers (a flag and a self-pipe),
 * curses, colours, mouse. Returns 0, or 1 with a one-line message on stderr
 * (no terminal description, a terminal that cannot move the cursor), in
 * which case the terminal is untouched. Call before starting the worker so
 * that a bad terminal does not wait for a prefill. */
int app_open(void);

/* Runs the interface (after app_open) until q, a signal (INT, TERM, HUP,
 * QUIT) or an error, and always restores the terminal (app_close) before
 * returning. Returns 0 after q, 128 + the signal's number after a signal,
 * 1 on an error. Does not stop the worker. */
int app_run(const app_opts *o);

/* Gives the terminal back (endwin) and restores the signal handlers; safe
 * to call when it is not open. */
void app_close(void);

/* Whether the locale's character set is UTF-8 (after setlocale). */
int app_locale_utf8(void);

#endif
