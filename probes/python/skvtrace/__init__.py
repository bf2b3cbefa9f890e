"""skvtrace: read skv traces (docs/TRACE.md, format version 3) into numpy.

    import skvtrace             # from the repository root: PYTHONPATH=probes/python
    t = skvtrace.load("run.skvtrace")
    t.meta                      # the metadata record (a dict)
    t["oracle"]["recall"]       # a numpy array, one value per oracle record
    t.array("decode_head", "sel")   # long table: record, lane, step, layer, head, i, sel
    t.frame("oracle")           # the same as a pandas DataFrame (pandas optional)

Every record kind gets one table: the columns `record` (its number among
the records of known kinds, from 0) and `lane` (compare mode; 0 for a
single run), then its scalar fields. Each array field gets a long table
keyed by record, lane, the record's step / layer / head (those it has) and
the element index i. These are the tables `skv export TRACE --format csv`
writes, value for value.

The file is checked as docs/TRACE.md says: magic, version, the footer's end
marker and CRC-32, every record's CRC-32, the record count, and that every
payload is consumed exactly. A truncated or damaged trace raises
TraceError; load(path, partial=True) keeps what is intact up to the last
complete decode step instead, as skv's own reader does, and sets
Trace.notice.

It needs numpy (Debian's python3-numpy, which `make deps` installs for
/usr/bin/python3): without it the import fails with one line that says so
and names the interpreter, instead of a traceback from deep inside.
"""

import json
import struct
import sys
import zlib

try:
    import numpy as np
except ImportError as e:
    _why = ("skvtrace needs numpy, which %s cannot import (%s): run it with Debian's /usr/bin/python3 "
            "(make deps installs python3-numpy)" % (sys.executable, e))
    if sys.argv[:1] == ["-m"]:  # python3 -m skvtrace (argv[0] is "-m" while the module is located): one line
        sys.exit("skvtrace: " + _why)
    raise ImportError(_why) from None

__all__ = ["load", "events", "Trace", "TraceError", "TraceValueError", "SCHEMA", "TraceWriter", "rewrite", "Recorder"]
__version__ = "3"          # the trace format this package reads and writes
WRITER_VERSION = "1.0"     # the Python writer's own version, in the metadata it writes

MAGIC = b"SKVTRACE"
END = b"SKVTEND\x00"
META_KIND = 0x7FFFFFFF
FOOTER = 28

# kind number -> (name, fields); a field is (name, type, count field or None).
# Types: i32, f32, f64, u64, str, bytes (counted), i32s, f32s (counted arrays).
SCHEMA = {
    1: ("run", [("random_weights", "i32"), ("n_layers", "i32"), ("n_heads", "i32"), ("n_kv_heads", "i32"),
                ("head_dim", "i32"), ("max_ctx", "i32"), ("prompt_len", "i32"), ("budget", "i32"),
                ("oracle", "i32"), ("model", "str"), ("arch", "str"), ("format", "str"), ("kv_policy", "str"),
                ("backend", "str"), ("kv_opts", "str")]),
    2: ("token", [("pos", "i32"), ("id", "i32"), ("step", "i32"), ("n_text", "i32"), ("text", "bytes", "n_text")]),
    3: ("prefill_layer", [("layer", "i32"), ("seq_len", "i32"), ("rank", "i32"), ("n_sv", "i32"), ("rel_err", "f32"),
                          ("t_svd", "f64"), ("t_landmarks", "f64"), ("t_cosmin", "f64"), ("t_outliers", "f64"),
                          ("t_offload", "f64"), ("sv", "f32s", "n_sv")]),
    4: ("prefill_head", [("layer", "i32"), ("head", "i32"), ("chunk", "i32"), ("n_chunks", "i32"),
                         ("n_outliers", "i32"), ("n_landmarks", "i32"), ("local_start", "i32"),
                         ("cos_min", "f32s", "n_chunks"), ("outliers", "i32s", "n_outliers")]),
    5: ("decode_head", [("step", "i32"), ("layer", "i32"), ("head", "i32"), ("block", "i32"), ("fetch_bytes", "u64"),
                        ("n_sel", "i32"), ("hits", "i32"), ("misses", "i32"), ("has_oracle", "i32"), ("recall", "f32"),
                        ("n_chunks", "i32"), ("sel", "i32s", "n_sel"), ("score", "f32s", "n_sel"),
                        ("rank_exact", "i32s", "n_chunks"), ("rank_landmark", "i32s", "n_chunks")]),
    6: ("step", [("step", "i32"), ("token", "i32"), ("seconds", "f64"), ("kv_resident", "u64"),
                 ("kv_offloaded", "u64"), ("hit_rate", "f32"), ("has_oracle", "i32"), ("top1_agree", "i32"),
                 ("n_fetch", "i32"), ("fetch_bytes", "u64"), ("kv_stats", "str")]),
    7: ("span", [("stream", "i32"), ("layer", "i32"), ("step", "i32"), ("t0", "f64"), ("t1", "f64"), ("op", "str")]),
    8: ("needle", [("id", "i32"), ("tok_begin", "i32"), ("tok_end", "i32"), ("n_chunks", "i32"), ("step", "i32"),
                   ("layer", "i32"), ("head", "i32"), ("mass_exact", "f32"), ("mass_sparse", "f32"),
                   ("chunks", "i32s", "n_chunks"), ("rank", "i32s", "n_chunks"), ("selected", "i32s", "n_chunks"),
                   ("k", "i32"), ("key_err", "f32"), ("mass_ideal", "f32"), ("out_err", "f32"), ("n_info", "i32"),
                   ("part", "i32s", "n_info"), ("rank_exact", "i32s", "n_info"), ("cos_min", "f32s", "n_info"),
                   ("mass_chunk", "f32s", "n_info")]),
    9: ("niah", [("index", "i32"), ("length", "i32"), ("depth", "f32"), ("run", "i32"), ("method", "i32"),
                 ("hit", "i32"), ("prompt_len", "i32"), ("tok_begin", "i32"), ("tok_end", "i32"), ("detail", "i32"),
                 ("n_steps", "i32"), ("policy", "str"), ("value", "str"), ("answer", "str"),
                 ("top1_agree", "i32s", "n_steps"), ("logit_dist", "f32s", "n_steps")]),
    10: ("oracle", [("step", "i32"), ("layer", "i32"), ("head", "i32"), ("n_q", "i32"), ("unit", "i32"),
                    ("ctx", "i32"), ("n_kept", "i32"), ("n_gen", "i32"), ("recall", "f32"), ("overlap", "f32"),
                    ("out_err", "f32"), ("mass_kept", "f32"), ("needle_len", "i32"), ("needle_kept", "i32"),
                    ("needle_rank", "i32"), ("needle_mass", "f32"), ("q_kept", "i32s", "n_q"),
                    ("q_recall", "f32s", "n_q"), ("q_overlap", "f32s", "n_q"), ("q_out_err", "f32s", "n_q")]),
    11: ("lane", [("lane", "i32"), ("n_lanes", "i32"), ("policy", "str"), ("teacher", "str")]),
    12: ("metric", [("step", "i32"), ("layer", "i32"), ("head", "i32"), ("value", "f32"), ("n", "i32"),
                    ("name", "str"), ("vals", "f32s", "n")]),
}

_SCALAR = {"i32": ("<i4", 4), "f32": ("<f4", 4), "f64": ("<f8", 8), "u64": ("<u8", 8)}
_LONG_KEYS = ("step", "layer", "head")


class TraceError(ValueError):
    """A file that is not a whole, valid skv trace."""


def _bytes_text(b):
    """Token bytes as skv export writes them: valid UTF-8 kept, other bytes
    \\xNN, a backslash \\\\ and NUL \\x00."""
    out, i = [], 0
    while i < len(b):
        c = b[i]
        if c == 0x5C:
            out.append("\\\\"); i += 1; continue
        if c == 0:
            out.append("\\x00"); i += 1; continue
        n = 1 if c < 0x80 else 2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 else 4 if c & 0xF8 == 0xF0 else 0
        if n:
            try:
                out.append(b[i:i + n].decode("utf-8")); i += n; continue
            except UnicodeDecodeError:
                pass
        out.append("\\x%02X" % c); i += 1
    return "".join(out)


class Trace:
    """A loaded trace: meta (dict), tables per kind, long tables per array field."""

    def __init__(self, path, meta, tables, arrays, version, notice):
        self.path = path
        self.meta = meta
        self.version = version
        self.notice = notice
        self._tables = tables
        self._arrays = arrays

    def kinds(self):
        """Names of the record kinds present."""
        return [k for k in self._tables if len(self._tables[k]["record"])]

    def __getitem__(self, kind):
        """The kind's table: a dict column -> numpy array (str columns: object arrays)."""
        return self._tables[kind]

    def array(self, kind, field):
        """The long table of an array field: a dict column -> numpy array."""
        return self._arrays[kind][field]

    def arrays(self, kind):
        """Names of the kind's array fields."""
        return list(self._arrays.get(kind, {}))

    def frame(self, kind, field=None):
        """The kind's table (or an array field's long table) as a pandas DataFrame."""
        import pandas as pd  # optional: only this method needs it
        return pd.DataFrame(self._tables[kind] if field is None else self._arrays[kind][field])


def _fail(path, what):
    raise TraceError("%s: %s" % (path, what))


def _decode(path, kind, payload, at):
    """One payload into a list of (name, value); arrays as lists."""
    name, fields = SCHEMA[kind]
    vals, off, n = {}, 0, len(payload)
    out = []
    for f in fields:
        fname, ftype = f[0], f[1]
        if ftype in _SCALAR:
            fmt, size = _SCALAR[ftype]
            if off + size > n:
                _fail(path, "record %s (%s at byte %d): field %s runs past the record" % (at[0], name, at[1], fname))
            v = np.frombuffer(payload, fmt, 1, off)[0]
            off += size
        elif ftype == "str":
            if off + 4 > n:
                _fail(path, "record %s (%s at byte %d): field %s runs past the record" % (at[0], name, at[1], fname))
            ln = struct.unpack_from("<I", payload, off)[0]
            off += 4
            if off + ln > n:
                _fail(path, "record %s (%s at byte %d): string %s runs past the record" % (at[0], name, at[1], fname))
            v = payload[off:off + ln].decode("utf-8", "surrogateescape")
            off += ln
        else:
            cnt = int(vals[f[2]])
            if cnt < 0:
                _fail(path, "record %s (%s at byte %d): count %s is negative" % (at[0], name, at[1], f[2]))
            size = cnt if ftype == "bytes" else 4 * cnt
            if off + size > n:
                _fail(path, "record %s (%s at byte %d): array %s runs past the record" % (at[0], name, at[1], fname))
            if ftype == "bytes":
                v = payload[off:off + cnt]
            else:
                v = np.frombuffer(payload, "<i4" if ftype == "i32s" else "<f4", cnt, off)
            off += size
        vals[fname] = v
        out.append((fname, ftype, v))
    if off != n:
        _fail(path, "record %s (%s at byte %d): %d bytes left over after the last field" % (at[0], name, at[1], n - off))
    return out


def _meta_problem(data, meta_at, end, n_records, n_found):
    """What is wrong with the metadata record the footer points at, or ""."""
    if meta_at < 16 or meta_at + 12 > end:
        return "the footer points at byte %d, where no metadata record fits" % meta_at
    kind, ln = struct.unpack_from("<II", data, meta_at)
    if kind != META_KIND or meta_at + 8 + ln + 4 != end:
        return "no metadata record at byte %d, where the footer points" % meta_at
    if zlib.crc32(data[meta_at:meta_at + 8 + ln]) & 0xFFFFFFFF != struct.unpack_from("<I", data, meta_at + 8 + ln)[0]:
        return "the metadata record's CRC-32 does not match"
    if n_records != n_found:
        return "the footer counts %d records, the file holds %d" % (n_records, n_found)
    return ""


def _scan(path, partial):
    """The file's framing checked: (version, records [(kind, payload, offset)],
    metadata (dict; {} when cut short or damaged), the metadata record's
    JSON bytes (None when absent), notice)."""
    with open(path, "rb") as fh:
        data = fh.read()
    if len(data) < 8 or data[:8] != MAGIC:
        _fail(path, "not an skv trace (bad magic)")
    if len(data) < 16:
        _fail(path, "truncated inside its header (%d bytes)" % len(data))
    version = struct.unpack_from("<I", data, 8)[0]
    if version != 3:
        _fail(path, "trace format version %d is not supported by skvtrace (version 3; skv export --format csv "
                    "reads version 2)" % version)
    notice = ""
    end = len(data) - FOOTER
    closed = end >= 16 and data[end:end + 8] == END
    n_records = meta_at = None
    if closed:
        n_records, meta_at = struct.unpack_from("<QQ", data, end + 8)
        crc = struct.unpack_from("<I", data, len(data) - 4)[0]
        if zlib.crc32(data[:len(data) - 4]) & 0xFFFFFFFF != crc:
            closed = False
            notice = "the file's CRC-32 does not match (a damaged byte)"
    else:
        notice = "cut short: the recording was interrupted before it closed (no footer)"
    if notice and not partial:
        _fail(path, notice + "; load(path, partial=True) keeps what is intact")

    records = []  # (kind, payload, offset)
    off, limit = 16, (meta_at if closed else len(data))
    meta = None
    meta_json = None
    last_step_end = None
    damaged = ""
    while off < limit:
        if off + 8 > len(data):
            damaged = "a record header at byte %d is cut off" % off
            break
        kind, ln = struct.unpack_from("<II", data, off)
        if off + 8 + ln + 4 > len(data):
            damaged = "record %d at byte %d runs past the end" % (len(records), off)
            break
        crc = struct.unpack_from("<I", data, off + 8 + ln)[0]
        if zlib.crc32(data[off:off + 8 + ln]) & 0xFFFFFFFF != crc:
            damaged = "record %d at byte %d: its CRC-32 does not match" % (len(records), off)
            break
        if kind == META_KIND:
            meta = data[off + 8:off + 8 + ln]
            break
        records.append((kind, data[off + 8:off + 8 + ln], off))
        if kind == 6:
            last_step_end = len(records)
        off += 8 + ln + 4
    if damaged:
        if not partial:
            _fail(path, damaged + "; load(path, partial=True) keeps what is intact")
        notice = (notice + "; " if notice else "") + damaged
    if closed and not damaged and off != meta_at:
        damaged = "the records end at byte %d, the footer puts the metadata at %d" % (off, meta_at)
        if not partial:
            _fail(path, damaged)
        notice = (notice + "; " if notice else "") + damaged
    if closed and not damaged:
        damaged = _meta_problem(data, meta_at, end, n_records, len(records))
        if not damaged:
            meta_json = data[meta_at + 8:end - 4]
            try:
                meta = json.loads(meta_json.decode("utf-8", "surrogateescape"))
            except (UnicodeDecodeError, ValueError, RecursionError) as e:
                damaged = "the metadata is not JSON (%s)" % (
                    "nested too deeply" if isinstance(e, RecursionError) else e)
            else:
                if not isinstance(meta, dict):
                    damaged = "the metadata is not a JSON object"
        if damaged:
            if not partial:
                _fail(path, damaged)
            notice = (notice + "; " if notice else "") + damaged
    if not closed or damaged:
        meta = {}
        meta_json = None
        if last_step_end is not None:
            records = records[:last_step_end]
        notice += "; loaded %d intact records" % len(records)
    return version, records, meta, meta_json, notice


def events(path, partial=False):
    """The trace's records in file order, as (kind, name, fields): fields a
    dict of the kind's values by name (arrays as numpy arrays, str as str,
    the token text as bytes), as TraceWriter.write takes them. A kind this
    reader does not know comes as (kind, None, payload bytes). Raises
    TraceError as load does; the metadata is load(path).meta."""
    version, records, meta, meta_json, notice = _scan(path, partial)
    rec = 0
    for kind, payload, at in records:
        if kind not in SCHEMA:
            yield kind, None, payload
            continue
        vals = _decode(path, kind, payload, (rec, at))
        yield kind, SCHEMA[kind][0], {fn: (bytes(v) if ft == "bytes" else v) for fn, ft, v in vals}
        rec += 1


def load(path, partial=False):
    """Reads the trace at path. Raises TraceError for a file that is not a
    whole, valid version-3 trace (partial=True: keeps the intact part up to
    the last complete decode step and says so in Trace.notice)."""
    version, records, meta, meta_json, notice = _scan(path, partial)

    tables, arrays = {}, {}
    for kind, (name, fields) in SCHEMA.items():
        # the lane kind's own field is its lane: no second column of that name
        tables[name] = {"record": []} if any(f[0] == "lane" for f in fields) else {"record": [], "lane": []}
        for f in fields:
            if f[1] in ("i32s", "f32s"):
                keys = [k for k in _LONG_KEYS if any(g[0] == k and g[1] in _SCALAR for g in fields)]
                arrays.setdefault(name, {})[f[0]] = {c: [] for c in ["record", "lane"] + keys + ["i", f[0]]}
            else:
                tables[name][f[0]] = []
    lane, rec = 0, 0
    for kind, payload, at in records:
        if kind not in SCHEMA:
            continue  # a kind this reader does not know: skipped by its length
        name, fields = SCHEMA[kind]
        vals = _decode(path, kind, payload, (rec, at))
        if kind == 11:
            lane = int(vals[0][2])
        t = tables[name]
        t["record"].append(rec)
        if kind != 11:
            t["lane"].append(lane)
        scal = {fn: v for fn, ft, v in vals if ft not in ("i32s", "f32s", "bytes")}
        for fn, ft, v in vals:
            if ft in ("i32s", "f32s"):
                a = arrays[name][fn]
                cnt = len(v)
                a["record"].append(np.full(cnt, rec, np.int64))
                a["lane"].append(np.full(cnt, lane, np.int64))
                for k in _LONG_KEYS:
                    if k in a:
                        a[k].append(np.full(cnt, int(scal[k]), np.int64))
                a["i"].append(np.arange(cnt, dtype=np.int64))
                a[fn].append(np.asarray(v))
            elif ft == "bytes":
                t[fn].append(_bytes_text(bytes(v)))
            else:
                t[fn].append(v)
        rec += 1
    for name, (_, fields) in ((SCHEMA[k][0], SCHEMA[k]) for k in SCHEMA):
        t = tables[name]
        types = {f[0]: f[1] for f in fields}
        for col in list(t):
            ft = types.get(col, "i64")
            if ft in _SCALAR:
                t[col] = np.array(t[col], dtype=_SCALAR[ft][0])
            elif ft in ("str", "bytes"):
                t[col] = np.array(t[col], dtype=object)
            else:
                t[col] = np.array(t[col], dtype=np.int64)
        for fn, a in arrays.get(name, {}).items():
            dt = "<i4" if types[fn] == "i32s" else "<f4"
            for col in list(a):
                parts = a[col]
                a[col] = np.concatenate(parts) if parts else np.zeros(0, dt if col == fn else np.int64)
    return Trace(path, meta, tables, arrays, version, notice)


from .writer import TraceValueError, TraceWriter, rewrite  # noqa: E402  (the writer uses the schema above)
from .recorder import Recorder  # noqa: E402
