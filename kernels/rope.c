/* rope.c: rotary position embedding for both pair layouts, with the
 * Llama-3 frequency scaling and GGUF's per-pair frequency divisors. */
#include "rope.h"
#include "skv.h"

#include <math.h>
#include <stdlib.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

double rope_llama3_divisor(const rope_params *p, int i) {
    double f = pow(p->theta, -2.0 * i / p->rope_dim);
    double lo_wl = p->orig_ctx / p->low_freq, hi_wl = p->orig_ctx / p->high_freq;
    double wl = 2 * M_PI / f;
    if (wl < hi_wl) return 1.0;
    if (wl > lo_wl) return p->factor;
    double smooth = (p->orig_ctx / wl - p->low_freq) / (p->high_freq - p->low_freq);
    return 1.0 / ((1 - smooth) / p->factor + smooth);
}

int rope_init(rope_ctx *r, const rope_params *p, const float *freq_factors) {
    r->mode = p->mode;
    r->head_dim = p->head_dim;
    r->rope_dim = p->rope_dim;
    int half = p->rope_dim / 2;
    r->inv_freq = malloc(sizeof(float) * (half ? half : 1));
    if (!r->inv_freq) return skv_error(SKV_ENOMEM, "out of memory for RoPE tables");
    for (int i = 0; i < half; i++) {
        double f = pow(p->theta, -2.0 * i / p->rope_dim);
        if (freq_factors) f /= freq_factors[i];
        else if (p->llama3) f /= rope_llama3_divisor(p, i);
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

/* Eight lanes at a time where AVX2 is built in: each product rounded, then
 * added or subtracted (addsub), the bits of the scalar loop below (built
 * without contraction, -std=c11). */
void rope_rotate(const rope_ctx *r, float *x, int n_heads, const float *cs, const float *sn) {
    int half = r->rope_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * r->head_dim;
        int i = 0;
        if (r->mode == ROPE_ADJACENT) {
#if defined(__AVX2__)
            const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
            for (; i + 4 <= half; i += 4) {
                __m256 xv = _mm256_loadu_ps(v + 2 * i);
                __m256 c = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cs + i)), dup);
                __m256 s = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sn + i)), dup);
                __m256 sw = _mm256_permute_ps(xv, 0xB1); /* (b, a) of every pair */
                _mm256_storeu_ps(v + 2 * i, _mm256_addsub_ps(_mm256_mul_ps(xv, c), _mm256_mul_ps(sw, s)));
            }
#endif
            for (; i < half; i++) {
                float a = v[2 * i], b = v[2 * i + 1];
                v[2 * i] = a * cs[i] - b * sn[i];
                v[2 * i + 1] = a * sn[i] + b * cs[i];
            }
        } else {
#if defined(__AVX2__)
            for (; i + 8 <= half; i += 8) {
                __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + i + half);
                __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(sn + i);
                _mm256_storeu_ps(v + i, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
                _mm256_storeu_ps(v + i + half, _mm256_add_ps(_mm256_mul_ps(a, s), _mm256_mul_ps(b, c)));
            }
#endif
            for (; i < half; i++) {
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
