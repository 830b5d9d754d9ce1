"""Random operation sequences over a tiny paged KV pool with shared prefixes
(ggml_py/model/kv_paged.py), checked after every operation against a model of what each
sequence holds.

Rows are written as a model writes them: the K and V rows of position p are a function
of the sequence's namespace and its token ids 0..p, so a page found by its name must
hold exactly the rows the finder would have written itself. Token ids come from three
symbols and prompts often repeat an earlier one's beginning, so prefixes collide often.
A second pool stands for another rank of a split model: it receives the same writes
and carries out the row copies and moves the first one orders through `mirror`
(as ggml_py/dist/model.py does), so the two must hold the same rows.
"""
import functools
import pickle
import zlib

import numpy as np
import pytest

import ggml_py as gg
from ggml_py.model.kv_paged import KVPoolFull, PagedKVCache

PS, D, VOCAB = 4, 8, 3          # page size, row width (1 kv head of 8), token symbols
PROBE = "probe"


def no_rerope(rows, n):
    """The shift's K rotation, left out: moved rows keep their bits."""


def row_values(namespace, ids):
    """(k, v) rows (D,) float32 a model would write for the last of `ids` (a function
    of the whole prefix and the namespace it was computed in)."""
    return _row_values(namespace, tuple(ids))


@functools.cache
def _row_values(namespace, ids):
    h = zlib.crc32(bytes([namespace, *ids]))
    k = np.random.default_rng(h).standard_normal(D).astype(np.float32)
    return k, -k[::-1] + np.float32(len(ids))


class Seq:
    """What one sequence holds: its ids per position and the rows it expects there."""

    def __init__(self, ids, namespace, share):
        self.ids, self.namespace, self.share = list(ids), namespace, share
        self.k, self.v = [], []       # expected rows (D,) per position held
        self.moved = False


class Fuzz:
    """One pool, its mirror and the model of its sequences; every operation is checked."""

    def __init__(self, rng, n_pages, page_size):
        self.rng, self.n_pages, self.ps = rng, n_pages, page_size
        self.pool = PagedKVCache(1, n_pages * self.ps, 1, D, type=gg.F32, page_size=self.ps)
        self.other = PagedKVCache(1, n_pages * self.ps, 1, D, type=gg.F32, page_size=self.ps)
        self.pool.k[0][:] = self.pool.v[0][:] = np.nan      # a row never written equals nothing
        self.other.k[0][:] = self.other.v[0][:] = np.nan
        self.orders = []
        self.pool.mirror = self._order
        self.seqs = {}
        self.next_id = 0
        self.history = []             # earlier prompts, to start new ones alike
        self.log = []                 # the operations, to replay a failure
        self.counts = {}

    def _order(self, order, *args):
        # ggml_py/dist/model.py ShardModel.execute: what another rank does with them
        self.orders.append(order)
        if order == "pool_copy":
            self.other.copy_rows(*args)
        elif order == "pool_shift":
            self.other.move_rows(*args, no_rerope)
        else:
            raise AssertionError(f"unknown mirror order {order!r}")

    # ---- what the pool holds, through its public methods -------------------------

    def table(self, seq):
        """(seq's pages in position order, its slots): whole pages cover its positions."""
        n = self.pool.length(seq)
        if n == 0:                    # (a sequence not yet in the pool holds nothing)
            return [], np.zeros(0, np.int32)
        slots = self.pool.slots(seq, 0, -(-n // self.ps) * self.ps)
        return (slots[::self.ps] // self.ps).tolist(), slots[:n]

    def pages_of(self, seq):
        """seq's pages in position order."""
        return self.table(seq)[0]

    def snapshot(self):
        """Everything a refused operation must leave as it was."""
        return ({s: (self.pool.length(s), self.pages_of(s)) for s in self.seqs},
                self.pool.pages_free, self.pool.pages_idle, self.pool.moved,
                self.pool.k[0].tobytes(), self.pool.v[0].tobytes(), len(self.orders))

    def write(self, seq, start, stop):
        """Write seq's rows at positions start..stop-1, as a step does (both pools)."""
        s = self.seqs[seq]
        slots = self.pool.slots(seq, start, stop)
        # a held page is never written: none of these pages is another sequence's
        others = {p for o in self.seqs if o != seq for p in self.pages_of(o)}
        assert not {int(x) // self.ps for x in slots} & others, "writing a page another holds"
        for p, slot in zip(range(start, stop), slots):
            k, v = row_values(s.namespace, s.ids[:p + 1])
            for pool in (self.pool, self.other):
                pool.k[0][0, slot], pool.v[0][0, slot] = k, v
            s.k.append(k)
            s.v.append(v)

    def done(self, what, *args):
        """pool.what(*args): True, or False for a KVPoolFull, after which the cache must be
        as it was."""
        before = self.snapshot()
        try:
            getattr(self.pool, what)(*args)
            return True
        except KVPoolFull:
            assert self.snapshot() == before, f"{what}: KVPoolFull changed the cache"
            self.counts["refused"] = self.counts.get("refused", 0) + 1
            return False

    # ---- operations ----------------------------------------------------------------

    def new_prompt(self):
        """Token ids, often an earlier prompt's beginning (whole pages or not) and more."""
        rng, n = self.rng, int(self.rng.integers(1, 13))
        ids = [int(t) for t in rng.integers(0, VOCAB, n)]
        if self.history and rng.random() < 0.7:
            head = self.history[int(rng.integers(len(self.history)))]
            cut = int(rng.integers(0, len(head) + 1))
            if rng.random() < 0.5:
                cut -= cut % self.ps
            ids = head[:cut] + ids[:max(1, n - cut)]
        self.history.append(ids)
        return ids

    def op_add(self, n_seqs=1):
        """New sequences (two: prompts alike read side by side, as a batch's arrive)."""
        ids = self.new_prompt()
        added = []
        for i in range(n_seqs):
            seq, self.next_id = self.next_id, self.next_id + 1
            if i and self.rng.random() < 0.5:
                ids = self.new_prompt()
            namespace, share = int(self.rng.random() < 0.25), bool(self.rng.random() < 0.9)
            added.append((seq, ids, namespace, share))
        self.read(added)

    def op_add_pair(self):
        """Two sequences at once."""
        self.op_add(2)

    def read(self, added):
        """Sequences (seq, ids, namespace, share) start: each takes its shared pages,
        then their prompts are read in chunks, in turns drawn at random. One the pool
        has no room for is let go (it would wait, holding nothing)."""
        reading = []
        for seq, ids, namespace, share in added:
            self.log.append(("add", seq, list(ids), namespace, share))
            self.seqs[seq] = Seq(ids, namespace, share)
            held = 0
            if share:
                held = self.pool.attach_prefix(seq, ids, namespace)
                self.check_attached(seq, held)
                self.counts["shared tokens"] = self.counts.get("shared tokens", 0) + held
            reading.append(seq)
        while reading:
            seq = reading[int(self.rng.integers(len(reading)))]
            s = self.seqs[seq]
            held = len(s.k)
            n = min(len(s.ids) - held, int(self.rng.integers(1, 7)))
            if not self.done("reserve", seq, n):
                reading.remove(seq)
                self.op_free(seq)
                continue
            self.write(seq, held, held + n)
            self.pool.advance(seq, n, s.ids if s.share else None, s.namespace)
            if held + n == len(s.ids):
                reading.remove(seq)

    def check_attached(self, seq, held):
        """attach_prefix's answer: whole pages, a token left, the rows of seq's prefix."""
        s = self.seqs[seq]
        assert held % self.ps == 0 and held <= max(0, len(s.ids) - 1), \
            f"attach_prefix gave {held} of {len(s.ids)} tokens"
        assert self.pool.length(seq) == held
        slots = self.pool.slots(seq, 0, held)
        for p, slot in enumerate(slots):
            k, v = row_values(s.namespace, s.ids[:p + 1])
            assert np.array_equal(self.pool.k[0][0, slot], k), f"attached row {p} is not its prefix's"
            assert np.array_equal(self.pool.v[0][0, slot], v), f"attached row {p} is not its prefix's"
            s.k.append(k)
            s.v.append(v)

    def op_append(self, seq):
        """Generated tokens: reserve, write, advance."""
        s, n = self.seqs[seq], int(self.rng.integers(1, 5))
        new = [int(t) for t in self.rng.integers(0, VOCAB, n)]
        # often what an earlier prompt went on with: the pages it named are made again
        longer = [h for h in self.history if len(h) > len(s.ids) and h[:len(s.ids)] == s.ids]
        if longer and self.rng.random() < 0.5:
            new = longer[int(self.rng.integers(len(longer)))][len(s.ids):][:n]
            n = len(new)
        self.log.append(("append", seq, new))
        if not self.done("reserve", seq, n):
            return
        start = len(s.ids)
        s.ids += new
        self.write(seq, start, start + n)
        self.pool.advance(seq, n, s.ids if s.share else None, s.namespace)

    def op_shift(self, seq, keep=None, n_discard=None):
        """Drop positions keep..keep+n_discard-1: the later rows move down."""
        s = self.seqs[seq]
        n = len(s.ids)
        if n == 0:
            return
        if keep is None:
            keep = int(self.rng.integers(0, n))
            n_discard = int(self.rng.integers(1, n - keep + 1))
        self.log.append(("shift", seq, keep, n_discard))
        if not self.done("shift", seq, keep, n_discard, no_rerope):
            return
        drop = slice(keep, keep + n_discard)
        del s.ids[drop], s.k[drop], s.v[drop]
        s.moved = True

    def op_truncate(self, seq, n=None):
        """Forget positions >= n (often a page boundary)."""
        s = self.seqs[seq]
        if n is None:
            n = int(self.rng.integers(0, len(s.ids) + 2))
            if self.rng.random() < 0.5:
                n -= n % self.ps
        self.log.append(("truncate", seq, n))
        if not self.done("truncate", seq, n):
            return
        del s.ids[n:], s.k[n:], s.v[n:]

    def op_free(self, seq):
        """A sequence ends: its pages go back."""
        self.log.append(("free", seq))
        self.pool.free(seq)
        self.history.append(self.seqs.pop(seq).ids)     # (a later prompt may start so)

    def op_preempt(self, seq):
        """Preemption: its pages go back, then it is read again from its ids."""
        s = self.seqs[seq]
        self.op_free(seq)
        if s.ids:                 # (a batch's sequence always has a token to read)
            self.read([(seq, s.ids, s.namespace, s.share)])

    def random_op(self):
        """One operation drawn at random (always a new sequence when none runs)."""
        live = sorted(self.seqs)
        name = str(self.rng.choice(["add", "add_pair"])) if not live or self.rng.random() < 0.3 \
            else str(self.rng.choice(["append", "append", "shift", "truncate", "free", "preempt"]))
        self.counts[name] = self.counts.get(name, 0) + 1
        if name.startswith("add"):
            getattr(self, "op_" + name)()
        else:
            getattr(self, "op_" + name)(live[int(self.rng.integers(len(live)))])

    # ---- invariants ------------------------------------------------------------------

    def check(self):
        """The invariants, after every operation."""
        pool, held = self.pool, set()
        for seq, s in self.seqs.items():
            n = len(s.ids)
            assert pool.length(seq) == n, f"sequence {seq}: length {pool.length(seq)}, not {n}"
            pages, slots = self.table(seq)
            assert len(set(pages)) == len(pages), f"sequence {seq} holds a page twice"
            held |= set(pages)
            k, v = np.reshape(s.k, (n, D)), np.reshape(s.v, (n, D))
            for other in (pool, self.other):
                assert (other.k[0][0, slots] == k).all(), f"sequence {seq}: K rows are not what it wrote"
                assert (other.v[0][0, slots] == v).all(), f"sequence {seq}: V rows are not what it wrote"
        assert pool.pages_used == len(held), f"pages_used {pool.pages_used}, held {len(held)}"
        assert pool.pages_free + pool.pages_used == self.n_pages
        assert 0 <= pool.pages_idle <= pool.pages_free
        assert pool.moved == {seq for seq, s in self.seqs.items() if s.moved}
        # No page is both free and held: every page counted free can be taken, and none of
        # them is a held one. Taken in a copy of the pool (reserve's public path), so the
        # pool's idle pages keep their names; no private field is read.
        mirror, pool.mirror = pool.mirror, None       # (the probe orders nothing)
        probe = pickle.loads(pickle.dumps(pool))
        pool.mirror = mirror
        free = probe.pages_free
        probe.reserve(PROBE, free * self.ps)
        taken = [int(x) // self.ps for x in probe.slots(PROBE, 0, free * self.ps)[::self.ps]]
        assert len(set(taken)) == free and not set(taken) & held, \
            f"free pages {sorted(taken)} overlap held pages {sorted(held)}"
        assert probe.pages_free == 0 and probe.pages_used == self.n_pages
        probe.advance(PROBE, free * self.ps)
        with pytest.raises(KVPoolFull):
            probe.reserve(PROBE, 1)


def run(seed, n_ops=30):
    """n_ops random operations on a pool drawn from seed; the operations' counts."""
    rng = np.random.default_rng(seed)
    # (pages of 2 make whole pages alike more often still)
    fuzz = Fuzz(rng, int(rng.integers(6, 13)), int(rng.choice([2, PS, PS])))
    for _ in range(n_ops):
        try:
            fuzz.random_op()
            fuzz.check()
        except AssertionError as e:
            raise AssertionError(f"seed {seed}, {fuzz.n_pages} pages of {fuzz.ps}, after "
                                 f"{fuzz.log[-6:]}: {e}") from e
    for seq in sorted(fuzz.seqs):
        fuzz.op_free(seq)
    fuzz.check()
    assert fuzz.pool.pages_used == 0 and fuzz.pool.pages_free == fuzz.n_pages
    return fuzz.counts


def test_random_operations_keep_every_sequences_rows_and_the_page_counts():
    counts = {}
    for seed in range(200):
        for k, v in run(seed).items():
            counts[k] = counts.get(k, 0) + v
    # the operations that matter were all drawn, shared pages found, full pools refused
    assert all(counts.get(k, 0) > 100 for k in
               ("add", "add_pair", "append", "shift", "truncate", "free", "preempt", "refused",
                "shared tokens")), counts


def test_a_refused_shift_to_the_end_changes_nothing():
    pool = PagedKVCache(1, 12, 1, D, type=gg.F32, page_size=PS)     # 3 pages of 4
    orders = []
    pool.mirror = lambda order, *args: orders.append(order)
    ids = [0, 1, 2, 3, 4]
    pool.reserve("a", 5)
    pool.advance("a", 5, ids)                        # a's page 0 named
    assert pool.attach_prefix("b", ids) == 4         # b shares it
    pool.reserve("b", 1)
    pool.advance("b", 1, ids)
    assert pool.pages_free == 0
    with pytest.raises(KVPoolFull):                  # keep 2 of 5: page 0 must be copied
        pool.shift("b", 2, 3, no_rerope)
    assert pool.length("b") == 5
    assert (pool.moved, orders) == (frozenset(), [])


# ---- paths the random runs seldom take (each once missed by a mutated pool) -----------

def written_pool(n_pages, page_size):
    """A pool whose rows are written as Fuzz writes them, and a writer: (pool, read)
    where read(seq, ids) reads seq's ids past what it holds and names its pages."""
    pool = PagedKVCache(1, n_pages * page_size, 1, D, type=gg.F32, page_size=page_size)

    def read(seq, ids, share=True):
        start = pool.length(seq)
        pool.reserve(seq, len(ids) - start)
        for p, slot in zip(range(start, len(ids)), pool.slots(seq, start, len(ids))):
            pool.k[0][0, slot], pool.v[0][0, slot] = row_values(0, ids[:p + 1])
        pool.advance(seq, len(ids) - start, ids if share else None)
    return pool, read


def assert_rows_of(pool, seq, ids):
    """seq's K rows are those of its ids' prefixes."""
    for p, slot in enumerate(pool.slots(seq, 0, pool.length(seq))):
        assert np.array_equal(pool.k[0][0, slot], row_values(0, ids[:p + 1])[0]), f"row {p}"


def test_a_page_rewritten_in_place_forgets_the_pages_named_after_it():
    pool, read = written_pool(4, 2)
    read("a", [0, 1, 2, 3, 9])               # pages (0 1) and (2 3) named
    pool.truncate("a", 2)                    # (2 3) idle, still named after a's first page
    pool.truncate("a", 1)                    # a's first page is written again ...
    read("a", [0, 5])                        # ... and named (0 5): (2 3) must not follow it
    ids = [0, 5, 2, 3, 7]
    assert pool.attach_prefix("b", ids) == 2
    assert_rows_of(pool, "b", ids)


def test_a_page_after_an_unnamed_one_is_not_named():
    pool, read = written_pool(6, 2)
    ids = [0, 1, 2, 3, 4]
    pool.reserve("a", 2)                     # two sequences read one prompt side by side:
    pool.reserve("b", 2)                     # b's first page holds what a's does (a's name)
    read("a", ids[:2])
    read("b", ids[:2])
    read("b", ids[:4])                       # so b's second page is not named after it
    pool.free("b")                           # (its first page is free again, the second idle)
    read("d", [5, 6, 9])                     # d takes b's first page and names it (5 6)
    other = [5, 6, 2, 3, 8]
    assert pool.attach_prefix("e", other) == 2
    assert_rows_of(pool, "e", other)


# ---- the batch scheduler over a nearly full pool --------------------------------------

def test_a_shift_that_must_copy_shared_pages_in_a_full_pool_does_not_end_the_step():
    llm = gg.Llama(n_ctx=80, n_threads=1, n_seq_max=2)       # a pool of 5 pages of 16
    ids = llm.tokenize("First Citizen.\nBefore we proceed any further, hear me speak.\n\n"
                       "All.\nSpeak, speak.")[:33]
    assert len(ids) == 33 and ids[0] == llm.tokenizer.bos_id  # (kept by a shift: keep 1)
    b = llm.batch(n_ctx_seq=48)
    kw = {"max_tokens": 40, "temperature": 0, "ignore_eos": True, "add_bos": False}
    a = b.add(ids, **kw)
    b.step()
    c = b.add(ids, **kw)            # starts on a's two full pages: 4 pages held, 1 free
    while b.running:                # a reaches 47 first: its shift must copy both
        b.step()
    assert b.n_shared_tokens >= 32
    assert [len(b.sequence(s).tokens) for s in (a, c)] == [40, 40]
    alone = llm.batch(n_ctx_seq=48, share_prefix=False)     # the same tokens as alone
    sid = alone.add(ids, **kw)
    while alone.running:
        alone.step()
    assert b.sequence(a).tokens == b.sequence(c).tokens == alone.sequence(sid).tokens
