"""A llama model's hyper-parameters from its GGUF metadata, every count checked against
the others (LlamaConfig), and the context-size rule every entry point shares."""
import math
from dataclasses import dataclass

import numpy as np

from ggml_py.core import ops
from ggml_py.files.gguf_reader import REQUIRED, GGUFModelFile

ARCH = "llama"
MAX_LAYERS = 512     # llama.cpp's LLAMA_MAX_LAYERS


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
        if head_dim % 2:        # rope turns pairs (llama.cpp's rope asserts it at the first token)
            given = "attention.key_length" if f.has(f"{ARCH}.attention.key_length") else \
                "embedding_length / head_count"
            raise f.error(f"the head size {head_dim} ({given}) is odd: rope rotates pairs of "
                          f"dimensions")

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
