"""Pack a graph's intermediate results into one buffer, reusing memory of dead ones.

Each op result normally gets its own arena memory, so a graph needs the sum of
all its intermediates (gigabytes for a 1B model at 512 tokens). Like ggml's
graph allocator, `build_packed` gives results whose lifetimes do not overlap the
same bytes:

1. build the graph once, recording every result that owns its data;
2. walk the nodes in execution order: a result is born at its node and dies
   after the last node that reads it (directly or through views of it); give
   it the best-fitting free block at birth, free the block at death; outputs
   never die;
3. build the graph again with each result placed at its offset in one shared
   buffer (ops.place_results).

The first build allocates no result data (only tensor structs), so packing
costs a second build's time (milliseconds per layer), not memory.
"""
from dataclasses import dataclass

import numpy as np

from ggml_py.core import ops
from ggml_py.core.graph import build_forward
from ggml_py.core.tensor import Context
from ggml_py.core.types import Type

ALIGN = 64
STRUCT_BYTES = 512           # a tensor struct in the arena, with alignment, rounded up
# ops whose result is (a view of) the memory of a source: which source
ALIAS_SOURCE = ops.VIEW_SOURCE


class _Recorder:
    """First build: results remembered in creation order, their data not allocated.

    Every result is placed at offset 0 of a tiny stand-in buffer, so this build
    costs only tensor structs. Its graph exists to be analysed and must never
    be computed (results would overrun the stand-in). (No op compares the
    addresses of two results: cpy's overlap check takes results apart.)
    """

    def __init__(self, stand_in):
        self.stand_in = stand_in
        self.results = []    # (tensor, nbytes)
        self._pending = None

    def place(self, nbytes):
        self._pending = nbytes
        return self.stand_in, 0

    def created(self, tensor):
        self.results.append((tensor, self._pending))


class _Placer:
    """Second build: the k-th result goes to offsets[k] in the shared buffer. A
    result of another size than the first build's k-th (a build that does not
    repeat itself) is refused: it would overrun the buffer or a live neighbour."""

    def __init__(self, buffer, offsets, sizes):
        self.buffer, self.offsets, self.sizes, self.count = buffer, offsets, sizes, 0

    def place(self, nbytes):
        k = self.count
        if k >= len(self.offsets) or nbytes != self.sizes[k]:
            raise RuntimeError("build_packed: the two builds made different graphs (result "
                               f"{k} is {nbytes} bytes, was "
                               f"{self.sizes[k] if k < len(self.sizes) else 'not made'})")
        self.count += 1
        return self.buffer, self.offsets[k]

    def created(self, tensor):
        pass


def plan_offsets(nodes, results, outputs):
    """Byte offsets for results (list of (tensor, nbytes)) and the buffer size.

    nodes: the graph's nodes in execution order; outputs stay alive to the end.
    """
    index = {id(t): k for k, (t, _) in enumerate(results)}
    sizes = [(n + ALIGN - 1) // ALIGN * ALIGN for _, n in results]
    root = {}                                  # id(tensor) -> result index of its memory
    last_use, birth = {}, {}
    for i, node in enumerate(nodes):
        k = index.get(id(node))
        if k is not None:
            root[id(node)] = k
            birth[i] = k
        elif node.op in ALIAS_SOURCE:
            src = node.src[ALIAS_SOURCE[node.op]]
            if id(src) in root:
                root[id(node)] = root[id(src)]
        for s in node.src:
            if s is not None and id(s) in root:
                last_use[root[id(s)]] = i
    end = len(nodes)
    for t in outputs:
        if id(t) in root:
            last_use[root[id(t)]] = end
    deaths = {}
    for k, i in last_use.items():
        deaths.setdefault(i, []).append(k)

    offsets = [0] * len(results)
    free = []                                   # (offset, size), sorted by offset
    top = 0
    for i in range(len(nodes)):
        k = birth.get(i)
        if k is not None:
            offsets[k], top = _allocate(free, top, sizes[k])
            if k not in last_use:               # never read: free at once
                _release(free, offsets[k], sizes[k])
        for k in deaths.get(i, ()):
            _release(free, offsets[k], sizes[k])
    return offsets, top


def _allocate(free, top, size):
    """Best fit among free blocks, else the top of the buffer. Returns (offset, new top)."""
    best = None
    for j, (off, sz) in enumerate(free):
        if sz >= size and (best is None or sz < free[best][1]):
            best = j
    if best is None:
        if free and free[-1][0] + free[-1][1] == top:      # grow the last free block
            off = free.pop()[0]
            return off, off + size
        return top, top + size
    off, sz = free[best]
    if sz == size:
        free.pop(best)
    else:
        free[best] = (off + size, sz - size)
    return off, top


def _release(free, offset, size):
    """Return a block to the free list, merging neighbours."""
    j = 0
    while j < len(free) and free[j][0] < offset:
        j += 1
    free.insert(j, (offset, size))
    if j + 1 < len(free) and free[j][0] + free[j][1] == free[j + 1][0]:
        free[j] = (free[j][0], free[j][1] + free[j + 1][1])
        free.pop(j + 1)
    if j > 0 and free[j - 1][0] + free[j - 1][1] == free[j][0]:
        free[j - 1] = (free[j - 1][0], free[j - 1][1] + free[j][1])
        free.pop(j)


@dataclass
class PackedBuild:
    """What build_packed returns: the build function's result, graph and byte counts."""
    result: object
    graph: object
    ctx: Context
    buffer_bytes: int      # the shared buffer of intermediates
    unpacked_bytes: int    # what they would take unpacked


@dataclass
class PackedPlan:
    """Where build_packed puts a build's results: offsets in one buffer of buffer_bytes."""
    offsets: list
    sizes: list            # each result's bytes
    buffer_bytes: int      # the shared buffer of intermediates
    unpacked_bytes: int    # what they would take unpacked
    other_bytes: int       # the arena besides them (tensor structs, inputs)


def plan_packed(build, outputs_of, arena_bytes):
    """The first build of build_packed only (tensor structs, no result data): where
    each result goes and how large the buffer must be."""
    while True:
        first_ctx = Context(mem_size=arena_bytes)
        recorder = _Recorder(first_ctx.new_tensor(Type.I8, (ALIGN,)))
        try:
            with ops.place_results(recorder):
                first = build(first_ctx)
            break
        except MemoryError:
            if arena_bytes > 1 << 40:
                raise
            arena_bytes *= 2
    first_outputs = outputs_of(first)
    first_graph = build_forward(*first_outputs)
    offsets, buffer_bytes = plan_offsets(first_graph.nodes, recorder.results, first_outputs)
    sizes = [n for _, n in recorder.results]
    return PackedPlan(offsets, sizes, buffer_bytes, sum(sizes), first_ctx.used)


def build_packed(build, outputs_of, arena_bytes, buffer_for=None):
    """Build twice (see module doc). build(ctx) -> result; outputs_of(result) -> tensors.

    arena_bytes: a guess of the arena the build needs besides its results
    (tensor structs and leaf data such as inputs); doubled until it suffices.
    buffer_for: None (the intermediates get a buffer in the graph's own arena), or
    buffer_for(nbytes) -> a writable uint8 numpy array of at least nbytes, its start
    aligned to ALIGN: one buffer shared by graphs that never run at the same time
    (their outputs, too, then last only until the next of them runs).
    """
    plan = plan_packed(build, outputs_of, arena_bytes)
    offsets, buffer_bytes, others = plan.offsets, plan.buffer_bytes, plan.other_bytes
    size = max(buffer_bytes, ALIGN)
    if buffer_for is None:
        ctx = Context(mem_size=others + buffer_bytes + 2 * ALIGN)
        buffer = ctx.new_tensor(Type.I8, (size,), name="intermediates")
    else:
        shared = buffer_for(size)
        if shared.ctypes.data % ALIGN or shared.nbytes < size or not shared.flags.writeable:
            raise ValueError(f"build_packed: buffer_for({size}) must give a writable buffer of "
                             f"that many bytes, aligned to {ALIGN}")
        ctx = Context(mem_size=others + 2 * ALIGN)
        buffer = ctx.from_buffer(shared[:size].view(np.int8), Type.I8, (size,), name="intermediates")
    placer = _Placer(buffer, offsets, plan.sizes)
    with ops.place_results(placer):
        result = build(ctx)
    if placer.count != len(offsets):
        raise RuntimeError("build_packed: the two builds made different graphs")
    return PackedBuild(result, build_forward(*outputs_of(result)), ctx, buffer_bytes,
                       plan.unpacked_bytes)
