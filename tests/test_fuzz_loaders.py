"""Seeded fuzzing of the loaders: mutants of small GGUF models and of a tune file.

The property, for every mutant: loading either succeeds — and then the file keeps the
consistency rules of docs/llama.md and docs/tokenizer.md (checked here apart from the
loaders), the model tokenizes, decodes every token and runs a short forward pass, or the
tune data gives estimates and plans a product that computes right — or it raises the
loader's own error, `ModelLoadError` (`TokenizerError` is one) or `TuneFileError`, with a
one-line message that starts with the file's name. Never another exception, a crash or a
hang (one in Python ends the test after HANG_S seconds); warnings are one line each, and a
special token id past the vocabulary must give one.

The mutants (tests/fuzz_mutants.py): structured GGUF edits, random GGUF bytes, random
hyper-parameters with weights of their shapes, and tune file edits; each test's id names
the seed that makes its file again.

GGML_PY_FUZZ_COUNT mutants of each kind run: 150 by default (600 tests, under 10 s on
2 cores); `GGML_PY_FUZZ_COUNT=5000 pytest -m fuzz` is a long run. The variable is read here
only. A failing mutant's file is kept in pytest's temporary folder.
"""
import contextlib
import functools
import math
import os
import signal
import warnings

import numpy as np
import pytest

import ggml_py as gg
from fuzz_mutants import MUTANTS, base_parts, tune_base
from ggml_py.tune import data as tune
from ggml_py.files.gguf_metadata import read_gguf_metadata
from ggml_py.files.gguf_reader import ModelLoadError
from llama_models import gguf_bytes, scratch_path

pytestmark = pytest.mark.fuzz

COUNT = int(os.environ.get("GGML_PY_FUZZ_COUNT") or 150)
HANG_S = 30            # far above any one mutant's load and run (milliseconds)


# ---- the property ----------------------------------------------------------------------

class Hang(BaseException):
    """A mutant still loading after HANG_S (a BaseException: no loader may turn it into
    its own error)."""


@contextlib.contextmanager
def time_limit(what):
    """Raise Hang in the body once it has run HANG_S seconds (where SIGALRM exists)."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def alarm(signum, frame):
        raise Hang(f"{what}: still running after {HANG_S} s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def check_message(error, path):
    message = str(error)
    assert message.startswith(f"{path}: ") and "\n" not in message, repr(message)


def check_warnings(caught):
    for w in caught:
        assert issubclass(w.category, UserWarning) and "\n" not in str(w.message), w


SPECIAL_IDS = ("bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask", "fim_pre",
               "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep", "prefix", "suffix", "middle")


def broken_rules(meta):
    """The consistency rules of docs/llama.md and docs/tokenizer.md that metadata `meta`
    (of a file that loaded) breaks, and the special-id keys that must have warned:
    worked out here apart from the loaders, so that a check dropped from them shows."""
    broken, warned = [], []
    tokens = meta["tokenizer.ggml.tokens"]
    n_vocab = len(tokens)
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        if key in meta and len(meta[key]) != n_vocab:
            broken.append(f"{key}: {len(meta[key])} entries for {n_vocab} tokens")
    named = [t for t in tokens if t]             # (empty ones get unique names)
    if len(set(named)) != len(named):
        broken.append("a token text twice")
    if meta["tokenizer.ggml.model"] == "gpt2":
        broken += [f"merge {m!r}" for m in meta["tokenizer.ggml.merges"] if " " not in m[1:-1]]
    for name in SPECIAL_IDS:
        value = meta.get(f"tokenizer.ggml.{name}_token_id")
        if value is not None and value < 0:
            broken.append(f"{name}_token_id {value}")
        elif value is not None and value >= n_vocab:
            warned.append(f"tokenizer.ggml.{name}_token_id = {value} ")
    n_embd, n_head = meta["llama.embedding_length"], meta["llama.attention.head_count"]
    n_head_kv = meta.get("llama.attention.head_count_kv", n_head)
    head = meta.get("llama.attention.key_length", n_embd // n_head)
    if n_head % n_head_kv or head % 2 or meta.get("llama.rope.dimension_count", head) != head:
        broken.append(f"heads: {n_head} of {head}, {n_head_kv} for K and V")
    if meta.get("llama.attention.value_length", n_embd // n_head) != head:
        broken.append("value_length")
    if meta.get("llama.vocab_size", n_vocab) != n_vocab:
        broken.append(f"vocab_size {meta['llama.vocab_size']} for {n_vocab} tokens")
    return broken, warned


TEXT = b"Hi, <s>world</s>! \xe2\x96 caf\xc3\xa9 \xff 12345 <|endoftext|>"   # some not UTF-8


def run(llm):
    """Tokenize (special texts too), decode every token, and run a short forward pass."""
    tokenizer, n_vocab = llm.tokenizer, llm.n_vocab()
    ids = llm.tokenize(TEXT, special=True) + llm.tokenize(TEXT)
    for token_id in range(n_vocab):
        tokenizer.token_to_piece(token_id)
    decoder = tokenizer.decoder(remove_special=True)
    streamed = "".join(decoder.feed(i) for i in ids) + decoder.flush()
    assert streamed == tokenizer.detokenize(ids, remove_special=True), ids
    ids = ids[:6] or [0]
    assert llm.eval(ids).shape == (len(ids), n_vocab)


def check_model(path, what):
    """Load the GGUF file at path as gg.Llama does; if it loads, check it keeps the
    consistency rules, tokenize and run it. Returns 'ran' or 'refused'; anything else
    fails the test."""
    with warnings.catch_warnings(record=True) as caught, time_limit(what):
        warnings.simplefilter("always")
        try:
            llm = gg.Llama(path, n_ctx=8, n_threads=1, n_batch=8, kv_pad=8)
        except ModelLoadError as error:
            check_message(error, path)
            return "refused"
        with llm:
            run(llm)
    check_warnings(caught)
    broken, warned = broken_rules(read_gguf_metadata(path))
    assert not broken, f"loaded, but it breaks {broken}"
    messages = [str(w.message) for w in caught]
    assert all(any(key in m for m in messages) for key in warned), (warned, messages)
    return "ran"


def check_tune_file(path, what, check_system):
    """Load the tune file at path; if it loads, estimate at every benched shape and plan
    and compute a product with it. Returns 'ran' or 'refused'."""
    with warnings.catch_warnings(record=True) as caught, time_limit(what):
        warnings.simplefilter("always")
        try:
            data = tune.load(path, check_system=check_system)
        except tune.TuneFileError as error:
            check_message(error, path)
            return "refused"
        for s in data.shapes:
            for t in data.thread_counts:
                for m in (1, 3, 33, 10 ** 6):
                    times = [e for e, _ in data.estimates(s.n, s.k, s.type, m, t)]
                    assert all(math.isfinite(e) and e >= 0 for e in times), times
                    assert times == sorted(times), times
        plan_and_compute(data)
    check_warnings(caught)
    return "ran"


@functools.lru_cache(maxsize=None)
def _operands():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((64, 64), dtype=np.float32),
            rng.standard_normal((4, 64), dtype=np.float32))


def plan_and_compute(data):
    """A (64, 64) x (4, 64) product planned with data at 1 and 2 threads: a profile the
    node has, and the product numpy gives."""
    w, x = _operands()
    for n_threads in (1, 2):
        ctx = gg.Context(mem_size=1 << 20)
        y = gg.mul_mat(ctx.from_numpy(w), ctx.from_numpy(x))
        graph = gg.build_forward(y)
        row = graph.plan(n_threads, tune=data).rows[-1]
        assert row.profile in y.profiles(), row
        graph.compute(n_threads=n_threads)
        np.testing.assert_allclose(y.numpy(), x @ w.T, rtol=1e-4, atol=1e-4)


# ---- the tests -------------------------------------------------------------------------

def test_the_base_models_run():
    for name in ("spm", "bpe"):
        path = scratch_path(f"fuzz-{name}-check.gguf")
        with open(path, "wb") as f:
            f.write(gguf_bytes(*base_parts(name)))
        assert check_model(path, name) == "ran"


def test_the_base_tune_file_plans(tmp_path):
    path = tmp_path / "base.json"
    path.write_text(tune_base())
    assert check_tune_file(path, "base", check_system=True) == "ran"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def run_mutant(folder, kind, seed, check):
    """Write mutant seed of kind, check it, and remove it (kept when the check fails)."""
    made = MUTANTS[kind](seed)
    what, data = made[0], made[1]
    path = str(folder / f"{kind}-{seed}.{'json' if kind == 'tune' else 'gguf'}")
    with open(path, "wb") as f:
        f.write(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    try:
        check(path, f"{kind} {seed} ({what})", *made[2:])
    except Exception as error:
        raise AssertionError(f"{kind} mutant {seed} ({what}): {type(error).__name__}: "
                             f"{error}") from error
    os.unlink(path)


@pytest.mark.parametrize("seed", range(COUNT))
def test_gguf_structured_mutant(folder, seed):
    run_mutant(folder, "gguf", seed, check_model)


@pytest.mark.parametrize("seed", range(COUNT))
def test_gguf_byte_mutant(folder, seed):
    run_mutant(folder, "bytes", seed, check_model)


@pytest.mark.parametrize("seed", range(COUNT))
def test_hyper_parameter_mutant(folder, seed):
    run_mutant(folder, "shapes", seed, check_model)


@pytest.mark.parametrize("seed", range(COUNT))
def test_tune_mutant(folder, seed):
    run_mutant(folder, "tune", seed, check_tune_file)
