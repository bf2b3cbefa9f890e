/* app.c: the inspector's curses application. The screen is a tab bar (one
 * tab per available view), the view area (a cells canvas of exactly that
 * size, drawn by the view and blitted by tui_blit.c), a status line (model,
 * context, steps, speed, KV bytes, hit rate) and a bottom line (prefill
 * progress, messages, key hints).
 *
 * One loop on the UI thread: drain the probe ring into the store, pick up
 * the worker's status, redraw when something changed (at most ~20 times a
 * second while events stream in), then poll() stdin, the signal self-pipe
 * and the worker's wake pipe. Keys go through one const table whose rows
 * return a small bit set (handled, redraw, quit), as htop's handlers do; the
 * help overlay is printed from the same table. SIGINT, SIGTERM, SIGHUP and
 * SIGQUIT only set a flag and write to the self-pipe; the loop then leaves
 * through endwin. An atexit handler and a SIGABRT handler restore the
 * terminal as a last resort. */
#define NCURSES_WIDECHAR 1
#include "app.h"
#include "cli.h"
#include "skv.h"

#include <curses.h>
#include <errno.h>
#include <fcntl.h>
#include <langinfo.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

enum { MIN_COLS = 60, MIN_ROWS = 15 };
enum { APP_HANDLED = 1, APP_REDRAW = 2, APP_QUIT = 4 };
enum { MAX_TABS = 32 };

/* PNG export size in logical pixels, and its scale (2 = a crisp 2x figure). */
enum { EXPORT_W = 1200, EXPORT_H = 700, EXPORT_SCALE = 2 };

typedef struct app {
    const app_opts *o;
    probe_store *st;
    int utf8, colors;
    int rows, cols;
    int view;                   /* index in view_classes */
    view_cursor cur;
    paint_result res;           /* layout of the last draw, for clicks */
    int res_ok;
    canvas *cv;                 /* cells canvas of the view area */
    int cv_cols, cv_rows;
    int view_top, view_h;       /* the view area on screen */
    int help;                   /* the help overlay is shown */
    char msg[1024];             /* a transient message for the bottom line */
    double msg_until;
    int msg_yields;             /* msg is the start's notice: a prefill's progress bar goes over it */
    char draw_err[256];
    tui_worker_status ws;       /* last snapshot of the worker */
    double t_start;
    int playing;                /* replay: stepping through recorded steps */
    int lane;                   /* compare mode: the one lane shown (p cycles), -1 for every lane */
    double play_next;
    int tab_y, n_tabs;          /* the tab bar: its row, and each tab's columns */
    int tab_x0[MAX_TABS], tab_x1[MAX_TABS], tab_view[MAX_TABS];
} app;

/* ---- signals and the last-resort restore ---- */

static volatile sig_atomic_t got_signal;
static int sig_pipe[2] = {-1, -1};
static volatile sig_atomic_t curses_up;
static SCREEN *screen;
static const int quit_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
#define N_QUIT_SIGNALS ((int)(sizeof quit_signals / sizeof quit_signals[0]))
static struct sigaction old_actions[N_QUIT_SIGNALS], old_abort;

static void on_quit_signal(int sig) {
    int e = errno;
    if (!got_signal) got_signal = sig;
    if (sig_pipe[1] >= 0) {
        char b = 1;
        ssize_t r = write(sig_pipe[1], &b, 1);
        (void)r;
    }
    errno = e;
}

/* A crash (abort, failed assert) with the screen up: put the terminal back
 * as well as can be done from a signal handler, then die as asked. */
static void on_abort(int sig) {
    if (curses_up) { curses_up = 0; endwin(); }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void restore_at_exit(void) {
    if (curses_up) { curses_up = 0; endwin(); }
}

static int install_signals(void) {
    if (pipe(sig_pipe)) return -1;
    for (int i = 0; i < 2; i++) {
        fcntl(sig_pipe[i], F_SETFL, fcntl(sig_pipe[i], F_GETFL) | O_NONBLOCK);
        fcntl(sig_pipe[i], F_SETFD, FD_CLOEXEC);
    }
    got_signal = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_quit_signal;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < N_QUIT_SIGNALS; i++) sigaction(quit_signals[i], &sa, &old_actions[i]);
    sa.sa_handler = on_abort;
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGABRT, &sa, &old_abort);
    static int registered;
    if (!registered) { atexit(restore_at_exit); registered = 1; }
    return 0;
}

static void remove_signals(void) {
    for (int i = 0; i < N_QUIT_SIGNALS; i++) sigaction(quit_signals[i], &old_actions[i], NULL);
    sigaction(SIGABRT, &old_abort, NULL);
    for (int i = 0; i < 2; i++) {
        if (sig_pipe[i] >= 0) close(sig_pipe[i]);
        sig_pipe[i] = -1;
    }
}

int app_locale_utf8(void) {
    const char *cs = nl_langinfo(CODESET);
    return cs && (!strcasecmp(cs, "UTF-8") || !strcasecmp(cs, "utf8"));
}

/* ---- small helpers ---- */

static void set_msg(app *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_msg(app *a, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->msg, sizeof a->msg, fmt, ap);
    va_end(ap);
    a->msg_until = skv_now() + 6;
    a->msg_yields = 0;
}

static const view_class *cur_view(const app *a) { return view_classes[a->view]; }

/* The store the status line and the cursor follow: the first lane whose
 * policy is not dense (the one a single run or a dense,X compare is about),
 * else lane 0. */
static probe_store *primary(const probe_lanes *L) {
    for (int i = 0; i < probe_lanes_count(L); i++) {
        const char *p = probe_lanes_policy(L, i);
        if (p[0] && strcmp(p, "dense")) return probe_lanes_store(L, i);
    }
    return probe_lanes_store(L, 0);
}

/* Every lane's store and name (its policy; "seq i" in a batch) for
 * drawing (the one picked with p, when one is); returns the count. */
static int lanes_of(app *a, const probe_store **sts, const char **names) {
    int n = probe_lanes_count(a->o->lanes);
    a->cur.batch = probe_lanes_batched(a->o->lanes);
    if (a->lane >= 0 && a->lane < n) {
        sts[0] = probe_lanes_store(a->o->lanes, a->lane);
        names[0] = probe_lanes_label(a->o->lanes, a->lane);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        sts[i] = probe_lanes_store(a->o->lanes, i);
        names[i] = probe_lanes_label(a->o->lanes, i);
    }
    return n;
}

/* The store the status line and the cursor follow: in a batch the sequence
 * shown (sequence 0 while all are), else primary(). */
static probe_store *followed(const app *a) {
    const probe_lanes *L = a->o->lanes;
    if (!probe_lanes_batched(L)) return primary(L);
    int n = probe_lanes_count(L), best = 0;
    if (a->lane >= 0 && a->lane < n) return probe_lanes_store(L, a->lane);
    for (int i = 1; i < n; i++) /* every sequence shown: the one that ran longest (one that ended stopped early) */
        if (probe_store_n_steps(probe_lanes_store(L, i)) > probe_store_n_steps(probe_lanes_store(L, best))) best = i;
    return probe_lanes_store(L, best);
}

static void clamp_cursor(app *a);

/* p: every lane, then each policy alone, then every lane again; in a batch
 * each sequence in turn (and all of them, when there are few). */
static int key_lane(app *a, int ch) {
    (void)ch;
    const probe_lanes *L = a->o->lanes;
    int n = probe_lanes_count(L), batched = probe_lanes_batched(L);
    if (n <= 1) {
        set_msg(a, "one lane in this run: p picks a policy of a compare run, or a sequence of a batched run");
        return APP_HANDLED | APP_REDRAW;
    }
    a->lane = a->lane + 1 < n ? a->lane + 1 : batched && n > VIEW_BATCH_STACK_MAX ? 0 : -1;
    a->st = followed(a);
    clamp_cursor(a);
    if (a->lane < 0) set_msg(a, batched ? "every sequence shown" : "every policy shown");
    else if (batched) set_msg(a, "sequence %d of %d alone (p: the next)", a->lane, n);
    else set_msg(a, "policy %s alone (p: the next)", probe_lanes_policy(L, a->lane));
    return APP_HANDLED | APP_REDRAW;
}

static int n_view_classes(void) {
    int n = 0;
    while (view_classes[n]) n++;
    return n;
}

/* A tab is shown for a view that can draw, and for a peer's own view only
 * when some policy of the run records its measure (a ShadowKV run has no
 * SpeCache tab). The view in front stays. */
static int tab_shown(const app *a, const view_class *vc) {
    if (!view_available(vc)) return 0;
    for (int i = 0; view_classes[i] && i < 32; i++)
        if (view_classes[i] == vc && (a->o->hidden >> i & 1u)) return 0;
    if (!vc->metric || vc == view_classes[a->view]) return 1;
    for (int i = 0; i < probe_lanes_count(a->o->lanes); i++)
        if (probe_store_has_metric(probe_lanes_store(a->o->lanes, i), vc->metric)) return 1;
    return 0;
}

/* The next view with a tab from index i in direction dir (+1/-1), or i. */
static int next_view(const app *a, int i, int dir) {
    int n = n_view_classes();
    for (int k = 1; k <= n; k++) {
        int j = ((i + dir * k) % n + n) % n;
        if (tab_shown(a, view_classes[j])) return j;
    }
    return i;
}

static int live(const app *a) { return a->o->worker != NULL; }

/* Keeps layer and head inside what the store knows. */
static void clamp_cursor(app *a) {
    int nl = probe_store_n_layers(a->st), nh = probe_store_n_kv_heads(a->st);
    if (nl > 0 && a->cur.layer >= nl) a->cur.layer = nl - 1;
    if (nh > 0 && a->cur.head >= nh) a->cur.head = nh - 1;
    if (a->cur.layer < 0) a->cur.layer = 0;
    if (a->cur.head < 0) a->cur.head = 0;
    int ns = probe_store_n_steps(a->st);
    if (a->cur.step >= ns) a->cur.step = ns > 0 ? ns - 1 : -1;
}

/* Moves the shown step by d, staying inside the steps there are; live, the
 * last step means "follow the latest" again. */
static int move_step(app *a, int d) {
    int n = probe_store_n_steps(a->st);
    int s = view_step(a->st, &a->cur);
    if (n <= 0 || s < 0) { set_msg(a, "no decode steps yet"); return APP_HANDLED | APP_REDRAW; }
    int t = s + d;
    if (t < 0) t = 0;
    if (t > n - 1) t = n - 1;
    a->cur.step = (live(a) && t == n - 1) ? -1 : t;
    return APP_HANDLED | APP_REDRAW;
}

/* 1, and the line saying so, when the live run's context is full: a step
 * has no position left (as end of text, not an engine failure). */
static int context_full(app *a) {
    if (a->ws.state == TUI_W_PREFILL || a->ws.n_ctx <= 0 || a->ws.n_past < a->ws.n_ctx) return 0;
    char why[160];
    cli_context_full_text(why, sizeof why, a->ws.n_ctx);
    set_msg(a, "%s", why);
    return 1;
}

/* ---- key handlers: each returns APP_* bits ---- */

static int key_step(app *a, int ch) {
    (void)ch;
    if (!live(a)) {
        int n = probe_store_n_steps(a->st), s = view_step(a->st, &a->cur);
        if (n <= 0) set_msg(a, "the trace has no decode steps");
        else if (s >= n - 1) set_msg(a, "last recorded step (%d)", n - 1);
        else a->cur.step = s + 1;
        a->playing = 0;
        return APP_HANDLED | APP_REDRAW;
    }
    if (a->ws.state == TUI_W_FAILED) { set_msg(a, "the engine stopped: %s", a->ws.error); return APP_HANDLED | APP_REDRAW; }
    if (context_full(a)) return APP_HANDLED | APP_REDRAW;
    if (a->ws.state == TUI_W_PREFILL) set_msg(a, "step queued: the prefill is still running");
    tui_worker_send(a->o->worker, TUI_CMD_STEP);
    a->cur.step = -1;
    return APP_HANDLED | APP_REDRAW;
}

static int key_run(app *a, int ch) {
    (void)ch;
    if (!live(a)) {
        int n = probe_store_n_steps(a->st);
        if (n <= 0) { set_msg(a, "the trace has no decode steps"); return APP_HANDLED | APP_REDRAW; }
        a->playing = !a->playing;
        if (a->playing && view_step(a->st, &a->cur) >= n - 1) a->cur.step = 0;
        a->play_next = skv_now() + 0.2;
        return APP_HANDLED | APP_REDRAW;
    }
    if (a->ws.state == TUI_W_FAILED) { set_msg(a, "the engine stopped: %s", a->ws.error); return APP_HANDLED | APP_REDRAW; }
    if (context_full(a)) return APP_HANDLED | APP_REDRAW;
    if (a->ws.state == TUI_W_PREFILL) set_msg(a, "run queued: the prefill is still running");
    tui_worker_send(a->o->worker, TUI_CMD_TOGGLE);
    a->cur.step = -1;
    return APP_HANDLED | APP_REDRAW;
}

static int key_view(app *a, int ch) {
    a->view = next_view(a, a->view, ch == KEY_BTAB ? -1 : 1);
    a->res_ok = 0;
    return APP_HANDLED | APP_REDRAW;
}

/* 1..9: the Nth view of the tab bar. */
static int key_jump(app *a, int ch) {
    int want = ch == '0' ? 9 : ch - '1', k = 0;
    for (int i = 0; view_classes[i]; i++) {
        if (!tab_shown(a, view_classes[i])) continue;
        if (k++ == want) {
            a->view = i;
            a->res_ok = 0;
            return APP_HANDLED | APP_REDRAW;
        }
    }
    set_msg(a, "there is no view %d (tab lists them)", want + 1);
    return APP_HANDLED | APP_REDRAW;
}

/* , and . (or < and >): the previous / next recorded step in every view. */
static int key_back_forth(app *a, int ch) {
    int d = ch == ',' || ch == '<' ? -1 : 1;
    if (!view_move_step(&a->cur, a->st, d)) { set_msg(a, "no decode steps yet"); return APP_HANDLED | APP_REDRAW; }
    a->playing = 0;
    return APP_HANDLED | APP_REDRAW;
}

static int key_layer(app *a, int ch) {
    int n = probe_store_n_layers(a->st);
    if (n <= 0) { set_msg(a, "no layers known yet"); return APP_HANDLED | APP_REDRAW; }
    a->cur.layer += ch == ']' ? 1 : -1;
    clamp_cursor(a);
    return APP_HANDLED | APP_REDRAW;
}

static int key_head(app *a, int ch) {
    int n = probe_store_n_kv_heads(a->st);
    if (n <= 0) { set_msg(a, "no KV heads known yet"); return APP_HANDLED | APP_REDRAW; }
    a->cur.head += ch == '}' ? 1 : -1;
    clamp_cursor(a);
    return APP_HANDLED | APP_REDRAW;
}

/* Arrows and hjkl go to the view's move(); left/right it leaves alone move
 * the shown step. */
static int key_move(app *a, int ch) {
    int dx = 0, dy = 0;
    switch (ch) {
    case KEY_LEFT: case 'h': dx = -1; break;
    case KEY_RIGHT: case 'l': dx = 1; break;
    case KEY_UP: case 'k': dy = -1; break;
    case KEY_DOWN: case 'j': dy = 1; break;
    default: return 0;
    }
    const view_class *vc = cur_view(a);
    int bits = vc->move ? (vc->move)(&a->cur, a->st, dx, dy) : 0; /* parenthesised: curses defines move() */
    if (!(bits & VIEW_HANDLED) && dx) return move_step(a, dx);
    clamp_cursor(a);
    return APP_HANDLED | APP_REDRAW;
}

static int key_first_last(app *a, int ch) {
    int n = probe_store_n_steps(a->st);
    if (n <= 0) { set_msg(a, "no decode steps yet"); return APP_HANDLED | APP_REDRAW; }
    if (ch == 'g' || ch == KEY_HOME) a->cur.step = 0;
    else a->cur.step = live(a) ? -1 : n - 1;
    a->playing = 0;
    return APP_HANDLED | APP_REDRAW;
}

/* Picks a file name in the export folder (made if missing) that does not
 * exist yet: skv-VIEW-L<layer>-H<head>-S<step>.png, then -2, -3, ... */
static int export_name(const app *a, char *out, size_t cap) {
    char base[PATH_MAX];
    int s = view_step(a->st, &a->cur);
    const char *dir = a->o->export_dir && a->o->export_dir[0] ? a->o->export_dir : ".";
    if (skv_make_dir(dir)) return SKV_EIO;
    if (s >= 0) snprintf(base, sizeof base, "%s/skv-%s-L%d-H%d-S%d", dir, cur_view(a)->name, a->cur.layer, a->cur.head, s);
    else snprintf(base, sizeof base, "%s/skv-%s-L%d-H%d-prefill", dir, cur_view(a)->name, a->cur.layer, a->cur.head);
    for (int k = 1; k < 10000; k++) {
        if (k == 1) snprintf(out, cap, "%s.png", base);
        else snprintf(out, cap, "%s-%d.png", base, k);
        struct stat sb;
        if (lstat(out, &sb) != 0 && errno == ENOENT) return 0;
    }
    return skv_error(SKV_EIO, "no free file name for %s in %s", cur_view(a)->name, dir);
}

static void draw(app *a);

static int key_export(app *a, int ch) {
    (void)ch;
    const view_class *vc = cur_view(a);
    set_msg(a, "exporting the %s view...", vc->name); /* drawing a 2x figure takes a moment: say so first */
    draw(a);
    canvas *pc;
    canvas_png_opts po = {.scale = EXPORT_SCALE};
    if (canvas_png_new(&pc, EXPORT_W, EXPORT_H, &po)) {
        set_msg(a, "export failed: %s", skv_last_error());
        return APP_HANDLED | APP_REDRAW;
    }
    canvas_clear(pc);
    const probe_store *sts[PROBE_MAX_LANES];
    const char *names[PROBE_MAX_LANES];
    int nl = lanes_of(a, sts, names);
    a->cur.unfinished = live(a) && a->ws.state != TUI_W_FAILED && !a->ws.eog && a->ws.n_past < a->ws.n_ctx;
    int rc = view_draw_lanes(vc, pc, (canvas_rect){0, 0, EXPORT_W, EXPORT_H}, sts, names, nl, &a->cur, NULL);
    char name[PATH_MAX + 32];
    if (rc == SKV_EMISSING) set_msg(a, "nothing to export: the %s view has no data yet", vc->name);
    else if (rc < 0) set_msg(a, "export failed: %s", skv_last_error());
    else if (export_name(a, name, sizeof name)) set_msg(a, "export failed: %s", skv_last_error());
    else if (canvas_png_save(pc, name, 0)) set_msg(a, "export failed: %s", skv_last_error());
    else set_msg(a, "exported %s (%dx%d)", name, EXPORT_W * EXPORT_SCALE, EXPORT_H * EXPORT_SCALE);
    canvas_free(pc);
    return APP_HANDLED | APP_REDRAW;
}

static int key_help(app *a, int ch) {
    (void)ch;
    a->help = !a->help;
    return APP_HANDLED | APP_REDRAW;
}

static int key_quit(app *a, int ch) {
    (void)a; (void)ch;
    return APP_HANDLED | APP_QUIT;
}

static int key_redraw(app *a, int ch) {
    (void)a; (void)ch;
    clearok(curscr, TRUE);
    return APP_HANDLED | APP_REDRAW;
}

/* The key table: the loop dispatches through it and the help lists it. */
static const struct app_key {
    int keys[6];          /* curses key codes, 0-terminated (at most 5) */
    const char *label;    /* as the help shows them */
    const char *help;
    int (*fn)(app *a, int ch);
} app_keys[] = {
    {{' ', 'n'}, "space n", "step one token (replay: the next recorded step)", key_step},
    {{'r'}, "r", "run / pause (to -n tokens or the end; replay: play)", key_run},
    {{'\t', KEY_BTAB}, "tab S-tab", "next / previous view", key_view},
    {{'[', ']'}, "[ ]", "previous / next layer", key_layer},
    {{'{', '}'}, "{ }", "previous / next KV head", key_head},
    {{KEY_LEFT, KEY_RIGHT, KEY_UP, KEY_DOWN}, "arrows", "move inside the view (left/right: step)", key_move},
    {{'h', 'j', 'k', 'l'}, "h j k l", "the same as the arrows", key_move},
    {{'g', 'G', KEY_HOME, KEY_END}, "g G Home End", "first / last step (G follows the newest)", key_first_last},
    {{',', '.', '<', '>'}, ", .", "previous / next recorded step, in every view", key_back_forth},
    {{'1', '2', '3', '4', '5'}, "1..9 0", "jump to the Nth view of the tab bar (0: the 10th)", key_jump},
    {{'6', '7', '8', '9', '0'}, NULL, NULL, key_jump},
    {{'e'}, "e", "export the view as PNG into the export folder", key_export},
    {{'p'}, "p", "a policy (compare run) or sequence (batch) alone, the next, then all again", key_lane},
    {{'?'}, "?", "this help (any key closes it)", key_help},
    {{12}, "C-l", "redraw the screen", key_redraw},
    {{'q', 'Q'}, "q", "quit", key_quit},
};
#define N_APP_KEYS ((int)(sizeof app_keys / sizeof app_keys[0]))

static int handle_mouse(app *a) {
    MEVENT me;
    if (getmouse(&me) != OK) return 0;
    if (a->help) { a->help = 0; return APP_HANDLED | APP_REDRAW; }
    if (me.bstate & BUTTON4_PRESSED) return key_move(a, KEY_UP);
#ifdef BUTTON5_PRESSED
    if (me.bstate & BUTTON5_PRESSED) return key_move(a, KEY_DOWN);
#endif
    if (!(me.bstate & (BUTTON1_PRESSED | BUTTON1_CLICKED))) return APP_HANDLED;
    if (me.y == a->tab_y) {
        for (int i = 0; i < a->n_tabs; i++)
            if (me.x >= a->tab_x0[i] && me.x < a->tab_x1[i]) {
                a->view = a->tab_view[i];
                a->res_ok = 0;
                return APP_HANDLED | APP_REDRAW;
            }
        return APP_HANDLED;
    }
    const view_class *vc = cur_view(a);
    if (me.y >= a->view_top && me.y < a->view_top + a->view_h && vc->click && a->res_ok) {
        /* the layout is the first band's: lane 0's store */
        int bits = vc->click(&a->cur, probe_lanes_store(a->o->lanes, 0), &a->res, me.x + 0.5, me.y - a->view_top + 0.5);
        clamp_cursor(a);
        return APP_HANDLED | ((bits & VIEW_REDRAW) ? APP_REDRAW : 0);
    }
    return APP_HANDLED;
}

static int handle_key(app *a, int ch) {
    if (ch == KEY_RESIZE) return APP_HANDLED | APP_REDRAW;
    if (ch == KEY_MOUSE) return handle_mouse(a);
    if (a->help) { a->help = 0; return APP_HANDLED | APP_REDRAW; }
    for (int i = 0; i < N_APP_KEYS; i++)
        for (int k = 0; app_keys[i].keys[k]; k++)
            if (app_keys[i].keys[k] == ch) return app_keys[i].fn(a, ch);
    return 0;
}

/* ---- drawing ---- */

static void draw_centered(int y, const char *s, int attr) {
    int w = (int)strlen(s);
    int x = (COLS - w) / 2;
    if (x < 0) x = 0;
    tui_blit_text(y, x, COLS - x, s, attr, 0, 0);
}

static void draw_too_small(app *a) {
    char need[96];
    snprintf(need, sizeof need, "terminal too small (need %dx%d, have %dx%d)", MIN_COLS, MIN_ROWS, a->cols, a->rows);
    if ((int)strlen(need) <= a->cols) {
        draw_centered(a->rows / 2, need, A_BOLD);
    } else {
        snprintf(need, sizeof need, "need %dx%d, have %dx%d", MIN_COLS, MIN_ROWS, a->cols, a->rows);
        draw_centered(a->rows / 2 - 1, "terminal too small", A_BOLD);
        draw_centered(a->rows / 2, need, 0);
    }
    if (a->rows > 2) draw_centered(a->rows / 2 + 1, "(q quits)", 0);
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s && s[1] ? s + 1 : p;
}

/* The tab bar: available views in order, the current one in brackets and
 * reverse video. The right end keeps the run's state ("live: idle") and,
 * when they fit, the cursor's place and the help key; the tabs share what is
 * left, scrolled so that the current tab is visible and cut at the edge. */
static void draw_tabs(app *a, int y, int h) {
    (void)h;
    a->tab_y = y;
    char where[64], src[96], right[200], label[96];
    snprintf(where, sizeof where, "L%d/%d H%d/%d", a->cur.layer, probe_store_n_layers(a->st), a->cur.head,
             probe_store_n_kv_heads(a->st));
    static const char *const state_name[] = {"prefill", "idle", "running", "stopped"};
    if (a->o->replay_path)
        snprintf(src, sizeof src, "replay %s%s", base_name(a->o->replay_path), a->playing ? ": playing" : "");
    else snprintf(src, sizeof src, "live: %s", state_name[a->ws.state]);
    /* the widest right end that leaves the tabs at least half the row */
    const char *sets[3][3] = {{where, src, "? help"}, {src, "? help", NULL}, {src, NULL, NULL}};
    for (int k = 0; k < 3; k++) {
        right[0] = 0;
        for (int i = 0; i < 3 && sets[k][i]; i++)
            snprintf(right + strlen(right), sizeof right - strlen(right), "%s%s", i ? "  " : " ", sets[k][i]);
        snprintf(right + strlen(right), sizeof right - strlen(right), " ");
        if ((int)strlen(right) <= a->cols / 2) break;
    }
    int rw = (int)strlen(right) <= a->cols / 2 ? (int)strlen(right) : 0, avail = a->cols - rw;
    int x = 0, cur_x1 = 0;
    a->n_tabs = 0;
    for (int i = 0; view_classes[i] && a->n_tabs < MAX_TABS; i++) {
        if (!tab_shown(a, view_classes[i])) continue;
        int w = (int)strlen(view_classes[i]->title) + 2;
        a->tab_x0[a->n_tabs] = x;
        a->tab_x1[a->n_tabs] = x + w;
        a->tab_view[a->n_tabs] = i;
        if (i == a->view) cur_x1 = x + w;
        a->n_tabs++;
        x += w + 1;
    }
    /* tabs that do not fit scroll to keep the current one whole; a column at
     * each cut edge holds its marker */
    int overflow = x - 1 > avail, lim = overflow ? avail - 1 : avail;
    int shift = cur_x1 > lim ? cur_x1 - lim : 0;
    if (shift > 0 && a->n_tabs && a->tab_x0[0] - shift > -1) shift = 0;
    for (int t = 0; t < a->n_tabs; t++) {
        a->tab_x0[t] -= shift;
        a->tab_x1[t] -= shift;
        if (a->tab_x1[t] > lim) a->tab_x1[t] = lim; /* clicks past the edge miss */
        int i = a->tab_view[t], on = i == a->view;
        snprintf(label, sizeof label, on ? "[%s]" : " %s ", view_classes[i]->title);
        int x0 = a->tab_x0[t], skip = x0 < 1 && shift > 0 ? 1 - x0 : x0 < 0 ? -x0 : 0;
        if (skip >= (int)strlen(label) || x0 + skip >= lim) continue;
        tui_blit_text(y, x0 + skip, lim - x0 - skip, label + skip, on ? (A_REVERSE | A_BOLD) : 0,
                      on ? 0 : tui_blit_pair(CANVAS_RGB(0xb0, 0xb0, 0xb0), CANVAS_DEFAULT), a->utf8);
    }
    /* tabs cut at either edge are marked, so none is hidden without a sign */
    if (shift > 0) tui_blit_text(y, 0, 1, a->utf8 ? "\xc2\xab" : "<", A_BOLD, 0, a->utf8);
    if (overflow && x - 1 - shift > lim) tui_blit_text(y, lim, 1, a->utf8 ? "\xc2\xbb" : ">", A_BOLD, 0, a->utf8);
    if (rw) tui_blit_text(y, avail, rw, right, A_BOLD, 0, a->utf8);
}

/* Whether a cells canvas shows nothing but blanks. */
static int cells_blank(canvas *c) {
    int cols, rows;
    const canvas_cell *g = canvas_cells_grid(c, &cols, &rows);
    for (long i = 0; g && i < (long)cols * rows; i++)
        if (g[i].ch != ' ' || g[i].bg != CANVAS_DEFAULT) return 0;
    return 1;
}

static void draw_view(app *a, int y, int h) {
    a->view_top = y;
    a->view_h = h;
    const view_class *vc = cur_view(a);
    unsigned flags = (a->utf8 ? 0 : CANVAS_CELLS_ASCII) | (a->colors ? 0 : CANVAS_CELLS_MONO);
    if (!a->cv || a->cv_cols != a->cols || a->cv_rows != a->view_h) {
        canvas_free(a->cv);
        a->cv = NULL;
        if (canvas_cells_new(&a->cv, a->cols, a->view_h, flags)) {
            snprintf(a->draw_err, sizeof a->draw_err, "%s", skv_last_error());
            return;
        }
        a->cv_cols = a->cols;
        a->cv_rows = a->view_h;
    }
    canvas_clear(a->cv);
    memset(&a->res, 0, sizeof a->res);
    const probe_store *sts[PROBE_MAX_LANES];
    const char *names[PROBE_MAX_LANES];
    int nl = lanes_of(a, sts, names);
    a->cur.unfinished = live(a) && a->ws.state != TUI_W_FAILED && !a->ws.eog && a->ws.n_past < a->ws.n_ctx;
    int rc = view_draw_lanes(vc, a->cv, (canvas_rect){0, 0, a->cols, a->view_h}, sts, names, nl, &a->cur, &a->res);
    if (rc == SKV_EMISSING && live(a) && a->ws.state == TUI_W_PREFILL) {
        /* nothing can exist yet: not "records none", which is only known once the prefill ends */
        char msg[200];
        snprintf(msg, sizeof msg, "prefill in progress (%d of %d prompt tokens): the view fills in when it ends",
                 a->ws.prefill_done, a->ws.prefill_total);
        canvas_clear(a->cv);
        rc = view_message(a->cv, (canvas_rect){0, 0, a->cols, a->view_h}, vc->title, msg, &a->res);
    }
    a->res_ok = rc == 0;
    if (rc < 0 && rc != SKV_EMISSING) snprintf(a->draw_err, sizeof a->draw_err, "%s: %s", vc->name, skv_last_error());
    else a->draw_err[0] = 0;
    if (rc < 0 && cells_blank(a->cv)) /* the view said nothing: say why it could not draw */
        canvas_text(a->cv, a->cols / 2.0, a->view_h / 2.0, skv_last_error(), CANVAS_FONT_BODY,
                    CANVAS_CENTER | CANVAS_MIDDLE, CANVAS_DEFAULT);
    tui_blit(a->cv, a->view_top, 0, a->utf8);
}

/* The status line is built from segments ranked by importance (1 = always
 * kept); when the row is too narrow the least important ones go first. */
enum { MAX_SEGS = 12 };
typedef struct status_line {
    char text[MAX_SEGS][160];
    int prio[MAX_SEGS];
    int n;
} status_line;

static void seg(status_line *l, int prio, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void seg(status_line *l, int prio, const char *fmt, ...) {
    if (l->n >= MAX_SEGS) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->text[l->n], sizeof l->text[0], fmt, ap);
    va_end(ap);
    l->prio[l->n++] = prio;
}

/* Joins the segments marked in keep with " | ". */
static int join_status(const status_line *l, const int *keep, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < l->n; i++) {
        if (!keep[i]) continue;
        n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s%s", n ? " | " : " ", l->text[i]);
        if (n >= cap) { out[cap - 1] = 0; n = cap - 1; }
    }
    return (int)n;
}

/* Keeps segments in order of importance while they fit in width cells;
 * rank 1 is kept regardless. Returns the joined line's length. */
static int fit_status(const status_line *l, int width, char *out, size_t cap) {
    int keep[MAX_SEGS] = {0};
    for (int rank = 1; rank <= 9; rank++)
        for (int i = 0; i < l->n; i++) {
            if (l->prio[i] != rank) continue;
            keep[i] = 1;
            if (rank > 1 && join_status(l, keep, out, cap) > width) keep[i] = 0;
        }
    return join_status(l, keep, out, cap);
}

static void draw_status(app *a, int y, int h) {
    (void)h;
    status_line l = {.n = 0};
    const probe_ev_run *run = probe_store_run(a->st);
    int n_steps = probe_store_n_steps(a->st);
    int vs = view_step(a->st, &a->cur);
    const probe_ev_step *se = vs >= 0 ? probe_store_step(a->st, vs) : NULL;
    int random = live(a) ? a->o->random_weights : run && run->random_weights;
    const char *model = live(a) ? a->o->model_label : run && run->model && run->model[0] ? run->model : "?";
    seg(&l, 1, "%s%s", model, random ? " [random weights]" : "");
    if (live(a)) seg(&l, 2, "ctx %d/%d", a->ws.n_past, a->ws.n_ctx);
    else if (run) seg(&l, 2, "ctx %d/%d", run->prompt_len + n_steps, run->max_ctx);
    int steps = live(a) ? a->ws.steps : n_steps;
    int n_seq = probe_lanes_batched(a->o->lanes) ? probe_lanes_count(a->o->lanes) : 1;
    if (n_seq > 1) seg(&l, 1, a->lane >= 0 ? "seq %d of %d" : "%d seqs", a->lane >= 0 ? a->lane : n_seq, n_seq);
    if (a->cur.step >= 0 && vs >= 0) seg(&l, 1, "steps %d (at %d)", steps, vs);
    else seg(&l, 1, "steps %d", steps);
    double tps = 0;
    if (live(a)) tps = a->ws.t_decode > 0 ? a->ws.steps / a->ws.t_decode : 0;
    else {
        double sum = 0;
        int k = 0;
        for (int i = 0; i < n_steps; i++) {
            const probe_ev_step *e = probe_store_step(a->st, i);
            if (e && e->seconds > 0) { sum += e->seconds; k++; }
        }
        tps = sum > 0 ? k / sum : 0;
    }
    if (tps > 0) {
        /* live: the threads doing the work (how fast it is depends on them) */
        if (live(a)) seg(&l, 6, tps >= 100 ? "%.0f tok/s (%d thr)" : "%.1f tok/s (%d thr)", tps, skv_threads());
        else if (n_seq > 1) { /* a step gives every live sequence a token (one that ended has fewer steps) */
            long fed = 0;
            for (int i = 0; i < n_seq; i++) fed += probe_store_n_steps(probe_lanes_store(a->o->lanes, i));
            if (fed >= (long)n_seq * n_steps || n_steps <= 0)
                seg(&l, 6, "%.1f tok/s (%d x %.1f steps/s)", tps * n_seq, n_seq, tps);
            else
                seg(&l, 6, "%.1f tok/s (%.1f steps/s, %.1f seqs a step)", tps * fed / n_steps, tps,
                    (double)fed / n_steps);
        }
        else seg(&l, 6, tps >= 100 ? "%.0f tok/s" : "%.1f tok/s", tps);
    }
    double res = se ? (double)se->kv_resident : live(a) ? (double)a->ws.kv_resident : -1;
    double off = se ? (double)se->kv_offloaded : live(a) ? (double)a->ws.kv_offloaded : -1;
    if (res >= 0 && (res > 0 || off > 0)) {
        char rb[32], ob[32];
        cli_bytes(rb, sizeof rb, res);
        cli_bytes(ob, sizeof ob, off);
        seg(&l, 5, "KV res %s off %s", rb, ob);
    }
    if (probe_store_count(a->st, PROBE_DECODE_HEAD) > 0 || (live(a) && a->ws.hits + a->ws.misses)) {
        if (se && isfinite(se->hit_rate)) seg(&l, 4, "step hit %.0f%%", 100.0 * se->hit_rate);
        else if (live(a) && a->ws.hits + a->ws.misses)
            seg(&l, 4, "hit %.0f%% all steps", 100.0 * a->ws.hits / (double)(a->ws.hits + a->ws.misses));
    }
    char full[MAX_SEGS * 170];
    int len = fit_status(&l, a->cols, full, sizeof full);
    tui_blit_text(y, 0, a->cols, full, A_REVERSE, 0, a->utf8);
    for (int x = len; x < a->cols; x++) tui_blit_text(y, x, 1, " ", A_REVERSE, 0, 0);
}

static void draw_progress(app *a, int y) {
    int done = a->ws.prefill_done, total = a->ws.prefill_total > 0 ? a->ws.prefill_total : 1;
    char tail[128];
    snprintf(tail, sizeof tail, " %d/%d tokens %3d%%  %.1f s", done, total, (int)(100.0 * done / total),
             skv_now() - a->t_start);
    const char *head = " prefill ";
    int bar = a->cols - (int)strlen(head) - (int)strlen(tail) - 3;
    if (bar < 5) bar = 5;
    int fill = (int)((double)bar * done / total);
    tui_blit_text(y, 0, a->cols, head, A_BOLD, 0, a->utf8);
    int x = (int)strlen(head);
    tui_blit_text(y, x++, 1, "[", 0, 0, 0);
    for (int i = 0; i < bar; i++) {
        const char *g = i < fill ? (a->utf8 ? "\xe2\x96\x88" : "#") : (a->utf8 ? "\xe2\x96\x91" : ".");
        tui_blit_text(y, x++, 1, g, 0, i < fill ? tui_blit_pair(CANVAS_RGB(0x3c, 0xa0, 0xe0), CANVAS_DEFAULT) : 0, a->utf8);
    }
    tui_blit_text(y, x++, 1, "]", 0, 0, 0);
    tui_blit_text(y, x, a->cols - x, tail, 0, 0, 0);
}

static void draw_bottom(app *a, int y, int h) {
    (void)h;
    int w = a->cols;
    /* a prefill's progress, or the engine's failure, goes over the start's notice (the
     * settings asked, which the settings in force replace when the prefill ends), not over
     * what a key said */
    int over = !a->msg[0] || a->msg_yields;
    if (live(a) && a->ws.state == TUI_W_PREFILL && over) { draw_progress(a, y); return; }
    if (live(a) && a->ws.state == TUI_W_FAILED && over) {
        char b[320];
        snprintf(b, sizeof b, "engine stopped: %s (q quits)", a->ws.error);
        tui_blit_text(y, 1, w - 1, b, A_BOLD, tui_blit_pair(CANVAS_RGB(0xff, 0x60, 0x60), CANVAS_DEFAULT), a->utf8);
        return;
    }
    /* why a run stopped (end of text, a full context) over the start's notice too */
    if (live(a) && a->ws.error[0] && over) { tui_blit_text(y, 1, w - 1, a->ws.error, 0, 0, a->utf8); return; }
    if (a->msg[0]) { tui_blit_text(y, 1, w - 1, a->msg, A_BOLD, 0, a->utf8); return; }
    if (live(a) && a->ws.notice[0]) {
        char b[300];
        snprintf(b, sizeof b, "kv: %s", a->ws.notice);
        tui_blit_text(y, 1, w - 1, b, 0, 0, a->utf8);
        return;
    }
    if (a->draw_err[0]) { tui_blit_text(y, 1, w - 1, a->draw_err, 0, 0, a->utf8); return; }
    /* key hints, the least needed dropped first when the line is narrow: "? help" and "q quit" always stay */
    static const struct { const char *live, *replay; int prio; } hints[] = {
        { "space step", "space next step", 2 }, { "r run/pause", "r play", 2 }, { "tab view", "tab view", 3 },
        { "[ ] layer", "[ ] layer", 4 }, { "{ } head", "{ } head", 5 }, { "arrows move", "arrows move", 6 },
        { "g G steps", "g G steps", 7 }, { "e export", "e export", 3 }, { "? help", "? help", 1 },
        { "q quit", "q quit", 1 },
    };
    enum { NH = (int)(sizeof hints / sizeof hints[0]) };
    char hint[256];
    for (int cut = 8; cut >= 1; cut--) {
        int len = 0;
        hint[0] = 0;
        for (int i = 0; i < NH; i++)
            if (hints[i].prio <= cut)
                len += snprintf(hint + len, sizeof hint - (size_t)len, "%s%s", len ? "  " : "",
                                live(a) ? hints[i].live : hints[i].replay);
        if (len <= w - 1) break;
    }
    tui_blit_text(y, 1, w - 1, hint, A_DIM, 0, a->utf8);
}

/* Breaks text into lines of at most width columns at spaces (a word longer
 * than width is cut); returns the number of lines written into out (max). */
static int wrap_text(const char *text, int width, char out[][256], int max) {
    int n = 0;
    const char *p = text;
    while (*p && n < max && width > 0) {
        while (*p == ' ') p++;
        if (!*p) break;
        int len = (int)strlen(p), take = len;
        if (len > width) {
            take = width;
            while (take > 0 && p[take] != ' ') take--;
            if (take == 0) take = width;
        }
        if (take > 255) take = 255;
        memcpy(out[n], p, (size_t)take);
        out[n][take] = 0;
        n++;
        p += take;
    }
    return n;
}

/* What p does in this run, for the help: its meaning for the run loaded
 * first (one line in an 80-column box), the table's line when it has one lane. */
static const char *lane_help(const app *a) {
    const probe_lanes *L = a->o->lanes;
    int n = probe_lanes_count(L);
    if (n <= 1) return "compare or batched run: a policy or a sequence alone (this run has one)";
    if (!probe_lanes_batched(L)) return "show one policy alone, the next, then all again";
    return n > VIEW_BATCH_STACK_MAX ? "show the next sequence of the batch"
                                    : "show one sequence alone, the next, then all again";
}

/* A framed box over the view area listing the key table and the view's help. */
static void draw_help(app *a) {
    int bw = a->cols - 4 < 84 ? a->cols - 4 : 84;
    int lines = N_APP_KEYS + 9; /* keys, mouse, a gap, the view's help (up to 4 lines), the closing hint, frame */
    int bh = lines < a->view_h ? lines : a->view_h;
    int x0 = (a->cols - bw) / 2, y0 = a->view_top + (a->view_h - bh) / 2;
    const char *h = a->utf8 ? "\xe2\x94\x80" : "-", *v = a->utf8 ? "\xe2\x94\x82" : "|";
    const char *c[4] = {"+", "+", "+", "+"};
    if (a->utf8) { c[0] = "\xe2\x94\x8c"; c[1] = "\xe2\x94\x90"; c[2] = "\xe2\x94\x94"; c[3] = "\xe2\x94\x98"; }
    for (int y = y0; y < y0 + bh; y++)
        for (int x = x0; x < x0 + bw; x++) {
            const char *g = " ";
            int top = y == y0, bot = y == y0 + bh - 1, lft = x == x0, rgt = x == x0 + bw - 1;
            if ((top || bot) && (lft || rgt)) g = c[(bot ? 2 : 0) + (rgt ? 1 : 0)];
            else if (top || bot) g = h;
            else if (lft || rgt) g = v;
            tui_blit_text(y, x, 1, g, 0, 0, a->utf8);
        }
    int y = y0 + 1, tw = bw - 4;
    char line[256];
    tui_blit_text(y0, x0 + 2, tw, " skv inspect: keys ", A_BOLD, 0, a->utf8);
    for (int i = 0; i < N_APP_KEYS && y < y0 + bh - 1; i++, y++) {
        if (!app_keys[i].label) { y--; continue; } /* a row that continues the one above */
        snprintf(line, sizeof line, "%-13s %s", app_keys[i].label,
                 app_keys[i].fn == key_lane ? lane_help(a) : app_keys[i].help);
        tui_blit_text(y, x0 + 2, tw, line, 0, 0, a->utf8);
    }
    char view_line[512], wrapped[4][256];
    snprintf(line, sizeof line, "%-13s %s", "mouse", "click: chunk, layer, step or tab; wheel moves");
    snprintf(view_line, sizeof view_line, "%s: %s", cur_view(a)->title, cur_view(a)->help ? cur_view(a)->help : "");
    int nw = wrap_text(view_line, tw, wrapped, 4); /* the view's help whole, over as many lines as it needs */
    tui_blit_text(y++, x0 + 2, tw, line, 0, 0, a->utf8);
    y++;
    for (int i = 0; i < nw && y < y0 + bh - 1; i++, y++) tui_blit_text(y, x0 + 2, tw, wrapped[i], A_BOLD, 0, a->utf8);
    if (y < y0 + bh - 1) tui_blit_text(y, x0 + 2, tw, "any key closes this help", A_DIM, 0, a->utf8);
}

/* The screen from top to bottom; a pane of 0 rows takes what the others leave. */
static const struct app_pane {
    const char *name;
    int rows;
    void (*draw)(app *a, int y, int h);
} app_panes[] = {
    {"tabs", 1, draw_tabs},
    {"view", 0, draw_view},
    {"status", 1, draw_status},
    {"bottom", 1, draw_bottom},
};
#define N_APP_PANES ((int)(sizeof app_panes / sizeof app_panes[0]))

static void draw(app *a) {
    getmaxyx(stdscr, a->rows, a->cols);
    erase();
    if (a->cols < MIN_COLS || a->rows < MIN_ROWS) {
        draw_too_small(a);
        a->res_ok = 0;
        a->n_tabs = 0;
        refresh();
        return;
    }
    int fixed = 0;
    for (int i = 0; i < N_APP_PANES; i++) fixed += app_panes[i].rows;
    for (int i = 0, y = 0; i < N_APP_PANES; i++) {
        int h = app_panes[i].rows ? app_panes[i].rows : a->rows - fixed;
        app_panes[i].draw(a, y, h);
        y += h;
    }
    if (a->help) draw_help(a);
    refresh();
}

/* ---- the loop ---- */

/* Moves pending probe events into the store for at most budget seconds.
 * Returns the number moved; *more is set when some are still waiting. */
static int drain(app *a, double budget, int *more) {
    *more = 0;
    if (!a->o->ring) return 0;
    double t0 = skv_now();
    int total = 0;
    for (int errors = 0; errors < 64;) {
        int r = probe_lanes_drain(a->o->lanes, a->o->ring, 512);
        if (r < 0) { errors++; set_msg(a, "probe event dropped: %s", skv_last_error()); continue; }
        if (r == 0) break;
        total += r;
        if (skv_now() - t0 > budget) { *more = probe_ring_pending(a->o->ring) > 0; break; }
    }
    if (total) {
        a->st = followed(a);
        clamp_cursor(a);
    }
    return total;
}

static void empty_pipe(int fd) {
    char buf[256];
    while (fd >= 0 && read(fd, buf, sizeof buf) > 0) {}
}

static void init_app(app *a, const app_opts *o) {
    memset(a, 0, sizeof *a);
    a->o = o;
    a->lane = -1;
    for (int i = 0; o->policy && i < probe_lanes_count(o->lanes); i++)
        if (!strcmp(probe_lanes_policy(o->lanes, i), o->policy)) a->lane = i;
    if (o->has_seq) a->lane = o->seq;
    else if (probe_lanes_batched(o->lanes) && probe_lanes_count(o->lanes) > VIEW_BATCH_STACK_MAX) a->lane = 0;
    a->st = followed(a);
    view_cursor_init(&a->cur);
    a->view = 0;
    if (!tab_shown(a, view_classes[0])) a->view = next_view(a, 0, 1);
    a->t_start = skv_now();
    if (!o->worker && probe_store_n_steps(a->st) > 0) a->cur.step = 0;
    if (o->worker) tui_worker_status_get(o->worker, &a->ws);
    clamp_cursor(a);
    if (o->notice && *o->notice) {
        set_msg(a, "%s", o->notice);
        a->msg_until = skv_now() + 15;
        a->msg_yields = 1;
    }
}

static int colors_in_use, utf8_in_use;

int app_open(void) {
    if (curses_up) return 0;
    int any = 0;
    for (int i = 0; view_classes[i]; i++) any |= view_available(view_classes[i]);
    if (!any) {
        fprintf(stderr, "skv inspect: no view is built into this skv\n");
        return 1;
    }
    if (install_signals()) {
        fprintf(stderr, "skv inspect: cannot create a pipe: %s\n", strerror(errno));
        return 1;
    }
    const char *term = getenv("TERM");
    screen = newterm(NULL, stdout, stdin);
    if (!screen) {
        remove_signals();
        fprintf(stderr, "skv inspect: cannot set up the terminal (TERM=%s)\n", term ? term : "unset");
        return 1;
    }
    curses_up = 1;
    char *cup = tigetstr("cup");
    if (!cup || cup == (char *)-1) { /* a terminal that cannot place the cursor would show garbage */
        app_close();
        fprintf(stderr, "skv inspect: the terminal (TERM=%s) cannot move the cursor; the inspector needs one that can\n",
                term ? term : "unset");
        return 1;
    }
    cbreak();
    noecho();
    nonl();
    keypad(stdscr, TRUE);
    nodelay(stdscr, TRUE);
    curs_set(0);
    set_escdelay(25);
    mousemask(BUTTON1_PRESSED | BUTTON1_CLICKED | BUTTON4_PRESSED
#ifdef BUTTON5_PRESSED
              | BUTTON5_PRESSED
#endif
              , NULL);
    mouseinterval(0);
    colors_in_use = tui_blit_init();
    utf8_in_use = app_locale_utf8();
    return 0;
}

void app_close(void) {
    if (!screen) return;
    curses_up = 0;
    endwin();
    delscreen(screen);
    screen = NULL;
    remove_signals();
}

int app_run(const app_opts *o) {
    if (!screen) return 1;
    app a;
    init_app(&a, o);
    a.colors = colors_in_use;
    a.utf8 = utf8_in_use;

    int rc = 0, dirty = 1, force = 1;
    double last_draw = 0;
    for (;;) {
        if (got_signal) { rc = 128 + got_signal; break; }
        int more = 0;
        if (drain(&a, 0.03, &more) > 0) dirty = 1;
        if (o->worker) {
            tui_worker_status ws;
            tui_worker_status_get(o->worker, &ws);
            if (ws.version != a.ws.version || ws.state != a.ws.state) dirty = 1;
            /* the prefill is done: the settings in force replace those asked, with the policy's clamps */
            if (a.ws.state == TUI_W_PREFILL && ws.state != TUI_W_PREFILL && ws.state != TUI_W_FAILED && ws.in_force[0]) {
                set_msg(&a, "in force: %s%s%s", ws.in_force, ws.notice[0] ? " | " : "", ws.notice);
                a.msg_until = skv_now() + 20;
                a.msg_yields = 1; /* to why a run stopped (end of text, a full context) */
            }
            a.ws = ws;
        }
        double now = skv_now();
        if (a.playing && now >= a.play_next) {
            int n = probe_store_n_steps(a.st), s = view_step(a.st, &a.cur);
            if (s + 1 < n) a.cur.step = s + 1;
            if (s + 1 >= n - 1) a.playing = 0;
            a.play_next = now + 0.2;
            dirty = 1;
        }
        if (a.msg[0] && now > a.msg_until) { a.msg[0] = 0; dirty = 1; }
        if (o->worker && a.ws.state == TUI_W_PREFILL && now - last_draw > 0.25) dirty = 1; /* elapsed time */
        if (dirty && (force || now - last_draw >= 0.05)) {
            draw(&a);
            last_draw = skv_now();
            dirty = force = 0;
        }
        int timeout = 500;
        if (more) timeout = 0;
        else if (dirty) timeout = 20;
        else if (a.playing) timeout = 50;
        else if (o->worker && (a.ws.state == TUI_W_PREFILL || a.ws.state == TUI_W_RUNNING)) timeout = 100;
        struct pollfd fds[3] = {
            {.fd = STDIN_FILENO, .events = POLLIN},
            {.fd = sig_pipe[0], .events = POLLIN},
            {.fd = o->wake_fd, .events = POLLIN},
        };
        int nfds = o->wake_fd >= 0 ? 3 : 2;
        if (poll(fds, nfds, timeout) < 0 && errno != EINTR) { rc = 1; break; }
        if (nfds == 3 && (fds[2].revents & POLLIN)) empty_pipe(o->wake_fd);
        if (fds[1].revents & POLLIN) empty_pipe(sig_pipe[0]);
        int quit = 0, ch;
        while (!quit && (ch = getch()) != ERR) {
            int bits = handle_key(&a, ch);
            if (bits & APP_QUIT) quit = 1;
            if (bits & APP_REDRAW) dirty = force = 1;
        }
        if (quit) break;
        /* Stdin gone (terminal closed): leave as after SIGHUP. */
        if (fds[0].revents & (POLLHUP | POLLERR | POLLNVAL)) { rc = 128 + SIGHUP; break; }
    }
    app_close();
    canvas_free(a.cv);
    return rc;
}
