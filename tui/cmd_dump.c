/* cmd_dump.c: `skv dump` writes one layer's tensors as numpy .npy files
 * (v1.0, little-endian f32) so other implementations can be checked against
 * skv: the pre-RoPE and post-RoPE keys, values and last query (recorded by a
 * kv_tap around the policy), ShadowKV's U, ΣVᵀ and landmarks (computed with
 * the same shadowkv_ops the policy uses), its cos-min and outlier ids (from
 * the prefill probe events) and the chunks selected at the first decode step
 * (from the decode probe events). */
#include "cli.h"
#include "model.h"
#include "probe.h"
#include "skv.h"
#include "tok.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Writes a 1-D or 2-D f32 array as dir/name.npy (temp file, then rename). */
/* An array of 4-byte elements (descr "<f4" or "<i4") as NAME.npy in dir,
 * through a temporary file; its path and shape are printed. */
static int npy_write(const char *dir, const char *name, const void *data, const char *descr, int nd, const int *shape) {
    char path[4096], tmp[4200], hdr[256], dims[96] = "", list[96] = "";
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    size_t count = 1, dl = 0, ll = 0;
    for (int i = 0; i < nd; i++) {
        count *= (size_t)shape[i];
        dl += snprintf(dims + dl, sizeof dims - dl, "%d,%s", shape[i], i + 1 < nd ? " " : "");
        ll += snprintf(list + ll, sizeof list - ll, "%s%d", i ? ", " : "", shape[i]);
    }
    if (nd > 1) dims[dl - 1] = 0; /* (a, b) but (a,) */
    int n = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, dims);
    int total = 10 + n + 1;
    int pad = (64 - total % 64) % 64;
    FILE *f = fopen(tmp, "wb");
    if (!f) return skv_error(SKV_EIO, "%s: cannot write: %s", tmp, strerror(errno));
    unsigned char magic[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0};
    uint16_t hl = (uint16_t)(n + pad + 1);
    magic[8] = hl & 0xff;
    magic[9] = hl >> 8;
    fwrite(magic, 1, 10, f);
    fwrite(hdr, 1, n, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    size_t w = count ? fwrite(data, 4, count, f) : 0;
    int bad = w != count || fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return skv_error(SKV_EIO, "%s: cannot write", path);
    }
    printf("%s  [%s]\n", path, list);
    return 0;
}

typedef struct {
    int layer, n_kv;
    int n_chunks;
    float *cos_min;      /* (n_kv, n_chunks) */
    int *n_out;          /* (n_kv) */
    int32_t *outliers;   /* (n_kv, max_out) chunk ids; -1 padding */
    int max_out;
    int k;
    int32_t *selected;   /* (n_kv, k) chunk ids of step 0; -1 padding */
    int got_sel;
} dump_capture;

static void on_event(const probe_event *ev, void *user) {
    dump_capture *d = user;
    if (ev->kind == PROBE_PREFILL_HEAD && ev->prefill_head.layer == d->layer) {
        const probe_ev_prefill_head *h = &ev->prefill_head;
        if (!d->cos_min) {
            d->n_chunks = h->n_chunks;
            d->cos_min = calloc((size_t)d->n_kv * (h->n_chunks ? h->n_chunks : 1), sizeof(float));
            d->n_out = calloc(d->n_kv, sizeof(int));
            d->max_out = h->n_outliers > 0 ? h->n_outliers : 1;
            d->outliers = malloc(sizeof(int32_t) * d->n_kv * d->max_out);
            for (int i = 0; d->outliers && i < d->n_kv * d->max_out; i++) d->outliers[i] = -1;
        }
        if (d->cos_min && h->head < d->n_kv && h->n_chunks == d->n_chunks) {
            for (int j = 0; j < h->n_chunks; j++) d->cos_min[(size_t)h->head * d->n_chunks + j] = h->cos_min[j];
            for (int j = 0; j < h->n_outliers && j < d->max_out; j++)
                d->outliers[(size_t)h->head * d->max_out + j] = h->outliers[j];
            d->n_out[h->head] = h->n_outliers;
        }
    }
    if (ev->kind == PROBE_DECODE_HEAD && ev->decode_head.step == 0 && ev->decode_head.layer == d->layer) {
        const probe_ev_decode_head *h = &ev->decode_head;
        if (!d->selected) {
            d->k = h->n_sel > 0 ? h->n_sel : 1;
            d->selected = malloc(sizeof(int32_t) * d->n_kv * d->k);
            for (int i = 0; d->selected && i < d->n_kv * d->k; i++) d->selected[i] = -1;
        }
        if (d->selected && h->head < d->n_kv)
            for (int j = 0; j < h->n_sel && j < d->k; j++) d->selected[(size_t)h->head * d->k + j] = h->sel[j];
        d->got_sel = 1;
    }
}

static void help(FILE *o) {
    fprintf(o, "usage: skv dump -m MODEL (-p TEXT | -f FILE) --layer L -o DIR [options]\n\n"
               "Writes layer L's tensors as numpy .npy files (v1.0, little-endian f32; chunk ids int32)\n"
               "into DIR: k_pre.npy (s, kv*hd), k_post.npy, v.npy, q_last.npy (heads*hd);\n"
               "  with a low-rank block policy (--kv shadowkv) also U.npy (s, r), SVt.npy (r, kv*hd), landmarks.npy\n"
               "  (kv, chunks, hd), cos_min.npy (kv, chunks), outliers.npy (kv, O; int32, -1 padding) and\n"
               "  selected.npy (kv, k; int32): the chunks chosen at the first decode step.\n"
               "An existing .npy file there is kept unless --force.\n\n");
    cli_gen_help(o, 0);
}

int cmd_dump(int argc, char **argv) {
    cli_gen g;
    cli_gen_default(&g);
    const char *dir = NULL;
    int layer = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { help(stdout); return 0; }
        if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) && i + 1 < argc) { dir = argv[++i]; continue; }
        if (!strcmp(argv[i], "--layer") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 0 || v > 4096) return cli_usage_error("dump", "--layer expects a layer number");
            layer = (int)v;
            continue;
        }
        int r = cli_gen_option(&g, argc, argv, &i);
        if (r < 0) return 2;
        if (r == CLI_DONE) return 0;
        if (r == 0) return cli_usage_error("dump", "unknown option '%s'", argv[i]);
    }
    if (cli_single_policy(&g, "dump") || cli_check_policy_flags(&g, "dump", NULL, 0)) return 2;
    if (cli_no_trace(&g, "dump")) return 2;
    if (!g.model) return cli_usage_error("dump", "no model: give -m MODEL");
    if (layer < 0) return cli_usage_error("dump", "no --layer L");
    if (!dir) return cli_usage_error("dump", "no -o DIR");
    const char *text = cli_prompt_text(&g);
    if (!text) return 2;
    /* Every file it may write, checked before the work: none is replaced
     * without --force. The folder is made only once the model has the
     * layer, so a refused command leaves nothing behind. */
    struct stat dsb;
    int dir_exists = stat(dir, &dsb) == 0;
    if (dir_exists && !S_ISDIR(dsb.st_mode)) {
        fprintf(stderr, "skv dump: -o %s: not a folder\n", dir);
        return 1;
    }
    static const char *const names[] = { "k_pre", "k_post", "v", "q_last", "U", "SVt", "landmarks", "cos_min",
                                         "outliers", "selected" };
    for (size_t i = 0; dir_exists && i < sizeof names / sizeof names[0]; i++) {
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/%s.npy", dir, names[i]);
        if (cli_check_output("dump", path, g.force)) return 1;
    }
    skv_model *m = NULL;
    skv_session *s = NULL;
    probe_bus *bus = NULL;
    probe_sub *sub = NULL;
    int32_t *ids = NULL;
    int n = 0, rc = 1;
    dump_capture cap = {.layer = layer};
    float *U = NULL, *SVt = NULL, *sv = NULL, *lm = NULL;
    if (model_load(g.model, &m)) { cli_fail(); goto out; }
    cap.n_kv = m->cfg.n_kv_heads;
    if (layer >= m->cfg.n_layers) {
        cli_msg("--layer %d is out of range (the model has %d layers)\n", layer, m->cfg.n_layers);
        goto out;
    }
    if (skv_make_dir(dir)) { cli_fail(); goto out; }
    if (tok_encode(m->tok, text, strlen(text), tok_add_bos(m->tok) && !g.no_bos, 1, &ids, &n)) { cli_fail(); goto out; }
    if (probe_bus_new(&bus) ||
        probe_subscribe_callback(bus, PROBE_MASK(PROBE_PREFILL_HEAD) | PROBE_MASK(PROBE_DECODE_HEAD), on_event, &cap,
                                 &sub)) { cli_fail(); goto out; }
    g.s.bus = bus;
    g.s.tap_layer = layer;
    if (session_new(m, &g.s, &s) || session_prefill(s, ids, n, NULL, NULL)) { cli_fail(); goto out; }
    if (s->kv->notice[0]) cli_msg("%s\n", s->kv->notice);
    if (session_decode(s, session_sample(s))) { cli_fail(); goto out; }
    const kv_tap_data *d = kv_tap_get(s->kv);
    int kvd = m->cfg.n_kv_heads * m->cfg.head_dim, hd = m->cfg.head_dim;
    if (npy_write(dir, "k_pre", d->k_pre, "<f4", 2, (int[]){n, kvd}) ||
        npy_write(dir, "k_post", d->k, "<f4", 2, (int[]){n, kvd}) || npy_write(dir, "v", d->v, "<f4", 2, (int[]){n, kvd}) ||
        npy_write(dir, "q_last", d->q_last, "<f4", 1, (int[]){m->cfg.n_heads * hd})) {
        cli_fail();
        goto out;
    }
    /* A low-rank block policy reports its rank and chunk as stats; its
     * factors are recomputed here through the same backend op. */
    double st_rank = kv_stat(s->kv, "rank"), st_chunk = kv_stat(s->kv, "chunk"), st_nch = kv_stat(s->kv, "n_chunks");
    if (!isnan(st_rank) && !isnan(st_chunk) && !isnan(st_nch) && st_rank >= 1) {
        int r = (int)st_rank, mn = n < kvd ? n : kvd;
        U = malloc(sizeof(float) * n * r);
        SVt = malloc(sizeof(float) * r * kvd);
        sv = malloc(sizeof(float) * mn);
        float err;
        if (!U || !SVt || !sv || s->be->svd(d->k_pre, n, kvd, r, U, SVt, NULL, sv, &err)) { cli_fail(); goto out; }
        int nc = (int)st_nch, chunk = (int)st_chunk;
        lm = malloc(sizeof(float) * (size_t)m->cfg.n_kv_heads * (nc ? nc : 1) * hd);
        for (int h = 0; h < m->cfg.n_kv_heads; h++)
            s->be->landmarks(d->k + (size_t)h * hd, kvd, hd, chunk, nc, lm + (size_t)h * nc * hd);
        if (npy_write(dir, "U", U, "<f4", 2, (int[]){n, r}) ||
            npy_write(dir, "SVt", SVt, "<f4", 2, (int[]){r, kvd}) ||
            npy_write(dir, "landmarks", lm, "<f4", 3, (int[]){m->cfg.n_kv_heads, nc, hd})) { cli_fail(); goto out; }
        if (cap.cos_min && (npy_write(dir, "cos_min", cap.cos_min, "<f4", 2, (int[]){cap.n_kv, cap.n_chunks}) ||
                            npy_write(dir, "outliers", cap.outliers, "<i4", 2, (int[]){cap.n_kv, cap.max_out}))) {
            cli_fail();
            goto out;
        }
        if (cap.selected && npy_write(dir, "selected", cap.selected, "<i4", 2, (int[]){cap.n_kv, cap.k})) {
            cli_fail();
            goto out;
        }
    } else {
        cli_msg("policy %s keeps no low-rank keys: only K, V and the query were written\n",
                s->kv->policy->name);
    }
    rc = 0;
out:
    free(U); free(SVt); free(sv); free(lm);
    free(cap.cos_min); free(cap.n_out); free(cap.outliers); free(cap.selected);
    session_free(s);
    if (sub) probe_unsubscribe(sub);
    probe_bus_free(bus);
    model_free(m);
    free(ids);
    cli_gen_free(&g);
    return rc;
}
