"""shadowkv_torch.py: ShadowKV (Sun et al., ICML 2025) in PyTorch, as skv's
engine/kv/kv_shadowkv.c computes it. At the end of the prompt, per layer: a
truncated SVD of the pre-RoPE keys of all KV heads side by side (rank r);
per KV head the post-RoPE chunk landmarks (means of `chunk` keys, kept in
half precision), each chunk's cosine minimum against its landmark, the
`outliers` chunks with the lowest minima kept dense, the last `local`
chunks and the tail kept dense; the other chunks are the candidates, whose
values would be offloaded. As skv keeps them, U, the offloaded values and the
attention rows (outliers, rebuilt keys, local window and generated tokens)
are rounded to bf16 (a fetched value, and a fetch's bytes, are bf16's); with
no candidate the rows stay f32 and attention is exact. Each decode step, per KV head: landmark scores
(softmax per query head, max over the group), the top budget/chunk
candidates (ties: the lower), their keys rebuilt as RoPE(U Sigma V^T), and
exact attention over [outliers | selected | local | generated]. A chunk
selected at the last step is a cache hit, the others misses (fetched)."""
import math

import torch


class ShadowKV:
    name = "shadowkv"

    def __init__(self, n_layers, budget, rope, rank=160, chunk=8, outliers=48, local=4):
        self.budget, self.rank, self.c, self.n_out_opt, self.local = budget, rank, chunk, outliers, local
        self.opts = "budget=%d rank=%d chunk=%d outliers=%d local=%d plus=0 overlap=1 f32_state=0" % (
            budget, rank, chunk, outliers, local)
        self.rope = rope  # (x (n, kv, d), positions (n,)) -> x rotated
        self.kpre = [None] * n_layers
        self.K = [None] * n_layers  # exact post-RoPE keys of every position (the generated part is attended)
        self.V = [None] * n_layers
        self.prev = {}

    def prefill(self, layer, k_pre, k, v):
        self.kpre[layer], self.K[layer], self.V[layer] = k_pre.clone(), k.clone(), v.clone()

    def append(self, layer, k_pre, k, v):
        self.K[layer] = torch.cat([self.K[layer], k[None]])
        self.V[layer] = torch.cat([self.V[layer], v[None]])

    def full_kv(self, layer):
        return self.K[layer], self.V[layer]

    def end_prefill(self, rec):
        s, kv, d = self.K[0].shape
        c = self.c
        self.s, self.n_chunks = s, s // c
        self.local_start = self.n_chunks - self.local if self.n_chunks > self.local else 0
        self.n_out = min(self.n_out_opt, self.local_start)
        self.n_cand = self.local_start - self.n_out
        self.k = min(self.budget // c, self.n_cand)
        self.r = min(self.rank, min(s, kv * d))
        self.U, self.SVt, self.outl, self.cand, self.lm = [], [], [], [], []
        for layer, kp in enumerate(self.kpre):
            U, S, Vt = torch.linalg.svd(kp.reshape(s, kv * d), full_matrices=False)
            self.U.append(U[:, :self.r].to(torch.bfloat16).float())  # kept in bf16, as skv's
            self.SVt.append((S[:self.r, None] * Vt[:self.r]).view(self.r, kv, d))
            K = self.K[layer][:self.n_chunks * c].view(self.n_chunks, c, kv, d)
            lm = K.mean(1)  # (n_chunks, kv, d)
            cosm = torch.nn.functional.cosine_similarity(K, lm[:, None], dim=-1, eps=0).amin(1)  # (n_chunks, kv)
            outl, cand, lms = [], [], []
            for kh in range(kv):
                o = torch.sort(cosm[:self.local_start, kh], stable=True).indices[:self.n_out].sort().values
                isout = torch.zeros(self.local_start, dtype=torch.bool)
                isout[o] = True
                cd = torch.nonzero(~isout).reshape(-1)
                outl.append(o)
                cand.append(cd)
                lms.append(lm[cd, kh].half().float())
            self.outl.append(outl)
            self.cand.append(cand)
            self.lm.append(lms)
            if rec is not None:
                rec.prefill(layer, k_pre=kp, k_post=self.K[layer][:s], rank=self.r, chunk=c,
                            outliers=[o.tolist() for o in outl], local_start=self.local_start,
                            n_landmarks=self.n_cand)
            self.kpre[layer] = None

    def _rebuilt(self, layer, kh, chunks):
        """Keys of the chunks' positions rebuilt from the rank-r factors, with RoPE."""
        c = self.c
        pos = (chunks[:, None] * c + torch.arange(c)).reshape(-1)
        k = self.U[layer][pos] @ self.SVt[layer][:, kh, :]  # (n, d)
        return self.rope(k[:, None, :], pos)[:, 0, :], pos

    def attend(self, layer, q, rec):
        from demo_model import attend_exact, spans
        K, V = self.K[layer], self.V[layer]
        T, kv, d = K.shape
        H = q.shape[0]
        g = H // kv
        if self.n_cand == 0:
            return attend_exact(q, K, V)
        c = self.c
        out = torch.empty_like(q)
        scale = 1.0 / math.sqrt(d)
        tail = torch.arange(self.local_start * c, T)
        span = spans(rec)
        for kh in range(kv):
            with span("select", layer, 0):  # landmark scores, softmax, group max, top-k
                lg = (q[kh * g:(kh + 1) * g] @ self.lm[layer][kh].T) * scale  # (g, n_cand)
                score = lg.softmax(-1).amax(0)
                sel = torch.sort(score, descending=True, stable=True).indices[:self.k]
                sel_id = self.cand[layer][kh][sel]
                prev = self.prev.get((layer, kh), set())
                misses = sum(1 for j in sel_id.tolist() if j not in prev)
                self.prev[(layer, kh)] = set(sel_id.tolist())
            with span("rebuild_k", layer, 2):  # the selected chunks' keys from the low-rank factors
                opos = (self.outl[layer][kh][:, None] * c + torch.arange(c)).reshape(-1)
                kr, spos = self._rebuilt(layer, kh, sel_id)
                keys = torch.cat([K[opos, kh], kr, K[tail, kh]]).to(torch.bfloat16).float()  # skv's bf16 rows
            with span("fetch_v", layer, 1):  # the values (offloaded in ShadowKV; here in memory)
                vals = torch.cat([V[opos, kh], V[spos, kh], V[tail, kh]]).to(torch.bfloat16).float()
            with span("sparse_attn", layer, 0):
                for j in range(g):
                    hq = kh * g + j
                    out[hq] = ((keys @ q[hq]) * scale).softmax(-1) @ vals
            if rec is not None:
                rec.select(layer, kh, pages=sel_id, page_size=c, scores=score[sel], also=torch.cat([opos, tail]),
                           fetch_bytes=misses * c * d * 2, hits=self.k - misses, misses=misses,
                           candidates=self.cand[layer][kh], cand_scores=score)
        return out
