"""demo_model.py: skv's demo model (samples/train/train.py's PyTorch
definition, loaded from the committed GGUF) decoding one token at a time
through a KV method written in PyTorch, recorded with skvtrace.Recorder.

A method is an object with
    prefill(layer, k_pre, k, v)        the prompt's keys (pre- and post-RoPE) and values, (s, kv, d)
    end_prefill(rec)                   the prompt is in: compress, and record what the views show
    append(layer, k_pre, k, v)         one decoded token's key and value, (kv, d)
    attend(layer, q, rec) -> out       one query (heads, d) over the cache; calls rec.select()
    full_kv(layer) -> (K, V)           every position's exact K and V (T, kv, d), for the oracle
    name, opts, budget                 for the run record
See quest_torch.py and shadowkv_torch.py; record_demo.py is the command line.
"""
import contextlib
import math
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "samples", "train"))
sys.path.insert(0, os.path.join(ROOT, "probes", "python"))
import train  # noqa: E402  (the demo model's PyTorch definition)


def spans(rec):
    """rec.span, or a span that records nothing when there is no recorder."""
    return rec.span if rec is not None else (lambda op, layer=-1, stream=0: contextlib.nullcontext())


def attend_exact(q, K, V):
    """Softmax attention of q (heads, d) over K, V (n, kv, d), GQA by head // group."""
    H, d = q.shape
    g = H // K.shape[1]
    Kq = K.repeat_interleave(g, dim=1)  # (n, H, d)
    Vq = V.repeat_interleave(g, dim=1)
    s = torch.einsum("hd,nhd->hn", q, Kq) / math.sqrt(d)
    return torch.einsum("hn,nhd->hd", s.softmax(-1), Vq)


class Dense:
    """Exact attention over every position (the reference, and the dense twin)."""
    name, opts, budget = "dense", "", 0

    def __init__(self, n_layers):
        self.K = [None] * n_layers
        self.V = [None] * n_layers

    def prefill(self, layer, k_pre, k, v):
        self.K[layer], self.V[layer] = k.clone(), v.clone()

    def end_prefill(self, rec):
        pass

    def append(self, layer, k_pre, k, v):
        self.K[layer] = torch.cat([self.K[layer], k[None]])
        self.V[layer] = torch.cat([self.V[layer], v[None]])

    def attend(self, layer, q, rec):
        return attend_exact(q, self.K[layer], self.V[layer])

    def full_kv(self, layer):
        return self.K[layer], self.V[layer]


class DemoModel:
    def __init__(self, gguf=os.path.join(ROOT, "samples", "model", "skv-demo.gguf")):
        tensors, self.tokens, _ = train.read_gguf(gguf)
        self.c = dict(train.MODEL)
        self.m = train.Llama(self.c)
        self.m.load_state_dict(train.state_from_gguf(tensors, self.c))
        self.m.eval()
        c = self.c
        self.n_layers, self.H, self.KV = c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]
        self.d = c["hidden_size"] // self.H
        self.max_ctx = c["max_position_embeddings"]
        self.cos, self.sin = train.rope_tables(self.max_ctx, self.d, c["rope_theta"])
        self._bytes = {ch: b for b, ch in train.bytes_to_unicode().items()}

    def text(self, tid):
        """A token's bytes (byte-level BPE: each character stands for a byte)."""
        s = self.tokens[tid]
        try:
            return bytes(self._bytes[ch] for ch in s)
        except KeyError:
            return s.encode("utf-8")

    def _rope(self, x, pos):
        """x (n, heads, d) at positions pos (n,): rotate-half, as train.py."""
        cs, sn = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        return x * cs + train.rotate_half(x) * sn

    def _qkv(self, blk, x, pos):
        n = x.shape[0]
        h = blk.input_layernorm(x)
        q = blk.q_proj(h).view(n, self.H, self.d)
        k_pre = blk.k_proj(h).view(n, self.KV, self.d)
        v = blk.v_proj(h).view(n, self.KV, self.d)
        return self._rope(q, pos), k_pre, self._rope(k_pre, pos), v

    def _mlp(self, blk, x):
        h = blk.post_attention_layernorm(x)
        return x + blk.down_proj(F.silu(blk.gate_proj(h)) * blk.up_proj(h))

    @torch.no_grad()
    def prefill(self, ids, method, rec=None):
        """The prompt through every layer (exact causal attention, as every
        method attends its prompt); returns the last position's logits."""
        n = len(ids)
        pos = torch.arange(n)
        x = self.m.embed_tokens(torch.tensor(ids))
        mask = torch.full((n, n), float("-inf")).triu(1)
        g = self.H // self.KV
        for layer, blk in enumerate(self.m.layers):
            q, k_pre, k, v = self._qkv(blk, x, pos)
            method.prefill(layer, k_pre, k, v)
            kq, vq = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
            s = torch.einsum("qhd,khd->hqk", q, kq) / math.sqrt(self.d) + mask
            y = torch.einsum("hqk,khd->qhd", s.softmax(-1), vq).reshape(n, self.H * self.d)
            x = self._mlp(blk, x + blk.o_proj(y))
        method.end_prefill(rec)
        return self.m.norm(x[-1]) @ self.m.embed_tokens.weight.T

    @torch.no_grad()
    def decode(self, token, pos, method, rec=None):
        """One token at position pos; returns its logits. With rec, each
        layer's attention is recorded (the method calls rec.select)."""
        span = spans(rec)
        x = self.m.embed_tokens(torch.tensor([token]))
        p = torch.tensor([pos])
        for layer, blk in enumerate(self.m.layers):
            with span("qkv", layer):
                q, k_pre, k, v = self._qkv(blk, x, p)
            with span("attention", layer):
                method.append(layer, k_pre[0], k[0], v[0])
                out = method.attend(layer, q[0], rec)
            if rec is not None:
                K, V = method.full_kv(layer) if rec.oracle else (None, None)
                rec.attention(layer, q[0], out, K, V)
            with span("mlp", layer):
                x = self._mlp(blk, x + blk.o_proj(out.reshape(1, -1)))
        with span("logits"):
            return self.m.norm(x[0]) @ self.m.embed_tokens.weight.T


def run(model, method, ids, n_steps, rec=None, feed=None, twin=None):
    """Prefills ids, then decodes n_steps tokens: step s feeds feed[s] when
    given (teacher forcing; the tokens another run generated), else the
    greedy token. With twin (a Dense), the same tokens also go through exact
    attention and each step records whether both agree on the next token.
    Returns the tokens fed."""
    torch.set_num_threads(2)
    if rec is not None:
        rec.prompt(ids, [model.text(i) for i in ids])
    logits = model.prefill(ids, method, rec)
    dl = model.prefill(ids, twin) if twin is not None else None
    fed = []
    for s in range(n_steps):
        tok = int(feed[s]) if feed is not None else int(logits.argmax())
        pos = len(ids) + s
        if rec is not None:
            rec.begin_step(tok, model.text(tok))
        logits = model.decode(tok, pos, method, rec)
        agree = None
        if twin is not None:
            dl = model.decode(tok, pos, twin)
            agree = int(logits.argmax()) == int(dl.argmax())
        if rec is not None:
            rec.end_step(top1_agree=agree)
        fed.append(tok)
    return fed
