#!/usr/bin/python3
"""test_hf_norms: an HF checkpoint whose norms are bf16, as a real one's are
(Llama-3.1-8B's model-*.safetensors hold every tensor in bf16; the shared
mini-smollm-hf keeps its norms f32). skv widens such a norm to f32 when it
loads the model (engine/model/model.c, to_f32), a path no other test takes.

Two copies of ../shared/models/mini-smollm-hf are written: A with each norm
rounded to bf16 but still stored f32, B with the same norms stored bf16.
Widening bf16 is exact, so `skv logits` on A and B must agree bit for bit
(tokens, every last logit, the greedy tokens). Prints PASS/FAIL/SKIP lines for tests/run.sh; needs only the
standard library."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

from testhelp import ROOT, SKV, check, finish  # noqa: E402

SHARED = os.environ.get("SKV_SHARED") or os.path.join(ROOT, "..", "shared")
SRC = os.path.join(SHARED, "models", "mini-smollm-hf")


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def to_bf16(raw):
    """f32 bytes to bf16 bytes, rounded to nearest even (no NaN in a norm)."""
    out = bytearray()
    for (u,) in struct.iter_unpack("<I", raw):
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFFFFFF
        out += struct.pack("<H", u >> 16)
    return bytes(out)


def widen(raw16):
    return b"".join(struct.pack("<I", h << 16) for (h,) in struct.iter_unpack("<H", raw16))


def write_st(path, tensors, meta):
    """tensors: (name, dtype, shape, bytes) in order."""
    header, blob, off = {}, bytearray(), 0
    if meta is not None:
        header["__metadata__"] = meta
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blob += raw
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blob)


def logits(model):
    p = subprocess.run([SKV, "logits", "-m", model, "-p", "The capital of France is", "-n", "4", "--json"],
                       capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def main():
    st = os.path.join(SRC, "model.safetensors")
    if not os.path.exists(st):
        print("SKIP test_hf_norms: %s is missing (the shared models)" % st)
        return 0
    header, data = read_st(st)
    meta = header.pop("__metadata__", None)
    a, b, n_norm = [], [], 0
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        raw = data[t["data_offsets"][0]:t["data_offsets"][1]]
        if name.endswith("norm.weight") and t["dtype"] == "F32":
            r16 = to_bf16(raw)
            a.append((name, "F32", t["shape"], widen(r16)))
            b.append((name, "BF16", t["shape"], r16))
            n_norm += 1
        else:
            a.append((name, t["dtype"], t["shape"], raw))
            b.append((name, t["dtype"], t["shape"], raw))
    check("the source holds f32 norms to rewrite (%d)" % n_norm, n_norm > 2)
    tmp = tempfile.mkdtemp(prefix="skv-hfnorms-")
    try:
        dirs = {}
        for tag, tensors in (("a", a), ("b", b)):
            d = os.path.join(tmp, tag)
            os.mkdir(d)
            for f in ("config.json", "tokenizer.json"):
                shutil.copy(os.path.join(SRC, f), d)
            write_st(os.path.join(d, "model.safetensors"), tensors, meta)
            dirs[tag] = d
        ra, oa, ea = logits(dirs["a"])
        rb, ob, eb = logits(dirs["b"])
        check("skv logits loads the copy with f32 norms", ra == 0, ea)
        check("skv logits loads the copy with bf16 norms", rb == 0, eb)
        ja = json.loads(oa) if ra == 0 else {}
        jb = json.loads(ob) if rb == 0 else {}
        same = bool(ja) and ja.get("tokens") == jb.get("tokens") and ja.get("greedy") == jb.get("greedy") and \
            len(ja.get("last_logits", [])) > 1000 and ja.get("last_logits") == jb.get("last_logits")
        diff = [i for i, (x, y) in enumerate(zip(ja.get("last_logits", []), jb.get("last_logits", []))) if x != y]
        check("bf16 norms widen exactly: the same tokens, every last logit and the greedy tokens as the f32 copy of "
              "the same values (%d logits differ)" % len(diff), same, diff[:5])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    main()
    sys.exit(finish("test_hf_norms"))
