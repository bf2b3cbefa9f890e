/* test_dump: `skv dump` writes valid .npy files whose contents agree with
 * each other: U·ΣVᵀ reconstructs the pre-RoPE keys to the probe's error, the
 * landmarks are chunk means of the post-RoPE keys, and the selected chunks
 * are neither outliers nor in the local window. */
#include "testhelp.h"

#include <sys/wait.h>

typedef struct { int rows, cols, mid; float *d; } npy; /* mid: the middle dim of 3 (then cols is the last), else 0 */

/* Reads a v1.0 C-order .npy of 1, 2 or 3 dims, of descr ("<f4", or "<i4"
 * whose values come back as floats in d). */
static int npy_read(const char *dir, const char *name, const char *descr, npy *a) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    unsigned char h[10];
    int ok = fread(h, 1, 10, f) == 10 && !memcmp(h, "\x93NUMPY\x01\x00", 8);
    int hl = h[8] | h[9] << 8;
    char hdr[512] = {0};
    ok = ok && hl < 511 && (int)fread(hdr, 1, hl, f) == hl && (10 + hl) % 64 == 0;
    char want[32];
    snprintf(want, sizeof want, "'descr': '%s'", descr);
    ok = ok && strstr(hdr, want) && strstr(hdr, "'fortran_order': False");
    char *sh = strstr(hdr, "'shape': (");
    a->rows = 1;
    a->cols = a->mid = 0;
    if (ok && sh) {
        if (sscanf(sh, "'shape': (%d, %d, %d)", &a->rows, &a->mid, &a->cols) == 3) {
            a->cols *= a->mid;
        } else if ((a->mid = 0, sscanf(sh, "'shape': (%d, %d)", &a->rows, &a->cols) != 2)) {
            a->rows = 1;
            ok = sscanf(sh, "'shape': (%d,)", &a->cols) == 1;
        }
    }
    a->d = ok ? malloc(sizeof(float) * a->rows * a->cols) : NULL;
    ok = ok && a->d && fread(a->d, sizeof(float), (size_t)a->rows * a->cols, f) == (size_t)a->rows * a->cols;
    for (size_t i = 0; ok && !strcmp(descr, "<i4") && i < (size_t)a->rows * a->cols; i++) {
        int32_t v;
        memcpy(&v, &a->d[i], sizeof v);
        a->d[i] = (float)v;
    }
    fclose(f);
    return ok ? 0 : -1;
}

int main(void) {
    const char *model = test_shared("models/stories260k.gguf");
    if (!model) { test_skip("test_dump: ../shared/models missing"); return test_report("test_dump"); }
    const char *bin = getenv("SKV_BIN") ? getenv("SKV_BIN") : "./build/skv";
    const char *dir = test_tmpdir("dump");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s dump -m %s -p 'Once upon a time, there was a little girl named Lily. She loved to play outside in "
             "the park with her friends. One day she found a big red ball' --layer 2 -o %s --kv shadowkv --rank 8 "
             "--budget 16 --outliers 1 --local 1 > %s/listing.txt", bin, model, dir, dir);
    int st = system(cmd);
    test_cond("skv dump exits 0", WIFEXITED(st) && WEXITSTATUS(st) == 0);
    static const char *names[] = {"k_pre", "k_post", "v", "q_last", "U", "SVt", "landmarks", "cos_min", "outliers", "selected"};
    npy a[10];
    int all = 1;
    for (int i = 0; i < 10; i++) all &= npy_read(dir, names[i], i >= 8 ? "<i4" : "<f4", &a[i]) == 0;
    test_cond("all ten .npy files parse as v1.0, <f4 but outliers and selected (chunk ids) <i4", all);
    if (!all) return test_report("test_dump");
    int s = a[0].rows, kvd = a[0].cols, r = a[4].cols;
    test_cond("shapes: k_pre (48, 32), U (48, 8), SVt (8, 32), q_last (64)",
              s == 48 && kvd == 32 && a[4].rows == s && r == 8 && a[5].rows == r && a[5].cols == kvd && a[3].cols == 64);
    char lpath[600], listing[4096] = "";
    snprintf(lpath, sizeof lpath, "%s/listing.txt", dir);
    FILE *lf = fopen(lpath, "r");
    if (lf) {
        listing[fread(listing, 1, sizeof listing - 1, lf)] = 0;
        fclose(lf);
    }
    test_cond("the files listed with the shapes their headers give: k_pre.npy [48, 32], q_last.npy [64]",
              strstr(listing, "/k_pre.npy  [48, 32]\n") && strstr(listing, "/q_last.npy  [64]\n"));
    double num = 0, den = 0;
    for (int t = 0; t < s; t++)
        for (int j = 0; j < kvd; j++) {
            double x = 0;
            for (int k = 0; k < r; k++) x += (double)a[4].d[t * r + k] * a[5].d[k * kvd + j];
            double y = a[0].d[t * kvd + j];
            num += (x - y) * (x - y);
            den += y * y;
        }
    double err = sqrt(num / den);
    char msg[256];
    snprintf(msg, sizeof msg, "U·SVt reconstructs k_pre at rank 8 with rel. error %.3f (< 0.2, > 0)", err);
    test_cond(msg, err < 0.2 && err > 0);
    int hd = 8, nc = a[7].cols, ok = 1;
    test_cond("landmarks.npy is (kv, chunks, hd): (4, chunks, 8)", a[6].rows == 4 && a[6].mid == nc && a[6].cols == nc * hd);
    for (int h = 0; h < 4; h++)
        for (int c = 0; c < nc; c++)
            for (int j = 0; j < hd; j++) {
                double m = 0;
                for (int t = 0; t < 8; t++) m += a[1].d[(c * 8 + t) * kvd + h * hd + j];
                ok &= fabs(m / 8 - a[6].d[h * nc * hd + c * hd + j]) < 1e-5;
            }
    test_cond("landmarks are the chunk means of the post-RoPE keys", ok);
    ok = 1;
    for (int h = 0; h < 4; h++)
        for (int j = 0; j < a[9].cols; j++) {
            int c = (int)a[9].d[h * a[9].cols + j];
            ok &= c >= 0 && c < nc - 1 && c != (int)a[8].d[h];
        }
    test_cond("selected chunks are candidates: not the outlier, not the local window", ok);
    for (int i = 0; i < 10; i++) {
        free(a[i].d);
        char p[1024];
        snprintf(p, sizeof p, "%s/%s.npy", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
    return test_report("test_dump");
}
