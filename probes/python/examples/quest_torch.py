"""quest_torch.py: Quest (Tang et al., ICML 2024) in PyTorch, as skv's
engine/kv/kv_quest.c computes it: pages of `page` tokens from position 0,
the min and max of each page's post-RoPE keys per KV head; at each decode
step, in layers past the first `dense_layers`, each query head scores every
page but the last with U = sum_c max(q_c min_c, q_c max_c), takes the top
budget/page - 1 (ties: the lower page) and attends them and the last page.
It records each (layer, KV head)'s pages with skvtrace.Recorder.select."""
import math

import torch


class Quest:
    name = "quest"

    def __init__(self, n_layers, budget, page=16, dense_layers=0):
        self.page, self.dense_layers, self.budget = page, dense_layers, budget
        self.opts = "budget=%d page=%d dense_layers=%d group_max=0" % (budget, page, dense_layers)
        kb = budget // page
        self.k = kb - 1 if kb > 1 else 0
        self.K = [None] * n_layers
        self.V = [None] * n_layers

    def prefill(self, layer, k_pre, k, v):
        self.K[layer], self.V[layer] = k.clone(), v.clone()

    def end_prefill(self, rec):
        pass

    def append(self, layer, k_pre, k, v):
        self.K[layer] = torch.cat([self.K[layer], k[None]])
        self.V[layer] = torch.cat([self.V[layer], v[None]])

    def full_kv(self, layer):
        return self.K[layer], self.V[layer]

    def _bounds(self, K, n_pages):
        """(n_pages, kv, d) min and max of each page's keys."""
        T, kv, d = K.shape
        pad = n_pages * self.page - T
        lo = torch.cat([K, K[-1:].expand(pad, kv, d)]) if pad else K
        lo = lo.view(n_pages, self.page, kv, d)
        return lo.amin(1), lo.amax(1)

    def attend(self, layer, q, rec):
        K, V = self.K[layer], self.V[layer]
        T, kv, d = K.shape
        H = q.shape[0]
        g = H // kv
        n_pages = (T + self.page - 1) // self.page
        last = n_pages - 1
        if layer < self.dense_layers or n_pages <= self.k + 1:
            from demo_model import attend_exact
            return attend_exact(q, K, V)
        mn, mx = self._bounds(K, n_pages)
        out = torch.empty_like(q)
        cur = torch.arange(last * self.page, T)
        for kh in range(kv):
            pages, scores = [], []
            for j in range(g):
                hq = kh * g + j
                qh = q[hq]
                U = torch.maximum(qh * mn[:last, kh], qh * mx[:last, kh]).sum(-1)
                order = torch.sort(U, descending=True, stable=True).indices[:self.k]
                pages.append(order)
                scores.append(U[order])
                if j == 0:
                    U0 = U  # the group's first query head's bounds, for the bound gap below
                rows = torch.cat([(order[:, None] * self.page + torch.arange(self.page)).reshape(-1), cur])
                s = (K[rows, kh] @ qh) / math.sqrt(d)
                out[hq] = s.softmax(-1) @ V[rows, kh]
            if rec is not None:
                rec.select(layer, kh, pages=pages, page_size=self.page, scores=scores, also=cur)
                # the bound gap of the group's first query head (skv's page_bound and page_max):
                # each page's bound U and true max q.k, and where the best page ranks under U
                true = (K[:last * self.page, kh] @ q[kh * g]).view(last, self.page).amax(1)
                best = int(torch.sort(true, descending=True, stable=True).indices[0])
                rec.metric("page_bound", float((U0 > U0[best]).sum()), layer, kh, U0)
                rec.metric("page_max", float(best), layer, kh, true)
        return out
