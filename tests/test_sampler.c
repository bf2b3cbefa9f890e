/* test_sampler: the next-token sampler (engine/sampler.c) on logits whose
 * probabilities are known: greedy, the frequencies of temperature sampling,
 * top-k and top-p (nucleus) cut-offs, ties by token id, and the seed. */
#include "sampler.h"
#include "testhelp.h"

#include <math.h>

#define V 5
#define DRAWS 20000

/* logits whose softmax at temperature 1 is p */
static void logits_of(const double *p, float *l) {
    for (int i = 0; i < V; i++) l[i] = p[i] > 0 ? (float)log(p[i]) : -1e30f;
}

/* Draws DRAWS tokens; counts each id into n. 0 on success. */
static int draw(const sampler_opts *o, const float *l, int *n) {
    sampler s;
    if (sampler_init(&s, o, V)) return -1;
    for (int i = 0; i < V; i++) n[i] = 0;
    int bad = 0;
    for (int d = 0; d < DRAWS; d++) {
        int t = sampler_sample(&s, l);
        if (t < 0 || t >= V) bad = 1;
        else n[t]++;
    }
    sampler_free(&s);
    return bad;
}

int main(void) {
    static const double p[V] = { 0.1, 0.45, 0.25, 0.15, 0.05 }; /* order: 1, 2, 3, 0, 4 */
    float l[V];
    logits_of(p, l);
    int n[V];

    sampler_opts g = { .temp = 0, .top_k = 0, .top_p = 1, .seed = 1 };
    int rc = draw(&g, l, n);
    test_cond("temp 0 is greedy: the most likely token every time", rc == 0 && n[1] == DRAWS);

    sampler_opts t1 = { .temp = 1, .top_k = 0, .top_p = 1, .seed = 7 };
    rc = draw(&t1, l, n);
    double worst = 0;
    for (int i = 0; i < V; i++) worst = fmax(worst, fabs((double)n[i] / DRAWS - p[i]));
    test_cond("temp 1 with no cut-off draws each token at its softmax probability (within 0.015 over 20000 draws)",
              rc == 0 && worst < 0.015);
    if (worst >= 0.015) printf("  worst frequency error %.4f\n", worst);

    sampler_opts hot = t1, cold = t1;
    hot.temp = 2;
    cold.temp = 0.5f;
    int nh[V], nc[V];
    rc = draw(&hot, l, nh) | draw(&cold, l, nc);
    /* at temperature T the top token's probability is 0.45^(1/T) / sum p^(1/T) */
    double zh = 0, zc = 0;
    for (int i = 0; i < V; i++) zh += pow(p[i], 0.5), zc += pow(p[i], 2.0);
    test_cond("temperature 2 flattens and 0.5 sharpens: the top token's frequency follows p^(1/T)",
              rc == 0 && fabs((double)nh[1] / DRAWS - pow(0.45, 0.5) / zh) < 0.015 &&
                  fabs((double)nc[1] / DRAWS - 0.45 * 0.45 / zc) < 0.015);

    sampler_opts k2 = t1;
    k2.top_k = 2;
    rc = draw(&k2, l, n);
    test_cond("top-k 2 draws only the two most likely tokens, renormalised (0.45 : 0.25)",
              rc == 0 && n[0] == 0 && n[3] == 0 && n[4] == 0 && fabs((double)n[1] / DRAWS - 0.45 / 0.70) < 0.015);

    sampler_opts k1 = t1;
    k1.top_k = 1;
    rc = draw(&k1, l, n);
    test_cond("top-k 1 at temp 1 is greedy", rc == 0 && n[1] == DRAWS);

    /* nucleus: the smallest prefix (most likely first) whose mass reaches top_p */
    sampler_opts p5 = t1;
    p5.top_p = 0.4f;
    rc = draw(&p5, l, n);
    test_cond("top-p 0.4: the top token alone holds 0.45, so only it is drawn", rc == 0 && n[1] == DRAWS);
    p5.top_p = 0.8f;
    rc = draw(&p5, l, n);
    test_cond("top-p 0.8: the first three (0.45 + 0.25 + 0.15 = 0.85) and never the others",
              rc == 0 && n[0] == 0 && n[4] == 0 && n[1] > 0 && n[2] > 0 && n[3] > 0 &&
                  fabs((double)n[3] / DRAWS - 0.15 / 0.85) < 0.015);
    p5.top_p = 0.8f;
    p5.top_k = 2;
    rc = draw(&p5, l, n);
    test_cond("top-k 2 and top-p 0.8 together: the tighter one (k) holds", rc == 0 && n[3] == 0 && n[1] + n[2] == DRAWS);

    /* equal probabilities: the lower token id ranks first */
    float tie[V] = { 0, 2, 1, 2, -1 };
    sampler_opts kt = t1;
    kt.top_k = 1;
    sampler s;
    int first = -1, same = 1;
    if (!sampler_init(&s, &kt, V)) {
        first = sampler_sample(&s, tie);
        for (int i = 0; i < 200; i++) same &= sampler_sample(&s, tie) == first;
        sampler_free(&s);
    }
    test_cond("a tie for the top is broken by the lower token id (1 before 3)", first == 1 && same);
    test_cond("sampler_argmax takes the first of equal maxima", sampler_argmax(tie, V) == 1);

    /* the seed: the same one replays the same tokens, another does not */
    int a[64], b[64], c[64];
    sampler_opts o1 = t1, o2 = t1;
    o2.seed = 8;
    sampler sa, sb, sc;
    rc = sampler_init(&sa, &o1, V) | sampler_init(&sb, &o1, V) | sampler_init(&sc, &o2, V);
    int diff = 0, eq = 1;
    for (int i = 0; i < 64 && !rc; i++) {
        a[i] = sampler_sample(&sa, l);
        b[i] = sampler_sample(&sb, l);
        c[i] = sampler_sample(&sc, l);
        eq &= a[i] == b[i];
        diff += a[i] != c[i];
    }
    if (!rc) {
        sampler_free(&sa);
        sampler_free(&sb);
        sampler_free(&sc);
    }
    test_cond("one seed replays the same 64 tokens; another seed draws others", rc == 0 && eq && diff > 8);
    return test_report("test_sampler");
}
