/* view.h: the inspector's views. Each view is one file views/view_NAME.c
 * with a const table of callbacks; it computes what to show from a
 * probe_store (live or replayed from a trace) and draws it with the shared
 * painters (paint.h) into any canvas, so the terminal and the exported PNG
 * come from the same code. Views never touch engine memory or curses. */
#ifndef SKV_VIEW_H
#define SKV_VIEW_H

#include "canvas.h"
#include "paint.h"
#include "store.h"

/* What the user is looking at; shared by every view, owned by the TUI or
 * the export command. */
typedef struct view_cursor {
    int layer;      /* model layer */
    int head;       /* KV head */
    int step;       /* decode step shown; -1 = the latest available */
    int chunk;      /* selected chunk, -1 = none */
    int token;      /* selected token position (tokens view), -1 = none */
    int scroll;     /* first row/column shown, as the view defines it */
    int clean;      /* 1: a figure (skv export without --annotate): no cursor decorations */
    int batch;      /* 1: the lanes drawn are a batch's sequences (one step for all, on one clock),
                       not a compare run's policies */
    int unfinished; /* 1: a live run that can still generate: an answer without the needle's value may
                       be unfinished, so it is not yet a miss */
} view_cursor;

void view_cursor_init(view_cursor *cur);

/* A batch of more sequences than this is shown one sequence at a time (the
 * inspector's p, skv export --seq): more stacked bands would each be too
 * thin to read. */
#define VIEW_BATCH_STACK_MAX 4

/* Bits returned by move and click. */
enum { VIEW_HANDLED = 1, VIEW_REDRAW = 2 };

typedef struct view_class {
    const char *name;     /* CLI name: spectrum, chunkmap, selection, cache, timeline, tokens, needle, niah */
    const char *title;    /* shown in the TUI's tab bar */
    const char *help;     /* one line: what the view shows */
    /* Draws the view into r. Returns 0, or SKV_EMISSING when the store has no
     * data for it yet (it then draws a message saying what is missing). res,
     * when not NULL, receives the painter's layout for click mapping and tests. */
    int (*draw)(canvas *c, canvas_rect r, const probe_store *st, const view_cursor *cur, paint_result *res);
    /* Arrow keys / hjkl inside the view: dx, dy in {-1, 0, 1}. May be NULL. */
    int (*move)(view_cursor *cur, const probe_store *st, int dx, int dy);
    /* A mouse click at (x, y) in canvas units, with the layout of the last
     * draw. May be NULL. */
    int (*click)(view_cursor *cur, const probe_store *st, const paint_result *res, double x, double y);
    /* Compare mode: draws from every lane's store at once (names: each
     * lane's policy). May be NULL: view_draw_lanes then stacks one draw per
     * lane. A view with draw_lanes may leave draw NULL-safe by drawing lane
     * 0 alone. */
    int (*draw_lanes)(canvas *c, canvas_rect r, const probe_store *const *st, const char *const *names, int n,
                      const view_cursor *cur, paint_result *res);
    /* A view of one policy's own measures names the PROBE_METRIC it reads:
     * in compare mode only the lanes that have it are drawn. May be NULL. */
    const char *metric;
    /* The event kind the view draws from (0: none in particular): the
     * inspector leaves out the tab of a trace from another writer that holds
     * none of it, and says so (tui/cmd_inspect.c). */
    probe_kind needs;
    /* 1: the view draws what the prefill made (a key spectrum); 2: that and
     * the step's selection (the chunks). A batch's sequences share one
     * prefill, so a batch gets one pane, not one per sequence (with 2, the
     * selection of sequence 0, and says so). */
    int prefill;
} view_class;

/* Draws vc for n lanes (compare mode): its draw_lanes when it has one, else
 * one band per lane, one above the other, each under a line naming its
 * policy (for a view with a metric, only the lanes that have it; the first
 * lane alone when none has); a single lane draws as vc->draw does. res gets the first band's
 * layout. Returns the first error (SKV_EMISSING when no lane had data). */
int view_draw_lanes(const view_class *vc, canvas *c, canvas_rect r, const probe_store *const *st,
                    const char *const *names, int n, const view_cursor *cur, paint_result *res);
/* The stacked form view_draw_lanes falls back to: one pane per lane that has
 * data for the view (the others are left out), each drawn by vc->draw; a
 * view's own draw_lanes may call it after setting what the panes share. A
 * batch (cur->batch) of a prefill view draws sequence 0's pane alone, under
 * a line saying that the prefill is shared. */
int view_draw_lanes_each(const view_class *vc, canvas *c, canvas_rect r, const probe_store *const *st,
                         const char *const *names, int n, const view_cursor *cur, paint_result *res);

/* Every view in tab order, NULL-terminated. A view whose draw is NULL has its
 * place reserved but is not built yet: it is listed, skipped
 * by the TUI's tab key and refused by export with a one-line message (none
 * today). */
extern const view_class *const view_classes[];

const view_class *view_find(const char *name);
/* Every view's name, with its tab's title where that differs ("chunkmap
 * (tab Chunks), ..."), into buf: for error messages. */
void view_names(char *buf, size_t n);
static inline int view_available(const view_class *v) { return v && v->draw != NULL; }

/* The step a cursor shows: cur->step, or the latest step in the store when
 * cur->step < 0 (-1 when there is none). */
int view_step(const probe_store *st, const view_cursor *cur);

/* Cuts buf (in place) with an ellipsis so that it is at most w wide in font. */
void view_fit_text(canvas *c, int font, double w, char *buf);

#define VIEW_LINE_MAX 512
/* Wraps text into at most max lines (each < VIEW_LINE_MAX bytes) at most w
 * wide in font, breaking at spaces; the last line ends in an ellipsis when
 * the text does not fit. Returns the number of lines (0 for empty text). */
int view_wrap(canvas *c, int font, double w, const char *text, char (*lines)[VIEW_LINE_MAX], int max);
/* The note under a figure (body font) into lines: a terminal (cells) gets
 * one line, cut to w; a figure wraps it into at most max lines within w
 * less a pad each side. Returns the number of lines. */
int view_note_lines(canvas *c, int cells, double w, double pad, const char *note, char (*lines)[VIEW_LINE_MAX],
                    int max);

/* Clears res, draws title and a centred message in r, records the message as
 * the last error and returns SKV_EMISSING: what a view draws when the store
 * has no data for it. */
int view_message(canvas *c, canvas_rect r, const char *title, const char *msg, paint_result *res);

/* Why a view has nothing to draw, for any policy: no run yet, no decode steps
 * yet (for per-step kinds), or the run's policy records no events of kind
 * (what names them: "key spectra"). Writes the sentence into buf. */
const char *view_no_data(const probe_store *st, probe_kind kind, const char *what, char *buf, size_t n);

/* As view_no_data, for a policy's own measure (PROBE_METRIC `metric`,
 * per decode step when per_step): owner names who records it ("FreeKV
 * (--kv freekv)"). */
const char *view_no_metric(const probe_store *st, const char *metric, int per_step, const char *what,
                           const char *owner, char *buf, size_t n);

/* The step a move of d (< 0 back, > 0 forward) goes to, into *ns: forward
 * past the last step (or from "latest") gives -1, follow the latest.
 * Returns 0 when the store has no steps. */
int view_next_step(const probe_store *st, const view_cursor *cur, int d, int *ns);
/* Moves cur->step by d as view_next_step says; returns VIEW_* bits. */
int view_move_step(view_cursor *cur, const probe_store *st, int d);

/* A move() for views that show one layer over steps: up/down change the
 * layer, left/right the step (right past the last step follows the latest). */
int view_move_layer_step(view_cursor *cur, const probe_store *st, int dx, int dy);

#endif
