"""The llama architecture as a ggml_py graph: config, weights, blocks, forward (the KV
cache it writes and reads is kv_cache.KVCache).

Reads top to bottom like llama2.c. Shapes are numpy order and written beside the
names: T = tokens in the batch, K = cache slots attended to (the window), E =
n_embd, H = n_head, Hkv = n_head_kv, D = head_dim, F = n_ff, V = n_vocab.

A forward graph is built once per (T, K, n_out) and cached; a call only
writes the input tensors (token ids, positions, KV slot ids, attention mask)
through numpy views and runs the graph. The K window grows in steps of
`kv_pad` slots, slots past the sequence hidden by the mask, so decoding a long
sequence builds only a handful of graphs.
"""
import math
import os
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ggml_py import _core
from ggml_py.core import ops
from ggml_py.files.gguf_reader import REQUIRED, USE_MATMUL, USE_NORM, USE_ROWS, GGUFModelFile
from ggml_py.core.graph import aligned_bytes, build_forward, check_tune, default_threads, shared_pool
from ggml_py.core.graph_alloc import STRUCT_BYTES, build_packed, plan_packed
from ggml_py.model.kv_cache import KVCache
from ggml_py.core.tensor import Context
from ggml_py.core.types import Type
from ggml_py.tune.bench import weight_type

ARCH = "llama"
MAX_LAYERS = 512     # llama.cpp's LLAMA_MAX_LAYERS
KV_PAD = 256          # the attention window grows in steps of this many slots
PACKED_ATTENTION_MIN_T = 32   # batches from this size (BLAS's minimum M) copy K and Q packed
MIN_GRAPHS = 16       # built graphs kept, at least (least recently used dropped) ...
MAX_GRAPHS = 64       # ... and at most
RESERVE_SPARE = 4     # the shared buffer of intermediates is reserved with need / this to spare


# ---- config -------------------------------------------------------------------

def is_float32(value):
    """Whether a float is finite in float32 (the ops' parameter type)."""
    return math.isfinite(value) and abs(value) <= ops.F32_MAX


@dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters of a llama model (from GGUF `llama.*` metadata)."""
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    head_dim: int
    n_rot: int                    # rotated dimensions of each head (rope.dimension_count)
    rope_freq_base: float = 10000.0
    rope_freq_scale: float = 1.0  # 1 / linear scaling factor
    rope_attn_factor: float = 1.0  # rope's cos and sin are scaled by it (rope.scaling.attn_factor)
    rms_eps: float = 1e-5

    @property
    def n_embd_kv(self):
        """Width of a K or V row of the cache: n_head_kv * head_dim."""
        return self.n_head_kv * self.head_dim

    @classmethod
    def from_gguf(cls, f: GGUFModelFile):
        """The config of a GGUF file's `llama.*` metadata, checked as llama.cpp does;
        ModelLoadError naming the key for a bad or missing value."""
        if f.architecture != ARCH:
            raise f.error(f"unknown architecture {f.architecture!r} (supported: {ARCH!r})")

        def key(name, default=REQUIRED, type=int):
            return f.get(f"{ARCH}.{name}", default, type=type)

        def count(name, default=REQUIRED, low=1):
            """An integer key that must be at least `low` (a count or a size); a default of
            None is given back as it is."""
            value = key(name, default)
            if value is not None and value < low:
                raise f.error(f"metadata '{ARCH}.{name}' = {value} must be at least {low}")
            return value

        def finite(name, default, positive):
            """A float key that must be finite and > 0 (positive) or >= 0, in float32 (the
            ops take their parameters as float32: 1e308 is inf there, 1e-50 is 0)."""
            value = key(name, default, type=float)
            if not (is_float32(value) and (np.float32(value) > 0 if positive else value >= 0)):
                raise f.error(f"metadata '{ARCH}.{name}' = {value} must be a finite number "
                              f"{'> 0' if positive else '>= 0'} (in float32)")
            return value

        n_embd = count("embedding_length")
        n_head = count("attention.head_count")
        n_head_kv = count("attention.head_count_kv", n_head)
        n_layer = count("block_count")
        if n_layer > MAX_LAYERS:
            raise f.error(f"block_count {n_layer} is more than {MAX_LAYERS} (llama.cpp's limit)")
        n_ff = count("feed_forward_length")
        n_ctx_train = count("context_length", low=0)    # 0: unknown, n_ctx must be given
        if n_head % n_head_kv:
            raise f.error(f"head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
        # the head size: attention.key_length where given (Mistral Nemo: 32 heads of 128 in
        # a 5120-wide model), else embedding_length / head_count
        head_dim = count("attention.key_length", None)
        if head_dim is None:
            if n_embd % n_head:
                raise f.error(f"embedding_length {n_embd} is not a multiple of head_count "
                              f"{n_head} (and no attention.key_length gives the head size)")
            head_dim = n_embd // n_head
        # llama.cpp's llama graph needs V heads of the head size too; without the key it
        # takes them as embedding_length / head_count
        value_length = count("attention.value_length", None)
        if value_length is None and head_dim != n_embd // n_head:
            raise f.error(f"attention.value_length is missing: llama.cpp takes it as "
                          f"embedding_length / head_count = {n_embd // n_head}, not the head "
                          f"size {head_dim} (attention.key_length)")
        if value_length is not None and value_length != head_dim:
            raise f.error(f"attention.value_length {value_length} differs from the head size "
                          f"{head_dim}")
        if count("expert_count", 0, low=0) > 0:
            raise f.error("mixture-of-experts llama models are not supported")
        if count("expert_used_count", 0, low=0) > 0:
            raise f.error("expert_used_count is set but expert_count is not")
        n_rot = key("rope.dimension_count", head_dim)
        if n_rot != head_dim:   # llama.cpp rotates whole heads of a llama model
            raise f.error(f"rope.dimension_count {n_rot} must equal the head size {head_dim}")

        # as llama.cpp reads them: the type is linear unless named, the factor the
        # scaling.factor key or else the older scale_linear, 0 (or none given) no scaling
        scaling = f.get(f"{ARCH}.rope.scaling.type", "linear", type=str)
        if scaling not in ("none", "linear"):
            raise f.error(f"rope scaling {scaling!r} is not supported (only linear)")
        factor_key = next((k for k in ("rope.scaling.factor", "rope.scale_linear")
                           if f.has(f"{ARCH}.{k}")), None)
        factor = key(factor_key, type=float) if factor_key else 0.0
        if not (factor >= 0 and math.isfinite(factor)):
            raise f.error(f"{factor_key} {factor} must be a finite number >= 0")
        freq_scale = 1.0 if scaling == "none" or factor == 0 else 1.0 / factor
        if not (is_float32(freq_scale) and np.float32(freq_scale) > 0):
            raise f.error(f"{factor_key} {factor} gives a rope frequency scale of 1/{factor}, "
                          f"not a float32 number > 0")

        token_embd = f.tensors.get("token_embd.weight")
        if token_embd is None:
            raise f.error("missing tensor 'token_embd.weight'")
        n_vocab = count("vocab_size", token_embd.shape[0] if token_embd.shape else 1)  # (V, E)
        # as llama.cpp (whose n_vocab is the token count): every token needs its rows
        n_tokens = f.array_len("tokenizer.ggml.tokens")
        if n_tokens is not None and n_tokens != n_vocab:
            source = f"{ARCH}.vocab_size" if f.has(f"{ARCH}.vocab_size") else \
                "rows of token_embd.weight"
            raise f.error(f"the tokenizer has {n_tokens} tokens, the model {n_vocab} ({source})")
        freq_base = finite("rope.freq_base", 10000.0, positive=True)
        # the largest angle rope turns, at the training context's last position: beyond
        # float32 it is inf there, and every logit NaN
        widest = max(n_ctx_train, 1) * freq_scale * freq_base ** (-(n_rot - 2) / n_rot)
        if not is_float32(widest):
            raise f.error(f"metadata '{ARCH}.rope.freq_base' = {freq_base} turns rope's angles "
                          f"past float32 ({widest:.3g} at position {max(n_ctx_train, 1)})")
        attn_factor = finite("rope.scaling.attn_factor", 1.0, positive=True)
        if not is_float32(attn_factor ** 2 / math.sqrt(head_dim)):   # the softmax's scale
            raise f.error(f"metadata '{ARCH}.rope.scaling.attn_factor' = {attn_factor} makes the "
                          f"attention scale attn_factor²/√{head_dim} beyond float32")
        return cls(
            n_vocab=n_vocab, n_ctx_train=n_ctx_train, n_embd=n_embd,
            n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv,
            n_ff=n_ff, head_dim=head_dim, n_rot=n_rot,
            rope_freq_base=freq_base,
            rope_freq_scale=freq_scale,
            rope_attn_factor=attn_factor,
            rms_eps=finite("attention.layer_norm_rms_epsilon", REQUIRED, positive=False),
        )


# ---- weights ------------------------------------------------------------------

@dataclass(frozen=True)
class LayerWeights:
    """The weights of one transformer block (gguf_model.Weight each), numpy-order shapes."""
    attn_norm: object   # (E,)
    wq: object          # (H*D, E)
    wk: object          # (Hkv*D, E)
    wv: object          # (Hkv*D, E)
    wo: object          # (E, H*D)
    ffn_norm: object    # (E,)
    w_gate: object      # (F, E)
    w_up: object        # (F, E)
    w_down: object      # (E, F)
    # optional biases, as llama.cpp's LLM_ARCH_LLAMA loads them (None: absent)
    bq: object = None       # (H*D,)
    bk: object = None       # (Hkv*D,)
    bv: object = None       # (Hkv*D,)
    bo: object = None       # (E,)
    b_gate: object = None   # (F,)
    b_up: object = None     # (F,)
    b_down: object = None   # (E,)


@dataclass(frozen=True)
class LlamaWeights:
    """Every weight as a gguf_model.Weight: memory-mapped bytes, type, shape."""
    token_embd: object  # (V, E)
    layers: tuple
    output_norm: object  # (E,)
    output: object       # (V, E), token_embd when the file ties them
    rope_freqs: object   # (n_rot/2,) or None

    @classmethod
    def from_gguf(cls, f: GGUFModelFile, c: LlamaConfig):
        """Every weight of the file, checked against config `c`; ModelLoadError for a missing,
        misshapen or unusable tensor, or one the model does not use."""
        E, F, V = c.n_embd, c.n_ff, c.n_vocab
        Q, KV = c.n_head * c.head_dim, c.n_embd_kv
        layers = []
        for i in range(c.n_layer):
            def w(name, shape, use=USE_MATMUL):
                return f.weight(f"blk.{i}.{name}.weight", shape, use)

            def b(name, n):
                return f.weight(f"blk.{i}.{name}.bias", (n,), USE_NORM, required=False)
            layers.append(LayerWeights(
                attn_norm=w("attn_norm", (E,), USE_NORM),
                wq=w("attn_q", (Q, E)), wk=w("attn_k", (KV, E)), wv=w("attn_v", (KV, E)),
                wo=w("attn_output", (E, Q)),
                ffn_norm=w("ffn_norm", (E,), USE_NORM),
                w_gate=w("ffn_gate", (F, E)), w_up=w("ffn_up", (F, E)), w_down=w("ffn_down", (E, F)),
                bq=b("attn_q", Q), bk=b("attn_k", KV), bv=b("attn_v", KV), bo=b("attn_output", E),
                b_gate=b("ffn_gate", F), b_up=b("ffn_up", F), b_down=b("ffn_down", E),
            ))
        token_embd = f.weight("token_embd.weight", (V, E), USE_ROWS)
        output = f.weight("output.weight", (V, E), USE_MATMUL, required=False)
        if output is None:   # tied embeddings
            output = f.weight("token_embd.weight", (V, E), USE_MATMUL)
        rope_freqs = f.weight("rope_freqs.weight", (c.n_rot // 2,), USE_NORM, required=False)
        output_norm = f.weight("output_norm.weight", (E,), USE_NORM)
        # as llama.cpp: a tensor the model does not use means the file is not what its
        # metadata says (a wrong block_count, another architecture's extra weights)
        unused = f.unused_tensors()
        if unused:
            names = ", ".join(repr(n) for n in unused[:4]) + (", ..." if len(unused) > 4 else "")
            n_file = len(f.tensors)
            raise f.error(f"wrong number of tensors: a llama model of block_count {c.n_layer} "
                          f"uses {n_file - len(unused)} of the file's {n_file}; not used: {names}")
        return cls(token_embd=token_embd, layers=tuple(layers), output_norm=output_norm,
                   output=output, rope_freqs=rope_freqs)


# ---- the forward graph ----------------------------------------------------------

class ForwardGraph:
    """A built forward pass for T tokens over a K-slot window, with its inputs."""

    def __init__(self, ctx, tokens, positions, slots, mask, logits, graph, buffer_bytes=None):
        self.ctx, self.graph = ctx, graph
        self.buffer_bytes = buffer_bytes    # the packed intermediates (None: unpacked)
        self.tokens = tokens.numpy()        # int32 (T,)
        self.positions = positions.numpy()  # int32 (T,)
        self.slots = slots.numpy()          # int32 (T,)
        self.mask = mask.numpy()            # float32 (T, K)
        self.logits = logits.numpy()        # float32 (n_out, V)


def _weight(ctx, w):
    """A leaf tensor over a weight's mapped bytes (no copy)."""
    return ctx.from_buffer(w.data, w.type, w.shape, name=w.name)


def linear(w, x, bias=None):
    """w x (+ bias): w (N, E), x (T, E), bias (N,) or None -> (T, N)."""
    y = ops.mul_mat(w, x)
    return y if bias is None else ops.add(y, bias)


def attention(c, x, lw, cache, il, positions, slots, mask, rope_freqs, T, K):
    """Self-attention of layer il: x (T, E) -> (T, E); writes this batch's K, V rows."""
    D, H, Hkv = c.head_dim, c.n_head, c.n_head_kv
    q = ops.reshape(linear(lw.wq, x, lw.bq), (T, H, D))             # (T, H, D)
    k = ops.reshape(linear(lw.wk, x, lw.bk), (T, Hkv, D))           # (T, Hkv, D)
    v = linear(lw.wv, x, lw.bv)                                     # (T, Hkv*D)
    q = ops.rope(q, positions, c.n_rot, ops.ROPE_NORMAL, c.rope_freq_base, c.rope_freq_scale,
                 rope_freqs)
    k = ops.rope(k, positions, c.n_rot, ops.ROPE_NORMAL, c.rope_freq_base, c.rope_freq_scale,
                 rope_freqs)

    keys, values = cache.store_and_load(x.ctx, il, ops.reshape(k, (T, Hkv * D)), v,
                                        slots, K)                   # (Hkv, K, D) each
    values = ops.cont(ops.permute(values, (0, 2, 1)))              # (Hkv, D, K)

    queries = ops.permute(q, (1, 0, 2))                              # (H, T, D)
    if T >= PACKED_ATTENTION_MIN_T:
        # packed copies (a few MB), so that the products can take BLAS
        keys, queries = ops.cont(keys), ops.cont(queries)

    # grouped-query attention: mul_mat broadcasts the Hkv heads over the H query heads
    scores = ops.mul_mat(keys, queries)                             # (H, T, K)
    # rope's attn_factor scales the rotated q and k (whole heads), so the scores by its square
    probs = ops.soft_max(scores, mask, c.rope_attn_factor ** 2 / math.sqrt(D))   # (H, T, K)
    out = ops.mul_mat(values, probs)                                # (H, T, D)
    out = ops.reshape(ops.cont(ops.permute(out, (1, 0, 2))), (T, H * D))   # (T, H*D)
    return linear(lw.wo, out, lw.bo)                                # (T, E)


def feed_forward(x, lw):
    """SwiGLU: w_down(silu(w_gate x) * w_up x), x (T, E) -> (T, E) (each plus its bias, if any)."""
    gated = ops.swiglu(linear(lw.w_gate, x, lw.b_gate), linear(lw.w_up, x, lw.b_up))   # (T, F)
    return linear(lw.w_down, gated, lw.b_down)


def build_forward_graph(c, weights, cache, T, K, n_out, packed=True, buffer_for=None,
                        mask_buffer=None):
    """The forward pass of T tokens attending to K cache slots, as a ForwardGraph.

    n_out: logits are computed for the last n_out tokens only (1 to sample the
    next token, T for all).
    packed: intermediates share one buffer where their lifetimes allow
    (graph_alloc); otherwise each has its own memory. buffer_for: see
    graph_alloc.build_packed (a buffer shared with other graphs). mask_buffer:
    a float32 array of T * K or more elements to hold the mask (shared with
    other graphs that never run at the same time; None: the graph's own).
    """
    build = _forward_builder(c, weights, cache, T, K, n_out, mask_buffer)
    if packed:
        leaf_bytes = _leaf_bytes(c, T, 0 if mask_buffer is not None else K)
        built = build_packed(build, lambda r: [r[-1]], leaf_bytes, buffer_for)
        return ForwardGraph(*built.result[:5], logits=built.result[5], graph=built.graph,
                            buffer_bytes=built.buffer_bytes)
    # every result its own memory: the arena a first build (structs only) counts, each
    # result aligned
    plan = plan_packed(build, lambda r: [r[-1]], _leaf_bytes(c, T, K))
    arena = plan.other_bytes + plan.unpacked_bytes + _core.ARENA_ALIGN * len(plan.sizes)
    ctx, tokens, positions, slots, mask, logits = build(Context(mem_size=arena))
    return ForwardGraph(ctx, tokens, positions, slots, mask, logits, build_forward(logits))


def forward_graph_bytes(c, weights, cache, T, K, n_out):
    """Bytes of the packed intermediates of build_forward_graph(..., T, K, n_out), found
    without building it (tensor structs only)."""
    build = _forward_builder(c, weights, cache, T, K, n_out)
    return plan_packed(build, lambda r: [r[-1]], _leaf_bytes(c, T, K)).buffer_bytes


def _forward_builder(c, weights, cache, T, K, n_out, mask_buffer=None):
    """build(ctx) -> (ctx, tokens, positions, slots, mask, logits) of the forward pass."""
    def build(ctx):
        tokens = ctx.new_tensor(Type.I32, (T,), name="tokens")
        positions = ctx.new_tensor(Type.I32, (T,), name="positions")
        slots = ctx.new_tensor(Type.I32, (T,), name="kv_slots")
        if mask_buffer is None:
            mask = ctx.new_tensor(Type.F32, (T, K), name="kq_mask")
        else:
            mask = ctx.from_buffer(mask_buffer[:T * K], Type.F32, (T, K), name="kq_mask")
        rope_freqs = _weight(ctx, weights.rope_freqs) if weights.rope_freqs is not None else None

        x = ops.get_rows(_weight(ctx, weights.token_embd), tokens)       # (T, E)
        for il, layer in enumerate(weights.layers):
            lw = LayerWeights(**{name: _weight(ctx, w) for name, w in vars(layer).items()
                                 if w is not None})
            h = ops.mul(ops.rms_norm(x, c.rms_eps), lw.attn_norm)
            x = ops.add(x, attention(c, h, lw, cache, il, positions, slots, mask, rope_freqs,
                                     T, K))
            h = ops.mul(ops.rms_norm(x, c.rms_eps), lw.ffn_norm)
            x = ops.add(x, feed_forward(h, lw))

        if n_out < T:           # the output matrix is the largest: skip unwanted rows
            x = ops.view(x, (n_out, c.n_embd), offset=(T - n_out) * x.strides[0])
        x = ops.mul(ops.rms_norm(x, c.rms_eps), _weight(ctx, weights.output_norm))
        logits = ops.mul_mat(_weight(ctx, weights.output), x)           # (n_out, V)
        logits.name = "logits"
        return ctx, tokens, positions, slots, mask, logits
    return build


def _leaf_bytes(c, T, K):
    """Arena bytes of one forward graph besides its results: structs and inputs."""
    n_tensors = c.n_layer * 64 + 32     # ~48 per layer, 14 more with every bias
    return n_tensors * STRUCT_BYTES + 4 * T * (K + 3) + 4096


# ---- the model ------------------------------------------------------------------

_live_models = weakref.WeakSet()


def _free_locks_after_fork():
    # A fork child has only the thread that forked: a forward lock another thread
    # held stays held for good, over a cache and graphs that forward left half-way
    # (a position marked held whose row was never written, nodes marked as being
    # computed). Such a model gets a free lock and graphs built again, and refuses
    # to run until its cache is cleared (what it holds is unknown).
    for model in list(_live_models):
        if model._lock.acquire(blocking=False):    # free, or held by the forking thread
            model._lock.release()
        else:
            model._lock = threading.RLock()
            model._cache.cut_by_fork = True
            model._drop_graphs()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_free_locks_after_fork)


def default_cache(config, n_ctx, kv_type):
    """The stock KV cache for a model of `config`: n_ctx slots of kv_type (F16 or F32)."""
    return KVCache(config.n_layer, n_ctx, config.n_head_kv, config.head_dim, type=kv_type)


# the weights each layer multiplies by (mul_mat's left operand), besides the output matrix
MATMUL_TENSORS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def matrix_shapes(f):
    """(model name, distinct (N, K, type)) of the matrix products a forward pass of the
    model in GGUFModelFile `f` runs: what the tune bench times for it. The name is the
    one a tune file records: general.name, else the file name."""
    shapes = set()
    for t in f.reader.tensors:
        base = t.name.rsplit(".", 1)[0].split(".")[-1]
        is_output = t.name == "output.weight" or (t.name == "token_embd.weight"
                                                  and not f.has_tensor("output.weight"))
        if len(t.shape) == 2 and (base in MATMUL_TENSORS or is_output):
            n, k = t.shape                              # numpy order: (rows, row length)
            shapes.add((n, k, weight_type(t.type, f"{f.path}: {t.name}")))
    if not shapes:
        raise ValueError(f"{f.path}: no llama matrix products found")
    name = str(f.get("general.name", default=None) or os.path.basename(f.path))
    return name, sorted(shapes)


DEFAULT_N_CTX = 2048     # no n_ctx given: this, or the training context when smaller


def context_size(n_ctx, n_ctx_train, f, default=DEFAULT_N_CTX):
    """The KV cache size in tokens, the one rule for `gg.Llama` and every program: n_ctx
    as given; 0: the training context (n_ctx_train); None: `default`, or the training
    context when that is smaller. ModelLoadError of GGUFModelFile `f` when the rule needs
    a training context and the file's is not positive; ValueError for n_ctx < 0."""
    if n_ctx is not None and n_ctx < 0:
        raise ValueError(f"n_ctx must be at least 1 (0: the model's training context), got {n_ctx}")
    if n_ctx:
        return int(n_ctx)
    if n_ctx_train < 1:
        raise f.error(f"no context size asks for the model's training context, and its "
                      f"context_length is {n_ctx_train}: give one (n_ctx, -c N)")
    return n_ctx_train if n_ctx == 0 else min(default, n_ctx_train)


class LlamaModel:
    """Weights + KV cache + cached forward graphs; forward(tokens, positions) -> logits.

    make_cache(config, n_ctx, kv_type) builds the KV cache (default_cache: a KVCache);
    another kind of cache, reached through kv_cache's interface only, takes its place.
    """

    def __init__(self, path, n_ctx=None, kv_type=Type.F16, n_threads=None, kv_pad=KV_PAD,
                 packed=True, make_cache=default_cache, use_mmap=True):
        """path: the GGUF file, or a GGUFModelFile already open; n_ctx: see context_size."""
        self.file = path if isinstance(path, GGUFModelFile) else GGUFModelFile(path, use_mmap=use_mmap)
        self.config = LlamaConfig.from_gguf(self.file)
        self.weights = LlamaWeights.from_gguf(self.file, self.config)
        self.n_ctx = context_size(n_ctx, self.config.n_ctx_train, self.file)
        self._cache = make_cache(self.config, self.n_ctx, kv_type)
        self.n_threads = n_threads or default_threads()
        self.kv_pad = kv_pad
        self.packed = packed
        self.tune = None           # TuneData: MUL_MAT profiles from measurements
        self._graphs = OrderedDict()
        # enough for a sequence's every window twice (a prompt's batches and the tokens
        # generated after them; a perplexity chunk's batches), so that none is rebuilt,
        # up to MAX_GRAPHS (each holds its tensor structs, ~32 KB a layer)
        self.max_graphs = min(MAX_GRAPHS, max(MIN_GRAPHS, 2 * -(-self.n_ctx // kv_pad) + 8))
        # the graphs run one at a time: one buffer of intermediates, one of masks and
        # one work buffer serve them all (as ggml's compute buffer)
        self._intermediates = None   # uint8 array on a cache line (graph.aligned_bytes)
        self._masks = None           # float32 array: the running graph's (T, K) mask
        self._reserved_for = set()   # batch sizes T whose largest graph the buffers fit
        self._work_donor = None      # the graph whose work buffer the next ones share
        self._work_bytes = 0
        self.build_s, self.n_built = 0.0, 0    # time spent building graphs, and how many
        self._lock = threading.RLock()         # one forward at a time: shared buffers and cache
        _live_models.add(self)

    @property
    def cache(self):
        """The KV cache. The graphs are built over its buffers, so it is not replaced
        (assigning another one made the cached graphs compute on the old one)."""
        return self._cache

    def set_tune(self, data):
        """Plan every MUL_MAT with this TuneData (None: ggml's fallback rule)."""
        self.tune = check_tune(data, "set_tune")
        for g in self._graphs.values():
            g.graph.plan(self.n_threads, tune=data)
            self._share_work(g.graph)

    def graph(self, T, K, n_out):
        """The cached forward graph for (T, K, n_out), built on first use."""
        key = (T, K, n_out)
        g = self._graphs.get(key)
        if g is None:
            t0 = time.perf_counter()
            if self.packed and T not in self._reserved_for:
                # size the buffers at once for T tokens over the whole context (as ggml
                # reserves its compute buffer), so that the windows to come, which need
                # more, do not grow them and drop the graphs built so far; with room to
                # spare, as the packing is not monotone in K (a smaller window has needed 6 %
                # more), though a graph that needs more still gets it
                need = forward_graph_bytes(self.config, self.weights, self.cache, T, self.n_ctx, T)
                self._intermediates_for(need + need // RESERVE_SPARE)
                self._masks_for(T * self.n_ctx)
                self._reserved_for.add(T)
            g = build_forward_graph(self.config, self.weights, self.cache, T, K, n_out,
                                    self.packed, buffer_for=self._intermediates_for,
                                    mask_buffer=self._masks_for(T * K) if self.packed else None)
            self._graphs[key] = g
            g.graph.plan(self.n_threads, tune=self.tune)
            self._share_work(g.graph)
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
            self.build_s += time.perf_counter() - t0
            self.n_built += 1
        else:
            self._graphs.move_to_end(key)
        return g

    def _intermediates_for(self, nbytes):
        """The shared buffer of intermediates, grown to nbytes when smaller."""
        if self._intermediates is None or self._intermediates.nbytes < nbytes:
            self._drop_graphs()               # they hold the old one: it goes before the new one
            self._intermediates = None
            self._intermediates = aligned_bytes(nbytes)
        return self._intermediates

    def _masks_for(self, n):
        """The shared mask buffer (float32), grown to n elements when smaller."""
        if self._masks is None or self._masks.size < n:
            self._drop_graphs()
            self._masks = None
            self._masks = np.empty(n, np.float32)
        return self._masks

    def _drop_graphs(self):
        """Forget every built graph (rebuilt when next needed): a shared buffer is growing."""
        self._graphs.clear()
        self._work_donor, self._work_bytes = None, 0

    def _share_work(self, graph):
        """Give graph the work buffer of the graphs before it (or, when it needs more,
        its own, which the next graphs share)."""
        size = graph.reserve(self.n_threads, share_with=self._work_donor)
        if size > self._work_bytes:
            self._work_donor, self._work_bytes = graph, size
            for g in self._graphs.values():     # all move to it: the smaller one is freed
                g.graph.reserve(self.n_threads, share_with=graph)

    def forward(self, tokens, positions, n_out=None):
        """Run one batch: tokens, positions int (T,) -> logits (n_out, V) of the last
        n_out tokens (default: all T).

        Writes the batch's K/V rows into the cache. The returned array is the
        graph's own output buffer: copy it to keep it past the next call. Calls from
        several threads take turns (the graphs share their buffers and the cache).
        """
        tokens = np.asarray(tokens).reshape(-1)
        positions = np.asarray(positions).reshape(-1)
        T = tokens.size
        if T == 0 or positions.size != T:
            raise ValueError(f"forward: {T} tokens and {positions.size} positions")
        # checked before the int32 cast, which would wrap 2**32 + 3 to 3 and cut 2.9 to 2;
        # distinct, as two tokens at one position would write one cache row at once
        if positions.dtype.kind not in "iu":
            raise ValueError(f"forward: positions must be integers, got {positions.dtype}")
        if positions.min() < 0 or positions.max() >= self.n_ctx:
            raise ValueError(f"forward: positions {positions.min()}..{positions.max()} do not "
                             f"fit a context of {self.n_ctx} tokens")
        if np.unique(positions).size != T:
            raise ValueError("forward: positions must be distinct")
        positions = positions.astype(np.int32)
        if tokens.dtype.kind not in "iu" or not all(0 <= int(t) < self.config.n_vocab
                                                     for t in (tokens.min(), tokens.max())):
            raise ValueError(f"forward: token ids must be integers in 0..{self.config.n_vocab - 1}")
        tokens = tokens.astype(np.int32)
        n_out = T if n_out is None else n_out
        if not 1 <= n_out <= T:
            raise ValueError(f"forward: n_out must be in 1..{T}, got {n_out}")
        with self._lock:
            return self._forward(tokens, positions, n_out)

    def _forward(self, tokens, positions, n_out):
        """forward's work, its arguments checked (int32 arrays), under its lock."""
        cache = self._cache
        if cache.cut_by_fork:
            raise RuntimeError("forward: another thread was running forward on this model when "
                               "the process forked, so its cache is unknown here; call "
                               "model.cache.clear() to start over")
        self.file.check_unchanged()    # a ModelLoadError here, not a SIGBUS in compute
        try:
            slots = cache.begin(positions)
            g = self.graph(tokens.size, cache.window(self.kv_pad), n_out)
            g.tokens[:] = tokens
            g.positions[:] = positions
            g.slots[:] = slots
            cache.fill_mask(g.mask, positions)
            pool = shared_pool(self.n_threads) if self.n_threads > 1 else None
            g.graph.compute(n_threads=self.n_threads if pool is None else None, pool=pool)
        except BaseException:
            # a failed call (no memory for a graph, Ctrl-C) leaves no position marked
            # as held that it may not have written
            cache.rollback()
            raise
        return g.logits
