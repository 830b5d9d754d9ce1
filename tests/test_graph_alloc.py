"""Packing intermediates: same results as unpacked graphs, memory reused safely."""
import numpy as np
import pytest

import ggml_py as gg
from ggml_py.core import graph as core_graph
from ggml_py.core import ops as core_ops
from ggml_py.core import graph_alloc
from ggml_py.core.graph_alloc import ALIAS_SOURCE, build_packed, plan_offsets

RNG = np.random.default_rng(0)
A = RNG.standard_normal((16, 32)).astype(np.float32)
W = RNG.standard_normal((32, 32)).astype(np.float32)


def build(ctx):
    """A graph with long- and short-lived results, views, and a diamond."""
    x = ctx.from_numpy(A, name="x")
    w = ctx.from_numpy(W, name="w")
    h = gg.mul_mat(w, x)                                  # lives to the end (residual)
    y = h
    for _ in range(6):
        t = gg.silu(gg.mul_mat(w, y))
        t = gg.reshape(gg.cont(gg.transpose(t)), (16, 32))   # views of a dead-soon result
        y = gg.add(gg.scale(t, 0.5), y)
    out = gg.add(gg.rms_norm(y), h)
    return ctx, x, w, out


def test_packed_graph_computes_the_same():
    ctx, *_, out = build(gg.Context(mem_size=4 << 20))
    gg.build_forward(out).compute(n_threads=2)
    packed = build_packed(build, lambda r: [r[-1]], 64 << 10)
    packed.graph.compute(n_threads=2)
    np.testing.assert_array_equal(packed.result[-1].numpy(), out.numpy())
    assert packed.buffer_bytes < packed.unpacked_bytes / 3


def test_live_results_never_overlap():
    ctx = gg.Context(mem_size=1 << 20)
    recorder = graph_alloc._Recorder(ctx.new_tensor(gg.I8, (64,)))
    with core_ops.place_results(recorder):
        *_, out = build(ctx)
    nodes = gg.build_forward(out).nodes
    results = recorder.results
    offsets, size = plan_offsets(nodes, results, [out])
    index = {id(t): k for k, (t, _) in enumerate(results)}
    # lifetime of each result: from its node to the last node reading it (or a view of it)
    root, life = {}, {}
    for i, node in enumerate(nodes):
        if id(node) in index:
            root[id(node)] = index[id(node)]
            life[index[id(node)]] = [i, i]
        elif node.op in ALIAS_SOURCE and id(node.src[ALIAS_SOURCE[node.op]]) in root:
            root[id(node)] = root[id(node.src[ALIAS_SOURCE[node.op]])]
        for s in node.src:
            if s is not None and id(s) in root:
                life[root[id(s)]][1] = i
    life[index[id(out)]][1] = len(nodes)
    for a in life:
        for b in life:
            if a < b and life[a][0] <= life[b][1] and life[b][0] <= life[a][1]:
                ra = (offsets[a], offsets[a] + results[a][1])
                rb = (offsets[b], offsets[b] + results[b][1])
                assert ra[1] <= rb[0] or rb[1] <= ra[0], (a, b)
    assert max(offsets[k] + results[k][1] for k in life) <= size


def test_free_list_merges_neighbours():
    free = []
    graph_alloc._release(free, 0, 64)
    graph_alloc._release(free, 128, 64)
    graph_alloc._release(free, 64, 64)
    assert free == [(0, 192)]
    assert graph_alloc._allocate(free, 192, 64) == (0, 192) and free == [(64, 128)]
    assert graph_alloc._allocate(free, 192, 256) == (64, 320)     # grows the top block


def test_outputs_other_than_the_last_node_stay_intact():
    # h is an output too: no later intermediate may be packed over it
    def h_of(ctx):
        x = ctx.from_numpy(A, name="x")
        h = gg.mul_mat(ctx.from_numpy(W, name="w"), x)
        y = h
        for _ in range(6):
            y = gg.add(gg.silu(gg.mul_mat(ctx.from_numpy(W), y)), y)
        return h, y
    packed = build_packed(h_of, lambda r: list(r), 64 << 10)
    packed.graph.compute(n_threads=1)
    np.testing.assert_allclose(packed.result[0].numpy(), A @ W.T, rtol=1e-5, atol=1e-5)


def test_a_misaligned_or_short_shared_buffer_is_refused():
    aligned = core_graph.aligned_bytes(1 << 20)
    for give in (lambda n: aligned[1:], lambda n: aligned[:n // 2]):
        with pytest.raises(ValueError, match="must give a writable buffer"):
            build_packed(build, lambda r: [r[-1]], 64 << 10, buffer_for=give)


def test_a_build_that_does_not_repeat_itself_is_refused():
    # the second build's results go where the first build's were planned: one of
    # another size would overrun the buffer (it wrote 16 MiB into 128 bytes)
    x = np.ones(1 << 16, np.float32)
    # (rows, relus) of the first and the second build: larger, smaller, one result more, less
    for first, second in [((16, 1), (1 << 16, 1)), ((16, 1), (8, 1)), ((16, 1), (16, 2)),
                          ((16, 2), (16, 1))]:
        runs = iter([first, second])

        def build(ctx):
            n, relus = next(runs)
            y = ctx.from_buffer(x[:n], gg.F32, (n,))
            for _ in range(relus):
                y = gg.relu(y)
            return gg.scale(y, 2.0)

        with pytest.raises(RuntimeError, match="the two builds made different graphs"):
            build_packed(build, lambda y: (y,), arena_bytes=1 << 20)


@pytest.mark.parametrize("write", ["cpy", "set_rows"])
def test_a_result_written_into_an_intermediate_keeps_it_alive(write):
    # cpy(a, b) and set_rows(b, ...) are views of b: b's bytes must outlive their readers,
    # not only the write itself, or the later intermediates are packed over them
    def copy_then_more(ctx):
        x = ctx.from_numpy(A, name="x")
        w = ctx.from_numpy(W, name="w")
        into = gg.scale(x, 0.0)                                  # an intermediate (16, 32)
        if write == "cpy":
            written = gg.cpy(gg.mul_mat(w, x), into)
        else:
            ids = ctx.from_numpy(np.arange(16, dtype=np.int32)[::-1].copy(), name="ids")
            written = gg.set_rows(into, gg.mul_mat(w, x), ids)
        y = x
        for _ in range(6):
            y = gg.add(gg.silu(gg.mul_mat(w, y)), y)
        return [gg.add(written, y)]                        # written first: computed first
    unpacked = copy_then_more(gg.Context(mem_size=4 << 20))[0]
    gg.build_forward(unpacked).compute(n_threads=1)
    packed = build_packed(copy_then_more, lambda r: r, 64 << 10)
    packed.graph.compute(n_threads=1)
    np.testing.assert_array_equal(packed.result[0].numpy(), unpacked.numpy())


def test_a_copy_between_two_intermediates_packs_as_it_builds():
    # results lie apart in both builds: the first build's addresses must not make cpy take
    # them for overlapping memory (a copy inserted in one build only)
    def build(ctx):
        y = ctx.from_numpy(np.arange(32, dtype=np.float32).reshape(4, 8))
        b = gg.scale(y, 3.0)
        a = gg.scale(gg.reshape(b, (8, 4)), 2.0)
        ids = ctx.from_numpy(np.array([3, 2, 1, 0], np.int32))
        return [gg.cpy(a, b), gg.set_rows(gg.scale(y, 1.0), gg.scale(y, 5.0), ids)]
    plain = build(gg.Context(mem_size=1 << 20))
    gg.build_forward(*plain).compute(n_threads=1)
    packed = build_packed(build, lambda r: r, 1 << 20)
    assert gg.Op.DUP not in [t.op for t in packed.graph.nodes]
    packed.graph.compute(n_threads=1)
    for got, want in zip(packed.result, plain):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_a_result_written_into_a_leaf_packs_as_it_builds():
    # as the KV cache: a leaf written with results; whatever address the first build gives
    # the results, the leaf's memory is never theirs (no copy in one build only)
    def build(ctx):
        dst = ctx.new_tensor(gg.F32, (64, 64))               # made after the stand-in
        src = gg.scale(ctx.from_numpy(np.ones((64, 64), np.float32)), 2.0)
        ids = ctx.from_numpy(np.arange(64, dtype=np.int32)[::-1].copy())
        written = gg.set_rows(dst, src, ids)
        return [written, gg.cpy(gg.scale(src, 0.5), dst)]
    packed = build_packed(build, lambda r: r, 1 << 20)
    assert gg.Op.DUP not in [t.op for t in packed.graph.nodes]
    packed.graph.compute(n_threads=1)
    np.testing.assert_array_equal(packed.result[-1].numpy(), np.ones((64, 64), np.float32))


def test_offsets_are_aligned_and_the_best_fitting_block_is_taken():
    def odd_sizes(ctx):                    # 3 floats: 12 bytes a result
        y = ctx.from_numpy(np.ones(3, np.float32), name="x")
        for _ in range(5):
            y = gg.silu(y)
        return [y]
    packed = build_packed(odd_sizes, lambda r: r, 64 << 10)
    pointers = [node.data_ptr for node in packed.graph.nodes]
    assert len(set(pointers)) > 1 and all(p % graph_alloc.ALIGN == 0 for p in pointers)
    # a 64-byte result goes into the free 64-byte block, not the first block it fits
    free = [(0, 256), (512, 64), (1024, 128)]
    assert graph_alloc._allocate(free, 2048, 64) == (512, 2048)
    assert free == [(0, 256), (1024, 128)]
    assert graph_alloc._allocate(free, 2048, 100) == (1024, 2048) and free == [(0, 256), (1124, 28)]


def test_a_view_read_later_keeps_its_source_alive():
    # a view aliases its source: a result made after the view must not take the
    # source's bytes while the view is still to be read
    x_values = np.arange(64, dtype=np.float32).reshape(8, 8) / 10

    def build_with_view(ctx):
        x = ctx.from_numpy(x_values, name="x")
        v = gg.view(gg.add(x, x), (4, 8))                             # read at the end
        c = gg.mul(gg.view(x, (4, 8)), gg.view(x, (4, 8)))            # made after the view
        return ctx, gg.add(v, c)

    packed = build_packed(build_with_view, lambda r: [r[-1]], 64 << 10)
    packed.graph.compute(n_threads=1)
    assert np.array_equal(packed.result[-1].numpy(), 2 * x_values[:4] + x_values[:4] ** 2)


def test_a_graph_of_views_only_packs_into_no_buffer():
    def views_only(ctx):
        x = ctx.from_numpy(np.arange(16, dtype=np.float32).reshape(4, 4), name="x")
        return ctx, gg.view(x, (2, 4))

    for buffer_for in (None, core_graph.aligned_bytes):
        packed = build_packed(views_only, lambda r: [r[-1]], 64 << 10, buffer_for)
        packed.graph.compute(n_threads=1)
        assert packed.buffer_bytes == 0
        assert packed.result[-1].numpy().tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
