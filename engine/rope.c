/* rope.c: rotary position embedding for both pair layouts, with the
 * Llama-3 frequency scaling and GGUF's per-pair frequency divisors. */
#include "rope.h"
#include "skv.h"

#include <math.h>
#include <stdlib.h>

/* Llama-3 scaling: long wavelengths are slowed by factor, short ones kept, and
 * the band between blends the two (as in Meta's reference). */
static double llama3_scale(const model_config *c, double freq) {
    double lo_wl = c->rope_orig_ctx / c->rope_low_freq;
    double hi_wl = c->rope_orig_ctx / c->rope_high_freq;
    double wl = 2 * M_PI / freq;
    if (wl < hi_wl) return freq;
    if (wl > lo_wl) return freq / c->rope_factor;
    double smooth = (c->rope_orig_ctx / wl - c->rope_low_freq) / (c->rope_high_freq - c->rope_low_freq);
    return (1 - smooth) * freq / c->rope_factor + smooth * freq;
}

int rope_init(rope_ctx *r, const model_config *cfg, const float *freq_factors) {
    r->mode = cfg->rope_mode;
    r->head_dim = cfg->head_dim;
    r->rope_dim = cfg->rope_dim;
    int half = cfg->rope_dim / 2;
    r->inv_freq = malloc(sizeof(float) * (half ? half : 1));
    if (!r->inv_freq) return skv_error(SKV_ENOMEM, "out of memory for RoPE tables");
    for (int i = 0; i < half; i++) {
        double f = pow(cfg->rope_theta, -2.0 * i / cfg->rope_dim);
        if (freq_factors) f /= freq_factors[i];
        else if (cfg->rope_llama3) f = llama3_scale(cfg, f);
        r->inv_freq[i] = (float)f;
    }
    return 0;
}

void rope_free(rope_ctx *r) {
    free(r->inv_freq);
    r->inv_freq = NULL;
}

void rope_angles(const rope_ctx *r, int pos, float *cs, float *sn) {
    for (int i = 0; i < r->rope_dim / 2; i++) {
        double th = (double)pos * r->inv_freq[i];
        cs[i] = (float)cos(th);
        sn[i] = (float)sin(th);
    }
}

void rope_rotate(const rope_ctx *r, float *x, int n_heads, const float *cs, const float *sn) {
    int half = r->rope_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * r->head_dim;
        if (r->mode == ROPE_ADJACENT) {
            for (int i = 0; i < half; i++) {
                float a = v[2 * i], b = v[2 * i + 1];
                v[2 * i] = a * cs[i] - b * sn[i];
                v[2 * i + 1] = a * sn[i] + b * cs[i];
            }
        } else {
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * cs[i] - b * sn[i];
                v[i + half] = a * sn[i] + b * cs[i];
            }
        }
    }
}

void rope_apply(const rope_ctx *r, float *x, int n_heads, int pos) {
    float cs[512], sn[512];
    SKV_ASSERT(r->rope_dim / 2 <= 512);
    rope_angles(r, pos, cs, sn);
    rope_rotate(r, x, n_heads, cs, sn);
}
