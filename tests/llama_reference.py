"""An independent float64 numpy forward pass of a llama GGUF file (the test oracle).

It reads the file with gguf.GGUFReader and gguf.quants.dequantize only (none of
ggml_py), and computes the whole sequence at once with a causal mask, in the
textbook way: no cache, no graph.
"""
import numpy as np


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


class ReferenceLlama:
    def __init__(self, path):
        import gguf
        r = gguf.GGUFReader(path)
        self.n_embd = _field(r, "llama.embedding_length")
        self.n_layer = _field(r, "llama.block_count")
        self.n_head = _field(r, "llama.attention.head_count")
        self.n_head_kv = _field(r, "llama.attention.head_count_kv", self.n_head)
        self.head_dim = _field(r, "llama.attention.key_length", self.n_embd // self.n_head)
        self.n_rot = _field(r, "llama.rope.dimension_count", self.head_dim)
        self.eps = _field(r, "llama.attention.layer_norm_rms_epsilon")
        self.base = _field(r, "llama.rope.freq_base", 10000.0)
        # llama.cpp: type linear unless named; factor from scaling.factor, else scale_linear
        factor = _field(r, "llama.rope.scaling.factor", _field(r, "llama.rope.scale_linear", 0.0))
        scaled = _field(r, "llama.rope.scaling.type", "linear") != "none" and factor != 0
        self.freq_scale = 1.0 / factor if scaled else 1.0
        self.attn_factor = _field(r, "llama.rope.scaling.attn_factor", 1.0)   # scales cos, sin
        self.w = {}
        for t in r.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            self.w[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).astype(
                np.float64).reshape(shape)
        self.output = self.w.get("output.weight", self.w["token_embd.weight"])
        self.freq_factors = self.w.get("rope_freqs.weight")

    def rms_norm(self, x, weight):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def rope(self, x, positions):
        """x (T, heads, D): rotate pairs (2i, 2i+1) of the first n_rot dims."""
        i = np.arange(self.n_rot // 2)
        inv_freq = self.base ** (-2.0 * i / self.n_rot)
        if self.freq_factors is not None:
            inv_freq = inv_freq / self.freq_factors[: self.n_rot // 2]
        theta = self.freq_scale * positions[:, None] * inv_freq[None, :]     # (T, n_rot/2)
        cos = self.attn_factor * np.cos(theta)[:, None, :]
        sin = self.attn_factor * np.sin(theta)[:, None, :]
        out = x.copy()
        x0, x1 = x[..., 0:self.n_rot:2], x[..., 1:self.n_rot:2]
        out[..., 0:self.n_rot:2] = x0 * cos - x1 * sin
        out[..., 1:self.n_rot:2] = x0 * sin + x1 * cos
        return out

    def forward(self, tokens, kv_dtype=None):
        """Logits (T, V) of a whole sequence starting at position 0.

        kv_dtype: round K and V to this dtype (e.g. np.float16) as a cache would.
        """
        tokens = np.asarray(tokens)
        T, H, Hkv, D = len(tokens), self.n_head, self.n_head_kv, self.head_dim
        positions = np.arange(T, dtype=np.float64)
        causal = np.triu(np.full((T, T), -np.inf), k=1)
        x = self.w["token_embd.weight"][tokens]
        for il in range(self.n_layer):
            w = {k[len(f"blk.{il}."):]: v for k, v in self.w.items() if k.startswith(f"blk.{il}.")}
            def linear(name, x):
                """x @ W.T plus the layer's bias for `name`, if the file has one."""
                return x @ w[f"{name}.weight"].T + w.get(f"{name}.bias", 0.0)

            h = self.rms_norm(x, w["attn_norm.weight"])
            q = self.rope(linear("attn_q", h).reshape(T, H, D), positions)
            k = self.rope(linear("attn_k", h).reshape(T, Hkv, D), positions)
            v = linear("attn_v", h).reshape(T, Hkv, D)
            if kv_dtype is not None:
                k = k.astype(kv_dtype).astype(np.float64)
                v = v.astype(kv_dtype).astype(np.float64)
            group = H // Hkv
            k = np.repeat(k, group, axis=1)                              # (T, H, D)
            v = np.repeat(v, group, axis=1)
            scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(D) + causal  # (H, T, T)
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            out = np.einsum("hts,shd->thd", probs, v).reshape(T, H * D)
            x = x + linear("attn_output", out)
            h = self.rms_norm(x, w["ffn_norm.weight"])
            gate, up = linear("ffn_gate", h), linear("ffn_up", h)
            x = x + linear("ffn_down", gate / (1.0 + np.exp(-gate)) * up)
        x = self.rms_norm(x, self.w["output_norm.weight"])
        return x @ self.output.T
