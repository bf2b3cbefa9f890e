/* page_ops.h: the page stages of the page-bound policies (Quest, FreeKV) as
 * pure functions: per-page min/max of the keys, and the upper bound of q·k
 * over a page that those bounds give. */
#ifndef SKV_PAGE_OPS_H
#define SKV_PAGE_OPS_H

/* Updates the bounds of the pages holding positions t0..t0+n-1: key t is
 * row t of K (rows `stride` floats apart, K offset to the head), page j =
 * t / p; its bounds are rows j of mn and mx (rows `bstride` floats apart,
 * offset to the head). A page's first position (t % p == 0) resets them. */
void page_bounds(const float *K, int stride, int d, int p, int t0, int n, float *mn, float *mx, int bstride);

/* U (n_pages): U[j] = Σ_c max(q_c·mn[j][c], q_c·mx[j][c]), an upper bound
 * of q·k for every key of page j (no 1/√d). */
void page_score(const float *q, int d, const float *mn, const float *mx, int bstride, int n_pages, float *U);

#endif
