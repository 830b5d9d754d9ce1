"""The paged KV cache: one pool of fixed-size pages shared by many sequences.

Every layer's K and V rows live in one pool of n_pages * page_size slots (sized by
n_ctx: the tokens of all sequences together). A sequence holds a page table, the
pages its positions 0, 1, 2 ... fill in order: position p sits in slot
table[p // page_size] * page_size + p % page_size. Nothing is reserved per sequence
beyond the pages its tokens fill; a finished or cancelled sequence gives its pages
back at once (the next one reuses them, most recently freed first).

The attention op reads a sequence's slots as one list in position order, so a
token's result does not depend on where its pages are or on the other sequences.

Prefixes are shared: a full page a sequence wrote from position 0 (and never moved by
a context shift) is named by its tokens and the page before it. A sequence that starts
with the same tokens takes those pages (a count of holders per page) instead of
computing and storing them again: a common system prompt is read once and held once.
A page nobody holds keeps its name and rows until its room is needed (the least
recently released first), so the next request with that prefix finds it too. A held
page is never written: a sequence about to write into a page others hold (a context
shift) copies it first. Rows of a shared page are the bits the sequence would have
written itself wherever a token's K and V do not depend on the rest of its step
(batches' invariant mode, docs/batching.md).

Shapes are numpy order: Hkv = n_head_kv, D = head_dim.
"""
from collections import OrderedDict

import numpy as np

from ggml_py.core.types import Type, checked_int
from ggml_py.model.kv_rows import KVRows, kv_type

PAGE_SIZE = 16            # tokens per page (docs/batching.md has the measurements)


class KVPoolFull(RuntimeError):
    """The pool has fewer free pages than a request needs; nothing was changed."""


class PagedKVCache:
    """K and V rows of every layer in pages: k[l], v[l] (Hkv, n_pages * page_size, D), in
    the pool's types (kv_rows.py)."""

    def __init__(self, n_layer, n_ctx, n_head_kv, head_dim, *, type=Type.F16, type_v=None,
                 page_size=PAGE_SIZE):
        n_layer, n_ctx, n_head_kv, head_dim, page_size = (
            checked_int(f"PagedKVCache: {name}", value, low=1) for name, value in
            (("n_layer", n_layer), ("n_ctx", n_ctx), ("n_head_kv", n_head_kv),
             ("head_dim", head_dim), ("page_size", page_size)))
        self.type = kv_type(type, "PagedKVCache: type")
        self.type_v = self.type if type_v is None else kv_type(type_v, "PagedKVCache: type_v")
        self.page_size = page_size
        self.n_head_kv, self.head_dim = n_head_kv, head_dim
        self.n_pages = -(-n_ctx // page_size)
        self.n_slots = self.n_pages * page_size
        self.rows = KVRows(n_layer, self.n_slots, n_head_kv, head_dim, self.type, self.type_v,
                           f"the KV pool for n_ctx={n_ctx}")
        self.k, self.v = self.rows.k, self.rows.v
        self._free = list(range(self.n_pages - 1, -1, -1))   # pop() takes the lowest first
        self._tables = {}      # sequence id -> its pages, in position order
        self._lengths = {}     # sequence id -> positions held (0..n-1)
        self._holders = {}     # page -> how many sequences hold it
        # prefix sharing: a named page is found by (the page before it, or ("start",
        # namespace) for a first page; its tokens)
        self._named = {}       # name -> page
        self._name_of = {}     # page -> name
        self._children = {}    # page -> the pages named after it
        self._idle = OrderedDict()   # named pages nobody holds, least recently released first
        self._moved = set()    # sequences whose rows a context shift moved (never named)
        self.mirror = None     # callable(order, *args): row copies another process makes too
        # sequences whose batch was collected unclosed: freed by the next step (a collector
        # may run inside another step, where the pool must not change under it)
        self.released = []

    # ---- facts ---------------------------------------------------------------

    @property
    def nbytes(self):
        """Bytes of the pool (int8 scales included): n_slots * bytes_per_token."""
        return self.rows.nbytes

    @property
    def bytes_per_token(self):
        """Bytes one token holds over all layers, K and V."""
        return self.rows.bytes_per_token()

    @property
    def pages_free(self):
        """Pages no sequence holds (idle named pages included: their room is free)."""
        return len(self._free) + len(self._idle)

    @property
    def pages_used(self):
        """Pages the sequences hold (a page several hold counts once)."""
        return self.n_pages - self.pages_free

    @property
    def pages_idle(self):
        """Pages no sequence holds that keep a prefix's rows for the next sequence."""
        return len(self._idle)

    @property
    def moved(self):
        """The sequences whose rows a context shift moved (their pages are never named)."""
        return frozenset(self._moved)

    def length(self, seq):
        """Positions held for seq (0 for one the cache does not know)."""
        return self._lengths.get(seq, 0)

    def pages_needed(self, seq, n_new):
        """Pages seq must add to hold n_new more positions."""
        have = len(self._tables.get(seq, ()))
        return max(0, -(-(self.length(seq) + n_new) // self.page_size) - have)

    # ---- holding positions ------------------------------------------------------

    def reserve(self, seq, n_new):
        """Pages for n_new more positions of seq (a new seq starts empty); KVPoolFull
        and nothing changed when the pool has too few free pages."""
        need = self.pages_needed(seq, n_new)
        self._check_free(need)
        table = self._tables.setdefault(seq, [])
        self._lengths.setdefault(seq, 0)
        table.extend(self._take() for _ in range(need))

    def attach_prefix(self, seq, ids, namespace=0):
        """Give seq, which holds nothing yet, the named pages that hold the longest
        prefix of its token ids `ids` in whole pages, leaving at least its last token to
        be computed. Returns the positions it now holds (a multiple of page_size).
        Pages are found only in the namespace (any hashable) they were named in: rows
        computed one way are not mixed with rows computed another."""
        if self._tables.get(seq):
            raise ValueError(f"attach_prefix: sequence {seq} already holds positions")
        table, parent = self._tables.setdefault(seq, []), ("start", namespace)
        for p in range((len(ids) - 1) // self.page_size):
            page = self._named.get((parent, tuple(ids[p * self.page_size:(p + 1) * self.page_size])))
            if page is None:
                break
            self._idle.pop(page, None)
            self._holders[page] = self._holders.get(page, 0) + 1
            table.append(page)
            parent = page
        self._lengths[seq] = len(table) * self.page_size
        return self._lengths[seq]

    def slots(self, seq, start, stop):
        """int32 slots of seq's positions start..stop-1 (pages reserved for them)."""
        positions = np.arange(start, stop)
        table = np.asarray(self._tables[seq], np.int64)
        return (table[positions // self.page_size] * self.page_size
                + positions % self.page_size).astype(np.int32)

    def advance(self, seq, n, ids=None, namespace=0):
        """Mark seq's next n positions as written (after the step that wrote them ran).
        With ids (seq's token ids, at least its positions), the pages this fills are
        named, in namespace, for other sequences to share."""
        first = self._lengths[seq] // self.page_size
        self._lengths[seq] += n
        if ids is None or seq in self._moved:
            return
        table = self._tables[seq]
        for p in range(first, self._lengths[seq] // self.page_size):
            parent = table[p - 1] if p else ("start", namespace)
            if p and parent not in self._name_of:
                return                   # (another page holds that prefix's name)
            name = (parent, tuple(ids[p * self.page_size:(p + 1) * self.page_size]))
            if name not in self._named and table[p] not in self._name_of:
                self._named[name], self._name_of[table[p]] = table[p], name
                self._children.setdefault(parent, set()).add(table[p])

    def truncate(self, seq, n):
        """Forget seq's positions >= n; pages no longer needed go back to the pool (a
        page kept in part is first made seq's own: KVPoolFull, nothing changed, when
        that needs a page the pool does not have)."""
        if seq not in self._lengths:
            return
        n = max(0, min(n, self.length(seq)))
        if n % self.page_size:
            self._make_own(seq, n // self.page_size, n // self.page_size + 1)
        self._lengths[seq] = n
        table = self._tables.get(seq, [])
        keep = -(-n // self.page_size)
        for page in reversed(table[keep:]):
            self._release(page)
        del table[keep:]

    def free_released(self):
        """Free the sequences queued in `released`."""
        while self.released:
            self.free(self.released.pop())

    def free(self, seq):
        """Forget seq: its pages go back to the pool (the next sequence reuses them)."""
        for page in reversed(self._tables.pop(seq, [])):
            self._release(page)
        self._lengths.pop(seq, None)
        self._moved.discard(seq)

    def shift(self, seq, keep, n_discard, rerope):
        """Context shift: drop seq's positions keep..keep+n_discard-1 and move the later
        ones down by n_discard (rows copied, K rotated by rerope(k_rows, -n_discard)
        for its new positions); freed pages go back to the pool. The pages it writes
        are first made seq's own (KVPoolFull, nothing changed, when the pool lacks them)."""
        n = self.length(seq)
        if not (0 <= keep and n_discard > 0 and keep + n_discard <= n):
            raise ValueError(f"shift: cannot drop {n_discard} positions after {keep} of {n}")
        # the pages it writes (positions keep on) and the last it keeps in part
        self._make_own(seq, keep // self.page_size, -(-(n - n_discard) // self.page_size))
        self._moved.add(seq)
        src, dst = self.slots(seq, keep + n_discard, n), self.slots(seq, keep, n - n_discard)
        if self.mirror is not None:
            self.mirror("pool_shift", src, dst, n_discard)
        self.move_rows(src, dst, n_discard, rerope)
        self.truncate(seq, n - n_discard)

    def copy_rows(self, src, dst):
        """Copy every layer's K and V rows (and scales) at slots src to slots dst, bit
        for bit (int32 arrays of one length)."""
        for il in range(len(self.k)):
            self.rows.copy(il, src, dst)

    def move_rows(self, src, dst, n_back, rerope):
        """Copy every layer's K, V rows at slots src to slots dst (int32 arrays of one
        length), K rotated by rerope(k_rows, -n_back) for positions n_back lower: shift's
        copy (the processes of a split model each make it in their own pool)."""
        for il in range(len(self.k)):
            rows = self.rows.keys_f32(il, src)
            rerope(rows, -n_back)
            self.rows.set_keys(il, dst, rows)
            self.rows.move(il, src, dst)

    # ---- pages --------------------------------------------------------------------------

    def _check_free(self, need):
        if need > self.pages_free:
            raise KVPoolFull(f"the KV pool has {self.pages_free} free pages of {self.page_size} "
                             f"tokens; {need} more are needed")

    def _take(self):
        """A page for one holder: a free one, else the least recently released idle one
        (its name, and its descendants', forgotten)."""
        if self._free:
            page = self._free.pop()
        else:
            page, _ = self._idle.popitem(last=False)
            self._unname(page)
        self._holders[page] = 1
        return page

    def _release(self, page):
        self._holders[page] -= 1
        if self._holders[page] == 0:
            del self._holders[page]
            if page in self._name_of:
                self._idle[page] = None
            else:
                self._free.append(page)

    def _unname(self, page):
        """Forget page's name and its descendants' (their names point at it); an idle
        descendant becomes free."""
        name = self._name_of.pop(page, None)
        if name is None:
            return
        del self._named[name]
        self._children.get(name[0], set()).discard(page)
        for child in self._children.pop(page, set()):
            self._unname(child)
            if child in self._idle:
                del self._idle[child]
                self._free.append(child)

    def _make_own(self, seq, first, stop):
        """Pages first..stop-1 of seq's table become seq's alone, to be written: one that
        others hold is copied to a new page; one named loses its name."""
        table = self._tables.get(seq, [])
        shared = [i for i in range(first, min(stop, len(table))) if self._holders[table[i]] > 1]
        self._check_free(len(shared))
        for i in range(first, min(stop, len(table))):
            page = table[i]
            if i in shared:
                table[i] = self._take()
                self._holders[page] -= 1
                src = np.arange(page * self.page_size, (page + 1) * self.page_size, dtype=np.int32)
                dst = np.arange(table[i] * self.page_size, (table[i] + 1) * self.page_size, dtype=np.int32)
                if self.mirror is not None:
                    self.mirror("pool_copy", src, dst)
                self.copy_rows(src, dst)
            else:
                self._unname(page)

    # ---- graph ops ------------------------------------------------------------------

    def store(self, ctx, il, k, v, slots):
        """Graph ops of layer il: write k, v (T, Hkv*D) into the pool rows at `slots`
        (I32 (T,)); the written pools as a kv_rows.AttentionKV, to be read after the writes."""
        return self.rows.store(ctx, il, k, v, slots, "kv_pool")
