/* tui_worker.c: the inspector's engine thread. It owns the generation
 * session: it runs the prompt (reporting progress), then waits on a small
 * command queue (mutex + condition variable) for step, run, pause and quit.
 * Everything the UI shows about the engine goes through a status snapshot
 * copied under the same lock, plus the probe events the session emits on its
 * bus; the UI never touches the session. After every change the worker
 * writes one byte to a wake pipe so that the UI's poll() returns at once. */
#include "app.h"
#include "cli.h"
#include "skv.h"
#include "tok.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define QUEUE_CAP 64

struct tui_worker {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    tui_wcmd queue[QUEUE_CAP];  /* ring of pending commands, guarded by mu */
    int q_head, q_len;
    int quit;                   /* guarded by mu */
    int running;                /* guarded by mu: keep stepping */
    tui_worker_status st;       /* guarded by mu */
    /* Owned by the thread while it runs. */
    compare_run *c;             /* the lanes (one policy, or several in lockstep) */
    skv_session *s;             /* the lane the status line shows: the first sparse one, else lane 0 */
    int32_t *ids;
    int n_ids, n_predict;
    int wake_fd;
};

static void wake(tui_worker *w) {
    if (w->wake_fd < 0) return;
    char b = 1;
    ssize_t r = write(w->wake_fd, &b, 1); /* a full pipe already means "wake up" */
    (void)r;
}

/* Refreshes the counters from the session; caller holds mu. */
static void status_from_session(tui_worker *w) {
    skv_session *s = w->s;
    w->st.n_past = s->n_past;
    w->st.n_ctx = s->o.ctx;
    w->st.steps = s->step;
    w->st.t_prefill = s->t_prefill;
    w->st.t_decode = s->t_decode;
    size_t res = 0, off = 0;
    s->kv->cls->bytes(s->kv, &res, &off);
    w->st.kv_resident = res;
    w->st.kv_offloaded = off;
    double hits = kv_stat(s->kv, "hits"), misses = kv_stat(s->kv, "misses");
    w->st.hits = isnan(hits) ? 0 : (uint64_t)hits;
    w->st.misses = isnan(misses) ? 0 : (uint64_t)misses;
    snprintf(w->st.notice, sizeof w->st.notice, "%s", s->kv->notice);
    w->st.version++;
}

/* Publishes prefill progress; a pending quit cancels the prefill. */
static int progress(void *user, int done, int total) {
    tui_worker *w = user;
    pthread_mutex_lock(&w->mu);
    w->st.prefill_done = done;
    w->st.prefill_total = total;
    w->st.n_past = w->s->n_past;
    w->st.version++;
    int quit = w->quit;
    pthread_mutex_unlock(&w->mu);
    wake(w);
    return quit;
}

/* Records an engine error and leaves the worker waiting for quit. */
static void fail(tui_worker *w, const char *what) {
    pthread_mutex_lock(&w->mu);
    w->st.state = TUI_W_FAILED;
    w->running = 0;
    snprintf(w->st.error, sizeof w->st.error, "%s: %s", what, skv_last_error());
    w->st.version++;
    pthread_mutex_unlock(&w->mu);
    wake(w);
}

/* One decode step: sample from the current logits and feed the token back.
 * auto_run: an end-of-generation token stops here instead of being fed.
 * Returns 0, 1 when a run should stop (end of generation), -1 on error. */
static int step_once(tui_worker *w, int auto_run) {
    skv_session *s = w->s;
    if (s->n_past + 1 > s->o.ctx) { /* a full context ends generation as end of text does: not an engine failure */
        pthread_mutex_lock(&w->mu);
        cli_context_full_text(w->st.error, sizeof w->st.error, s->o.ctx);
        w->st.version++;
        pthread_mutex_unlock(&w->mu);
        return 1;
    }
    int tok = compare_next(w->c);
    int eog = tok_is_eog(s->m->tok, tok);
    if (eog && auto_run) {
        pthread_mutex_lock(&w->mu);
        w->st.eog = 1;
        snprintf(w->st.error, sizeof w->st.error, "end of generation at step %d (n steps on)", s->step);
        w->st.version++;
        pthread_mutex_unlock(&w->mu);
        return 1;
    }
    if (compare_decode(w->c, tok)) return -1;
    pthread_mutex_lock(&w->mu);
    w->st.eog = eog;
    w->st.error[0] = 0;
    status_from_session(w);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

/* Takes the next thing to do: a queued command, an implicit step while
 * running, or quit. Blocks while there is nothing. */
static tui_wcmd next_command(tui_worker *w, int *auto_step) {
    pthread_mutex_lock(&w->mu);
    while (!w->quit && w->q_len == 0 && !w->running) pthread_cond_wait(&w->cv, &w->mu);
    tui_wcmd c;
    *auto_step = 0;
    if (w->quit) c = TUI_CMD_QUIT;
    else if (w->q_len) {
        c = w->queue[w->q_head];
        w->q_head = (w->q_head + 1) % QUEUE_CAP;
        w->q_len--;
    } else {
        c = TUI_CMD_STEP;
        *auto_step = 1;
    }
    pthread_mutex_unlock(&w->mu);
    return c;
}

static void set_running(tui_worker *w, int on) {
    pthread_mutex_lock(&w->mu);
    if (on && w->st.steps >= w->st.generated_target) w->st.generated_target = w->st.steps + w->n_predict;
    if (on && w->n_predict == 0) on = 0;
    w->running = on;
    if (w->st.state != TUI_W_FAILED) w->st.state = on ? TUI_W_RUNNING : TUI_W_IDLE;
    if (on) w->st.error[0] = 0;
    w->st.version++;
    pthread_mutex_unlock(&w->mu);
    wake(w);
}

static void *worker_main(void *arg) {
    tui_worker *w = arg;
    /* OpenMP's thread count is per thread: apply -t (or the default) here too. */
    skv_set_threads(skv_threads());
    if (compare_prefill(w->c, w->ids, w->n_ids, progress, w)) {
        fail(w, "prefill");
    } else {
        pthread_mutex_lock(&w->mu);
        w->st.state = TUI_W_IDLE;
        status_from_session(w);
        /* the settings each lane's policy put in force (clamps shown) */
        size_t len = 0;
        for (int i = 0; i < w->c->n && len < sizeof w->st.in_force; i++) {
            skv_session *s = w->c->s[i];
            char d[400];
            kv_describe_in_force(kv_unwrap(s->kv), &s->o.kv, s->n_prompt, d, sizeof d);
            len += (size_t)snprintf(w->st.in_force + len, sizeof w->st.in_force - len, "%s%s: %s", i ? "; " : "",
                                    w->c->policy[i], d);
        }
        pthread_mutex_unlock(&w->mu);
        wake(w);
    }
    for (;;) {
        int auto_step;
        tui_wcmd c = next_command(w, &auto_step);
        if (c == TUI_CMD_QUIT) break;
        pthread_mutex_lock(&w->mu);
        int failed = w->st.state == TUI_W_FAILED, running = w->running;
        pthread_mutex_unlock(&w->mu);
        if (failed) {
            if (auto_step) set_running(w, 0);
            continue;
        }
        switch (c) {
        case TUI_CMD_RUN: set_running(w, 1); break;
        case TUI_CMD_PAUSE: set_running(w, 0); break;
        case TUI_CMD_TOGGLE: set_running(w, !running); break;
        case TUI_CMD_STEP: {
            int r = step_once(w, auto_step);
            if (r < 0) { fail(w, "decode"); break; }
            pthread_mutex_lock(&w->mu);
            int stop = auto_step && (r > 0 || w->st.steps >= w->st.generated_target);
            pthread_mutex_unlock(&w->mu);
            if (stop) set_running(w, 0);
            else wake(w);
            break;
        }
        case TUI_CMD_QUIT: break;
        }
    }
    return NULL;
}

int tui_worker_start(compare_run *c, int32_t *ids, int n_ids, int n_predict, int wake_fd, tui_worker **out) {
    *out = NULL;
    tui_worker *w = calloc(1, sizeof *w);
    if (!w) return skv_error(SKV_ENOMEM, "inspect: out of memory for the worker");
    w->c = c;
    w->s = c->s[0];
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->policy[i], "dense")) { w->s = c->s[i]; break; }
    skv_session *s = w->s;
    w->ids = ids;
    w->n_ids = n_ids;
    w->n_predict = n_predict;
    w->wake_fd = wake_fd;
    w->st.state = TUI_W_PREFILL;
    w->st.prefill_total = n_ids * c->n;
    w->st.n_ctx = s->o.ctx;
    w->st.generated_target = n_predict;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    /* The new thread inherits this mask: signals then go to the UI thread. */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigaddset(&block, SIGQUIT);
    sigaddset(&block, SIGWINCH);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    int rc = pthread_create(&w->thread, NULL, worker_main, w);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return skv_error(SKV_ENOMEM, "inspect: cannot start the engine thread: %s", strerror(rc));
    }
    *out = w;
    return 0;
}

void tui_worker_send(tui_worker *w, tui_wcmd cmd) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    if (cmd == TUI_CMD_QUIT) w->quit = 1;
    else if (cmd == TUI_CMD_PAUSE) { /* takes effect before anything queued */
        w->running = 0;
        w->q_len = 0;
        w->queue[w->q_head] = cmd;
        w->q_len = 1;
    } else if (w->q_len < QUEUE_CAP) {
        w->queue[(w->q_head + w->q_len) % QUEUE_CAP] = cmd;
        w->q_len++;
    }
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void tui_worker_status_get(tui_worker *w, tui_worker_status *out) {
    pthread_mutex_lock(&w->mu);
    *out = w->st;
    pthread_mutex_unlock(&w->mu);
}

void tui_worker_free(tui_worker *w) {
    if (!w) return;
    tui_worker_send(w, TUI_CMD_QUIT);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    compare_free(w->c);
    free(w->ids);
    free(w);
}
