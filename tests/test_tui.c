/* test_tui: `skv inspect` end to end, in a detached tmux server of its own.
 *
 * Bad input (an unknown flag, a missing trace, no terminal) must give one
 * line and a non-zero exit before curses starts. Then, in tmux panes, the
 * inspector replays a trace recorded with `skv run --trace` (views, tab and
 * shift-tab, a mouse click on the tab bar, stepping with n g G , . and with
 * the arrows and hjkl inside a view, the help overlay, PNG export), runs
 * live on the built-in default model (n steps the engine, r runs to -n), shows the "too small" message in a 40x12 pane and recovers on
 * resize, falls back to ASCII without a UTF-8 locale and to no colour on a
 * vt100, refuses a terminal that cannot move the cursor, and on q or SIGTERM leaves the terminal as it found it (the shell
 * after it prints "EXITED <status>" and tmux reports the alternate screen
 * off). Every wait polls the pane with a generous timeout, so slow (ASan)
 * builds pass too; every tmux session is killed on the way out. */
#include "testhelp.h"
#include "view.h"

#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <time.h>

/* Seconds to wait for the screen to show something; the live prefill of the
 * default model gets the longer one. Polls return as soon as it shows. */
#define UI_TIMEOUT 120.0
#define PREFILL_TIMEOUT 900.0

static char bin[PATH_MAX];      /* absolute path of the skv binary */
static char sock[PATH_MAX];     /* tmux -S socket, private to this run, in dir */
static const char *dir;         /* scratch directory: traces, exports */
static int server_started;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void nap(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Runs a shell command built from fmt; returns its exit status (-1 on a signal). */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static void kill_server(void) {
    if (server_started) sh("tmux -S %s kill-server >/dev/null 2>&1", sock);
    server_started = 0;
    unlink(sock);
}

static void on_signal(int sig) {
    kill_server();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Starts a detached w x h session running cmd in dir; the pane stays open
 * after cmd ends and shows "EXITED <status>". */
/* Starts a detached session and waits until tmux reports it exists. A new
 * session can fail while the server of the previous one is still shutting
 * down (its last session was just killed), so it is tried again until the
 * session is there, within a generous limit, rather than after a fixed sleep. */
static int start(const char *name, int w, int h, const char *cmd) {
    double t0 = now_s();
    do {
        int rc = sh("tmux -S %s -f /dev/null new-session -d -s %s -x %d -y %d -c %s "
                    "'%s; echo EXITED $?; sleep 3600' >/dev/null 2>&1",
                    sock, name, w, h, dir, cmd);
        if (rc == 0 || sh("tmux -S %s has-session -t %s >/dev/null 2>&1", sock, name) == 0) {
            server_started = 1;
            return 1;
        }
        nap(0.2);
    } while (now_s() - t0 < 30);
    return 0;
}

static void stop(const char *name) { sh("tmux -S %s kill-session -t %s >/dev/null 2>&1", sock, name); }

static char screen[65536];

static const char *capture(const char *name) {
    if (test_popen(screen, sizeof screen, "tmux -S %s capture-pane -p -t %s 2>&1", sock, name) != 0) screen[0] = 0;
    return screen;
}

/* Whether the inspector has already ended (the shell printed its status). */
static int ended(const char *scr, const char *want) { return !strstr(want, "EXITED") && strstr(scr, "EXITED "); }

/* Polls the pane until it shows want (or, with absent, until it no longer
 * does); gives up early when the inspector has exited. */
static int wait_screen(const char *name, const char *want, int absent, double timeout) {
    double t0 = now_s();
    for (;;) {
        const char *scr = capture(name);
        int has = strstr(scr, want) != NULL;
        if (has != absent) return 1;
        if (ended(scr, want) || now_s() - t0 > timeout) return 0;
        nap(0.1);
    }
}

static int wait_for(const char *name, const char *want, double timeout) { return wait_screen(name, want, 0, timeout); }

/* Polls the pane until it shows a or b. */
static int wait_any(const char *name, const char *a, const char *b, double timeout) {
    double t0 = now_s();
    for (;;) {
        const char *s = capture(name);
        if (strstr(s, a) || strstr(s, b)) return 1;
        if (ended(s, a) || now_s() - t0 > timeout) return 0;
        nap(0.1);
    }
}

static void show_screen(void) {
    printf("  screen was:\n");
    for (const char *s = screen; *s;) {
        const char *e = strchr(s, '\n');
        int n = e ? (int)(e - s) : (int)strlen(s);
        if (n) printf("  | %.*s\n", n, s);
        if (!e) break;
        s = e + 1;
    }
}

static void check_screen(const char *what, const char *name, const char *want, double timeout) {
    int ok = wait_for(name, want, timeout);
    test_cond(what, ok);
    if (!ok) show_screen();
}

/* The status line's step counter reads n ("steps n" ends a segment or the line). */
static void check_steps(const char *what, const char *name, int n) {
    char a[32], b[32];
    snprintf(a, sizeof a, "steps %d |", n);
    snprintf(b, sizeof b, "steps %d\n", n);
    int ok = wait_any(name, a, b, UI_TIMEOUT);
    test_cond(what, ok);
    if (!ok) show_screen();
}

static void keys(const char *name, const char *k) { sh("tmux -S %s send-keys -t %s %s", sock, name, k); }

/* An SGR (xterm 1006) left click at cell (x, y), 0-based. */
static void click(const char *name, int x, int y) {
    char seq[64], hex[256] = "";
    snprintf(seq, sizeof seq, "\033[<0;%d;%dM", x + 1, y + 1);
    for (const char *p = seq; *p; p++) snprintf(hex + strlen(hex), sizeof hex - strlen(hex), " %02x", (unsigned char)*p);
    sh("tmux -S %s send-keys -t %s -H%s", sock, name, hex);
}

static int alternate_off(const char *name) {
    char out[64];
    test_popen(out, sizeof out, "tmux -S %s display -p -t %s '#{alternate_on}'", sock, name);
    return out[0] == '0';
}

/* Quits with q and checks the exit status and that the terminal is back. */
static void quit_and_check(const char *what, const char *name) {
    char msg[256];
    keys(name, "q");
    snprintf(msg, sizeof msg, "%s: q exits with status 0", what);
    check_screen(msg, name, "EXITED 0", UI_TIMEOUT);
    snprintf(msg, sizeof msg, "%s: the terminal is restored (alternate screen off)", what);
    test_cond(msg, alternate_off(name));
}

/* The pid of the pane shell's child (the skv process), or -1. */
static int pane_child(const char *name) {
    char out[64];
    if (test_popen(out, sizeof out, "tmux -S %s display -p -t %s '#{pane_pid}'", sock, name)) return -1;
    int parent = atoi(out);
    DIR *d = opendir("/proc");
    if (!d) return -1;
    struct dirent *e;
    int found = -1;
    while ((e = readdir(d)) && found < 0) {
        int pid = atoi(e->d_name);
        if (pid <= 0) continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        const char *rp = strrchr(buf, ')'); /* the command name may hold spaces */
        int ppid;
        char state;
        if (rp && sscanf(rp + 1, " %c %d", &state, &ppid) == 2 && ppid == parent) found = pid;
    }
    closedir(d);
    return found;
}

/* Available view titles in tab order. */
static int view_titles(const char **t, int cap) {
    int n = 0;
    for (int i = 0; view_classes[i] && n < cap; i++)
        if (view_available(view_classes[i])) t[n++] = view_classes[i]->title;
    return n;
}

/* PNGs exported into the inspector's default export folder, skv-exports/
 * under the session's directory. */
static int count_png(void) {
    char sub[PATH_MAX + 32];
    snprintf(sub, sizeof sub, "%s/skv-exports", dir);
    DIR *d = opendir(sub);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        n += !strncmp(e->d_name, "skv-", 4) && l > 4 && !strcmp(e->d_name + l - 4, ".png");
    }
    closedir(d);
    return n;
}

/* Removes what the tests wrote (the trace, exports, the suppressions) and the directory. */
static void remove_scratch(void) {
    char sub[PATH_MAX + 32];
    snprintf(sub, sizeof sub, "%s/skv-exports", dir);
    DIR *x = opendir(sub);
    if (x) {
        struct dirent *e;
        char path[PATH_MAX + 300];
        while ((e = readdir(x))) {
            if (e->d_name[0] == '.') continue;
            snprintf(path, sizeof path, "%s/%s", sub, e->d_name);
            unlink(path);
        }
        closedir(x);
        rmdir(sub);
    }
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[PATH_MAX + 300];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static void test_bad_input(const char *trace) {
    char out[8192];
    int rc = test_popen(out, sizeof out, "%s inspect --no-such-flag 2>&1 </dev/null", bin);
    test_cond("a bad flag: one line and a non-zero exit", rc > 0 && lines(out) == 1 && strstr(out, "--no-such-flag"));
    rc = test_popen(out, sizeof out, "%s inspect --replay %s/missing.trace 2>&1 </dev/null", bin, dir);
    test_cond("a missing trace: one line naming it and a non-zero exit",
              rc > 0 && lines(out) == 1 && strstr(out, "missing.trace"));
    rc = test_popen(out, sizeof out, "%s inspect --trace %s/t.trace --kv dense 2>&1 </dev/null", bin, dir);
    test_cond("replay with generation flags: one line and a non-zero exit", rc > 0 && lines(out) == 1);
    rc = test_popen(out, sizeof out, "%s inspect -m %s/missing.gguf -p hi 2>&1 </dev/null", bin, dir);
    test_cond("a missing model: one line and a non-zero exit", rc > 0 && lines(out) == 1 && strstr(out, "missing.gguf"));
    if (trace) {
        rc = test_popen(out, sizeof out, "%s inspect --trace %s 2>&1 </dev/null | cat", bin, trace);
        test_cond("stdout not a terminal: one line saying so", lines(out) == 1 && strstr(out, "not a terminal"));
        rc = test_popen(out, sizeof out, "%s inspect --trace %s 2>&1 </dev/null >/dev/null; echo rc=$?", bin, trace);
        test_cond("stdout not a terminal: non-zero exit", strstr(out, "rc=0") == NULL);
    }
    rc = test_popen(out, sizeof out, "%s inspect --help", bin);
    test_cond("--help documents keys and options", rc == 0 && strstr(out, "keys:") && strstr(out, "--trace"));
}

/* A key (tmux send-keys' name) and what the screen then shows. */
typedef struct { const char *key, *want, *what; } key_check;

static void press_all(const char *name, const key_check *k, int n) {
    for (int i = 0; i < n; i++) {
        keys(name, k[i].key);
        check_screen(k[i].what, name, k[i].want, UI_TIMEOUT);
    }
}

/* Replays the trace: views and tabs, mouse, steps, help, export, quit. */
static void test_replay(void) {
    const char *titles[32];
    int nt = view_titles(titles, 32);
    char cmd[PATH_MAX * 2 + 64], want[128];
    snprintf(cmd, sizeof cmd, "TERM=xterm-256color %s inspect --trace %s/t.trace", bin, dir);
    if (!start("replay", 120, 40, cmd)) { test_cond("tmux starts a replay session", 0); return; }
    snprintf(want, sizeof want, "[%s]", titles[0]);
    check_screen("replay: the first view's tab is selected", "replay", want, UI_TIMEOUT);
    check_screen("replay: the status line names the replayed trace", "replay", "replay t.trace", UI_TIMEOUT);
    check_screen("replay: the status line says random weights", "replay", "random weights", UI_TIMEOUT);
    if (nt >= 2) {
        keys("replay", "Tab");
        snprintf(want, sizeof want, "[%s]", titles[1]);
        check_screen("replay: tab switches to the next view's title", "replay", want, UI_TIMEOUT);
        keys("replay", "BTab");
        snprintf(want, sizeof want, "[%s]", titles[0]);
        check_screen("replay: shift-tab goes back", "replay", want, UI_TIMEOUT);
    }
    if (nt >= 3) {
        int x = 0;
        for (int i = 0; i < 2; i++) x += (int)strlen(titles[i]) + 3;
        click("replay", x + 1, 0);
        snprintf(want, sizeof want, "[%s]", titles[2]);
        check_screen("replay: a click on the tab bar switches views", "replay", want, UI_TIMEOUT);
    }
    check_screen("replay: starts at step 0", "replay", "(at 0)", UI_TIMEOUT);
    keys("replay", "n");
    check_screen("replay: n moves to the next recorded step", "replay", "(at 1)", UI_TIMEOUT);
    /* The recorded steps: "steps N (at S)" on the status line. */
    const char *sp = strstr(capture("replay"), "| steps ");
    int n_steps = sp ? atoi(sp + 8) : 0;
    snprintf(want, sizeof want, "(at %d)", n_steps - 1);
    keys("replay", "G");
    check_screen("replay: G goes to the last step", "replay", want, UI_TIMEOUT);
    keys("replay", "g");
    check_screen("replay: g goes to the first step", "replay", "(at 0)", UI_TIMEOUT);
    static const key_check steps[] = {
        {"'.'", "(at 1)", "replay: . moves to the next recorded step"},
        {"','", "(at 0)", "replay: , moves back a step"},
    }, raster[] = { /* the selection raster, the view the click chose: j and k move its step */
        {"j", "(at 1)", "replay: j in the selection raster moves down a step"},
        {"k", "(at 0)", "replay: k moves back up"},
    };
    press_all("replay", steps, 2);
    if (nt >= 3 && !strcmp(titles[2], "Selection")) press_all("replay", raster, 2);
    keys("replay", "']'");
    check_screen("replay: ] selects the next layer", "replay", "L1/", UI_TIMEOUT);
    keys("replay", "'?'");
    check_screen("replay: ? shows the help overlay", "replay", "skv inspect: keys", UI_TIMEOUT);
    keys("replay", "x");
    test_cond("replay: any key closes the help", wait_screen("replay", "skv inspect: keys", 1, UI_TIMEOUT));
    /* C-l repaints the whole screen: text written to the terminal behind
     * curses' back (a background job's output, say) stays until then */
    sh("printf 'ZZGARBLEZZ' > \"$(tmux -S %s display -p -t %s '#{pane_tty}')\"", sock, "replay");
    check_screen("replay: text written behind the inspector's back shows", "replay", "ZZGARBLEZZ", UI_TIMEOUT);
    keys("replay", "C-l");
    test_cond("replay: C-l redraws the screen and the stray text is gone",
              wait_screen("replay", "ZZGARBLEZZ", 1, UI_TIMEOUT));
    int before = count_png();
    keys("replay", "Tab");
    static const key_check arrows[] = { /* the hit-rate plot: up/down the layer, left/right the step */
        {"Down", "L2/", "replay: the down arrow in the cache view picks the next layer"},
        {"Up", "L1/", "replay: the up arrow the previous one"},
        {"Right", "(at 1)", "replay: the right arrow the next step"},
        {"Left", "(at 0)", "replay: the left arrow the step before"},
    };
    if (nt >= 4 && !strcmp(titles[3], "Cache")) {
        check_screen("replay: tab goes on to the cache view", "replay", "[Cache]", UI_TIMEOUT);
        press_all("replay", arrows, 4);
    }
    keys("replay", "e");
    check_screen("replay: e exports and names the file", "replay", "exported skv-", UI_TIMEOUT);
    test_cond("replay: the exported PNG is in the export folder skv-exports/", count_png() == before + 1);
    keys("replay", "e");
    double t0 = now_s();
    while (count_png() < before + 2 && now_s() - t0 < UI_TIMEOUT) nap(0.1);
    test_cond("replay: a second export picks a new name", count_png() == before + 2);
    quit_and_check("replay", "replay");
    stop("replay");
}

/* A slow prefill (the built-in default a token a pass: about a second here)
 * shows a progress bar on the bottom line, then the worker goes idle. */
static void test_progress(void) {
    char cmd[PATH_MAX + 128];
    snprintf(cmd, sizeof cmd, "TERM=xterm-256color %s inspect -b 1", bin);
    if (!start("prog", 120, 30, cmd)) { test_cond("tmux starts a slow-prefill session", 0); return; }
    check_screen("live: a slow prefill shows its progress bar on the bottom line", "prog", " prefill [", UI_TIMEOUT);
    const char *scr = capture("prog"), *bar = strstr(scr, " prefill [");
    int done = -1, total = -1;
    if (bar && (bar = strchr(bar, ']'))) sscanf(bar + 1, " %d/%d tokens", &done, &total);
    char msg[160];
    snprintf(msg, sizeof msg, "live: the bar counts the prompt's tokens (%d of %d)", done, total);
    test_cond(msg, total > 1000 && done >= 0 && done <= total);
    check_screen("live: the prefill finishes and the worker is idle", "prog", "live: idle", PREFILL_TIMEOUT);
    test_cond("live: the bar is gone once the prefill is done", wait_screen("prog", " prefill [", 1, UI_TIMEOUT));
    quit_and_check("slow prefill", "prog");
    stop("prog");
}

/* The engine fails in the prefill (ShadowKV's offload file cannot grow past
 * a file-size limit of 32 KiB, the disk-full case): the bottom line says so
 * at once, over the start's settings notice (which hid it for its 15 s), and
 * q exits with status 1 after saying it on stderr. */
static void test_engine_fail(void) {
    char cmd[PATH_MAX * 2 + 256];
    snprintf(cmd, sizeof cmd, "(trap \"\" XFSZ; ulimit -f 64; exec env TERM=xterm-256color %s inspect --offload-file %s/off.bin)",
             bin, dir);
    if (!start("fail", 150, 30, cmd)) { test_cond("tmux starts a failing session", 0); return; }
    check_screen("live: an engine that fails in the prefill says so on the bottom line at once", "fail",
                 "engine stopped: prefill: offload file", 5);
    keys("fail", "q");
    check_screen("live: q after the failure exits with status 1", "fail", "EXITED 1", UI_TIMEOUT);
    check_screen("live: and the failure is said again after the inspector closes", "fail",
                 "skv inspect: the engine stopped: prefill: offload file", UI_TIMEOUT);
    stop("fail");
}

/* A live run whose context fills (-c 12, a 7-token prompt): the run stops
 * as at end of text, saying why, and the engine has not failed: a step
 * after it says the same, not "engine stopped", and q exits with 0. */
static void test_context_full(void) {
    char cmd[PATH_MAX * 2 + 256];
    snprintf(cmd, sizeof cmd, "TERM=xterm-256color %s inspect -p \"Once upon a time\" -c 12 -n 20", bin);
    if (!start("full", 150, 30, cmd)) { test_cond("tmux starts a live session with a small context", 0); return; }
    check_screen("live, -c 12: the prefill finishes", "full", "live: idle", UI_TIMEOUT);
    keys("full", "r");
    check_screen("live, -c 12: a run stops when the context is full, and the bottom line says why", "full",
                 "the context of 12 positions is full: generation stops here", UI_TIMEOUT);
    keys("full", "n");
    nap(0.5);
    test_cond("live, -c 12: a step after it says the context is full again; the engine has not failed",
              wait_for("full", "is full: generation stops here", UI_TIMEOUT) && !strstr(capture("full"), "engine stopped"));
    keys("full", "q");
    check_screen("live, -c 12: q exits with status 0", "full", "EXITED 0", UI_TIMEOUT);
    stop("full");
}

/* A live run of the built-in default: prefill, n, r, tab, q. */
static void test_live(const char *model_args) {
    const char *titles[32];
    int nt = view_titles(titles, 32);
    char cmd[PATH_MAX * 3 + 1024], want[128];
    snprintf(cmd, sizeof cmd, "TERM=xterm-256color %s inspect %s --record %s/live.trace", bin, model_args, dir);
    if (!start("live", 120, 40, cmd)) { test_cond("tmux starts a live session", 0); return; }
    check_screen("live: the status line shows the model", "live", "| ctx ", UI_TIMEOUT);
    check_screen("live: the prefill finishes and the worker is idle", "live", "live: idle", PREFILL_TIMEOUT);
    check_steps("live: no steps yet", "live", 0);
    keys("live", "n");
    check_steps("live: n steps the engine (steps 1)", "live", 1);
    keys("live", "Space");
    check_steps("live: space steps again (steps 2)", "live", 2);
    keys("live", "r");
    /* A random-weight model may sample end-of-generation first: that stops a run too. */
    int ok = wait_any("live", "steps 4 |", "end of generation", UI_TIMEOUT);
    test_cond("live: r runs to -n (steps 4) or to the end of generation", ok);
    if (!ok) show_screen();
    check_screen("live: the run stops", "live", "live: idle", UI_TIMEOUT);
    if (nt >= 2) {
        keys("live", "Tab");
        snprintf(want, sizeof want, "[%s]", titles[1]);
        check_screen("live: tab switches views", "live", want, UI_TIMEOUT);
    }
    keys("live", "'}'");
    check_screen("live: } selects the next KV head", "live", "H1/", UI_TIMEOUT);
    if (strstr(model_args, "--kv") == NULL) { /* a ShadowKV run: no peer's tab, and every tab on the bar */
        const char *scr = capture("live");
        const char *eol = strchr(scr, '\n');
        size_t n = eol ? (size_t)(eol - scr) : strlen(scr);
        char bar[512];
        snprintf(bar, sizeof bar, "%.*s", (int)(n < sizeof bar ? n : sizeof bar - 1), scr);
        test_cond("live: a ShadowKV run's tab bar has no peer tab (Bounds, SpeCache, TailorKV) and cuts none",
                  !strstr(bar, "Bounds") && !strstr(bar, "SpeCache") && !strstr(bar, "TailorKV") &&
                      strstr(bar, "Compare") && !strstr(bar, "\xc2\xbb") && !strstr(bar, "\xc2\xab"));
    }
    if (strstr(model_args, "--kv") == NULL) { /* the default session watches its needle (samples/prompts/needle.json) */
        int found = 0;
        for (int i = 0; i < 32 && !found; i++) {
            found = strstr(capture("live"), "[Needle]") != NULL;
            if (!found) { keys("live", "Tab"); nap(0.2); }
        }
        int ok = found && wait_for("live", "Needle, step", UI_TIMEOUT) && strstr(capture("live"), "needle");
        test_cond("live: the default session's Needle view shows its needle at the current step", ok);
        if (!ok) show_screen();
    }
    quit_and_check("live", "live");
    check_screen("live: --trace records the inspected run", "live", "trace written to", UI_TIMEOUT);
    char path[PATH_MAX + 32];
    struct stat sb;
    snprintf(path, sizeof path, "%s/live.trace", dir);
    test_cond("live: the recorded trace exists", stat(path, &sb) == 0 && sb.st_size > 0);
    if (strstr(model_args, "--kv") == NULL && stat(path, &sb) == 0) {
        /* the default session records no needle results: the diagnosis reads the value from the
         * watched needle and the answer from the generated tokens, and says the outcome first */
        char out[1 << 14];
        test_popen(out, sizeof out, "%s needle --diagnose %s 2>&1", bin, path);
        test_cond("live: skv needle --diagnose of the recording names the value and opens with the outcome",
                  strstr(out, "4817093") && (strstr(out, "  shadowkv retrieved 4817093") ||
                                             strstr(out, "  shadowkv missed 4817093") ||
                                             strstr(out, "  shadowkv has not finished its answer")) &&
                      !strstr(out, "value ?"));
    }
    stop("live");
}

/* Compare mode, live: three policies in lockstep at w x h; the Timeline
 * puts them on one time axis, and the Compare view tabulates them. */
static void test_compare_live(const char *model_args, int w, int h) {
    char cmd[PATH_MAX * 3 + 1024], name[32], what[160];
    snprintf(name, sizeof name, "cmp%dx%d", w, h);
    snprintf(cmd, sizeof cmd, "TERM=xterm-256color %s inspect %s --kv dense,shadowkv,quest --oracle -n 3", bin,
             model_args);
    if (!start(name, w, h, cmd)) { test_cond("tmux starts a compare session", 0); return; }
    snprintf(what, sizeof what, "compare %dx%d: the prefill of every policy finishes", w, h);
    check_screen(what, name, "live: idle", PREFILL_TIMEOUT);
    keys(name, "r");
    snprintf(what, sizeof what, "compare %dx%d: r steps every policy in lockstep to -n", w, h);
    int ok = wait_any(name, "steps 3 |", "end of generation", UI_TIMEOUT);
    test_cond(what, ok);
    if (!ok) show_screen();
    int found = 0;
    for (int i = 0; i < 32 && !found; i++) {
        found = strstr(capture(name), "[Compare]") != NULL;
        if (!found) { keys(name, "Tab"); nap(0.2); }
    }
    snprintf(what, sizeof what, "compare %dx%d: the Compare view lists recall and every policy", w, h);
    ok = found && wait_for(name, "recall", UI_TIMEOUT) && strstr(capture(name), "shadowkv") &&
         strstr(screen, "quest") && strstr(screen, "dense");
    test_cond(what, ok);
    if (!ok) show_screen();
    /* the Compare view moves nothing of its own: left and right go to the app, which moves the
     * shown step, and back on the newest follows the run again */
    keys(name, "Left");
    snprintf(what, sizeof what, "compare %dx%d: left in the Compare view shows the step before the newest", w, h);
    test_cond(what, found && wait_for(name, "(at 1)", UI_TIMEOUT));
    keys(name, "Right");
    snprintf(what, sizeof what, "compare %dx%d: right back on the newest step follows the run again", w, h);
    test_cond(what, found && wait_screen(name, "(at ", 1, UI_TIMEOUT) && strstr(capture(name), "steps 3"));
    for (int i = 0; i < 32 && !strstr(capture(name), "[Timeline]"); i++) { keys(name, "BTab"); nap(0.2); }
    snprintf(what, sizeof what, "compare %dx%d: the Timeline draws every policy's streams on one time axis", w, h);
    ok = wait_for(name, "quest", UI_TIMEOUT) && strstr(capture(name), "shadowkv") && strstr(screen, "dense") &&
         strstr(screen, "[Timeline]");
    test_cond(what, ok);
    if (!ok) show_screen();
    snprintf(what, sizeof what, "compare %dx%d", w, h);
    quit_and_check(what, name);
    stop(name);
}


/* The tab bar's first row as tab titles, in order (the current one without
 * its brackets); returns the count. The right end (the cursor's place,
 * starting "L<digit>") ends the tabs. */
static int tab_row(const char *scr, char titles[][32], int cap) {
    char row[1024];
    size_t n = strcspn(scr, "\n");
    if (n >= sizeof row) n = sizeof row - 1;
    memcpy(row, scr, n);
    row[n] = 0;
    int k = 0;
    for (char *save = NULL, *t = strtok_r(row, " ", &save); t && k < cap; t = strtok_r(NULL, " ", &save)) {
        if (t[0] == 'L' && t[1] >= '0' && t[1] <= '9') break;
        if (t[0] == '[') t++;
        size_t l = strlen(t);
        if (l && t[l - 1] == ']') t[--l] = 0;
        snprintf(titles[k++], 32, "%s", t);
    }
    return k;
}

/* A compare trace of five policies has ten tabs or more: 0 jumps to the
 * 10th and 1 back to the 1st; in a narrow pane the tabs cut at either edge
 * are marked (« on the left once the bar has scrolled, » on the right while
 * tabs lie past it), and the current tab stays whole between them. */
static void test_tab_jump(const char *model_args) {
    char out[8192], trace[PATH_MAX + 32], cmd[PATH_MAX * 2 + 128], want[64];
    snprintf(trace, sizeof trace, "%s/cmp.trace", dir);
    int rc = test_popen(out, sizeof out, "%s run %s --kv shadowkv,quest,freekv,specache,tailorkv --oracle -n 3 --trace %s 2>&1",
                    bin, model_args, trace);
    test_cond("a compare trace of five policies is recorded", rc == 0);
    if (rc) { printf("  got: %s", out); return; }
    snprintf(cmd, sizeof cmd, "LC_ALL=C.UTF-8 TERM=xterm-256color %s inspect --trace %s", bin, trace);
    if (!start("tabs", 250, 40, cmd)) { test_cond("tmux starts a compare replay", 0); return; }
    char titles[32][32];
    int nt = 0;
    double t0 = now_s();
    while (now_s() - t0 < UI_TIMEOUT && (nt = tab_row(capture("tabs"), titles, 32)) < 10) nap(0.2);
    test_cond("the compare replay shows ten tabs or more at 250 columns", nt >= 10);
    if (nt < 10) { show_screen(); stop("tabs"); return; }
    keys("tabs", "0");
    snprintf(want, sizeof want, "[%s]", titles[9]);
    check_screen("0 jumps to the 10th tab", "tabs", want, UI_TIMEOUT);
    sh("tmux -S %s resize-window -t tabs -x 70 -y 30 >/dev/null 2>&1", sock);
    double t1 = now_s();
    int ok = 0;
    while (!ok && now_s() - t1 < UI_TIMEOUT) {
        const char *scr = capture("tabs");
        size_t n = strcspn(scr, "\n");
        ok = n < 200 && !strncmp(scr, "\xc2\xab", 2) && strstr(scr, want) && strstr(scr, want) < scr + n &&
             strstr(scr, "\xc2\xbb") && strstr(scr, "\xc2\xbb") < scr + n;
        if (!ok) nap(0.2);
    }
    test_cond("at 70 columns, the 10th tab shown whole between the cut markers « and »", ok);
    if (!ok) show_screen();
    keys("tabs", "1");
    snprintf(want, sizeof want, "[%s]", titles[0]);
    t1 = now_s();
    ok = 0;
    while (!ok && now_s() - t1 < UI_TIMEOUT) {
        const char *scr = capture("tabs");
        size_t n = strcspn(scr, "\n");
        const char *r = strstr(scr, "\xc2\xbb");
        ok = !strncmp(scr, want, strlen(want)) && r && r < scr + n && !memmem(scr, n, "\xc2\xab", 2);
        if (!ok) nap(0.2);
    }
    test_cond("1 goes back to the first tab, at the left edge: only the right edge is marked cut", ok);
    if (!ok) show_screen();
    quit_and_check("tabs", "tabs");
    stop("tabs");
}

/* A batched trace (skv run --parallel 6 --trace): the inspector starts on
 * sequence 0 of 6 (too many to stack), and p steps through the sequences
 * in every view, each drawing without an error; --seq N starts on N and a
 * --seq past the batch is one line. */
/* A replay says what the policy put in force at other values than asked, as
 * the live inspector does after its prefill: a 7-token prompt runs
 * ShadowKV at rank 7, not the 160 asked. */
static void test_in_force(void) {
    char path[PATH_MAX + 32], cmd[PATH_MAX * 2 + 200], out[8192];
    snprintf(path, sizeof path, "%s/inforce.trace", dir);
    int rc = test_popen(out, sizeof out, "%s run -m samples/model/skv-demo.gguf -p 'Once upon a time' --kv shadowkv "
                        "-n 3 --trace %s 2>&1", bin, path);
    if (rc) { test_cond("skv run --trace on the demo model (for the in-force replay)", 0); printf("  got: %s", out); return; }
    snprintf(cmd, sizeof cmd, "TERM=xterm-256color %s inspect --replay %s", bin, path);
    if (!start("inforce", 160, 30, cmd)) { test_cond("tmux starts the in-force replay", 0); return; }
    check_screen("replay: the status line says the rank in force (7, asked 160), as live inspect does", "inforce",
                 "in force: shadowkv: rank=7 (asked 160)", UI_TIMEOUT);
    stop("inforce");
}

static void test_batch_replay(const char *rec_args) {
    char path[PATH_MAX + 32], cmd[PATH_MAX * 2 + 700], out[8192], what[200];
    snprintf(path, sizeof path, "%s/batch.trace", dir);
    int rc = test_popen(out, sizeof out, "%s run %s --temp 0.9 -n 4 --parallel 6 --trace %s 2>&1", bin, rec_args, path);
    test_cond("skv run --parallel 6 --trace records the batch", rc == 0 && strstr(out, "trace written to"));
    if (rc) { printf("  got: %s", out); return; }
    rc = test_popen(out, sizeof out, "%s inspect --replay %s --seq 6 2>&1 </dev/null", bin, path);
    test_cond("inspect --seq past the batch: one line naming the sequences there are",
              rc == 2 && lines(out) == 1 && strstr(out, "sequences 0 to 5"));
    const char *titles[32];
    int nt = view_titles(titles, 32);
    snprintf(cmd, sizeof cmd, "TERM=xterm-256color %s inspect --replay %s", bin, path);
    if (!start("batch", 120, 40, cmd)) { test_cond("tmux starts a batch replay session", 0); return; }
    check_screen("batch: starts on sequence 0 of 6", "batch", "seq 0 of 6", UI_TIMEOUT);
    int ok = 1;
    for (int v = 0; v < nt; v++) {
        char want[64];
        snprintf(want, sizeof want, "[%s]", titles[v]);
        if (!wait_for("batch", want, 2.0)) { keys("batch", "Tab"); continue; } /* a tab this run does not show */
        for (int k = 1; k <= 2; k++) {
            keys("batch", "p");
            snprintf(want, sizeof want, "seq %d of 6", (v * 2 + k) % 6);
            ok &= wait_for("batch", want, UI_TIMEOUT);
        }
        keys("batch", "Tab");
    }
    snprintf(what, sizeof what, "batch: p steps to the next sequence in every view (%d tabs)", nt);
    test_cond(what, ok);
    if (!ok) show_screen();
    /* each view draws each sequence: as a figure, or says it has no data (a view for another policy) */
    int drawn = 0, bad = 0;
    for (int v = 0; v < nt; v++)
        for (int q = 0; q < 6; q += 5) {
            rc = test_popen(out, sizeof out, "%s export --trace %s --view '%s' --seq %d -o %s/b.png --force 2>&1", bin, path,
                        titles[v], q, dir);
            if (rc == 0) drawn++;
            else if (!strstr(out, "has no data for view")) { bad++; printf("  %s, seq %d: %s", titles[v], q, out); }
        }
    snprintf(what, sizeof what, "batch: every view exports sequences 0 and 5 or says it has no data (%d figures)", drawn);
    test_cond(what, bad == 0 && drawn >= 8);
    quit_and_check("batch", "batch");
    stop("batch");
    snprintf(cmd, sizeof cmd, "TERM=xterm-256color %s inspect --replay %s --seq 4", bin, path);
    if (!start("batchseq", 120, 40, cmd)) { test_cond("tmux starts a batch replay session", 0); return; }
    check_screen("batch: --seq 4 starts on sequence 4", "batchseq", "seq 4 of 6", UI_TIMEOUT);
    quit_and_check("batch --seq 4", "batchseq");
    stop("batchseq");
}

/* Too small, then resized: the message, the recovery, and SIGTERM. */
static void test_small_and_signal(void) {
    const char *titles[32];
    view_titles(titles, 32);
    char cmd[PATH_MAX * 2 + 64], want[128];
    snprintf(cmd, sizeof cmd, "%s inspect --trace %s/t.trace", bin, dir);
    if (!start("small", 40, 12, cmd)) { test_cond("tmux starts a 40x12 session", 0); return; }
    check_screen("40x12: the too-small message", "small", "terminal too small", UI_TIMEOUT);
    check_screen("40x12: says what it needs and has", "small", "have 40x12", UI_TIMEOUT);
    sh("tmux -S %s resize-window -t small -x 100 -y 30 >/dev/null 2>&1", sock);
    snprintf(want, sizeof want, "[%s]", titles[0]);
    check_screen("resized to 100x30: the views come back", "small", want, UI_TIMEOUT);
    sh("tmux -S %s resize-window -t small -x 59 -y 20 >/dev/null 2>&1", sock);
    check_screen("resized to 59x20: too small again", "small", "have 59x20", UI_TIMEOUT);
    int pid = pane_child("small");
    test_cond("the inspector's pid is found", pid > 0);
    if (pid > 0) kill(pid, SIGTERM);
    check_screen("SIGTERM: a clean exit with status 128+15", "small", "EXITED 143", UI_TIMEOUT);
    test_cond("SIGTERM: the terminal is restored (alternate screen off)", alternate_off("small"));
    stop("small");
}

/* No UTF-8 locale: ASCII only; a vt100: no colour, still drawn. */
static void test_fallbacks(void) {
    const char *titles[32];
    view_titles(titles, 32);
    char cmd[PATH_MAX * 2 + 64], want[128];
    snprintf(want, sizeof want, "[%s]", titles[0]);
    snprintf(cmd, sizeof cmd, "LC_ALL=C LANG=C %s inspect --trace %s/t.trace", bin, dir);
    if (start("ascii", 100, 30, cmd)) {
        check_screen("C locale: the views are drawn", "ascii", want, UI_TIMEOUT);
        nap(0.3);
        const char *s = capture("ascii");
        int ascii = 1;
        for (; *s; s++) ascii &= (unsigned char)*s < 0x80;
        test_cond("C locale: only ASCII on the screen", ascii);
        quit_and_check("C locale", "ascii");
        stop("ascii");
    }
    snprintf(cmd, sizeof cmd, "TERM=dumb %s inspect --trace %s/t.trace", bin, dir);
    if (start("dumb", 100, 30, cmd)) {
        check_screen("TERM=dumb: one line saying the terminal cannot move the cursor", "dumb", "cannot move the cursor",
                     UI_TIMEOUT);
        check_screen("TERM=dumb: a non-zero exit", "dumb", "EXITED 1", UI_TIMEOUT);
        stop("dumb");
    }
    snprintf(cmd, sizeof cmd, "TERM=vt100 %s inspect --trace %s/t.trace", bin, dir);
    if (start("mono", 100, 30, cmd)) {
        check_screen("vt100 (no colour): the views are drawn", "mono", want, UI_TIMEOUT);
        quit_and_check("vt100", "mono");
        stop("mono");
    }
}

int main(void) {
    const char *b = getenv("SKV_BIN");
    if (!b || !*b) b = "./build/skv";
    if (!realpath(b, bin)) {
        test_skip("test_tui: the skv binary is missing (build it first)");
        return test_report("test_tui");
    }
    dir = test_tmpdir("tui");
    snprintf(sock, sizeof sock, "%s/tmux.sock", dir);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    atexit(kill_server);

    /* The random-weight test model lies next to the binary
     * (build/default-model.gguf); inspect's own default is the demo model. */
    char model[PATH_MAX + 32], bdir[PATH_MAX];
    snprintf(bdir, sizeof bdir, "%s", bin);
    char *slash = strrchr(bdir, '/');
    if (slash) *slash = 0;
    snprintf(model, sizeof model, "%s/default-model.gguf", bdir);
    struct stat sb;
    int have_default = stat(model, &sb) == 0;
    const char *stories = test_shared("models/stories260k.gguf");
    char rec_args[PATH_MAX + 512] = "", live_args[PATH_MAX + 600] = "";
    if (have_default) {
        snprintf(rec_args, sizeof rec_args, "-m %s -p \"%s\" --kv shadowkv --rank 8 --budget 32 --outliers 2 --local 2",
                 model, "The quick brown fox jumps over the lazy dog. A needle hides in a haystack of words; "
                        "the inspector shows which chunks each head selects at every step.");
        /* No -m: the built-in default (the demo model, samples/model/). */
        if (stat("samples/model/skv-demo.gguf", &sb) == 0) snprintf(live_args, sizeof live_args, "-n 4");
        else snprintf(live_args, sizeof live_args, "%s -n 4", rec_args);
    } else if (stories) {
        snprintf(rec_args, sizeof rec_args, "-m %s -p \"Once upon a time, there was a little girl named Lily. "
                 "She liked to play in the park with her friends.\" --kv shadowkv --rank 8 --chunk 4 --budget 16 "
                 "--outliers 1 --local 1", stories);
        snprintf(live_args, sizeof live_args, "%s -n 4", rec_args);
    }

    char trace[PATH_MAX + 32], out[8192];
    snprintf(trace, sizeof trace, "%s/t.trace", dir);
    int have_trace = 0;
    if (rec_args[0]) {
        int rc = test_popen(out, sizeof out, "%s run %s -n 6 --trace %s 2>&1", bin, rec_args, trace);
        have_trace = rc == 0 && stat(trace, &sb) == 0;
        test_cond("a trace is recorded with skv run --trace", have_trace);
        if (!have_trace) printf("  got: %s", out);
    } else {
        test_skip("no model (build/default-model.gguf or ../shared/models/stories260k.gguf): live and replay parts");
    }
    test_bad_input(have_trace ? trace : NULL);

    if (sh("command -v tmux >/dev/null 2>&1") != 0) {
        test_skip("tmux is missing: the terminal tests");
        return test_report("test_tui");
    }

    if (have_trace) {
        test_replay();
        test_small_and_signal();
        test_fallbacks();
    }
    if (rec_args[0]) test_live(live_args);
    if (rec_args[0]) test_progress();
    if (rec_args[0]) test_engine_fail();
    if (stat("samples/model/skv-demo.gguf", &sb) == 0) test_context_full();
    if (have_default) test_batch_replay(rec_args);
    if (stat("samples/model/skv-demo.gguf", &sb) == 0) test_in_force();
    if (have_default) {
        char cmp_args[PATH_MAX + 600];
        snprintf(cmp_args, sizeof cmp_args, "-m %s -p \"%s\" --rank 8 --budget 32 --outliers 2 --local 2", model,
                 "The quick brown fox jumps over the lazy dog. A needle hides in a haystack of words; "
                 "the inspector shows which chunks each head selects at every step.");
        test_compare_live(cmp_args, 120, 40);
        test_compare_live(cmp_args, 80, 24);
        test_tab_jump(cmp_args);
    }
    kill_server();
    remove_scratch();
    return test_report("test_tui");
}
