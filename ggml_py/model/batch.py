"""Many sequences at once: a step scheduler over the paged KV cache.

    b = llm.batch()
    a = b.add("ROMEO.", max_tokens=32, temperature=0)
    c = b.add("JULIET.", max_tokens=32, seed=1)
    while b.running:
        for sid, piece in b.step():
            print(sid, piece)

Each step is one forward pass over the tokens of every running sequence, put one
after another in R rows without padding: one token for a sequence that is generating,
a chunk of its prompt for one that is reading (both mix in a step). Every token carries
its own position; the attention op reads each token's own sequence's slots only (the
slot lists in kv_index), so a sequence's logits do not depend on the others - with
`invariant` (the default) bitwise, as every product takes profiles whose rows do not
depend on the other rows (llama.pin_row_invariant).

Sequences wait when n_seq_max are running or the pool has no room for their prompt.
When the pool fills during a step the youngest running sequence is preempted: its
pages go back and it waits to be read again (prompt and generated tokens), which gives
the same tokens as if it had gone on (its sampler goes on where it was).

With share_prefix (the default), a sequence starts on the pool's pages that already
hold its first tokens (kv_paged.py: a prompt's common beginning is read once and held
once) and names the pages it fills for the next ones.
"""
import bisect
import weakref
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ggml_py.core.types import checked_int
from ggml_py.model.context_shift import (check_shift_context, discard_count, kept_count,
                                         rope_rotation)
from ggml_py.model.kv_paged import KVPoolFull
from ggml_py.model.sampling import Sampler, SamplingParams
from ggml_py.model.stops import StopFilter, stop_strings

KV_INDEX_BUCKET = 256    # slot lists are padded to a multiple of this: fewer graph shapes


@dataclass(eq=False)
class Sequence:
    """One sequence of a Batch: what it was asked and what it has produced."""
    id: int
    prompt_tokens: list
    max_tokens: int                  # -1: until end-of-generation or the context is full
    logprobs_n: int | None           # None: no log-probabilities kept
    tokens: list = field(default_factory=list)     # generated ids
    text: str = ""                   # generated text (up to a stop string)
    finish_reason: str | None = None  # "stop", "length", "cancelled"
    logprobs: list = field(default_factory=list)   # (id, logprob, [(id, logprob)] top-n)
    # where each generated token's text begins in the text decoded before a stop string
    # cut it (a prefix of that text is `text`)
    token_starts: list = field(default_factory=list)
    n_decoded: int = 0
    cache_salt: str | None = None    # shares KV pages only with sequences of the same salt
    started: bool = False            # admitted once (a preempted one is read again)
    # the scheduler's state
    ids: list = field(default_factory=list)        # every token to be in the cache, in order
    n_cached: int = 0                # ids[:n_cached] are in the cache
    n_kept: int = 0                  # context shifts keep this many first tokens
    sampler: Sampler = None
    decoder: object = None
    stop: StopFilter = None

    @property
    def done(self):
        """True once the sequence has finished (finish_reason says why)."""
        return self.finish_reason is not None

    def tokens_within(self, n_chars):
        """How many generated tokens begin within the first n_chars characters of the
        text: those a text of that length shows (a stop string's tokens past it, none)."""
        return bisect.bisect_left(self.token_starts, n_chars)


class Batch:
    """The step scheduler of a Llama (made by llm.batch()): add, step, cancel."""

    def __init__(self, llm, n_seq_max, n_batch, n_ctx_seq=None, keep=0, context_shift=True,
                 invariant=True, share_prefix=True):
        self.llm, self.model, self.tokenizer = llm, llm.model, llm.tokenizer
        self.cache = llm.kv_pool()
        self.n_seq_max, self.n_batch = n_seq_max, n_batch
        # (the pool holds whole pages, n_ctx rounded up: a sequence gets n_ctx at most, as
        # generate does; a shift needs a token past the kept ones to drop)
        n_ctx = llm.n_ctx()
        self.n_ctx_seq = checked_int("n_ctx_seq", n_ctx if n_ctx_seq is None else n_ctx_seq,
                                     low=2, high=n_ctx)
        if context_shift:
            check_shift_context(self.n_ctx_seq, "a sequence's context (n_ctx_seq)")
        self.keep = checked_int("keep", keep, low=-1, high=self.n_ctx_seq // 2)
        self.context_shift, self.invariant = bool(context_shift), bool(invariant)
        self.share_prefix = bool(share_prefix)
        self._rerope = rope_rotation(self.model.config, _array(self.model.weights.rope_freqs))
        self._running, self._waiting = [], deque()     # Sequences, in the order they started
        self._all = {}
        # a batch dropped unclosed gives its pages back (the pool is the Llama's: another
        # batch would wait for them for ever), at the next step of any batch
        weakref.finalize(self, _release, self.cache.released, self._running, self._waiting)
        self.n_steps, self.step_rows = 0, []    # steps run and their R (for the bench)
        self.n_shared_tokens = 0     # prompt tokens found in others' pages (not computed)

    # ---- the interface ------------------------------------------------------------

    @property
    def running(self):
        """Sequences added and not finished (running and waiting)."""
        return len(self._running) + len(self._waiting)

    @property
    def waiting(self):
        """Sequences waiting for room (n_seq_max running, or no pages for their prompt)."""
        return len(self._waiting)

    def add(self, prompt, max_tokens=16, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05,
            repeat_penalty=1.0, repeat_last_n=64, seed=None, stop=None, add_bos=True,
            ignore_eos=False, frequency_penalty=0.0, presence_penalty=0.0, logprobs=None,
            cache_salt=None):
        """Queue a sequence: prompt (text, or token ids) and its own sampling settings
        (as Llama.generate's). Returns its id. ValueError for an empty prompt or one
        that does not fit a sequence's context (both counts named). cache_salt (a
        string): its KV pages are shared only with sequences given the same salt (one
        user's requests, say: another cannot learn from timings what they hold)."""
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise TypeError(f"cache_salt must be a string, got {type(cache_salt).__name__}")
        ids = self.llm._input_ids(prompt, add_bos, special=True)   # as generate reads it
        if not ids:
            raise ValueError("the prompt is empty")
        self.llm._check_vocab(ids)
        if len(ids) >= self.n_ctx_seq:
            raise ValueError(f"the prompt has {len(ids)} tokens, a sequence's context "
                             f"{self.n_ctx_seq}")
        max_tokens = -1 if max_tokens is None else checked_int("max_tokens", max_tokens)
        if logprobs is not None:
            logprobs = checked_int("logprobs", logprobs, low=0, high=self.model.config.n_vocab)
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                frequency_penalty=frequency_penalty,
                                presence_penalty=presence_penalty, seed=seed)
        banned = sorted(self.tokenizer.eog_ids) if ignore_eos else ()
        n_kept = kept_count(ids, self.keep, self.tokenizer.bos_id, self.n_ctx_seq)
        s = Sequence(next(self.llm._sequence_ids), list(ids), max_tokens, logprobs, ids=list(ids),
                     n_kept=n_kept, sampler=Sampler(params, banned=banned),
                     decoder=self.tokenizer.decoder(strip_leading_space=False),
                     stop=StopFilter(stop_strings(stop)), cache_salt=cache_salt)
        s.sampler.accept_all(ids)
        self._all[s.id] = s
        self._waiting.append(s)
        return s.id

    def sequence(self, sid):
        """The Sequence of id sid (KeyError for one never added or forgotten)."""
        if sid not in self._all:
            raise KeyError(f"no sequence {sid!r} in this batch (never added, or forgotten)")
        return self._all[sid]

    def forget(self, sid):
        """Drop a finished sequence's record (ValueError while it runs)."""
        if not self.sequence(sid).done:
            raise ValueError(f"sequence {sid} is still running: cancel it first")
        del self._all[sid]

    def cancel(self, sid):
        """Stop sequence sid now (finish_reason "cancelled"); its pages return to the pool."""
        s = self.sequence(sid)
        if not s.done:
            self._finish(s, "cancelled")

    def close(self):
        """Cancel every sequence: all pages return to the pool."""
        for s in list(self._running) + list(self._waiting):
            self._finish(s, "cancelled")

    def step(self):
        """One forward step for every running sequence: a list of (sid, piece) - the
        text each generating sequence added (may be ""); a sequence that finished this
        step appears once more with its last text ([] for a step that only read
        prompts). Nothing runs (n_steps unchanged) when no sequence is left, or while
        the sequences wait for pages another batch of this Llama holds."""
        with self.llm._turn("step"):     # the graphs' buffers are the Llama's
            self.cache.free_released()
            self._admit()
            plan = self._plan()
            if not plan:
                return []
            events = {}
            for s, logits_row in self._run(plan):
                self._sample(s, logits_row, events)
        return list(events.items())

    # ---- scheduling ---------------------------------------------------------------

    def _admit(self):
        """Start waiting sequences, oldest first, while there is room for their prompt."""
        while self._waiting and len(self._running) < self.n_seq_max:
            s = self._waiting[0]
            shared = 0
            if self.share_prefix and s.n_cached == 0:
                if self._reading_its_prefix(s):
                    break                 # a step later it takes those pages instead
                shared = s.n_cached = self.cache.attach_prefix(s.id, s.ids, self._namespace(s))
            if self.cache.pages_needed(s.id, len(s.ids) - s.n_cached) > self.cache.pages_free:
                self.cache.free(s.id)
                s.n_cached = 0
                break
            if not s.started:              # (read again, it finds its own pages: not counted)
                self.n_shared_tokens += shared
            s.started = True
            self._waiting.popleft()
            self._running.append(s)

    def _namespace(self, s):
        """Where s's rows are named: invariant batches share among themselves only (the
        others' products round with the step's shape), only rows computed under the same
        plans (a new thread count or tune data may round otherwise), and within s's salt."""
        return (self.invariant, self.model.replans, s.cache_salt)

    def _reading_its_prefix(self, s):
        """True while a running sequence has yet to write whole pages that s's tokens
        begin with (prompts admitted together: the first reads them, the others wait a
        step or two and share its pages)."""
        page, moved = self.cache.page_size, self.cache.moved
        last = (len(s.ids) - 1) // page * page      # s computes its last token itself
        for r in self._running:
            if r.cache_salt != s.cache_salt:
                continue                  # (it would not share them)
            common = 0
            while common < last and r.ids[common:common + page] == s.ids[common:common + page]:
                common += page
            if common and r.n_cached < common and r.id not in moved:
                return True
        return False

    def _plan(self):
        """[(sequence, n tokens to feed)]: one token for each generating sequence, then
        prompt chunks, at most n_batch tokens in all; pages reserved for them."""
        plan, budget = [], self.n_batch
        generating = [s for s in self._running if len(s.ids) - s.n_cached == 1]
        reading = [s for s in self._running if len(s.ids) - s.n_cached > 1]
        for s in generating + reading:
            if budget == 0:
                break
            if s not in self._running:        # preempted while planning this step
                continue
            # as generate: a token that would take the context's last slot shifts it first
            if s.n_cached + 1 >= self.n_ctx_seq and not self._shift(s, plan):
                continue
            n = min(len(s.ids) - s.n_cached, budget)
            if not self._reserve(s, n, plan):
                continue
            plan.append((s, n))
            budget -= n
        return plan

    def _reserve(self, s, n, plan):
        """Pages for n more tokens of s, preempting the youngest other sequences not in
        this step's plan when the pool is full; False when s itself had to wait."""
        while True:
            try:
                self.cache.reserve(s.id, n)
                return True
            except KVPoolFull:
                victims = self._victims(s, plan)
                self._preempt(victims[0] if victims else s)
                if not victims:
                    return False

    def _victims(self, s, plan):
        """The running sequences other than s and not in this step's plan, youngest first."""
        planned = {p.id for p, _ in plan}
        return [v for v in reversed(self._running) if v is not s and v.id not in planned]

    def _preempt(self, s):
        """Give back s's pages; it waits (first in line) to be read again. One that was
        due to shift its context is read again shifted (its kept rows computed afresh at
        their new positions, not rotated: they may round differently)."""
        if len(s.ids) >= self.n_ctx_seq and self.context_shift:
            del s.ids[s.n_kept:s.n_kept + discard_count(len(s.ids) - 1, s.n_kept)]
        self.cache.free(s.id)
        s.n_cached = 0
        self._running.remove(s)
        self._waiting.appendleft(s)

    def _shift(self, s, plan):
        """Make room in s's own context: drop half of its tokens after the kept ones
        (llama.cpp's context shift); False when it may not shift (s finished), or when
        the pool has no room for the shared pages it must copy first and no sequence
        outside this step's plan to preempt (s waits)."""
        if not self.context_shift:
            self._finish(s, "length")
            return False
        n_discard = discard_count(s.n_cached, s.n_kept)
        while True:
            try:
                self.cache.shift(s.id, s.n_kept, n_discard, self._rerope)
                break
            except KVPoolFull:
                victims = self._victims(s, plan)
                if not victims:
                    return False          # it stays, unfed, until the pages' holders move on
                self._preempt(victims[0])
        del s.ids[s.n_kept:s.n_kept + n_discard]
        s.n_cached -= n_discard
        return True

    def _run(self, plan):
        """Write the step's inputs, run its graph: [(sequence, its logits row)] for the
        sequences whose last token was fed."""
        R = sum(n for _, n in plan)
        lists = [self.cache.slots(s.id, 0, s.n_cached + n) for s, n in plan]
        N = sum(len(x) for x in lists)
        wanted = [i for i, (s, n) in enumerate(plan) if s.n_cached + n == len(s.ids)]
        n_out = max(1, len(wanted))
        g = self.model.step_graph(self.cache, R, -(-N // KV_INDEX_BUCKET) * KV_INDEX_BUCKET,
                                  n_out, self.invariant)
        row, start = 0, 2 * R
        out_rows = []
        for (s, n), slots in zip(plan, lists):
            rows = slice(row, row + n)
            g.tokens[rows] = s.ids[s.n_cached:s.n_cached + n]
            g.positions[rows] = np.arange(s.n_cached, s.n_cached + n)
            g.slots[rows] = slots[s.n_cached:]
            g.kv_index[start:start + len(slots)] = slots
            pairs = g.kv_index[2 * row:2 * (row + n)].reshape(n, 2)
            pairs[:, 0] = start
            pairs[:, 1] = np.arange(s.n_cached + 1, s.n_cached + n + 1)   # causal
            start += len(slots)
            row += n
            out_rows.append(row - 1)
        g.out_rows[:] = [out_rows[i] for i in wanted] if wanted else [R - 1]
        logits = self.model.run_step(g)
        for s, n in plan:
            self.cache.advance(s.id, n, s.ids if self.share_prefix else None, self._namespace(s))
            s.n_cached += n
        self.n_steps += 1
        self.step_rows.append(R)
        return [(plan[i][0], logits[j]) for j, i in enumerate(wanted)]

    # ---- sampling -----------------------------------------------------------------

    def _sample(self, s, logits, events):
        """Choose s's next token from its logits row; record its text and whether it ends."""
        if s.max_tokens == 0:              # as generate: the prompt read, nothing generated
            events[s.id] = ""
            self._finish(s, "length")
            return
        token = s.sampler.sample(logits)
        s.sampler.accept(token)
        if self.tokenizer.is_eog(token):   # not a token of the output: no logprobs entry
            events[s.id] = s.stop.feed(s.decoder.flush()) + s.stop.flush()
            s.text += events[s.id]
            self._cut_logprobs(s)
            self._finish(s, "stop")
            return
        s.tokens.append(token)
        s.ids.append(token)
        if s.logprobs_n is not None:
            s.logprobs.append(_logprobs(logits, token, s.logprobs_n))
        s.token_starts.append(s.n_decoded)
        decoded = s.decoder.feed(token)
        s.n_decoded += len(decoded)
        text = s.stop.feed(decoded)
        if s.stop.stopped:
            s.text += text
            events[s.id] = text
            self._cut_logprobs(s)
            self._finish(s, "stop")
            return
        full = s.max_tokens >= 0 and len(s.tokens) >= s.max_tokens
        # as generate: a token that would take the last slot is the last one, unless the
        # sequence shifts its context to go on
        no_room = s.n_cached + 1 >= self.n_ctx_seq and not self.context_shift
        s.text += text
        if full or no_room:
            end = s.stop.feed(s.decoder.flush()) + s.stop.flush()
            s.text += end
            text += end
            self._cut_logprobs(s)
            self._finish(s, "stop" if s.stop.cut else "length")
        events[s.id] = text

    def _cut_logprobs(self, s):
        """Where a stop string cut s's text: no entries for the tokens that begin past it."""
        if s.stop.cut:
            del s.logprobs[s.tokens_within(len(s.text)):]

    def _finish(self, s, reason):
        s.finish_reason = reason
        self.cache.free(s.id)
        if s in self._running:
            self._running.remove(s)
        elif s in self._waiting:
            self._waiting.remove(s)


def _release(released, *queues):
    """Queue the ids of a dropped batch's unfinished sequences for the pool to free."""
    released.extend(s.id for queue in queues for s in queue)


def _logprobs(logits, token, n):
    """(token, its log-probability, the top n as [(id, logprob)]) of a logits row."""
    x = np.asarray(logits, np.float64)
    lse = x.max() + np.log(np.exp(x - x.max()).sum())
    top = np.argsort(-x, kind="stable")[:n]
    return int(token), float(x[token] - lse), [(int(i), float(x[i] - lse)) for i in top]


def _array(weight):
    """A weight's values as a numpy array (None stays None)."""
    return None if weight is None else np.asarray(weight.data, np.float32)
