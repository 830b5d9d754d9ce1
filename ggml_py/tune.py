"""mulmat-tune data: measured per-stage times of every MUL_MAT profile, per
matrix shape (N, K, weight type), batch size M and thread count, and the
estimates that let the planner pick the fastest profile for any M.

A tune file is JSON, self-contained and versioned (see docs/tune.md):

    {"format": "ggml_py-mulmat-tune", "version": 1,
     "system": {"features": ..., "kernels": ..., "blas": ..., "ggml_py": ..., "cpu": ...},
     "model": "tinyllama-1.1b", "m_values": [1, 2, 4, ...], "thread_counts": [1, 2],
     "shapes": [{"n": 2048, "k": 2048, "type": "Q4_0",
                 "profiles": [{"id": 0, "name": "cpu", "stages": [[1,1,0],[1,1,0],[0,0,0]],
                               "times_us": {"1": {"init": [...], "compute": [...]}, ...}}]}]}

Times are the fastest of the passes, in microseconds, one per M of m_values.
"""
import json
import math
import platform
from dataclasses import dataclass, field

from ggml_py.profiles import STAGES, TaskProfile
from ggml_py.system import kernels, system_info
from ggml_py.types import Type

FORMAT = "ggml_py-mulmat-tune"
VERSION = 1


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
    import ggml_py
    return {"cpu": cpu_name(), "features": system_info(), "kernels": kernels(),
            "ggml_py": ggml_py.__version__}


def interpolate(xs, ys, x):
    """Piecewise-linear y(x) through (xs, ys), xs ascending; linear past both ends."""
    if len(xs) == 1:
        return ys[0]
    i = 1
    while i < len(xs) - 1 and xs[i] < x:
        i += 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


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


@dataclass
class ShapeTimes:
    """All profiles benched for one (N, K, type) matrix."""
    n: int
    k: int
    type: Type
    profiles: list = field(default_factory=list)

    @property
    def key(self):
        return (self.n, self.k, self.type)


@dataclass
class TuneData:
    """A whole tune file in memory."""
    model: str
    m_values: list
    thread_counts: list
    shapes: list = field(default_factory=list)
    system: dict = field(default_factory=current_system)

    def shape(self, n, k, type):
        """The ShapeTimes of (N, K, type), or None."""
        for s in self.shapes:
            if s.key == (n, k, Type(type)):
                return s
        return None

    def estimates(self, n, k, type, m, n_threads):
        """[(estimated µs, TaskProfile)] for every benched profile, fastest first.

        Empty when the shape or the thread count was not benched.
        """
        shape = self.shape(n, k, type)
        if shape is None:
            return []
        found = []
        for p in shape.profiles:
            t = p.estimate(self.m_values, m, n_threads)
            if t is not None:
                found.append((t, p.profile))
        return sorted(found, key=lambda e: e[0])

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
        }

    def save(self, path):
        """Write the tune file (JSON)."""
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")


def load(path, model=None, check_system=True, shapes=None):
    """Read a tune file; raises TuneFileError saying why it cannot be used.

    model: when given, the file must have been benched for this model name.
    check_system: the file must come from this CPU, build and ggml_py version.
    shapes: when given, (N, K, type) triples the file must all cover.
    """
    try:
        with open(path) as f:
            obj = json.load(f)
    except OSError as exc:
        raise TuneFileError(f"{path}: cannot read tune file: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TuneFileError(f"{path}: not a tune file (corrupt or truncated JSON: {exc})") from None
    try:
        data = _from_json(obj, path, model, check_system)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        if isinstance(exc, TuneFileError):
            raise
        raise TuneFileError(f"{path}: malformed tune file ({type(exc).__name__}: {exc})") from None
    missing = [s for s in (shapes or ()) if data.shape(*s) is None]
    if missing:
        n, k, t = missing[0]
        raise TuneFileError(f"{path}: has no times for {len(missing)} of the model's matrix shapes "
                            f"(e.g. N={n} K={k} {Type(t).name}); bench again with ggml-tune")
    return data


def _from_json(obj, path, model, check_system):
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise TuneFileError(f"{path}: not a {FORMAT} file")
    if obj.get("version") != VERSION:
        raise TuneFileError(f"{path}: tune file version {obj.get('version')} is not {VERSION}; "
                            f"bench again with ggml-tune")
    system = obj["system"]
    if check_system:
        here = current_system()
        for key in ("cpu", "features", "kernels", "ggml_py"):
            if system.get(key) != here[key]:
                raise TuneFileError(f"{path}: benched with {key} {system.get(key)!r}, "
                                    f"this run has {here[key]!r}; bench again with ggml-tune")
    if model is not None and obj["model"] != model:
        raise TuneFileError(f"{path}: benched for model {obj['model']!r}, not {model!r}")
    m_values = [int(m) for m in obj["m_values"]]
    if not m_values or m_values != sorted(set(m_values)) or m_values[0] < 1:
        raise TuneFileError(f"{path}: m_values must be distinct, ascending and >= 1")
    thread_counts = [int(t) for t in obj["thread_counts"]]
    data = TuneData(model=obj["model"], m_values=m_values, thread_counts=thread_counts,
                    system=system)
    for s in obj["shapes"]:
        shape = ShapeTimes(int(s["n"]), int(s["k"]), Type[s["type"]])
        for p in s["profiles"]:
            stages = [tuple(bool(x) for x in flags) for flags in p["stages"]]
            if len(stages) != len(STAGES):
                raise TuneFileError(f"{path}: profile {p['name']!r} needs {len(STAGES)} stages")
            profile = TaskProfile._from_raw((int(p["id"]), str(p["name"]), stages))
            times = {}
            for t, per in p["times_us"].items():
                times[int(t)] = {}
                for stage, values in per.items():
                    if stage not in STAGES:
                        raise TuneFileError(f"{path}: unknown stage {stage!r}")
                    values = [float(v) for v in values]
                    if len(values) != len(m_values) or not all(math.isfinite(v) and v >= 0
                                                               for v in values):
                        raise TuneFileError(f"{path}: {shape.key} {profile.name}: need one finite "
                                            f"time >= 0 per M for stage {stage}")
                    times[int(t)][stage] = values
            shape.profiles.append(ProfileTimes(profile, times))
        data.shapes.append(shape)
    return data
