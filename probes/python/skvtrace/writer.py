"""skvtrace.writer: writes skv traces (docs/TRACE.md, format version 3) from
Python, byte for byte as skv's own writer (probes/trace.c) lays them out.

    w = skvtrace.TraceWriter("run.skvtrace", producer="my_method.py")
    w.write("run", n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, ...)
    w.write("decode_head", step=0, layer=3, head=1, block=16, sel=[4, 9, 17], ...)
    w.write("step", step=0, token=1234, ...)     # flushes: a kill loses nothing before it
    w.close()                                    # the metadata record and the footer

Each record is its kind's fields in schema order (skvtrace.SCHEMA, checked
against `skv trace schema` by tests/test_pywriter.py), little-endian, after
a head (u32 kind, u32 payload length) and followed by the CRC-32 of head and
payload. At close come the metadata record (JSON, printed as cJSON prints
it unformatted) and the footer (end marker, record count, the metadata's
offset, the CRC-32 of the whole file).

Crash safety as in skv: a new file is written in place and flushed at every
`step` record (and synced to disk every 2 s), so a process that dies leaves a
trace that loads up to its last complete step; an existing file is replaced
only at close, from a temporary file beside it. Leaving a `with` block by an
exception keeps a new file cut short there (what a crash would leave).

Every value is checked against its field before anything is written: a
missing or unknown field, a value of the wrong type or shape, an integer
outside its field's range, a float too large for f32, a count field that
disagrees with its array, or a string holding NUL raises TraceValueError, a
one-line message naming the kind and the field, and the trace is unchanged.
"""

import json
import math
import os
import socket
import struct
import sys
import tempfile
import time
import zlib

import numpy as np

from . import END, FOOTER, MAGIC, META_KIND, SCHEMA, WRITER_VERSION, TraceError, __version__, events, _scan

SYNC_SECONDS = 2.0
_I32 = (-2 ** 31, 2 ** 31 - 1)
_U64 = (0, 2 ** 64 - 1)
_F32_MAX = float(np.finfo(np.float32).max)
KIND_OF = {name: kind for kind, (name, _) in SCHEMA.items()}


class TraceValueError(ValueError):
    """A value that does not fit its field (the message is one line)."""


# ---------------------------------------------------------------- JSON as cJSON prints it

def _cjson_number(v):
    """A number as cJSON_PrintUnformatted prints it (cJSON 1.7): an integral
    value within int's range as %d, else %1.15g, or %1.17g when 15 digits do
    not give the double back; NaN and infinities as null."""
    d = float(v)
    if math.isnan(d) or math.isinf(d):
        return "null"
    vi = 2 ** 31 - 1 if d >= 2 ** 31 - 1 else -2 ** 31 if d <= -2 ** 31 else int(d)
    if d == float(vi):
        return "%d" % vi
    s = "%1.15g" % d
    t = float(s)
    if abs(t - d) > max(abs(t), abs(d)) * sys.float_info.epsilon:
        s = "%1.17g" % d
    return s


def _cjson_string(s):
    esc = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    out = ['"']
    for ch in s:
        if ch in esc:
            out.append(esc[ch])
        elif ord(ch) < 32:
            out.append("\\u%04x" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def cjson_dumps(v):
    """v (dict, list, str, int, float, bool, None) as the JSON text cJSON_PrintUnformatted makes."""
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, str):
        return _cjson_string(v)
    if isinstance(v, (int, float, np.integer, np.floating)):
        return _cjson_number(v)
    if isinstance(v, dict):
        return "{" + ",".join(_cjson_string(str(k)) + ":" + cjson_dumps(x) for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(cjson_dumps(x) for x in v) + "]"
    raise TraceValueError("metadata: a value of type %s cannot be written as JSON" % type(v).__name__)


# ---------------------------------------------------------------- encoding

def _int(kind, fname, v, lo, hi, what):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        if isinstance(v, (float, np.floating)) and float(v).is_integer():
            v = int(v)
        else:
            raise TraceValueError("%s.%s: expected an integer (%s), got %s" % (kind, fname, what, _show(v)))
    v = int(v)
    if not lo <= v <= hi:
        raise TraceValueError("%s.%s = %d does not fit %s (%d..%d)" % (kind, fname, v, what, lo, hi))
    return v


def _show(v):
    t = type(v).__name__
    if isinstance(v, np.ndarray):
        return "an array of shape %s (%s)" % (v.shape, v.dtype)
    r = repr(v)
    return "%s %s" % (t, r if len(r) <= 40 else r[:37] + "...")


def _float(kind, fname, v, f32):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TraceValueError("%s.%s: expected a number, got %s" % (kind, fname, _show(v)))
    if f32 and isinstance(v, np.float32):
        return v.tobytes()  # its own bits (a NaN's payload too)
    d = float(v)
    if f32:
        if math.isfinite(d) and abs(d) > _F32_MAX:
            raise TraceValueError("%s.%s = %g does not fit f32" % (kind, fname, d))
        return struct.pack("<f", d)
    return struct.pack("<d", d)


def host_array(x):
    """x as a numpy array in host memory: a torch tensor on any device
    (bfloat16 and float16 widened to float32; torch is not imported), or
    anything numpy takes."""
    if hasattr(x, "detach"):
        x = x.detach()
        if str(getattr(x, "dtype", "")) in ("torch.bfloat16", "torch.float16"):
            x = x.float()
        x = x.cpu().numpy()
    return np.asarray(x)


def _array(kind, fname, v, ftype):
    """A 1-D array field as little-endian bytes and its length."""
    if isinstance(v, (str, bytes)) or v is None:
        raise TraceValueError("%s.%s: expected a 1-D array of %s, got %s" % (
            kind, fname, "integers" if ftype == "i32s" else "numbers", _show(v)))
    a = host_array(v)
    if a.ndim != 1:
        if a.size == 0:
            a = a.reshape(0)
        else:
            raise TraceValueError("%s.%s: expected a 1-D array, got shape %s" % (kind, fname, tuple(a.shape)))
    if ftype == "i32s":
        if a.size and a.dtype.kind not in "iu":
            raise TraceValueError("%s.%s: expected integers, got dtype %s" % (kind, fname, a.dtype))
        if a.size and (a.min() < _I32[0] or a.max() > _I32[1]):
            raise TraceValueError("%s.%s: a value does not fit i32" % (kind, fname))
        return a.astype("<i4").tobytes(), a.size
    if a.size and a.dtype.kind not in "fiu":
        raise TraceValueError("%s.%s: expected numbers, got dtype %s" % (kind, fname, a.dtype))
    if a.dtype != np.float32 and a.size:
        f = a.astype(np.float64)
        fin = np.isfinite(f)
        if np.any(np.abs(f[fin]) > _F32_MAX):
            raise TraceValueError("%s.%s: a value does not fit f32" % (kind, fname))
    return a.astype("<f4").tobytes(), a.size


def encode(kind, fields):
    """The payload of one record of kind (a number or a name) from a dict of
    its fields; count fields may be left out (they are the arrays' lengths).
    Returns (kind number, payload bytes, the values of the scalar fields)."""
    if isinstance(kind, str):
        if kind not in KIND_OF:
            raise TraceValueError("unknown event kind %r (known: %s)" % (kind, ", ".join(KIND_OF)))
        kind = KIND_OF[kind]
    if kind not in SCHEMA:
        raise TraceValueError("unknown event kind %r" % kind)
    name, schema = SCHEMA[kind]
    names = {f[0] for f in schema}
    extra = [k for k in fields if k not in names]
    if extra:
        raise TraceValueError("%s: no field %s (fields: %s)" % (name, extra[0], ", ".join(f[0] for f in schema)))
    counts = {f[2]: f[0] for f in schema if len(f) > 2}
    parts = {}
    lengths = {}
    for f in schema:  # arrays first: their lengths fill the count fields
        fname, ftype = f[0], f[1]
        if len(f) < 3:
            continue
        if fname not in fields:
            raise TraceValueError("%s: field %s is missing" % (name, fname))
        v = fields[fname]
        if ftype == "bytes":
            if isinstance(v, str):
                v = v.encode("utf-8", "surrogateescape")
            if not isinstance(v, (bytes, bytearray, memoryview)):
                raise TraceValueError("%s.%s: expected bytes, got %s" % (name, fname, _show(v)))
            parts[fname], lengths[fname] = bytes(v), len(v)
        else:
            parts[fname], lengths[fname] = _array(name, fname, v, ftype)
    out = []
    scal = {}
    for f in schema:
        fname, ftype = f[0], f[1]
        if fname in counts and fname not in fields:
            v = lengths[counts[fname]]
        elif len(f) > 2:
            out.append(parts[fname])
            continue
        elif fname not in fields:
            raise TraceValueError("%s: field %s is missing" % (name, fname))
        else:
            v = fields[fname]
        if ftype == "i32":
            v = _int(name, fname, v, _I32[0], _I32[1], "i32")
            if fname in counts and v != lengths[counts[fname]]:
                raise TraceValueError("%s.%s = %d, but %s has %d elements" % (
                    name, fname, v, counts[fname], lengths[counts[fname]]))
            out.append(struct.pack("<i", v))
        elif ftype == "u64":
            v = _int(name, fname, v, _U64[0], _U64[1], "u64")
            out.append(struct.pack("<Q", v))
        elif ftype in ("f32", "f64"):
            out.append(_float(name, fname, v, ftype == "f32"))
            v = float(v)
        elif ftype == "str":
            if isinstance(v, str):
                b = v.encode("utf-8", "surrogateescape")
            elif isinstance(v, (bytes, bytearray)):
                b = bytes(v)
            else:
                raise TraceValueError("%s.%s: expected a string, got %s" % (name, fname, _show(v)))
            if b"\0" in b:
                raise TraceValueError("%s.%s: a string cannot hold NUL" % (name, fname))
            if len(b) > 2 ** 32 - 9:
                raise TraceValueError("%s.%s: a string of %d bytes is over 4 GiB" % (name, fname, len(b)))
            out.append(struct.pack("<I", len(b)) + b)
            v = b.decode("utf-8", "surrogateescape")
        scal[fname] = v
    payload = b"".join(out)
    if len(payload) > 2 ** 32 - 1:
        raise TraceValueError("%s: the record is over 4 GiB" % name)
    return kind, payload, scal


# ---------------------------------------------------------------- the writer

class TraceWriter:
    """Writes a trace at path as events come (see the module's docstring).
    producer: who made the events (a script, a framework), kept in the
    metadata beside the writer's name and version."""

    def __init__(self, path, producer=None):
        self.path = os.fspath(path)
        self.producer = producer
        self._tmp = None
        _check_output(self.path)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            d = os.path.dirname(os.path.abspath(self.path))
            fd, self._tmp = tempfile.mkstemp(prefix="." + os.path.basename(self.path) + ".rec.", dir=d)
            os.fchmod(fd, 0o644)
        except OSError as e:
            raise TraceError("%s: cannot create the trace: %s" % (self.path, e.strerror)) from None
        self._f = os.fdopen(fd, "wb", buffering=1 << 20)
        self._crc = 0
        self._off = 0
        self.n_records = 0
        self._count = {}
        self._run = None
        self._policies = []
        self._lanes = 0
        self._batched = False
        self._steps = self._layers = self._heads = 0
        self._notes = {}
        self._last_sync = time.monotonic()
        self._put(MAGIC + struct.pack("<II", 3, 0))
        self._f.flush()

    def _put(self, b):
        try:
            self._f.write(b)
        except OSError as e:
            raise TraceError("%s: cannot write the trace: %s" % (self.path, e.strerror)) from None
        self._crc = zlib.crc32(b, self._crc)
        self._off += len(b)

    def write(self, kind, fields=None, **kw):
        """Records one event: kind is its name ("decode_head") or number, its
        fields a dict or keywords. Raises TraceValueError (nothing written)
        for a value that does not fit."""
        if self._f is None:
            raise TraceValueError("%s: the writer is closed" % self.path)
        f = dict(fields or {}, **kw)
        k, payload, scal = encode(kind, f)
        self._record(k, payload)
        name = SCHEMA[k][0]
        self._count[name] = self._count.get(name, 0) + 1
        if name == "run":
            if self._run is None:
                self._run = scal
            opts = scal.get("kv_opts", "")
            one = "%s%s%s" % (scal.get("kv_policy") or "?", ": " if opts else "", opts)
            if one not in self._policies and len(self._policies) < 16:
                self._policies.append(one[:159])
        if name == "lane":
            self._lanes = max(self._lanes, scal["n_lanes"])
            self._batched = not scal["teacher"]
        for key, attr in (("step", "_steps"), ("layer", "_layers"), ("head", "_heads")):
            v = scal.get(key)
            if key == "step" and name == "token":
                continue  # a token counts no step: the run's last is fed by none (skv's rule)
            if isinstance(v, int) and v + 1 > getattr(self, attr):
                setattr(self, attr, v + 1)
        if name == "step":
            self.flush()

    def write_raw(self, kind, payload):
        """A record of a kind this package does not know, passed through (rewrite)."""
        if kind in SCHEMA or kind == META_KIND or not 0 < kind < 2 ** 32:
            raise TraceValueError("write_raw: kind %d is not an unknown kind" % kind)
        self._record(kind, bytes(payload))

    def _record(self, kind, payload):
        head = struct.pack("<II", kind, len(payload))
        self._put(head + payload + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))))
        self.n_records += 1

    def flush(self):
        """The records so far reach the file (and, every 2 s, the disk)."""
        try:
            self._f.flush()
            if time.monotonic() - self._last_sync >= SYNC_SECONDS:
                self._last_sync = time.monotonic()
                os.fdatasync(self._f.fileno())
        except OSError as e:
            raise TraceError("%s: cannot write the trace: %s" % (self.path, e.strerror)) from None

    def note(self, key, value):
        """A string for the metadata (keys the writer fills are not replaced)."""
        self._notes[str(key)] = str(value)

    def metadata(self):
        """The metadata record close writes: skv's keys, in skv's order, then
        who wrote it (writer, writer_version, producer) and the notes."""
        now = int(time.time())
        m = {"format": "skv-trace", "format_version": 3,
             "writer": "skvtrace (Python %d.%d)" % sys.version_info[:2], "writer_version": WRITER_VERSION}
        if self.producer:
            m["producer"] = str(self.producer)
        m["created"] = {"utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)), "unix_time": now,
                        "host": socket.gethostname(), "pid": os.getpid()}
        if self._run is not None:
            m["run"] = {fn: self._run[fn] for fn, ft in SCHEMA[1][1] if ft in ("i32", "str")}
        else:
            m["run"] = None
        m["policies"] = list(self._policies)
        m["lanes"] = self._lanes if self._lanes > 1 else 1
        m["batch"] = bool(self._lanes > 1 and self._batched)
        m["kinds"] = {SCHEMA[k][0]: self._count[SCHEMA[k][0]] for k in sorted(SCHEMA) if SCHEMA[k][0] in self._count}
        m["records"] = self.n_records
        run = self._run or {}
        m["steps"] = self._steps
        m["layers"] = run["n_layers"] if run.get("n_layers", 0) > 0 else self._layers
        m["kv_heads"] = run["n_kv_heads"] if run.get("n_kv_heads", 0) > 0 else self._heads
        for k, v in self._notes.items():
            m.setdefault(k, v)
        return m

    def close(self, meta=None):
        """Writes the metadata record (meta: this dict instead of metadata()'s,
        as a rewrite keeps the original's), the footer, syncs, and puts the
        file in place. Returns the path."""
        if self._f is None:
            return self.path
        text = cjson_dumps(self.metadata() if meta is None else meta).encode("utf-8", "surrogateescape")
        meta_off = self._off
        head = struct.pack("<II", META_KIND, len(text))
        self._put(head + text + struct.pack("<I", zlib.crc32(text, zlib.crc32(head))))
        foot = END + struct.pack("<QQ", self.n_records, meta_off)
        self._put(foot)
        try:
            self._f.write(struct.pack("<I", self._crc))
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
        except OSError as e:
            raise TraceError("%s: cannot write the trace: %s" % (self.path, e.strerror)) from None
        self._f = None
        if self._tmp:
            try:
                os.replace(self._tmp, self.path)
            except OSError as e:  # the temporary file never stays behind
                os.unlink(self._tmp)
                raise TraceError("%s: cannot put the trace in place: %s" % (self.path, e.strerror)) from None
            finally:
                self._tmp = None
        return self.path

    def abort(self):
        """Removes what was written (an existing file at path is kept)."""
        if self._f is not None:
            self._f.close()
            self._f = None
            os.unlink(self._tmp or self.path)
        elif self._tmp and os.path.exists(self._tmp):
            os.unlink(self._tmp)
        self._tmp = None

    def cut(self):
        """Stops without the metadata and footer, as a crash would: a new file
        stays cut short at its last complete step (skv loads that part); a
        temporary file beside an existing one is removed."""
        if self._f is not None:
            self._f.flush()
            self._f.close()
            self._f = None
            if self._tmp:
                os.unlink(self._tmp)
                self._tmp = None

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if et is None:
            self.close()
        else:
            self.cut()
        return False


def _check_output(path):
    """A trace's path, before any work: not a folder, in a folder that exists."""
    if os.path.isdir(path):
        raise TraceError("%s: is a directory; give a file name for the trace" % path)
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise TraceError("%s: the folder %s does not exist" % (path, d))


def rewrite(src, dst, force=False):
    """Reads the trace at src and writes it again at dst through TraceWriter,
    every record re-encoded from its decoded values and the metadata from
    its decoded JSON: for a trace skv wrote, dst is src byte for byte. An
    existing dst is refused unless force. Returns the records written."""
    _check_output(dst)
    if os.path.exists(dst) and not force:
        raise TraceError("%s: exists (force=True replaces it)" % dst)
    _, _, meta, meta_json, _ = _scan(src, False)
    w = TraceWriter(dst)
    try:
        for kind, name, fields in events(src):
            if name is None:
                w.write_raw(kind, fields)
            else:
                w.write(kind, fields)
        w.close(meta)
    except BaseException:
        w.abort()
        raise
    return w.n_records
