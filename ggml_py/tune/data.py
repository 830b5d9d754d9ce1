"""mulmat-tune data: measured per-stage times of every MUL_MAT profile, per
matrix shape (N, K, weight type), batch size M and thread count, and the
estimates that let the planner pick the fastest profile for any M.

A tune file is JSON, self-contained and versioned (see docs/tune.md):

    {"format": "ggml_py-mulmat-tune", "version": 1,
     "system": {"cpu": ..., "features": ..., "blas": ..., "kernels": ..., "ggml_py": ...},
     "model": "tinyllama-1.1b", "m_values": [1, 2, 4, ...], "thread_counts": [1, 2],
     "shapes": [{"n": 2048, "k": 2048, "type": "Q4_0",
                 "profiles": [{"id": 0, "name": "cpu", "stages": [[1,1,0],[1,1,0],[0,0,0]],
                               "times_us": {"1": {"init": [...], "compute": [...]}, ...}}]}]}

Times are the fastest of the passes, in microseconds, one per M of m_values.

An optional "attention" list holds the attention op's profiles per shape (tune/attention.py):

    "attention": [{"head_dim": 64, "n_head": 32, "n_head_kv": 4, "type_k": "F16", "type_v": "F16",
                   "tokens": [1, 16, 256], "lengths": [256, 1024, 4096],
                   "times_us": {"slim": {"2": [[...one per length...], ...one per token count]},
                                "flash": {...}}}]
"""
import errno
import json
import math
import os
import platform
import stat
from dataclasses import dataclass, field

from ggml_py._core import MAX_THREADS, check_thread_count
from ggml_py.files.output import OutputPathError, atomic_output, check_output_path
from ggml_py.core.profiles import STAGES, TaskProfile, task_profiles
from ggml_py.core.system import PACKAGE_VERSION, blas, kernels, system_info
from ggml_py.core.types import Op, Type

FORMAT = "ggml_py-mulmat-tune"
VERSION = 1


# With one thread these profiles run exactly blas's code (the same
# de-quantization, the same single-threaded sgemm on the calling thread), so
# there they are benched, and chosen, only as blas.
SAME_AS_BLAS_ON_ONE_THREAD = ("blas-split", "blas-mt")


def distinct_profiles(profiles, n_threads):
    """The profiles worth benching at n_threads.

    With one thread blas-split and blas-mt are blas (SAME_AS_BLAS_ON_ONE_THREAD).
    With more, blas still runs on one thread while blas-split does the same
    work with the de-quantization shared out, so blas is left out where
    blas-split exists (quantized and F16 weights).
    """
    names = {p.name for p in profiles}
    if n_threads == 1:
        return [p for p in profiles if p.name not in SAME_AS_BLAS_ON_ONE_THREAD]
    return [p for p in profiles if not (p.name == "blas" and "blas-split" in names)]


class TuneFileError(ValueError):
    """A tune file that cannot be used here (corrupt, other CPU, model or version)."""


def cpu_name():
    """The CPU model name (for the tune file's system section)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def current_system():
    """What a tune file must agree with to be used on this machine and build."""
    return {"cpu": cpu_name(), "features": system_info(), "blas": blas(), "kernels": kernels(),
            "ggml_py": PACKAGE_VERSION}


def interpolate(xs, ys, x):
    """Piecewise-linear y(x) through (xs, ys), xs ascending (two or more); linear past
    both ends, never below 0. Past the last x the line runs from the last point back
    to the nearest earlier point below it: a last stretch that is flat (a time held
    down to a later, lower one) or falls (noise) would otherwise stop the growth, or
    reach 0, however far past the benched Ms the run goes; with no earlier point
    below, the last y."""
    if len(xs) < 2:
        raise ValueError(f"interpolate needs two or more points, got {len(xs)}")
    if x > xs[-1]:
        below = [i for i in range(len(xs) - 1) if ys[i] < ys[-1]]
        if not below:
            return max(0.0, ys[-1])
        i = below[-1]
        return max(0.0, ys[-1] + (ys[-1] - ys[i]) / (xs[-1] - xs[i]) * (x - xs[-1]))
    i = 1
    while i < len(xs) - 1 and xs[i] < x:
        i += 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) / (x1 - x0) * (x - x0))


@dataclass
class ProfileTimes:
    """One profile's stage times: times_us[n_threads][stage] -> list over m_values."""
    profile: TaskProfile
    times_us: dict = field(default_factory=dict)

    def estimate(self, m_values, m, n_threads):
        """Estimated µs at M=m, or None when n_threads was not benched."""
        per_stage = self.times_us.get(n_threads)
        if per_stage is None:
            return None
        return sum(interpolate(m_values, per_stage[s], m) for s in per_stage)


@dataclass(frozen=True)
class ShapeTimes:
    """All profiles benched for one (N, K, type) matrix (the matrix fixed: TuneData finds it
    by its key)."""
    n: int
    k: int
    type: Type
    profiles: list = field(default_factory=list)

    @property
    def key(self):
        """(N, K, type), what TuneData.shape finds this matrix by."""
        return (self.n, self.k, self.type)

    def estimate(self, p, m_values, m, n_threads):
        """Profile p's (a ProfileTimes of this shape) estimated µs at M=m on n_threads
        benched threads, or None. With one thread the profiles that run blas's code are
        benched as blas (SAME_AS_BLAS_ON_ONE_THREAD), so blas's time stands for theirs."""
        t = p.estimate(m_values, m, n_threads)
        if t is None and n_threads == 1 and p.profile.name in SAME_AS_BLAS_ON_ONE_THREAD:
            blas = next((q for q in self.profiles if q.profile.name == "blas"), None)
            t = None if blas is None else blas.estimate(m_values, m, 1)
        return t


class Estimates(list):
    """[(estimated µs, TaskProfile)], fastest first; `between` is None when the thread
    count was benched, else the two benched counts its times were interpolated between."""
    between = None


def thread_neighbours(thread_counts, n_threads):
    """(lo, hi): the benched thread counts either side of n_threads, or None when
    n_threads is benched itself or lies outside them (nothing to interpolate between)."""
    below = [t for t in thread_counts if t < n_threads]
    above = [t for t in thread_counts if t > n_threads]
    if n_threads in thread_counts or not below or not above:
        return None
    return max(below), min(above)


def between_threads(lo, t_lo, hi, t_hi, n_threads):
    """A time at n_threads from the times at lo and hi threads (lo < n_threads < hi),
    on a straight line in 1 / n_threads: a stage split over the threads takes
    serial / n + constant (a single-thread stage, the constant alone), which such a
    line runs through exactly."""
    w = (1 / n_threads - 1 / hi) / (1 / lo - 1 / hi)     # 1 at lo, 0 at hi
    return w * t_lo + (1 - w) * t_hi


ATTENTION_PROFILES = ("slim", "flash")


@dataclass(frozen=True)
class AttentionTimes:
    """The attention op's profiles benched for one shape: times_us[profile][n_threads] is a
    list over `tokens` (query rows of the node) of lists over `lengths` (the longest list)."""
    head_dim: int
    n_head: int
    n_head_kv: int
    type_k: Type
    type_v: Type
    tokens: list
    lengths: list
    times_us: dict = field(default_factory=dict)

    @property
    def key(self):
        """(head size, heads, KV heads, K type, V type)."""
        return (self.head_dim, self.n_head, self.n_head_kv, self.type_k, self.type_v)

    def estimate(self, profile, T, K, n_threads):
        """Estimated µs of `profile` for T query tokens over lists of K: the benched token
        count nearest T (by ratio), linear in K between the benched lengths; None where the
        profile or n_threads was not benched."""
        per = self.times_us.get(profile, {}).get(n_threads)
        if per is None:
            return None
        i = min(range(len(self.tokens)), key=lambda j: abs(math.log(self.tokens[j] / max(T, 1))))
        return interpolate(self.lengths, per[i], K)


@dataclass
class TuneData:
    """A whole tune file in memory."""
    model: str
    m_values: list
    thread_counts: list
    shapes: list = field(default_factory=list)        # ShapeTimes
    system: dict = field(default_factory=current_system)
    attention: list = field(default_factory=list)     # AttentionTimes

    def attention_estimates(self, head_dim, n_head, n_head_kv, type_k, type_v, T, K, n_threads):
        """[(estimated µs, profile name)] of the attention op for this shape, fastest first;
        empty when the shape or the thread count was not benched."""
        key = (head_dim, n_head, n_head_kv, Type.of(type_k, "attention_estimates"),
               Type.of(type_v, "attention_estimates"))
        shape = next((a for a in self.attention if a.key == key), None)
        if shape is None:
            return []
        found = [(shape.estimate(p, T, K, n_threads), p) for p in shape.times_us]
        return sorted((e, p) for e, p in found if e is not None)

    def shape(self, n, k, type):
        """The ShapeTimes of (N, K, type), or None (a scan: a file has at most MAX_SHAPES)."""
        key = (n, k, Type.of(type, "TuneData.shape"))
        return next((s for s in self.shapes if s.key == key), None)

    def covers(self, n_threads):
        """Whether estimates serve n_threads: benched, or between two benched counts."""
        return n_threads in self.thread_counts or \
            thread_neighbours(self.thread_counts, n_threads) is not None

    def estimates(self, n, k, type, m, n_threads):
        """Estimates [(estimated µs, TaskProfile)] for every benched profile, fastest first.

        A thread count that was not benched but lies between two that were gets
        each profile's time interpolated between theirs (between_threads; the
        list's `between` names the two); a profile needs times at both.
        Empty when the shape was not benched, or the thread count is outside the
        benched ones.
        """
        found = Estimates()
        shape = self.shape(n, k, type)
        if shape is None:
            return found
        between = thread_neighbours(self.thread_counts, n_threads)
        for p in shape.profiles:
            if between is None:
                t = p.estimate(self.m_values, m, n_threads)
            else:
                lo, hi = between
                t_lo = shape.estimate(p, self.m_values, m, lo)
                t_hi = shape.estimate(p, self.m_values, m, hi)
                t = None if t_lo is None or t_hi is None else \
                    between_threads(lo, t_lo, hi, t_hi, n_threads)
            if t is not None:
                found.append((t, p.profile))
        found.sort(key=lambda e: e[0])
        found.between = between
        return found

    # ---- file I/O ---------------------------------------------------------------

    def to_json(self):
        """The file's JSON object."""
        return {
            "format": FORMAT, "version": VERSION, "system": self.system, "model": self.model,
            "m_values": list(self.m_values), "thread_counts": list(self.thread_counts),
            "shapes": [{
                "n": s.n, "k": s.k, "type": Type(s.type).name,
                "profiles": [{
                    "id": p.profile.id, "name": p.profile.name,
                    "stages": [[int(f.valid), int(f.parallel), int(f.wait)] for f in p.profile.stages],
                    "times_us": {str(t): {st: [round(v, 3) for v in vals] for st, vals in per.items()}
                                 for t, per in p.times_us.items()},
                } for p in s.profiles],
            } for s in self.shapes],
            **({"attention": [{
                "head_dim": a.head_dim, "n_head": a.n_head, "n_head_kv": a.n_head_kv,
                "type_k": Type(a.type_k).name, "type_v": Type(a.type_v).name,
                "tokens": list(a.tokens), "lengths": list(a.lengths),
                "times_us": {p: {str(t): [[round(v, 3) for v in row] for row in per]
                                 for t, per in by_t.items()} for p, by_t in a.times_us.items()},
            } for a in self.attention]} if self.attention else {}),
        }

    def save(self, path):
        """Write the tune file (JSON), whole or not at all (files.output.atomic_output, whose
        checks of the path give a TuneFileError here)."""
        try:
            with atomic_output(path) as tmp, open(tmp, "w") as f:
                json.dump(self.to_json(), f, indent=1)
                f.write("\n")
        except OutputPathError as exc:
            raise TuneFileError(str(exc)) from None


def check_writable(path, not_over=None):
    """Raise TuneFileError unless a tune file can be saved at `path` (files.output's
    rules) — before a bench, not after it. not_over: a file (the model) it must not replace."""
    try:
        check_output_path(path, inputs={not_over: "the model file"} if not_over is not None else None)
    except OutputPathError as exc:
        raise TuneFileError(str(exc)) from None


MAX_FILE_BYTES = 64 << 20   # far above any real tune file (a 70B model's is well under 1 MB)
MAX_M = (1 << 31) - 1       # an M beyond any batch (and exact in the float estimates)
MAX_TIME_US = 1e12          # 11.6 days: no product takes longer (larger times would sum to inf)
MAX_SHAPES = 1024           # a model has a few dozen (N, K, type); more only makes loading slow


class _DuplicateKey(ValueError):
    """A key twice in one JSON object (json.loads would keep the last silently)."""


def _unique_keys(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _DuplicateKey(next(k for k in keys if keys.count(k) > 1))
    return dict(pairs)


def load(path, model=None, check_system=True, shapes=None, n_threads=None):
    """Read a tune file; raises TuneFileError saying why it cannot be used.

    model: when given, the file must have been benched for this model name.
    check_system: the file must come from this CPU, build and ggml_py version,
    and its profiles must be this build's MUL_MAT profiles.
    shapes: when given, (N, K, type) triples the file must all cover.
    n_threads: when given, a thread count the file must serve: benched at, or between
    two benched counts (TuneData.estimates interpolates).
    """
    if n_threads is not None:
        n_threads = check_thread_count(n_threads, "load")
    try:
        raw = _read_at_most(path, MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise TuneFileError(f"{path}: cannot read tune file: {exc.strerror}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise TuneFileError(f"{path}: not a tune file (over {MAX_FILE_BYTES >> 20} MiB)")
    try:
        obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise TuneFileError(f"{path}: malformed tune file (key {str(exc)!r:.40} appears twice "
                            f"in one object)") from None
    except (ValueError, RecursionError) as exc:   # JSONDecodeError and UnicodeDecodeError
        raise TuneFileError(f"{path}: not a tune file (corrupt or truncated JSON: {exc})") from None
    try:
        data = _from_json(obj, path, model, check_system)
    except TuneFileError:
        raise
    except KeyError as exc:
        raise TuneFileError(f"{path}: malformed tune file (no {str(exc.args[0])!r:.40} key)") from None
    except (TypeError, ValueError, IndexError, AttributeError, OverflowError) as exc:
        raise TuneFileError(f"{path}: malformed tune file ({type(exc).__name__}: {exc})") from None
    missing = [s for s in (shapes or ()) if data.shape(*s) is None]
    if missing:
        n, k, t = missing[0]
        raise TuneFileError(f"{path}: has no times for {len(missing)} of the model's matrix shapes "
                            f"(e.g. N={n} K={k} {Type(t).name}); bench again with ggml-tune")
    if n_threads is not None and not data.covers(n_threads):
        raise TuneFileError(f"{path}: benched at {threads_text(data.thread_counts)}, not at "
                            f"{n_threads} nor on both sides of it; bench again with ggml-tune "
                            f"--n-threads {n_threads}")
    return data


def _read_at_most(path, n):
    """Up to n bytes of a regular file or a pipe (`--tune-file <(zcat t.json.gz)`); a
    device is refused (OSError). The open does not wait for a FIFO's writer: one
    without a writer reads as empty."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            raise OSError(errno.EINVAL, "not a regular file or a pipe", path)
        os.set_blocking(fd, True)
        f = open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        return f.read(n)


def threads_text(counts):
    """'1 thread', '2 threads', '1, 2 threads': thread counts for a message."""
    return f"{', '.join(map(str, counts))} thread{'s' if counts != [1] else ''}"


class _Malformed:
    """Checks of the JSON values of one file; each failure is a TuneFileError naming `path`."""

    KINDS = {list: "a list", dict: "an object", str: "a string", int: "an integer"}

    def __init__(self, path):
        self.path = path

    def fail(self, what):
        raise TuneFileError(f"{self.path}: malformed tune file ({what})")

    def of_type(self, value, kind, what):
        # bool is an int in Python, never a valid JSON number or list here
        if not isinstance(value, kind) or isinstance(value, bool):
            self.fail(f"{what} must be {self.KINDS[kind]}, not {value!r:.40}")
        return value

    def integer(self, value, what, minimum, maximum=None):
        self.of_type(value, int, what)
        if value < minimum:
            self.fail(f"{what} must be >= {minimum}, not {value}")
        if maximum is not None and value > maximum:
            self.fail(f"{what} must be <= {maximum}, not {value!r:.20}")
        return value

    def ascending(self, values, what, maximum):
        values = [self.integer(v, what, 1, maximum) for v in self.of_type(values, list, what)]
        if not values or values != sorted(set(values)):
            self.fail(f"{what} must be distinct, ascending and >= 1, not {values!r:.60}")
        return values

    def thread_key(self, key, thread_counts, what):
        """A times_us key: a thread count thread_counts lists, written as str(n)."""
        n = int(key) if key.isascii() and key.isdigit() else None
        if n is None or str(n) != key or n not in thread_counts:
            self.fail(f"{what}: times for {key!r:.20} threads; the keys are thread counts "
                      f"thread_counts lists, as plain numbers")
        return n

    def thread_counts(self, values):
        """A set of thread counts >= 1, in any order (older files wrote them as given)."""
        values = [self.integer(v, "thread_counts", 1, MAX_THREADS)
                  for v in self.of_type(values, list, "thread_counts")]
        if not values:
            self.fail("thread_counts is empty")
        return sorted(set(values))

    def times(self, values, n_m, what):
        values = self.of_type(values, list, what)
        if len(values) != n_m or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool)
                and 0 <= v <= MAX_TIME_US for v in values):   # (NaN compares false; a huge
            # int compares exactly, where math.isfinite would overflow)
            self.fail(f"{what}: need one time in 0 .. {MAX_TIME_US:g} µs per M ({n_m})")
        return [float(v) for v in values]


def _from_json(obj, path, model, check_system):
    check = _Malformed(path)
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise TuneFileError(f"{path}: not a {FORMAT} file")
    version = obj.get("version")
    if type(version) is not int or version != VERSION:
        raise TuneFileError(f"{path}: tune file version {version!r} is not {VERSION}; "
                            f"bench again with ggml-tune")
    system = check.of_type(obj["system"], dict, "system")
    if check_system:
        here = current_system()
        for key in ("cpu", "features", "blas", "kernels", "ggml_py"):
            if system.get(key) != here[key]:
                raise TuneFileError(f"{path}: benched with {key} {system.get(key)!r}, "
                                    f"this run has {here[key]!r}; bench again with ggml-tune")
    name = check.of_type(obj["model"], str, "model")
    if model is not None and name != model:
        raise TuneFileError(f"{path}: benched for model {name!r}, not {model!r}")
    m_values = check.ascending(obj["m_values"], "m_values", MAX_M)
    if len(m_values) < 2:
        check.fail(f"m_values must hold two or more Ms (estimates interpolate between them), "
                   f"not {m_values!r}")
    thread_counts = check.thread_counts(obj["thread_counts"])
    data = TuneData(model=name, m_values=m_values, thread_counts=thread_counts, system=system)
    shapes = check.of_type(obj["shapes"], list, "shapes")
    if not shapes:
        check.fail("no shapes")
    if len(shapes) > MAX_SHAPES:
        check.fail(f"{len(shapes)} shapes, more than a model has (at most {MAX_SHAPES})")
    seen = set()
    for s in shapes:
        shape = _shape_from_json(check.of_type(s, dict, "a shape"), check, data, check_system)
        if shape.key in seen:
            check.fail(f"{_describe(shape)} appears twice")
        seen.add(shape.key)
        data.shapes.append(shape)
    for a in check.of_type(obj.get("attention", []), list, "attention"):
        times = _attention_from_json(check.of_type(a, dict, "an attention shape"), check, data)
        if any(b.key == times.key for b in data.attention):
            check.fail(f"attention shape {times.key[:3]} {times.type_k.name}/{times.type_v.name} "
                       f"appears twice")
        data.attention.append(times)
    return data


def _attention_from_json(a, check, data):
    """AttentionTimes of one attention shape's JSON: known profiles and types, a time per
    (token count, length), thread counts the file lists."""
    types = []
    for key in ("type_k", "type_v"):
        name = check.of_type(a[key], str, key)
        if name not in Type.__members__:
            check.fail(f"unknown KV type {name!r:.20}")
        types.append(Type[name])
    tokens = check.ascending(a["tokens"], "attention tokens", MAX_M)
    lengths = check.ascending(a["lengths"], "attention lengths", MAX_M)
    if len(lengths) < 2:
        check.fail("attention lengths must hold two or more lengths (estimates interpolate)")
    times = {}
    for profile, by_t in check.of_type(a["times_us"], dict, "attention times_us").items():
        if profile not in ATTENTION_PROFILES:
            check.fail(f"unknown attention profile {profile!r:.20}")
        times[profile] = {}
        for t, rows in check.of_type(by_t, dict, f"attention {profile} times").items():
            n_threads = check.thread_key(t, data.thread_counts, f"attention {profile}")
            rows = check.of_type(rows, list, f"attention {profile} times")
            if len(rows) != len(tokens):
                check.fail(f"attention {profile}: need one list of times per token count")
            times[profile][n_threads] = [check.times(r, len(lengths), f"attention {profile}")
                                         for r in rows]
    return AttentionTimes(check.integer(a["head_dim"], "head_dim", 1),
                          check.integer(a["n_head"], "n_head", 1),
                          check.integer(a["n_head_kv"], "n_head_kv", 1), types[0], types[1],
                          tokens, lengths, times)


def _describe(shape):
    return f"{shape.n}x{shape.k} {Type(shape.type).name}"


def _shape_from_json(s, check, data, check_system):
    """ShapeTimes of one shape's JSON; every profile a known one (this build's,
    with check_system), benched at the file's thread counts, one time per M
    for each stage it runs and no other."""
    type_name = check.of_type(s["type"], str, "type")
    if type_name not in Type.__members__:
        check.fail(f"unknown weight type {type_name!r}")
    shape = ShapeTimes(check.integer(s["n"], "n", 1), check.integer(s["k"], "k", 1), Type[type_name])
    where = _describe(shape)
    profiles = check.of_type(s["profiles"], list, f"{where} profiles")
    if not profiles:
        check.fail(f"{where} has no profiles")
    real = {p.id: p for p in task_profiles(Op.MUL_MAT, shape.type)}
    for p in profiles:
        p = check.of_type(p, dict, f"{where} profile")
        flags = check.of_type(p["stages"], list, f"{where} stages")
        if len(flags) != len(STAGES) or not all(
                isinstance(f, list) and len(f) == 3 and all(type(x) is int and x in (0, 1) for x in f)
                for f in flags):
            check.fail(f"{where}: stages must be {len(STAGES)} lists of 3 flags (0 or 1)")
        profile = TaskProfile._from_raw((check.integer(p["id"], "profile id", 0),
                                         check.of_type(p["name"], str, "profile name"),
                                         [tuple(bool(x) for x in f) for f in flags]))
        if check_system and real.get(profile.id) != profile:
            check.fail(f"{where}: profile {profile.name!r} (id {profile.id}) is not one of this "
                       f"build's MUL_MAT profiles for {type_name}")
        if any(pt.profile.id == profile.id for pt in shape.profiles):
            check.fail(f"{where}: profile id {profile.id} appears twice")
        valid = [st for st, f in zip(STAGES, profile.stages) if f.valid]
        times = {}
        for t, per in check.of_type(p["times_us"], dict, f"{where} times_us").items():
            n_threads = check.thread_key(t, data.thread_counts, f"{where} {profile.name}")
            per = check.of_type(per, dict, f"{where} {profile.name} times")
            if sorted(per) != sorted(valid):
                check.fail(f"{where} {profile.name}: times for stages {sorted(per)}, but it runs "
                           f"{sorted(valid)}")
            times[n_threads] = {st: check.times(per[st], len(data.m_values),
                                                f"{where} {profile.name} {st}") for st in valid}
        shape.profiles.append(ProfileTimes(profile, times))
    # as ggml-tune benches: a profile missing at a thread count (damage, or an edit)
    # would otherwise leave the choice to the others without a word. This build's
    # profiles with check_system; else (a file from another machine) the file's own
    known = list(real.values()) if check_system else [pt.profile for pt in shape.profiles]
    for t in data.thread_counts:
        benched = [p.name for p in distinct_profiles(known, t)]
        timed = [pt.profile.name for pt in shape.profiles if t in pt.times_us]
        if sorted(timed) != sorted(benched):
            check.fail(f"{where}: times at {threads_text([t])} for {', '.join(timed) or 'no profile'}; "
                       f"ggml-tune benches {', '.join(benched)}")
    return shape
