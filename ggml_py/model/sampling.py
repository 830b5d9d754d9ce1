"""Choosing the next token from logits, with llama.cpp's semantics and order.

The chain is llama.cpp's default one (with its optional samplers left out):
repeat penalty -> top-k -> top-p -> min-p -> temperature -> draw. A temperature
<= 0 means greedy: the highest logit after the penalty. Candidates are kept as
(ids, logits) arrays sorted by logit, highest first, once top-k has run.

The draw uses a numpy Generator: same seed, same tokens (seed None or -1
draws a seed from the OS). Its numbers differ from llama.cpp's mt19937, so sampled
text matches llama.cpp only when greedy.
"""
import ctypes
import ctypes.util
import functools
import math
import numbers
from collections import deque
from dataclasses import dataclass

import numpy as np

from ggml_py.core.types import checked_int


@dataclass(frozen=True)
class SamplingParams:
    """Sampler settings; defaults are llama.cpp's. Checked when made (ValueError, TypeError)."""
    temperature: float = 0.8
    top_k: int = 40               # <= 0: all tokens
    top_p: float = 0.95           # >= 1: off
    min_p: float = 0.05           # <= 0: off
    repeat_penalty: float = 1.0   # 1: off; must be > 0
    repeat_last_n: int = 64       # tokens the penalty looks back over (0: off, -1: all of them)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None       # None or -1: a random seed

    def __post_init__(self):
        for name in ("temperature", "top_p", "min_p", "repeat_penalty", "frequency_penalty",
                     "presence_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a number, got {value!r}")
            try:
                value = float(value)
            except OverflowError:     # an int beyond a float's range
                raise ValueError(f"{name} must be a number a float holds, got an integer of "
                                 f"{int(value).bit_length()} bits") from None
            if math.isnan(value):
                raise ValueError(f"{name} must be a number, got nan")
        if not 0 < self.repeat_penalty < math.inf:
            raise ValueError(f"repeat_penalty must be a positive number, got {self.repeat_penalty}")
        checked_int("top_k", self.top_k)
        checked_int("repeat_last_n", self.repeat_last_n, low=-1, high=2 ** 31 - 1)
        if self.seed is not None:
            checked_int("seed", self.seed, low=-1)

    @property
    def greedy(self):
        """True when temperature <= 0: the sampler takes the highest logit."""
        return self.temperature <= 0


def apply_penalties(logits, history, repeat_penalty, frequency_penalty=0.0, presence_penalty=0.0):
    """Penalise tokens seen in `history` (llama.cpp): a positive logit is divided by
    repeat_penalty, a negative one multiplied; then count * frequency_penalty and
    presence_penalty are subtracted. Changes logits (float32 (V,)) in place."""
    if not len(history):
        return logits
    if repeat_penalty == 1.0 and frequency_penalty == 0.0 and presence_penalty == 0.0:
        return logits
    ids, counts = np.unique(np.asarray(history, np.int64), return_counts=True)
    inside = (ids >= 0) & (ids < len(logits))      # ids not in the vocabulary: no token to penalise
    ids, counts = ids[inside], counts[inside]
    # in float32, step by step, as llama.cpp: logit -= count * freq + (count > 0) * presence
    repeat, freq, presence = (np.float32(v) for v in (repeat_penalty, frequency_penalty,
                                                       presence_penalty))
    x = logits[ids]
    x = np.where(x <= 0, x * repeat, x / repeat)
    logits[ids] = x - (counts.astype(np.float32) * freq + presence)
    return logits


def top_k(ids, logits, k):
    """The k highest candidates, sorted by logit (all of them, sorted, if k <= 0); among
    equal logits the earlier candidates (the lower ids) come first and survive the cut.
    logits: float32 without NaN (Sampler makes NaN -inf first)."""
    n = len(logits)
    if 0 < k < n:
        kth = -np.partition(-logits, k - 1)[k - 1]          # the k-th highest logit
        above = np.flatnonzero(logits > kth)
        tied = np.flatnonzero(logits == kth)[:k - len(above)]
        keep = np.sort(np.concatenate([above, tied]))       # in candidate order
        ids, logits = ids[keep], logits[keep]
    order = np.argsort(-logits, kind="stable")
    return ids[order], logits[order]


def top_p(ids, logits, p, min_keep=1):
    """Sorted candidates: keep the smallest prefix whose probability reaches p.

    In float32, summed in order, as llama.cpp: a prefix that reaches p only by
    float32 rounding is cut where llama.cpp cuts it (20 equal logits, p 0.5: 10).
    """
    if p >= 1.0 or len(logits) <= min_keep:
        return ids, logits
    e = np.exp((logits - logits[0]).astype(np.float64)).astype(np.float32)   # expf (C,)
    cum = np.cumsum(e / np.cumsum(e)[-1])       # numpy's cumsum adds in order, in float32
    reached = np.nonzero(cum >= np.float32(p))[0]
    n = len(logits) if not reached.size else max(int(reached[0]) + 1, min_keep)
    return ids[:n], logits[:n]


@functools.cache
def _c_logf():
    """The C library's logf, which llama.cpp's min-p calls (glibc's is not correctly
    rounded for about one float in 500), or a correctly rounded stand-in where ctypes
    finds no C math library."""
    try:
        libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        logf = libm.logf
    except (OSError, AttributeError):
        return lambda x: np.float32(math.log(x))
    logf.restype, logf.argtypes = ctypes.c_float, [ctypes.c_float]
    return lambda x: np.float32(logf(x))


def min_p(ids, logits, p, min_keep=1):
    """Sorted candidates: keep those with probability >= p * the highest one."""
    if p <= 0.0 or not len(logits):
        return ids, logits
    threshold = logits[0] + _c_logf()(np.float32(p))    # as llama.cpp: max + logf(p)
    n = max(int(np.count_nonzero(logits >= threshold)), min_keep)
    return ids[:n], logits[:n]


def draw(logits, rng):
    """Index drawn from softmax(logits) with one uniform number (llama.cpp's dist)."""
    cum = np.cumsum(np.exp(logits.astype(np.float64) - logits.max()))
    target = cum[-1] * rng.random()
    return min(int(np.searchsorted(cum, target, side="left")), len(logits) - 1)


class Sampler:
    """Stateful sampler: remembers recent tokens for the repeat penalty, owns the RNG.

    >>> s = Sampler(SamplingParams(temperature=0.8, seed=1))
    >>> s.accept_all(prompt_ids); token = s.sample(logits); s.accept(token)
    """

    def __init__(self, params=SamplingParams(), banned=()):
        self.params = params
        self.rng = np.random.default_rng(None if params.seed == -1 else params.seed)
        # repeat_last_n -1: every token accepted (a generation's whole context)
        window = params.repeat_last_n
        self.history = deque(maxlen=None if window == -1 else window)
        self.banned = np.asarray(sorted(banned), np.int64)   # e.g. EOS with --ignore-eos

    def accept(self, token):
        """Record a token (prompt or generated) for the repeat penalty."""
        if self.history.maxlen != 0:
            self.history.append(int(token))

    def accept_all(self, tokens):
        """accept() each of tokens, in order."""
        for t in tokens:
            self.accept(t)

    def sample(self, logits):
        """The next token id from logits (V,) (not recorded: call accept)."""
        p = self.params
        x = np.array(logits, np.float32).reshape(-1)
        if self.banned.size:
            x[self.banned] = -np.inf
        # float32 overflow to +-inf (huge logits or penalties) is taken as it comes, as
        # llama.cpp's float math takes it; what it leads to is settled below, without warnings
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            apply_penalties(x, self.history, p.repeat_penalty, p.frequency_penalty,
                            p.presence_penalty)
            x[np.isnan(x)] = -np.inf     # a NaN never wins, and never poisons the softmax
            if not (x > -np.inf).any():
                raise ValueError("sample: no token can be drawn: every logit is NaN or -inf "
                                 "(damaged weights, K/V values beyond an F16 KV cache's range, "
                                 "penalties that push every token to -inf, or every token "
                                 "banned)")
            if p.greedy:
                return int(np.argmax(x))
            if x.max() == np.inf:        # +inf logits: the draw is among them alone, evenly
                x = np.where(x == np.inf, np.float32(0), np.float32(-np.inf))
            ids, x = top_k(np.arange(len(x)), x, p.top_k)
            ids, x = top_p(ids, x, p.top_p)
            ids, x = min_p(ids, x, p.min_p)
            scaled = x / np.float32(p.temperature)
        if not np.isfinite(scaled[0]):   # a temperature so small that the highest logit
            # overflows, or that is 0 in float32 (x is sorted): greedy, ties drawn evenly
            scaled = np.where(x == x[0], np.float32(0), np.float32(-np.inf))
        scaled[np.isnan(scaled)] = -np.inf     # -inf / inf (temperature inf): never drawn
        return int(ids[draw(scaled, self.rng)])
