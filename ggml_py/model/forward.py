"""The llama forward pass as a ggml_py graph: embeddings, then per layer attention and
the feed-forward block, then the output. Reads top to bottom like llama2.c.

Shapes are numpy order and written beside the names: T = tokens in the batch, K = cache
slots attended to (the window), E = n_embd, H = n_head, Hkv = n_head_kv, D = head_dim,
F = n_ff, V = n_vocab.
"""
import math


from ggml_py import _core
from ggml_py.core import ops
from ggml_py.core.graph import build_forward
from ggml_py.core.graph_alloc import STRUCT_BYTES, build_packed, plan_packed
from ggml_py.core.tensor import Context
from ggml_py.core.types import Type
from ggml_py.model.weights import ColumnSlice, LayerWeights

PACKED_ATTENTION_MIN_T = 32   # batches from this size (BLAS's minimum M) copy K and Q packed


class ForwardGraph:
    """A built forward pass for T tokens over a K-slot window, with its inputs: the
    three-node attention's mask, or the attention op's kv_index (the other one None)."""

    def __init__(self, ctx, tokens, positions, slots, mask, logits, graph, buffer_bytes=None,
                 kv_index=None):
        self.ctx, self.graph = ctx, graph
        self.buffer_bytes = buffer_bytes    # the packed intermediates (None: unpacked)
        self.tokens = tokens.numpy()        # int32 (T,)
        self.positions = positions.numpy()  # int32 (T,)
        self.slots = slots.numpy()          # int32 (T,)
        self.mask = None if mask is None else mask.numpy()               # float32 (T, K)
        self.kv_index = None if kv_index is None else kv_index.numpy()   # int32 (2T + K,)
        self.logits = logits.numpy()        # float32 (n_out, V)


def _weight(ctx, w):
    """A leaf tensor over a weight's mapped bytes (no copy); a ColumnSlice, a view of its
    columns in the leaf over the whole matrix."""
    if isinstance(w, ColumnSlice):
        whole = ctx.from_buffer(w.whole.data, w.type, w.whole.shape, name=w.name)
        part = ops.view(whole, w.shape, whole.strides, offset=w.offset)
        if w.rows8 is not None:
            part.set_rows8(w.rows8)
        return part
    return ctx.from_buffer(w.data, w.type, w.shape, name=w.name, rows8=w.rows8)


def linear(w, x, bias=None):
    """w x (+ bias): w (N, E), x (T, E), bias (N,) or None -> (T, N)."""
    y = ops.mul_mat(w, x)
    return y if bias is None else ops.add(y, bias)


def project_qkv(c, x, lw, positions, rope_freqs, T):
    """Queries, keys and values of x (T, E): q (T, H, D) and k (T, Hkv*D) rotated by rope
    for their positions, v (T, Hkv*D)."""
    D, H, Hkv = c.head_dim, c.n_head, c.n_head_kv
    q = ops.reshape(linear(lw.wq, x, lw.bq), (T, H, D))             # (T, H, D)
    k = ops.reshape(linear(lw.wk, x, lw.bk), (T, Hkv, D))           # (T, Hkv, D)
    v = linear(lw.wv, x, lw.bv)                                     # (T, Hkv*D)
    q = ops.rope(q, positions, c.n_rot, ops.ROPE_NORMAL, c.rope_freq_base, c.rope_freq_scale,
                 rope_freqs)
    k = ops.rope(k, positions, c.n_rot, ops.ROPE_NORMAL, c.rope_freq_base, c.rope_freq_scale,
                 rope_freqs)
    return q, ops.reshape(k, (T, Hkv * D)), v


def attention_scale(c):
    """The scores' scale: rope's attn_factor scales the rotated q and k (whole heads),
    so the scores by its square."""
    return c.rope_attn_factor ** 2 / math.sqrt(c.head_dim)


def attention(c, x, lw, cache, il, positions, slots, mask, rope_freqs, T, K):
    """Self-attention of layer il in three nodes (mul_mat, soft_max, mul_mat over the
    window of K slots, the reference): x (T, E) -> (T, E); writes this batch's K, V rows."""
    q, k, v = project_qkv(c, x, lw, positions, rope_freqs, T)
    keys, values = cache.store_and_load(x.ctx, il, k, v, slots, K)   # (Hkv, K, D) each
    out = graph_attention(q, keys, values, mask, attention_scale(c))   # (T, H*D)
    return linear(lw.wo, out, lw.bo)                                # (T, E)


def graph_attention(q, keys, values, mask, scale):
    """softmax(scale q k^T + mask) v as three nodes: q (T, H, D), keys and values
    (Hkv, K, D), mask (T, K) -> (T, H*D)."""
    T, H, D = q.shape
    values = ops.cont(ops.permute(values, (0, 2, 1)))              # (Hkv, D, K)
    queries = ops.permute(q, (1, 0, 2))                              # (H, T, D)
    if T >= PACKED_ATTENTION_MIN_T:
        # packed copies (a few MB), so that the products can take BLAS
        keys, queries = ops.cont(keys), ops.cont(queries)

    # grouped-query attention: mul_mat broadcasts the Hkv heads over the H query heads
    scores = ops.mul_mat(keys, queries)                             # (H, T, K)
    probs = ops.soft_max(scores, mask, scale)                       # (H, T, K)
    out = ops.mul_mat(values, probs)                                # (H, T, D)
    return ops.reshape(ops.cont(ops.permute(out, (1, 0, 2))), (T, H * D))   # (T, H*D)


def fused_attention(c, x, lw, cache, il, positions, slots, kv_index, rope_freqs, T):
    """Self-attention of layer il as one node (gg.attention) over each token's list of
    slots: x (T, E) -> (T, E). This batch's K, V rows are written at `slots` first
    (cache.store: the single sequence's KVCache or the paged pool of batches)."""
    q, k, v = project_qkv(c, x, lw, positions, rope_freqs, T)
    kv = cache.store(x.ctx, il, k, v, slots)
    out = ops.attention(q, kv.k, kv.v, kv_index, attention_scale(c),
                        kv.k_scales, kv.v_scales)                   # (T, H, D)
    return linear(lw.wo, ops.reshape(out, (T, c.n_head * c.head_dim)), lw.bo)   # (T, E)


def feed_forward(x, lw):
    """SwiGLU: w_down(silu(w_gate x) * w_up x), x (T, E) -> (T, E) (each plus its bias, if any)."""
    gated = ops.swiglu(linear(lw.w_gate, x, lw.b_gate), linear(lw.w_up, x, lw.b_up))   # (T, F)
    return linear(lw.w_down, gated, lw.b_down)


def build_forward_graph(c, weights, cache, T, K, n_out, packed=True, buffer_for=None,
                        mask_buffer=None, fused=False, reduce=None):
    """The forward pass of T tokens attending to K cache slots, as a ForwardGraph.

    n_out: logits are computed for the last n_out tokens only (1 to sample the
    next token, T for all).
    packed: intermediates share one buffer where their lifetimes allow
    (graph_alloc); otherwise each has its own memory. buffer_for: see
    graph_alloc.build_packed (a buffer shared with other graphs). mask_buffer:
    a float32 array of T * K or more elements to hold the mask (shared with
    other graphs that never run at the same time; None: the graph's own).
    fused: attention as one node (gg.attention; its input kv_index, filled by
    cache.fill_index) instead of three (the mask, filled by cache.fill_mask). reduce: see
    _layers.
    """
    build = _forward_builder(c, weights, cache, T, K, n_out, mask_buffer, fused, reduce)
    if packed:
        leaf_bytes = _leaf_bytes(c, T, 0 if mask_buffer is not None else K)
        built = build_packed(build, lambda r: [r[-1]], leaf_bytes, buffer_for)
        return _forward_graph(built.result, built.graph, fused, built.buffer_bytes)
    # every result its own memory: the arena a first build (structs only) counts, each
    # result aligned
    plan = plan_packed(build, lambda r: [r[-1]], _leaf_bytes(c, T, K))
    arena = plan.other_bytes + plan.unpacked_bytes + _core.ARENA_ALIGN * len(plan.sizes)
    result = build(Context(mem_size=arena))
    return _forward_graph(result, build_forward(result[-1]), fused)


def _forward_graph(result, graph, fused, buffer_bytes=None):
    ctx, tokens, positions, slots, mask_or_index, logits = result
    return ForwardGraph(ctx, tokens, positions, slots, None if fused else mask_or_index, logits,
                        graph, buffer_bytes, kv_index=mask_or_index if fused else None)


def forward_graph_bytes(c, weights, cache, T, K, n_out, fused=False, reduce=None):
    """Bytes of the packed intermediates of build_forward_graph(..., T, K, n_out), found
    without building it (tensor structs only)."""
    build = _forward_builder(c, weights, cache, T, K, n_out, fused=fused, reduce=reduce)
    return plan_packed(build, lambda r: [r[-1]], _leaf_bytes(c, T, K)).buffer_bytes


def _forward_builder(c, weights, cache, T, K, n_out, mask_buffer=None, fused=False, reduce=None):
    """build(ctx) -> (ctx, tokens, positions, slots, mask or kv_index, logits)."""
    def build(ctx):
        tokens = ctx.new_tensor(Type.I32, (T,), name="tokens")
        positions = ctx.new_tensor(Type.I32, (T,), name="positions")
        slots = ctx.new_tensor(Type.I32, (T,), name="kv_slots")
        if fused:
            kv_index = ctx.new_tensor(Type.I32, (2 * T + K,), name="kv_index")
            x = _layers(ctx, c, weights, tokens, lambda h, lw, il, rope_freqs: fused_attention(
                c, h, lw, cache, il, positions, slots, kv_index, rope_freqs, T), reduce)
            inputs = kv_index
        else:
            if mask_buffer is None:
                mask = ctx.new_tensor(Type.F32, (T, K), name="kq_mask")
            else:
                mask = ctx.from_buffer(mask_buffer[:T * K], Type.F32, (T, K), name="kq_mask")
            x = _layers(ctx, c, weights, tokens, lambda h, lw, il, rope_freqs: attention(
                c, h, lw, cache, il, positions, slots, mask, rope_freqs, T, K), reduce)
            inputs = mask
        if n_out < T:           # the output matrix is the largest: skip unwanted rows
            x = ops.view(x, (n_out, c.n_embd), offset=(T - n_out) * x.strides[0])
        return ctx, tokens, positions, slots, inputs, _logits(ctx, c, weights, x)
    return build


def _layers(ctx, c, weights, tokens, attend, reduce=None):
    """The embeddings of tokens (T,) through every layer: x (T, E), each layer's
    attention made by attend(h, layer weights, il, rope_freqs). reduce: None, or
    reduce(partial (T, E)) -> the sum over the processes of a split model, after each
    attention and feed-forward block (whose weights are then this process's share)."""
    if reduce is None:
        reduce = _whole
    rope_freqs = _weight(ctx, weights.rope_freqs) if weights.rope_freqs is not None else None
    x = ops.get_rows(_weight(ctx, weights.token_embd), tokens)       # (T, E)
    for il, layer in enumerate(weights.layers):
        lw = LayerWeights(**{name: _weight(ctx, w) for name, w in vars(layer).items()
                             if w is not None})
        h = ops.mul(ops.rms_norm(x, c.rms_eps), lw.attn_norm)
        x = ops.add(x, reduce(attend(h, lw, il, rope_freqs)))
        h = ops.mul(ops.rms_norm(x, c.rms_eps), lw.ffn_norm)
        x = ops.add(x, reduce(feed_forward(h, lw)))
    return x


def _whole(x):
    """One process computes every block whole: nothing to reduce."""
    return x


def _logits(ctx, c, weights, x):
    """Logits (n, V) of the rows x (n, E): the final norm, then the output matrix."""
    x = ops.mul(ops.rms_norm(x, c.rms_eps), _weight(ctx, weights.output_norm))
    logits = ops.mul_mat(_weight(ctx, weights.output), x)           # (n, V)
    logits.name = "logits"
    return logits


class StepGraph:
    """A built step over a paged cache: R tokens of any sequences, kv_index of 2R + N
    values, logits of n_out chosen rows; its inputs as numpy views."""

    def __init__(self, ctx, tokens, positions, slots, kv_index, out_rows, logits, graph):
        self.ctx, self.graph = ctx, graph
        self.tokens = tokens.numpy()          # int32 (R,)
        self.positions = positions.numpy()    # int32 (R,)
        self.slots = slots.numpy()            # int32 (R,): where each token's K, V rows go
        self.kv_index = kv_index.numpy()      # int32 (2R + N,): see ops.attention
        self.out_rows = out_rows.numpy()      # int32 (n_out,): rows whose logits are computed
        self.logits = logits.numpy()          # float32 (n_out, V)


def build_step_graph(c, weights, cache, R, N, n_out, buffer_for=None, reduce=None):
    """The forward pass of one step over a paged cache (kv_paged.PagedKVCache): R
    tokens, slot lists of N values in all, logits for n_out of the rows, as a
    StepGraph. buffer_for: see graph_alloc.build_packed; reduce: see _layers."""
    def build(ctx):
        tokens = ctx.new_tensor(Type.I32, (R,), name="tokens")
        positions = ctx.new_tensor(Type.I32, (R,), name="positions")
        slots = ctx.new_tensor(Type.I32, (R,), name="kv_slots")
        kv_index = ctx.new_tensor(Type.I32, (2 * R + N,), name="kv_index")
        out_rows = ctx.new_tensor(Type.I32, (n_out,), name="out_rows")
        x = _layers(ctx, c, weights, tokens, lambda h, lw, il, rope_freqs: fused_attention(
            c, h, lw, cache, il, positions, slots, kv_index, rope_freqs, R), reduce)
        if n_out < R:
            x = ops.get_rows(x, out_rows)                               # (n_out, E)
        return ctx, tokens, positions, slots, kv_index, out_rows, _logits(ctx, c, weights, x)
    leaf_bytes = c.n_layer * 64 * STRUCT_BYTES + 4 * (5 * R + N + n_out) + 8192
    built = build_packed(build, lambda r: [r[-1]], leaf_bytes, buffer_for)
    return StepGraph(*built.result, graph=built.graph)


def _leaf_bytes(c, T, K):
    """Arena bytes of one forward graph besides its results: structs and inputs."""
    n_tensors = c.n_layer * 64 + 32     # ~48 per layer, 14 more with every bias
    return n_tensors * STRUCT_BYTES + 4 * T * (K + 3) + 4096
