"""Counters of a Llama's work, printed as llama.cpp prints its timings."""
import time
from dataclasses import dataclass, field


@dataclass
class Timings:
    """Counters like llama.cpp's perf print (seconds, tokens).

    prompt: a prompt's evaluations (generate's, an eval() of several tokens);
    eval: those of one generated token (an eval() of one). Building a graph for a
    new batch shape (once per shape: llama.cpp has no such one-off cost after its
    warm-up) is kept out of both and counted in build_s. start: when the model was loaded; total time is the wall
    time from then to the print, as llama.cpp's (which excludes the load too).
    clock: what every time here is read from (seconds; time.perf_counter, or a fake
    one a test steps by hand); start defaults to its reading when the Timings is made.
    """
    load_s: float = 0.0
    prompt_s: float = 0.0
    prompt_tokens: int = 0
    eval_s: float = 0.0
    eval_tokens: int = 0
    sample_s: float = 0.0
    sample_runs: int = 0
    build_s: float = 0.0
    builds: int = 0
    context_shifts: int = 0       # times generate dropped old tokens to go on
    start: float = None
    clock: object = field(default=time.perf_counter, repr=False, compare=False)

    def __post_init__(self):
        if self.start is None:
            self.start = self.clock()

    def lines(self):
        """llama.cpp-style timing lines, and the graph-build line."""
        def rate(label, seconds, n, unit):
            ms = 1e3 * seconds
            per = ms / n if n else 0.0
            tps = n / seconds if seconds > 0 else 0.0
            return (f"{label} = {ms:10.2f} ms / {n:5d} {unit:<6} ({per:8.2f} ms per token, "
                    f"{tps:8.2f} tokens per second)")
        total = self.clock() - self.start
        return [
            rate("   sampling time", self.sample_s, self.sample_runs, "runs"),
            f"       load time = {1e3 * self.load_s:10.2f} ms",
            rate("prompt eval time", self.prompt_s, self.prompt_tokens, "tokens"),
            rate("       eval time", self.eval_s, self.eval_tokens, "runs"),
            f"graph build time = {1e3 * self.build_s:10.2f} ms / {self.builds:5d} graphs",
            *([f"  context shifts = {self.context_shifts:10d}"] if self.context_shifts else []),
            f"      total time = {1e3 * total:10.2f} ms / "
            f"{self.prompt_tokens + self.eval_tokens:5d} tokens",
        ]

    def count(self, n_tokens, seconds, build_s, builds, prompt):
        """Add one evaluation of n_tokens (a prompt's, or a generated token's) that took
        `seconds`, `build_s` of them building `builds` graphs."""
        self.build_s += build_s
        self.builds += builds
        if prompt:
            self.prompt_s += seconds - build_s
            self.prompt_tokens += n_tokens
        else:
            self.eval_s += seconds - build_s
            self.eval_tokens += n_tokens
