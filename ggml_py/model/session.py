"""`Llama`: the Python API of a loaded model (names follow llama-cpp-python).

    llm = gg.Llama("model.gguf", n_ctx=2048, n_threads=2)
    ids = llm.tokenize("ROMEO.")                  # BOS added as the vocabulary asks
    logits = llm.eval(ids)                        # (len(ids), n_vocab), continues the sequence
    for piece in llm.generate("ROMEO.", max_tokens=64, temperature=0.8, seed=1):
        print(piece, end="", flush=True)
    result = llm.perplexity(text, n_ctx=256)      # result.ppl, result.error
"""
import contextlib
import gc
import itertools
import os
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Mapping, Set

import numpy as np

from ggml_py.core.graph import MAX_THREADS
from ggml_py.files.gguf_reader import GGUFModelFile
from ggml_py.model.batch import Batch
from ggml_py.model.context_shift import (check_shift_context, discard_count, kept_count,
                                         rope_rotation)
from ggml_py.model.kv_paged import PAGE_SIZE, KVPoolFull, PagedKVCache
from ggml_py.model import kv_rows
from ggml_py.model.llama import (KV_PAD, LlamaModel, check_attention, check_attention_cache,
                                 default_cache)
from ggml_py.model.weights import matrix_shapes
from ggml_py.model.sampling import Sampler, SamplingParams
from ggml_py.model.stops import stop_strings, until_stop
from ggml_py.model.timings import Timings
from ggml_py.tokenizer.tokenizer import Tokenizer
from ggml_py.core.types import checked_int

DEFAULT_SEQ_MAX = 8       # sequences a batch runs at once
TEXT_TYPES = (str, bytes, bytearray, memoryview)   # what tokenize() takes; anything else is ids
# exact types whose values numpy holds as integers (bool is not one: True is no token id)
INT_TYPES = frozenset({int} | {np.dtype(c).type for c in np.typecodes["AllInteger"]})


def token_ids(tokens):
    """tokens (integers: int or numpy integer types) as a list of ints; TypeError otherwise.

    An integer numpy array or a list of ints is converted in one pass (perplexity hands
    whole files through here); anything else is checked id by id.
    """
    if isinstance(tokens, TEXT_TYPES):
        raise TypeError(f"expected token ids, got {type(tokens).__name__}")
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1:
            raise TypeError(f"expected a 1-D array of token ids, got {tokens.ndim}-D")
        if tokens.dtype.kind in "iu":
            return tokens.tolist()
    # (a sequence may iterate by __getitem__ and __len__ alone, as a ctypes array; a
    # ctypes pointer, an endless __getitem__ without a length, must not be walked)
    kind = type(tokens)
    sequence = hasattr(kind, "__getitem__") and hasattr(kind, "__len__")
    ordered = (isinstance(tokens, Iterable) or sequence) and not isinstance(tokens, (Set, Mapping))
    if not ordered:
        raise TypeError(f"expected token ids in order (a list, tuple or 1-D integer array), "
                        f"got {type(tokens).__name__}")
    if not isinstance(tokens, Iterable):       # by index, as far as its length says
        tokens = [tokens[i] for i in range(len(tokens))]
    if isinstance(tokens, (list, tuple)):
        types = set(map(type, tokens))
        if types <= {int}:
            return list(tokens)
        if types <= INT_TYPES:
            ids = np.asarray(tokens)
            if ids.dtype.kind in "iu":      # not object (an int past 64 bits) or float
                return ids.tolist()
    return [checked_int("token id", t) for t in tokens]


class _CutByFork:
    """A Llama's lock in a fork child when another thread of the parent held it: that
    thread's call stopped half-way here (the cache may hold half a batch), so every
    call refuses instead of waiting forever on a lock nobody will release."""

    def __enter__(self):
        raise RuntimeError("this Llama was in use by another thread when the process forked: "
                           "its sequence is unknown in the child; load the model again here")

    def __exit__(self, *exc):
        return False


class _Closed:
    """What a closed Llama holds in place of its model and its lock: any use raises."""

    def __getattr__(self, name):
        raise RuntimeError("this Llama is closed")

    def __enter__(self):
        raise RuntimeError("this Llama is closed")

    def __exit__(self, *exc):
        return False


_live_llamas = weakref.WeakSet()


def _after_fork_in_child():
    for llm in list(_live_llamas):
        if isinstance(llm._lock, (_CutByFork, _Closed)):      # cut at an earlier fork, or closed
            continue
        if llm._lock.acquire(blocking=False):    # free, or held by the thread that forked
            llm._lock.release()
        else:
            llm._lock = _CutByFork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class TrainingContextWarning(UserWarning):
    """A context longer than the model's training context (allowed, as in llama.cpp)."""


class Llama:
    """A llama-architecture GGUF model, ready to tokenize, evaluate and generate.

    model_path: a llama GGUF file, str, bytes or path (default: the bundled Shakespeare model),
    or a GGUFModelFile already open (use_mmap is then the file's).
    n_ctx: KV cache size in tokens (None: 2048, or the model's training context when that
    is smaller, as the programs' default; 0: the model's training context).
    n_batch: most tokens evaluated in one graph (longer inputs are split).
    kv_type: the KV cache type of K: 'f16' (default), 'f32', 'q8_0', 'q4_0' or 'int8' (int8
    with one scale per token and head); kv_type_v: V's (None: as K). docs/attention.md.
    attention: 'auto' (default), 'graph' (three nodes, F16/F32 caches; the single sequence
    only), 'slim' or 'flash' (the attention op with that profile).
    n_threads: 1..256 (None: the physical cores).
    kv_pad: the attention window grows in steps of this many slots.
    make_cache: builds the KV cache, make_cache(config, n_ctx, kv_type) (with kv_type_v
    too when it differs) (None: a KVCache; see ggml_py/model/kv_cache.py for the members
    the model uses).
    n_seq_max: most sequences a batch() runs at once (more wait); its pages come from a
    pool of n_ctx tokens, allocated at the first batch() (docs/batching.md).
    use_mmap: map the file's weights (the default, as llama.cpp); False reads the whole
    file into memory, so that changing the file later does not reach the model (mapped,
    a file changed in place makes the next evaluation raise ModelLoadError).
    repack: also hold each Q4_0, Q4_K, Q5_K and Q6_K matrix with its rows interleaved by
    eight, the layout the SIMD kernels read fastest (the default, as llama.cpp repacks at
    load; a mapped file's pages of them are let go); False keeps the file's layout: no copy
    at load, slower decoding.
    clock: what the timings are read from, a function returning seconds (default
    time.perf_counter; tests give one they step by hand).
    Raises ModelLoadError (a ValueError) naming the file if it cannot be used, and
    ValueError / TypeError naming the argument for a bad one. A context longer than the
    model's training context is allowed with a TrainingContextWarning (a UserWarning),
    as llama.cpp warns.
    """

    _init_frames = 0   # __init__s of subclasses between the caller and this one's warnings

    def __init__(self, model_path=None, n_ctx=None, n_threads=None, n_batch=512, kv_type="f16",
                 kv_pad=KV_PAD, make_cache=None, use_mmap=True, n_seq_max=DEFAULT_SEQ_MAX,
                 clock=time.perf_counter, kv_type_v=None, attention="auto", repack=True):
        if not callable(clock):
            raise TypeError(f"Llama: clock must be callable () -> seconds, got "
                            f"{type(clock).__name__}")
        t0 = clock()
        self._n_seq_max = checked_int("n_seq_max", n_seq_max, low=1)
        kv_type = kv_rows.kv_type(kv_type, "Llama: kv_type")
        kv_type_v = kv_type if kv_type_v is None else kv_rows.kv_type(kv_type_v, "Llama: kv_type_v")
        check_attention(attention, "Llama")
        check_attention_cache(attention, kv_type, kv_type_v)   # (before the file is read)
        if make_cache is not None and not callable(make_cache):
            raise TypeError(f"Llama: make_cache must be callable (config, n_ctx, kv_type) -> "
                            f"cache, got {type(make_cache).__name__}")
        n_ctx = None if n_ctx is None else checked_int("n_ctx", n_ctx, low=0)
        n_batch = checked_int("n_batch", n_batch, low=1)
        kv_pad = checked_int("kv_pad", kv_pad, low=1)
        if n_threads is not None:
            n_threads = checked_int("n_threads", n_threads, low=1, high=MAX_THREADS)
        if model_path is None:
            from ggml_py.model.bundled import default_model_path
            model_path = default_model_path()
        self.model_path = model_path.path if isinstance(model_path, GGUFModelFile) else \
            os.fsdecode(model_path)
        self.model = self._make_model(model_path if isinstance(model_path, GGUFModelFile) else
                                      self.model_path, n_ctx=n_ctx, kv_type=kv_type,
                                      n_threads=n_threads, kv_pad=kv_pad,
                                      make_cache=make_cache or default_cache,
                                      use_mmap=bool(use_mmap), clock=clock, kv_type_v=kv_type_v,
                                      attention=attention, repack=bool(repack))
        self.tokenizer = Tokenizer.from_model_file(self.model.file)
        self.n_batch = n_batch
        self._kv_type, self._kv_type_v = kv_type, kv_type_v
        self._kv_pool = None      # the paged cache of batch(), made at its first use
        self._sequence_ids = itertools.count()   # ids of batches' sequences: one pool, no two alike
        self.shift_log = []       # (kept, dropped) of each context shift of the sequence, in order
        self.tokens = []          # the sequence whose K/V rows are in the cache
        self.changes = 0          # counts changes of the sequence: a paused generate checks it
        # (prompt ids, logits of its last token) of generate's last prompt, while the cache
        # holds its rows: the same prompt again starts from them (see _generate)
        self._prompt_logits = None
        # one call at a time reads or changes the sequence, the cache and the graphs'
        # buffers (Python threads sharing a Llama take turns; see _turn)
        self._lock = threading.RLock()
        self._in_turn = False     # a call holds the lock (a nested one is refused)
        _live_llamas.add(self)
        if self.n_ctx() > self.config.n_ctx_train:
            warnings.warn(f"n_ctx ({self.n_ctx()}) > n_ctx_train ({self.config.n_ctx_train}) "
                          f"-- possible training context overflow", TrainingContextWarning,
                          stacklevel=2 + self._init_frames)
        # its start: now, after the load
        self.timings = Timings(load_s=clock() - t0, clock=clock)

    def _make_model(self, path, **kwargs):
        """The LlamaModel this Llama runs (a process of a model split over several makes
        its share instead: ggml_py/dist)."""
        return LlamaModel(path, **kwargs)

    def close(self):
        """Let go of the model: its memory-mapped file, KV cache, graphs and buffers
        (freed once nothing else holds them, e.g. a weight's numpy view). Afterwards
        whatever needs the model raises RuntimeError (tokenize and detokenize still
        work); a call running in another thread is waited for. Closing again does
        nothing. `with gg.Llama(...) as llm:` closes at the end of the block."""
        lock = self._lock
        if isinstance(lock, _Closed):
            return
        with contextlib.nullcontext() if isinstance(lock, _CutByFork) else self._turn("close"):
            self.model = self._lock = _Closed()
            self._kv_pool = None
            self.tokens = []
            self._prompt_logits = None
            self.changes += 1
        _live_llamas.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @contextlib.contextmanager
    def _turn(self, what):
        """This Llama for one call: other threads wait for it; a call from inside it in
        this thread (a signal handler, or perplexity's callback, calling in) would change
        the sequence under it, and raises RuntimeError. (The lock is reentrant so that
        the nested call gets here to be refused, instead of waiting for itself.)"""
        with self._lock:
            if self._in_turn:
                raise RuntimeError(f"{what}: this Llama is in the middle of another call in "
                                   f"this thread (a signal handler or a callback called in); "
                                   f"use it after that call returns")
            self._in_turn = True
            try:
                yield
            finally:
                self._in_turn = False

    def __reduce_ex__(self, protocol):   # copy, deepcopy and pickle all come here
        raise TypeError("Llama cannot be copied or pickled: a copy would share its KV cache and "
                        "sequence with the original; load the model again instead")

    # ---- facts ------------------------------------------------------------------

    @property
    def config(self):
        """The model's LlamaConfig."""
        return self.model.config

    def n_ctx(self):
        """KV cache size in tokens."""
        return self.model.n_ctx

    def n_vocab(self):
        """Vocabulary size: the length of a logits row."""
        return self.config.n_vocab

    @property
    def n_tokens(self):
        """Tokens evaluated so far in the current sequence."""
        return len(self.tokens)

    def token_bos(self):
        """The beginning-of-sequence token id, or None if the vocabulary has none."""
        return self.tokenizer.bos_id

    def token_eos(self):
        """The end-of-sequence token id, or None if the vocabulary has none."""
        return self.tokenizer.eos_id

    def n_threads(self):
        """Threads a forward pass runs on."""
        return self.model.n_threads

    def set_tune(self, data):
        """Schedule MUL_MAT profiles with tune data: a TuneData, a tune-file path
        (str, bytes or os.PathLike; checked against this CPU, build and model), or None
        for ggml's rule. Anything else is a TypeError, and the schedule stays as it was."""
        if isinstance(data, (str, bytes, os.PathLike)):
            from ggml_py.tune import data as tune
            name, shapes = matrix_shapes(self.model.file)
            data = tune.load(os.fsdecode(data), model=name, shapes=shapes, n_threads=self.n_threads())
        with self._turn("set_tune"):   # the graphs are planned again: not under a running eval
            self.model.set_tune(data)

    # ---- text <-> ids -----------------------------------------------------------

    def tokenize(self, text, add_bos=True, special=False):
        """Token ids of text (str, or UTF-8 bytes / bytearray / memoryview); BOS if add_bos and the
        vocabulary adds it; special: control-token texts such as "<s>" become their ids."""
        if not isinstance(text, TEXT_TYPES):
            raise TypeError(f"text must be str, bytes, bytearray or memoryview, got "
                            f"{type(text).__name__}")
        if isinstance(text, memoryview):
            text = bytes(text)
        # bytes go through as they are: invalid UTF-8 is handled as llama.cpp handles it
        return self.tokenizer.tokenize(text, add_special=add_bos, parse_special=special)

    def _input_ids(self, text_or_ids, add_bos, special):
        """Token ids of a prompt or perplexity input: text is tokenized (special: control-token
        texts become their ids), ids are checked."""
        if isinstance(text_or_ids, TEXT_TYPES):
            return self.tokenize(text_or_ids, add_bos=add_bos, special=special)
        return token_ids(text_or_ids)

    def detokenize(self, tokens):
        """Text of token ids (control tokens such as BOS are not shown)."""
        return self.tokenizer.detokenize(tokens)

    # ---- evaluation ---------------------------------------------------------------

    def reset(self):
        """Start a new sequence (the cache is emptied)."""
        with self._turn("reset"):
            self._reset()

    def _reset(self):
        """reset, within a call that holds the Llama."""
        self.tokens = []
        self._prompt_logits = None
        self.model.cache.clear()
        self.changes += 1

    def eval(self, tokens):
        """Evaluate tokens (integer ids) after the current sequence; logits
        (len(tokens), n_vocab), a copy. Counted in timings."""
        tokens = token_ids(tokens)
        out = np.empty((len(tokens), self.n_vocab()), np.float32)
        with self._turn("eval"):
            self._timed_decode(tokens, prompt=len(tokens) > 1, out=out)
        return out

    def _timed_decode(self, tokens, prompt, **kwargs):
        """_decode, counted in timings as a prompt's or a generated token's (see Timings):
        the tokens it evaluated, so a refused call counts nothing and one stopped part-way
        (Ctrl-C: the whole batches run are kept) its batches run."""
        model, clock = self.model, self.timings.clock
        t0, build_s, builds, before = clock(), model.build_s, model.n_built, self.n_tokens
        try:
            return self._decode(tokens, **kwargs)
        finally:
            if self.n_tokens > before:
                self.timings.count(self.n_tokens - before, clock() - t0,
                                   model.build_s - build_s, model.n_built - builds, prompt)

    def _check_vocab(self, tokens):
        """ValueError unless every token id (a list of ints) is in 0..n_vocab - 1."""
        n_vocab = self.n_vocab()
        ids = np.asarray(tokens)     # one pass: perplexity checks whole files
        if ids.dtype.kind in "iu":
            if ids.min() >= 0 and ids.max() < n_vocab:
                return
            bad = tokens[int(np.flatnonzero((ids < 0) | (ids >= n_vocab))[0])]
        else:   # an id past 64 bits (object), or ints of both signs past int64 (float)
            bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
            if bad is None:
                return
        raise ValueError(f"token id {bad} is not in 0..{n_vocab - 1}")

    def _decode(self, tokens, out=None, first_output=0):
        """Run tokens through the model in n_batch pieces, appending them to the sequence.

        out: (len(tokens) - first_output, V) receives the logits of tokens from
        first_output on; without out only the last token's logits are computed,
        and returned (a view valid until the next call).
        """
        if not tokens:
            raise ValueError("no tokens to evaluate")
        self._check_vocab(tokens)    # all of them before any batch runs
        if self.n_tokens + len(tokens) > self.n_ctx():
            raise ValueError(f"{self.n_tokens} + {len(tokens)} tokens do not fit the context "
                             f"of {self.n_ctx()} tokens")
        cache = self.model.cache
        if cache.cut_by_fork or cache.n_past != self.n_tokens:
            # (the model used directly: forward in another thread at a fork, or its
            # cache cleared or filled behind this Llama's back)
            raise RuntimeError(f"the model's cache does not hold this Llama's sequence of "
                               f"{self.n_tokens} tokens; call reset() to start over")
        self.changes += 1
        logits = None
        for start in range(0, len(tokens), self.n_batch):
            batch = tokens[start:start + self.n_batch]
            end = start + len(batch)
            positions = np.arange(self.n_tokens, self.n_tokens + len(batch), dtype=np.int32)
            # rows of this batch whose logits are wanted: from first_output on, or the last
            lo = max(first_output - start, 0) if out is not None and end > first_output \
                else len(batch) - 1
            try:
                logits = self.model.forward(batch, positions, n_out=len(batch) - lo)
                self.tokens.extend(batch)
            except BaseException:   # (a signal handler's exception may come between the two)
                self.model.cache.truncate(self.n_tokens)   # drop rows a half-run batch wrote
                raise
            if out is not None and end > first_output:
                out[start + lo - first_output:end - first_output] = logits
        return logits[-1]

    # ---- generation ---------------------------------------------------------------

    def generate(self, prompt, max_tokens=16, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05,
                 repeat_penalty=1.0, repeat_last_n=64, seed=None, ignore_eos=False, add_bos=True,
                 frequency_penalty=0.0, presence_penalty=0.0, stop=None, context_shift=False,
                 keep=0):
        """The text pieces generated after prompt (text, or token ids), an iterator that
        produces them as they are generated; the arguments are checked now.

        Stops after max_tokens (None or < 0: until the end of the context), at an
        end-of-generation token unless ignore_eos, when the context is full, or where
        the text reaches one of the stop strings (a str or a list of them; the stop
        string and what follows are not produced, and text that may begin one is
        held back until it is known not to).
        temperature <= 0 is greedy; same seed, same text (None or -1: a random one).
        The penalties (repeat, frequency, presence) look back over the last
        repeat_last_n tokens, the prompt's included, as llama-cli's (-1: the whole context).
        context_shift, keep: see generate_tokens (go on past a full context).
        """
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                frequency_penalty=frequency_penalty,
                                presence_penalty=presence_penalty, seed=seed)
        stops = stop_strings(stop)
        pieces = self._pieces(self.generate_tokens(prompt, params, max_tokens, ignore_eos, add_bos,
                                                   context_shift, keep))
        return until_stop(pieces, stops) if stops else pieces

    def _pieces(self, tokens):
        """Text of the token ids, piece by piece (UTF-8 sequences split across tokens joined)."""
        decoder = self.tokenizer.decoder(strip_leading_space=False)
        for token in tokens:
            piece = decoder.feed(token)
            if piece:
                yield piece
        rest = decoder.flush()
        if rest:
            yield rest

    def generate_tokens(self, prompt, params=SamplingParams(), max_tokens=16, ignore_eos=False,
                        add_bos=True, context_shift=False, keep=0, yield_eog=False):
        """Generated token ids (see generate), an iterator. A text prompt's control-token
        texts ("<s>") are read as those tokens, as llama-cpp-python's create_completion and
        llama-cli read them (pass ids from tokenize(text) to keep them text). The prompt
        is checked now (ValueError if it is empty or does not fit the context) and evaluated on the
        first next(), reusing the cached prefix of the prompt. context_shift: when the
        context is full, drop half of the tokens after the first `keep` of the prompt
        (-1: all of it; a BOS is always kept) and go on, as llama-cli -n -1 does.
        yield_eog: the end-of-generation token that ends it is produced too, as the
        last one (not evaluated, nor counted in max_tokens); a chat keeps it in its
        history."""
        ids = self._input_ids(prompt, add_bos, special=True)   # as llama-cpp-python, llama-cli
        max_tokens = -1 if max_tokens is None else checked_int("max_tokens", max_tokens)
        if not ids:
            raise ValueError("the prompt is empty")
        self._check_vocab(ids)
        if len(ids) >= self.n_ctx():
            raise ValueError(f"the prompt has {len(ids)} tokens, the context {self.n_ctx()}")
        banned = sorted(self.tokenizer.eog_ids) if ignore_eos else ()   # as Batch.add
        sampler = Sampler(params, banned=banned)
        sampler.accept_all(ids)
        keep = checked_int("keep", keep, low=-1)
        if context_shift:
            check_shift_context(self.n_ctx(), "a context")
        n_kept = kept_count(ids, keep, self.token_bos(), self.n_ctx()) if context_shift else None
        return self._generate(ids, sampler, max_tokens, n_kept, yield_eog)

    def _generate(self, ids, sampler, max_tokens, n_kept=None, yield_eog=False):
        """Evaluate the prompt ids, then sample, yield and evaluate token by token."""
        with self._turn("generate"):      # one call at a time changes the sequence
            logits = self._prompt_again(ids)
            if logits is None:
                keep = self._common_prefix(ids)
                self.tokens = self.tokens[:keep]
                self.model.cache.truncate(keep)
                self._prompt_logits = None
                # a copy: the graph's buffer is the next call's (and kept: the sampler
                # reads logits, never writes them)
                logits = self._timed_decode(ids[keep:], prompt=True).copy()
                self._prompt_logits = (ids, logits)
            mine = self.changes

        n = 0
        clock = self.timings.clock
        while max_tokens < 0 or n < max_tokens:
            t0 = clock()
            token = sampler.sample(logits)
            sampler.accept(token)
            self.timings.sample_s += clock() - t0
            self.timings.sample_runs += 1
            if self.tokenizer.is_eog(token):
                if yield_eog:
                    yield token
                return
            yield token
            n += 1
            if 0 <= max_tokens <= n:
                return
            # as llama-cli and llama-cpp-python: a token that would take the last slot is the
            # last one (prompt and generated tokens together are at most n_ctx), unless the
            # context shifts
            full = self.n_tokens + 1 >= self.n_ctx()
            if full and n_kept is None:
                return
            with self._turn("generate"):
                if self.changes != mine:
                    raise RuntimeError("generate: this Llama's sequence was changed by another "
                                       "call (eval, generate, perplexity or reset) while the "
                                       "generator was paused; start a new generate")
                if full:
                    self._shift_context(n_kept)
                logits = self._timed_decode([token], prompt=False).copy()
                mine = self.changes

    def _shift_context(self, n_kept):
        """Drop half of the cached tokens after the first n_kept (llama.cpp's context
        shift): their K, V rows go, the later ones move down (keys rotated to match)."""
        n_discard = discard_count(self.n_tokens, n_kept)
        rerope = rope_rotation(self.config, None if self.model.weights.rope_freqs is None else
                               np.asarray(self.model.weights.rope_freqs.data, np.float32))
        self.model.cache.shift(n_kept, n_discard, rerope)
        del self.tokens[n_kept:n_kept + n_discard]
        self._prompt_logits = None
        self.changes += 1
        self.timings.context_shifts += 1
        self.shift_log.append((n_kept, n_discard))

    def shift_context(self, n_kept):
        """Shift the context now: drop half of the sequence's tokens after its first n_kept
        (their K, V rows go; the later ones move down, keys rotated to match), to make
        room for input (a conversation's next message). Returns (n_kept, dropped);
        ValueError when there is nothing after n_kept to drop."""
        n_kept = checked_int("n_kept", n_kept, low=0)
        with self._turn("shift_context"):
            if self.n_tokens <= n_kept + 1:
                raise ValueError(f"shift_context: {self.n_tokens} tokens, {n_kept} kept: "
                                 f"nothing to drop")
            self._shift_context(n_kept)
            return self.shift_log[-1]

    def _prompt_again(self, ids):
        """The logits of the last prompt's last token when ids is that prompt again and the
        cache still holds its rows (the sequence cut back to it), else None.

        Re-running only the last token would take another MUL_MAT profile than the whole
        prompt's batch took (BLAS from 32 tokens, activations rounded to Q8_0 below): logits
        that differ by more than rounding, and a text that differs for the same seed."""
        cache = self.model.cache
        if self._prompt_logits is None or self._prompt_logits[0] != ids \
                or self.tokens[:len(ids)] != ids \
                or cache.cut_by_fork or cache.n_past != self.n_tokens:   # (_decode says why)
            return None
        self.tokens = self.tokens[:len(ids)]
        self.model.cache.truncate(len(ids))
        self.changes += 1
        return self._prompt_logits[1].copy()

    def _common_prefix(self, ids):
        """Tokens of the cached sequence reusable for ids (the last id is always re-run)."""
        n = 0
        for a, b in zip(self.tokens, ids[:-1]):
            if a != b:
                break
            n += 1
        return n

    # ---- many sequences -------------------------------------------------------------

    def n_seq_max(self):
        """Most sequences a batch runs at once."""
        return self._n_seq_max

    def kv_pool(self):
        """The paged KV cache batches use (n_ctx tokens in pages), made on first use."""
        if self._kv_pool is None:
            c = self.config    # (a closed Llama raises here)
            self._kv_pool = PagedKVCache(c.n_layer, self.n_ctx(), c.n_head_kv, c.head_dim,
                                         type=self._kv_type, type_v=self._kv_type_v)
        return self._kv_pool

    def kv_pages_used(self):
        """Pages of the batch pool held by sequences (0 before the first batch)."""
        return 0 if self._kv_pool is None else self._kv_pool.pages_used

    def kv_pages_total(self):
        """Pages of the batch pool (n_ctx tokens in pages of PAGE_SIZE)."""
        return -(-self.n_ctx() // PAGE_SIZE)

    def batch(self, n_ctx_seq=None, keep=0, context_shift=True, invariant=True, share_prefix=True):
        """A step scheduler over many sequences (a Batch: add, step, cancel; see
        ggml_py/model/batch.py). n_ctx_seq: the most tokens one sequence holds (None:
        n_ctx); at its last slot a sequence drops half of its tokens after the first
        `keep` and goes on (context_shift), or ends ("length"). invariant: a sequence's
        logits are bitwise the same whatever else is in the batch (docs/batching.md).
        share_prefix: a sequence starts on the pool's pages that already hold its first
        tokens, and leaves the pages it fills for the next ones to share. Steps always
        run the attention op (attention="graph" takes auto's profiles there)."""
        return Batch(self, self._n_seq_max, self.n_batch, n_ctx_seq=n_ctx_seq, keep=keep,
                     context_shift=context_shift, invariant=invariant, share_prefix=share_prefix)

    def generate_batch(self, prompts, **kwargs):
        """The text generated for each prompt (a list of texts or token-id lists), all
        run together: for each, the text generate(prompt, same arguments) gives
        (docs/batching.md says when it is bitwise the same); keyword arguments as
        generate's (context_shift and keep included, off by default as there), and
        logprobs."""
        return [s.text for s in self._run_batch(prompts, kwargs)]

    def generate_batch_tokens(self, prompts, **kwargs):
        """As generate_batch, the generated token ids of each prompt."""
        return [s.tokens for s in self._run_batch(prompts, kwargs)]

    def _run_batch(self, prompts, kwargs):
        if isinstance(prompts, TEXT_TYPES) or not isinstance(prompts, (list, tuple)):
            raise TypeError(f"prompts must be a list of prompts, got {type(prompts).__name__}")
        if not prompts:
            raise ValueError("generate_batch: the list of prompts is empty")
        keep = checked_int("keep", kwargs.pop("keep", 0), low=-1)   # (as generate: at most
        b = self.batch(context_shift=kwargs.pop("context_shift", False),   # half the context)
                       keep=min(keep, self.n_ctx() // 2))
        try:
            sids = [b.add(p, **kwargs) for p in prompts]
            waited = False
            while b.running:
                n_steps = b.n_steps
                b.step()
                if b.running and b.n_steps == n_steps:
                    if waited:               # (they would wait for ever)
                        raise KVPoolFull(f"generate_batch: the KV pages its prompts need are "
                                         f"held by another batch of this Llama "
                                         f"({self.kv_pages_used()} of {self.kv_pages_total()} "
                                         f"in use): close it first")
                    gc.collect()             # a batch dropped in a cycle gives its pages back
                    waited = True
            return [b.sequence(sid) for sid in sids]
        finally:
            b.close()

    # ---- perplexity ---------------------------------------------------------------

    def perplexity(self, text, n_ctx=512, n_batch=None, n_chunks=-1, callback=None):
        """llama.cpp's perplexity of text (str, bytes, or token ids with BOS) with chunks
        of n_ctx tokens evaluated in batches of n_batch (None: this Llama's), at most
        n_chunks of them (negative: all); a PerplexityResult (see ggml_py.model.perplexity)."""
        from ggml_py.model.perplexity import perplexity
        return perplexity(self, text, n_ctx=n_ctx, n_batch=n_batch, n_chunks=n_chunks,
                          callback=callback)
