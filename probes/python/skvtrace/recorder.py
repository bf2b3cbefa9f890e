"""skvtrace.recorder: records a KV method written in PyTorch (or numpy) into
an skv trace, so `skv inspect --replay`, `skv export` and `skv needle
--diagnose` show it as they show skv's own policies.

    rec = Recorder("quest.skvtrace", n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                   max_ctx=8192, policy="quest", policy_opts="budget=1024 page=16",
                   budget=1024, oracle=True)
    rec.prompt(ids, texts)                         # the run and the prompt's tokens
    rec.prefill(layer, k_pre=..., k_post=..., chunk=8, rank=160)   # optional: spectra, cos-min
    for each decode step:
        rec.begin_step(token, text)                # the token fed at this step
        for each layer:
            for each KV head: rec.select(layer, kh, pages=..., page_size=16, scores=..., also=...)
            rec.attention(layer, q, out, k, v)     # with oracle=True: exact attention beside it
        rec.end_step()                             # the step's record (flushed to disk)
    rec.last_token(token, text)                    # the token sampled after the last step
    rec.close()

Shapes: a query q and an output out are (n_heads, head_dim) for the one
decoding position; k and v are the whole cache, (T, n_kv_heads, head_dim),
post-RoPE, T = prompt + step + 1 positions (the exact keys the method would
attend without its policy). Tensors may be torch tensors on any device or
numpy arrays; they are copied to the CPU as float32 (float64 for the sums).

What a method attended is said per (layer, KV head) by select():
- the blocks it chose this step: `indices` (token positions), `mask` (a
  boolean (T,) mask), or `pages` with their `page_size`; a list of such
  selections, one per query head of the group, when each query head chose
  its own (the event gets their union, the oracle each head's own);
- `also`: positions it attended in full precision besides what it chose
  (a local window, the current page, outlier chunks, generated tokens);
- optionally the scores of the chosen blocks, what it fetched and its cache
  hits and misses, and for block methods the candidate blocks with the
  score of each (the oracle then ranks them by exact attention mass).
A (layer, KV head) without a select() at a step attended every position
(a dense layer; the oracle gives it the unit `block`, the method's page or
chunk size). The oracle events are those of skv's `--oracle`: per
(step, layer, KV head), the mass recall (exact mass on what was attended over
the mass of the exact top-B), the overlap with that top-B and the output
error |out - exact| / |exact| per query head, and with a needle span the
needle's exact rank, mass and how many of its tokens every query head of the
group attended.

Every input is checked before anything is written; a wrong shape or dtype,
a position past the sequence, a layer or head out of range or a step out of
order raises TraceValueError with one line, and the trace is unchanged.
"""

import contextlib
import math
import time

import numpy as np

from .writer import TraceValueError, TraceWriter, host_array


def _np(x, what, dtype=np.float32):
    """x (a torch tensor or an array) as a float numpy array on the CPU."""
    a = host_array(x)
    if dtype is not None:
        if a.dtype.kind not in "f":
            raise TraceValueError("%s: expected floats, got dtype %s" % (what, a.dtype))
        a = a.astype(dtype, copy=False)
    return a


def _shape(a, want, what):
    if tuple(a.shape) != tuple(want):
        raise TraceValueError("%s: expected shape %s, got %s" % (what, tuple(want), tuple(a.shape)))


class Recorder:
    """Records one run of a KV method (see the module's docstring)."""

    def __init__(self, path, *, n_layers, n_heads, n_kv_heads, head_dim, max_ctx, policy, policy_opts="",
                 budget=0, oracle=False, needle=None, block=1, model="", arch="llama", fmt="pytorch",
                 backend="torch", random_weights=0, producer=None):
        for name, v in (("n_layers", n_layers), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads),
                        ("head_dim", head_dim), ("max_ctx", max_ctx)):
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise TraceValueError("Recorder: %s must be a positive integer, got %r" % (name, v))
        if n_heads % n_kv_heads:
            raise TraceValueError("Recorder: %d query heads do not split into %d KV heads" % (n_heads, n_kv_heads))
        self.L, self.H, self.KV, self.d, self.max_ctx = n_layers, n_heads, n_kv_heads, head_dim, max_ctx
        self.group = n_heads // n_kv_heads
        self.oracle = bool(oracle)
        self.block = int(block)  # the oracle's unit where a layer attended densely (no select)
        self.needle = None
        if needle is not None:
            b, e = int(needle[0]), int(needle[1])
            if not 0 <= b < e <= max_ctx:
                raise TraceValueError("Recorder: needle span %d..%d is outside 0..%d" % (b, e, max_ctx))
            self.needle = (b, e)
        self._run = dict(random_weights=int(random_weights), n_layers=n_layers, n_heads=n_heads,
                         n_kv_heads=n_kv_heads, head_dim=head_dim, max_ctx=max_ctx, prompt_len=0,
                         budget=int(budget), oracle=int(self.oracle), model=model, arch=arch, format=fmt,
                         kv_policy=policy, backend=backend, kv_opts=policy_opts)
        self.w = TraceWriter(path, producer=producer)
        self.prompt_len = None
        self.step = -1            # the decode step in progress (-1: prefill)
        self._last_done = False   # last_token() came: no step may follow
        self.in_step = False
        self._sel = {}            # (layer, kv head) -> selection of this step
        self._attended = set()    # layers whose attention() came this step
        self._t_step = None
        self._fetch = 0
        self._spans = []          # (op, layer, stream, torch event a, event b): resolved at end_step
        self._t0 = time.perf_counter()
        self._cuda_base = None

    # ---- the run and the prompt

    def prompt(self, ids, texts=None):
        """The prompt's token ids (and each token's text, str or bytes): the
        run record, then a token record per position (step -1)."""
        ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        if self.prompt_len is not None:
            raise TraceValueError("prompt: already given")
        if not 0 < len(ids) <= self.max_ctx:
            raise TraceValueError("prompt: %d tokens, the context holds 1..%d" % (len(ids), self.max_ctx))
        if texts is not None and len(texts) != len(ids):
            raise TraceValueError("prompt: %d texts for %d tokens" % (len(texts), len(ids)))
        self.prompt_len = len(ids)
        self._run["prompt_len"] = len(ids)
        self.w.write("run", self._run)
        for p, i in enumerate(ids):
            self.w.write("token", pos=p, id=i, step=-1, text=self._text(texts[p] if texts is not None else b""))

    @staticmethod
    def _text(t):
        return t.encode("utf-8", "surrogateescape") if isinstance(t, str) else bytes(t)

    def _layer(self, layer, what):
        if not isinstance(layer, (int, np.integer)) or not 0 <= layer < self.L:
            raise TraceValueError("%s: layer %r is out of range 0..%d" % (what, layer, self.L - 1))
        return int(layer)

    def _need_prompt(self, what):
        if self.prompt_len is None:
            raise TraceValueError("%s: give the prompt first (Recorder.prompt)" % what)

    # ---- prefill

    def prefill(self, layer, k_pre=None, k_post=None, rank=None, chunk=None, outliers=None, n_outliers=None,
                local_start=None, n_landmarks=None, times=None):
        """What a ShadowKV-like method sees of layer's prompt keys, (s,
        n_kv_heads, head_dim) each: with k_pre, the singular values of the
        pre-RoPE keys of all KV heads side by side (the spectrum view) and,
        with rank, the rank-`rank` relative error; with k_post and chunk, each
        KV head's chunk landmarks' cosine minima (the chunk map), its outlier
        chunks (outliers: a list per KV head, or the n_outliers lowest
        minima), local_start (the first chunk of an always-kept window) and
        n_landmarks (the candidate chunks). times: seconds of the method's
        own stages (svd, landmarks, cosmin, outliers, offload)."""
        self._need_prompt("prefill")
        layer = self._layer(layer, "prefill")
        if self.step >= 0:
            raise TraceValueError("prefill: decode step %d has begun" % self.step)
        s = self.prompt_len
        t = dict(svd=0.0, landmarks=0.0, cosmin=0.0, outliers=0.0, offload=0.0, **(times or {}))
        if k_pre is not None:
            K = _np(k_pre, "prefill k_pre")
            _shape(K, (s, self.KV, self.d), "prefill k_pre")
            M = K.reshape(s, self.KV * self.d).astype(np.float64)
            sv = np.linalg.svd(M, compute_uv=False)
            r = int(rank) if rank else len(sv)
            r = max(1, min(r, len(sv)))
            fro = float((M * M).sum())
            rel = math.sqrt(float((sv[r:] ** 2).sum()) / fro) if fro > 0 else 0.0
            self.w.write("prefill_layer", layer=layer, seq_len=s, rank=r, rel_err=rel, t_svd=t["svd"],
                         t_landmarks=t["landmarks"], t_cosmin=t["cosmin"], t_outliers=t["outliers"],
                         t_offload=t["offload"], sv=sv.astype(np.float32))
        if k_post is not None:
            if not chunk or chunk < 1:
                raise TraceValueError("prefill: k_post needs chunk (tokens per chunk)")
            K = _np(k_post, "prefill k_post")
            _shape(K, (s, self.KV, self.d), "prefill k_post")
            nch = s // chunk
            ls = nch if local_start is None else int(local_start)
            if not 0 <= ls <= nch:
                raise TraceValueError("prefill: local_start %d is outside 0..%d chunks" % (ls, nch))
            for kh in range(self.KV):
                X = K[:nch * chunk, kh, :].reshape(nch, chunk, self.d)
                lm = X.mean(axis=1)
                ln = np.sqrt((lm * lm).sum(-1))
                kn = np.sqrt((X * X).sum(-1))
                den = ln[:, None] * kn
                cs = np.where(den > 0, (X * lm[:, None, :]).sum(-1) / np.where(den > 0, den, 1), 0.0)
                cm = cs.min(axis=1).astype(np.float32) if nch else np.zeros(0, np.float32)
                if outliers is not None:
                    out = np.asarray(outliers[kh], dtype=np.int64).reshape(-1)
                    if out.size and (out.min() < 0 or out.max() >= nch):
                        raise TraceValueError("prefill: an outlier chunk of KV head %d is outside 0..%d" % (kh, nch - 1))
                else:
                    no = min(int(n_outliers or 0), ls)
                    out = np.sort(np.argsort(cm[:ls], kind="stable")[:no])
                nl = n_landmarks if n_landmarks is not None else ls - len(out)
                self.w.write("prefill_head", layer=layer, head=kh, chunk=chunk, n_outliers=len(out),
                             n_landmarks=int(nl), local_start=ls, cos_min=cm, outliers=np.sort(out).astype(np.int32))

    # ---- decode

    def begin_step(self, token, text=b"", step=None):
        """Starts decode step `step` (default: the next) for the token fed at
        position prompt + step."""
        self._need_prompt("begin_step")
        if self._last_done:
            raise TraceValueError("begin_step: the last token is recorded (last_token); no step follows it")
        nxt = self.step + 1
        if step is not None and step != nxt:
            raise TraceValueError("begin_step: step %r out of order (the next is %d)" % (step, nxt))
        if self.in_step:
            raise TraceValueError("begin_step: step %d has not ended (end_step)" % self.step)
        if self.prompt_len + nxt >= self.max_ctx:
            raise TraceValueError("begin_step: position %d is past the context of %d" % (self.prompt_len + nxt,
                                                                                           self.max_ctx))
        self.step = nxt
        self.in_step = True
        self._sel.clear()
        self._attended.clear()
        self._fetch = 0
        self._token = int(token)
        self._t_step = time.perf_counter()
        self.w.write("token", pos=self.prompt_len + self.step, id=int(token), step=self.step, text=self._text(text))

    @property
    def ctx(self):
        """Positions attended at the current step."""
        return self.prompt_len + self.step + 1

    def _positions(self, T, indices=None, mask=None, pages=None, page_size=1, what="select"):
        """(sorted unique positions, block ids) of one selection."""
        given = [x is not None for x in (indices, mask, pages)]
        if sum(given) != 1:
            raise TraceValueError("%s: give one of indices, mask or pages" % what)
        if mask is not None:
            m = host_array(mask)
            if m.dtype != np.bool_:
                raise TraceValueError("%s: mask must be boolean, got dtype %s" % (what, m.dtype))
            _shape(m, (T,), what + " mask")
            pos = np.nonzero(m)[0]
            return pos, pos
        src = indices if indices is not None else pages
        a = host_array(src)
        if a.size and a.dtype.kind not in "iu":
            raise TraceValueError("%s: %s must be integers, got dtype %s" % (what, "indices" if indices is not None
                                                                            else "pages", a.dtype))
        a = a.astype(np.int64).reshape(-1)
        if indices is not None:
            if a.size and (a.min() < 0 or a.max() >= T):
                raise TraceValueError("%s: position %d is past the sequence of %d tokens" % (
                    what, int(a.max() if a.max() >= T else a.min()), T))
            return np.unique(a), a
        if not isinstance(page_size, (int, np.integer)) or page_size < 1:
            raise TraceValueError("%s: page_size must be a positive integer" % what)
        if a.size and (a.min() < 0 or a.min() * page_size >= T or a.max() * page_size >= T):
            bad = int(a.max() if a.max() * page_size >= T else a.min())
            raise TraceValueError("%s: page %d (size %d) is past the sequence of %d tokens" % (what, bad, page_size, T))
        pos = (a[:, None] * page_size + np.arange(page_size)[None, :]).reshape(-1)
        return np.unique(pos[pos < T]), a

    def select(self, layer, kv_head, *, indices=None, mask=None, pages=None, page_size=1, scores=None, also=None,
               fetch_bytes=0, hits=0, misses=0, candidates=None, cand_scores=None):
        """What the method attended in full precision at this step for KV head
        kv_head of layer (see the module's docstring). indices, mask or pages
        may be a list with one entry per query head of the group."""
        if not self.in_step:
            raise TraceValueError("select: no decode step in progress (begin_step)")
        layer = self._layer(layer, "select")
        if not isinstance(kv_head, (int, np.integer)) or not 0 <= kv_head < self.KV:
            raise TraceValueError("select: KV head %r is out of range 0..%d" % (kv_head, self.KV - 1))
        if layer in self._attended:
            raise TraceValueError("select: layer %d's attention() has already come at step %d" % (layer, self.step))
        if (layer, kv_head) in self._sel:
            raise TraceValueError("select: layer %d KV head %d already selected at step %d" % (layer, kv_head, self.step))
        T = self.ctx
        what = "select(layer %d, KV head %d)" % (layer, kv_head)
        src = indices if indices is not None else mask if mask is not None else pages
        per_q = isinstance(src, (list, tuple)) and len(src) == self.group and all(
            hasattr(x, "__len__") and not isinstance(x, (int, np.integer)) for x in src) and self.group > 1
        heads = []
        for g in range(self.group if per_q else 1):
            kw = {"indices": None, "mask": None, "pages": None}
            kw["indices" if indices is not None else "mask" if mask is not None else "pages"] = src[g] if per_q else src
            heads.append(self._positions(T, page_size=page_size, what=what, **kw))
        extra = np.zeros(0, np.int64)
        if also is not None:
            also = host_array(also)
            extra, _ = self._positions(T, **({"mask": also} if also.dtype == np.bool_ else {"indices": also}),
                                       what=what + " also")
        block = page_size if pages is not None else 1
        # the event: the union of the chosen blocks (first seen first), each with its best score
        order, best = [], {}
        sc = None
        if scores is not None:
            sc = [np.asarray(_np(x, what + " scores")).reshape(-1) for x in (scores if per_q else [scores])]
            for g, (_, ids) in enumerate(heads):
                if len(sc[g]) != len(ids):
                    raise TraceValueError("%s: %d scores for %d blocks" % (what, len(sc[g]), len(ids)))
        for g, (_, ids) in enumerate(heads):
            for i, b in enumerate(ids.tolist()):
                v = float(sc[g][i]) if sc is not None else 0.0
                if b not in best:
                    order.append(b)
                    best[b] = v
                elif v > best[b]:
                    best[b] = v
        kept = [np.union1d(p, extra) for p, _ in heads]
        if len(kept) == 1:
            kept = kept * self.group
        cand = None
        if candidates is not None:
            c = np.asarray(candidates, dtype=np.int64).reshape(-1)
            cs = _np(cand_scores, what + " cand_scores").reshape(-1) if cand_scores is not None else None
            if cs is None or len(cs) != len(c):
                raise TraceValueError("%s: candidates need one cand_score each" % what)
            if c.size and (c.min() < 0 or (c.max() + 1) * block > T):
                raise TraceValueError("%s: a candidate block is past the sequence of %d tokens" % (what, T))
            cand = (c, cs)
        self._sel[(layer, kv_head)] = dict(block=block, sel=np.asarray(order, np.int64),
                                           score=np.asarray([best[b] for b in order], np.float32), kept=kept,
                                           fetch=int(fetch_bytes), hits=int(hits), misses=int(misses), cand=cand)
        self._fetch += int(fetch_bytes)

    def attention(self, layer, q, out=None, k=None, v=None):
        """Ends layer's attention at this step: writes its selection records
        and, with oracle=True, scores them against exact softmax attention
        over k and v (q and out: (n_heads, head_dim); k, v: (T, n_kv_heads,
        head_dim))."""
        if not self.in_step:
            raise TraceValueError("attention: no decode step in progress (begin_step)")
        layer = self._layer(layer, "attention")
        if layer in self._attended:
            raise TraceValueError("attention: layer %d already done at step %d" % (layer, self.step))
        T = self.ctx
        ora = None
        if self.oracle:
            if q is None or out is None or k is None or v is None:
                raise TraceValueError("attention: oracle=True needs q, out, k and v")
            Q = _np(q, "attention q")
            _shape(Q, (self.H, self.d), "attention q")
            O = _np(out, "attention out")
            _shape(O, (self.H, self.d), "attention out")
            K = _np(k, "attention k")
            _shape(K, (T, self.KV, self.d), "attention k (T = prompt + step + 1)")
            V = _np(v, "attention v")
            _shape(V, (T, self.KV, self.d), "attention v (T = prompt + step + 1)")
            ora = self._oracle(layer, Q, O, K, V, T)
        self._attended.add(layer)
        for kh in range(self.KV):
            s = self._sel.get((layer, kh))
            if s is None:
                continue
            ev = dict(step=self.step, layer=layer, head=kh, block=s["block"], fetch_bytes=s["fetch"],
                      hits=s["hits"], misses=s["misses"], has_oracle=0, recall=0.0, sel=s["sel"].astype(np.int32),
                      score=s["score"], rank_exact=np.zeros(0, np.int32), rank_landmark=np.zeros(0, np.int32))
            if ora is not None:
                p = ora["p"][kh]  # (group, T)
                b = s["block"]
                sel_pos = (s["sel"][:, None] * b + np.arange(b)[None, :]).reshape(-1)
                sel_pos = sel_pos[sel_pos < T]
                ev["has_oracle"] = 1
                ev["recall"] = float(np.mean(p[:, sel_pos].astype(np.float64).sum(axis=1)))
                if s["cand"] is not None:
                    nb = self.prompt_len // b
                    c, cs = s["cand"]
                    mass = np.zeros(len(c))
                    for g in range(self.group):
                        m = p[g, :nb * b].astype(np.float64).reshape(nb, b).sum(axis=1)
                        mass = np.maximum(mass, m[c]) if len(c) else mass
                    re = np.full(nb, -1, np.int32)
                    rl = np.full(nb, -1, np.int32)
                    re[c] = _rank(mass.astype(np.float32))
                    rl[c] = _rank(cs)
                    ev["rank_exact"], ev["rank_landmark"] = re, rl
            self.w.write("decode_head", ev)
        if ora is not None:
            for kh in range(self.KV):
                self.w.write("oracle", ora["ev"][kh])

    def _oracle(self, layer, Q, O, K, V, T):
        """The oracle's measures of every KV head (score_head of engine/kv/kv_oracle.c)."""
        g, d = self.group, self.d
        scale = np.float32(1.0 / math.sqrt(d))
        evs, ps = [], []
        for kh in range(self.KV):
            s = self._sel.get((layer, kh))
            Kh, Vh = K[:, kh, :], V[:, kh, :]
            P = np.zeros((g, T), np.float32)
            mark = np.zeros(T, np.int64)
            q_kept, q_rec, q_ov, q_err = [], [], [], []
            mass_kept = 0.0
            unit = s["block"] if s is not None else self.block
            for j in range(g):
                hq = kh * g + j
                lg = (Kh @ Q[hq]) * scale
                e = np.exp((lg - lg.max()).astype(np.float32))
                p = (e / e.astype(np.float64).sum()).astype(np.float32)
                P[j] = p
                o = (p.astype(np.float64)[:, None] * Vh).sum(axis=0)
                den = float((o * o).sum())
                num = float(((O[hq].astype(np.float64) - o) ** 2).sum())
                q_err.append(math.sqrt(num / den) if den > 0 else math.sqrt(num))
                pos = s["kept"][j] if s is not None else np.arange(T)
                n = len(pos)
                kept = float(p[pos].astype(np.float64).sum())
                mark[pos] += 1
                q_kept.append(n)
                mass_kept += kept / g
                if n <= 0:
                    q_rec.append(0.0)
                    q_ov.append(0.0)
                    continue
                srt = np.sort(p)[::-1]
                kth = srt[n - 1]
                top = float(srt[:n].astype(np.float64).sum())
                n_above = int((p > kth).sum())
                above = int((p[pos] > kth).sum())
                tie = int((p[pos] == kth).sum())
                hit = above + min(tie, n - n_above)
                q_rec.append(min(1.0, kept / top) if top > 0 else 1.0)
                q_ov.append(hit / n)
            pm = P.astype(np.float64).mean(axis=0)
            ev = dict(step=self.step, layer=layer, head=kh, unit=unit, ctx=T,
                      n_kept=int((mark > 0).sum()), n_gen=int((mark[self.prompt_len:] > 0).sum()),
                      recall=float(np.mean(q_rec)), overlap=float(np.mean(q_ov)), out_err=float(np.mean(q_err)),
                      mass_kept=mass_kept, needle_len=0, needle_kept=0, needle_rank=-1, needle_mass=0.0,
                      q_kept=np.asarray(q_kept, np.int32), q_recall=np.asarray(q_rec, np.float32),
                      q_overlap=np.asarray(q_ov, np.float32), q_out_err=np.asarray(q_err, np.float32))
            if self.needle is not None:
                b, e = self.needle[0], min(self.needle[1], self.prompt_len)
                if e > b:
                    best = pm[b:e].max()
                    ev.update(needle_len=e - b, needle_kept=int((mark[b:e] == g).sum()),
                              needle_rank=int((pm > best).sum()), needle_mass=float(pm[b:e].sum()))
            evs.append(ev)
            ps.append(P)
        return {"ev": evs, "p": ps}

    @contextlib.contextmanager
    def span(self, op, layer=-1, stream=0):
        """Times the block inside as one span of the timeline (wall clock)."""
        t0 = time.perf_counter() - self._t0
        yield
        self._span(op, layer, stream, t0, time.perf_counter() - self._t0)

    def cuda_span(self, op, start, end, layer=-1, stream=0):
        """A span between two recorded torch.cuda.Event(enable_timing=True),
        read at end_step (after a synchronize) on the recorder's clock."""
        if self._cuda_base is None:
            import torch  # only a caller with CUDA events gets here
            self._cuda_base = torch.cuda.Event(enable_timing=True)
            self._cuda_base.record()
            torch.cuda.synchronize()
            self._cuda_base_t = time.perf_counter() - self._t0
        self._spans.append((op, layer, stream, start, end))

    def _span(self, op, layer, stream, t0, t1):
        if not 0 <= stream <= 2:
            raise TraceValueError("span: stream %r is not 0 (compute), 1 (fetch) or 2 (rebuild)" % stream)
        if layer != -1:
            self._layer(layer, "span")
        self.w.write("span", stream=stream, layer=layer, step=self.step, t0=t0, t1=t1, op=op)

    def metric(self, name, value, layer=-1, head=-1, vals=()):
        """A measure of the method's own (docs/TRACE.md, kind metric)."""
        if layer != -1:
            self._layer(layer, "metric")
        self.w.write("metric", step=self.step, layer=layer, head=head, value=float(value), name=name,
                     vals=np.asarray(vals, np.float32).reshape(-1))

    def end_step(self, top1_agree=None, kv_resident=0, kv_offloaded=0, hit_rate=None, kv_stats=""):
        """Ends the step: its record (flushed, so a crash keeps it).
        top1_agree: with the oracle, whether the method's next token is
        dense attention's."""
        if not self.in_step:
            raise TraceValueError("end_step: no decode step in progress (begin_step)")
        if self._spans:
            import torch
            torch.cuda.synchronize()
            for op, layer, stream, a, b in self._spans:
                t0 = self._cuda_base_t + self._cuda_base.elapsed_time(a) / 1000.0
                t1 = self._cuda_base_t + self._cuda_base.elapsed_time(b) / 1000.0
                self._span(op, layer, stream, t0, t1)
            self._spans.clear()
        hits = sum(s["hits"] for s in self._sel.values())
        miss = sum(s["misses"] for s in self._sel.values())
        if hit_rate is None:  # NaN: no cache (Quest) or nothing selected, as skv writes it
            hit_rate = hits / (hits + miss) if hits + miss else float("nan")
        self.w.write("step", step=self.step, token=self._token, seconds=time.perf_counter() - self._t_step,
                     kv_resident=int(kv_resident), kv_offloaded=int(kv_offloaded), hit_rate=float(hit_rate),
                     has_oracle=int(top1_agree is not None), top1_agree=int(bool(top1_agree)),
                     n_fetch=miss, fetch_bytes=self._fetch,
                     kv_stats=kv_stats)
        self.in_step = False

    def niah(self, value, answer, dense_answer=None, top1_agree=(), logit_dist=()):
        """The needle case's results, as skv needle records them (kind niah):
        the value planted in the needle span, the method's answer text and,
        when known, dense attention's answer on the same prompt. A hit is the
        value in the answer, not inside a longer number. `skv needle
        --diagnose` reads them beside the oracle's needle measures."""
        if self.needle is None:
            raise TraceValueError("niah: the recorder has no needle span (Recorder(needle=(begin, end)))")
        self._need_prompt("niah")
        value = str(value)
        if not value:
            raise TraceValueError("niah: the value is empty")
        b, e = self.needle
        rows = [] if dense_answer is None else [(0, "dense", dense_answer, (), ())]
        rows.append((1, self._run["kv_policy"], answer, top1_agree, logit_dist))
        for method, pol, ans, agree, dist in rows:
            ans = ans.decode("utf-8", "replace") if isinstance(ans, bytes) else str(ans)
            self.w.write("niah", index=0, length=self.prompt_len, depth=100.0 * b / self.prompt_len, run=0,
                         method=method, hit=int(_found(ans, value)), prompt_len=self.prompt_len, tok_begin=b,
                         tok_end=e, detail=1, policy=pol, value=value, answer=ans.replace("\0", ""),
                         top1_agree=np.asarray(agree, np.int32).reshape(-1),
                         logit_dist=np.asarray(dist, np.float32).reshape(-1))

    def last_token(self, token, text=b""):
        """The last generated token, sampled after the last step and fed to
        none: its token record (at the step that would have fed it), so that
        the trace holds the whole text. Counts no step."""
        self._need_prompt("last_token")
        if self.in_step:
            raise TraceValueError("last_token: step %d has not ended (end_step)" % self.step)
        if self._last_done:
            raise TraceValueError("last_token: the last token is already recorded")
        self._last_done = True
        self.w.write("token", pos=self.prompt_len + self.step + 1, id=int(token), step=self.step + 1,
                     text=self._text(text))

    def close(self):
        if self.in_step:
            raise TraceValueError("close: step %d has not ended (end_step)" % self.step)
        return self.w.close()

    def cut(self):
        """Stops as a crash would: the trace stays cut short at its last step."""
        self.w.cut()

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if et is None:
            self.close()
        else:
            self.cut()
        return False


def _found(text, value):
    """value in text, not as part of a longer number (skv needle's rule)."""
    i = text.find(value)
    while i >= 0:
        before = i > 0 and text[i - 1].isdigit()
        after = i + len(value) < len(text) and text[i + len(value)].isdigit()
        if not before and not after:
            return True
        i = text.find(value, i + 1)
    return False


def _rank(score):
    """Each entry's place when sorted by score, higher first, ties to the lower index, NaN last."""
    s = np.asarray(score, np.float64)
    key = np.where(np.isnan(s), -np.inf, s)
    order = sorted(range(len(s)), key=lambda i: (np.isnan(s[i]), -key[i], i))
    r = np.empty(len(s), np.int32)
    r[order] = np.arange(len(s), dtype=np.int32)
    return r
