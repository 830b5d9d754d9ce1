"""The paged KV cache: one pool of fixed-size pages shared by many sequences.

Every layer's K and V rows live in one pool of n_pages * page_size slots (sized by
n_ctx: the tokens of all sequences together). A sequence holds a page table, the
pages its positions 0, 1, 2 ... fill in order: position p sits in slot
table[p // page_size] * page_size + p % page_size. Nothing is reserved per sequence
beyond the pages its tokens fill; a finished or cancelled sequence gives its pages
back at once (the next one reuses them, most recently freed first).

The attention op reads a sequence's slots as one list in position order, so a
token's result does not depend on where its pages are or on the other sequences.

Shapes are numpy order: Hkv = n_head_kv, D = head_dim.
"""
import numpy as np

from ggml_py.core.types import Type, checked_int
from ggml_py.model.kv_rows import KVRows, kv_type

PAGE_SIZE = 16            # tokens per page (docs/batching.md has the measurements)


class KVPoolFull(RuntimeError):
    """The pool has fewer free pages than a request needs; nothing was changed."""


class PagedKVCache:
    """K and V rows of every layer in pages: k[l], v[l] (n_pages * page_size, Hkv*D), in
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
        """Pages no sequence holds."""
        return len(self._free)

    @property
    def pages_used(self):
        """Pages the sequences hold."""
        return self.n_pages - len(self._free)

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
        if need > len(self._free):
            raise KVPoolFull(f"the KV pool has {len(self._free)} free pages of {self.page_size} "
                             f"tokens; {need} more are needed")
        table = self._tables.setdefault(seq, [])
        self._lengths.setdefault(seq, 0)
        table.extend(self._free.pop() for _ in range(need))

    def slots(self, seq, start, stop):
        """int32 slots of seq's positions start..stop-1 (pages reserved for them)."""
        positions = np.arange(start, stop)
        table = np.asarray(self._tables[seq], np.int64)
        return (table[positions // self.page_size] * self.page_size
                + positions % self.page_size).astype(np.int32)

    def advance(self, seq, n):
        """Mark seq's next n positions as written (after the step that wrote them ran)."""
        self._lengths[seq] += n

    def truncate(self, seq, n):
        """Forget seq's positions >= n; pages no longer needed go back to the pool."""
        n = max(0, min(n, self.length(seq)))
        self._lengths[seq] = n
        table = self._tables.get(seq, [])
        keep = -(-n // self.page_size)
        self._free.extend(reversed(table[keep:]))
        del table[keep:]

    def free(self, seq):
        """Forget seq: its pages go back to the pool (the next sequence reuses them)."""
        self._free.extend(reversed(self._tables.pop(seq, [])))
        self._lengths.pop(seq, None)

    def shift(self, seq, keep, n_discard, rerope):
        """Context shift: drop seq's positions keep..keep+n_discard-1 and move the later
        ones down by n_discard (rows copied, K rotated by rerope(k_rows, -n_discard)
        for its new positions); freed pages go back to the pool."""
        n = self.length(seq)
        if not (0 <= keep and n_discard > 0 and keep + n_discard <= n):
            raise ValueError(f"shift: cannot drop {n_discard} positions after {keep} of {n}")
        self.move_rows(self.slots(seq, keep + n_discard, n), self.slots(seq, keep, n - n_discard),
                       n_discard, rerope)
        self.truncate(seq, n - n_discard)

    def move_rows(self, src, dst, n_back, rerope):
        """Copy every layer's K, V rows at slots src to slots dst (int32 arrays of one
        length), K rotated by rerope(k_rows, -n_back) for positions n_back lower: shift's
        copy (the processes of a split model each make it in their own pool)."""
        for il in range(len(self.k)):
            rows = self.rows.keys_f32(il, src)
            rerope(rows, -n_back)
            self.rows.set_keys(il, dst, rows)
            self.rows.move(il, src, dst)

    # ---- graph ops ------------------------------------------------------------------

    def store(self, ctx, il, k, v, slots):
        """Graph ops of layer il: write k, v (T, Hkv*D) into the pool rows at `slots`
        (I32 (T,)); the written pools as a kv_rows.AttentionKV, to be read after the writes."""
        return self.rows.store(ctx, il, k, v, slots, "kv_pool")
