"""How a llama model is split over R processes (ranks) for tensor-parallel inference, and
each rank's share of the weights: views of the memory-mapped file wherever rows are
contiguous, never a copy of what another rank reads.

| weight                       | split                      | a rank's share                       |
|------------------------------|----------------------------|--------------------------------------|
| attn_q (H*D, E)              | rows, by query heads       | its H/R heads' rows: a view          |
| attn_k, attn_v (Hkv*D, E)    | rows, by KV heads          | its Hkv/R heads' rows: a view        |
| attn_output (E, H*D)         | columns, by query heads    | a strided view (ColumnSlice)         |
| ffn_gate, ffn_up (F, E)      | rows (output columns)      | rows f0..f1: a view                  |
| ffn_down (E, F)              | columns (its input)        | columns f0..f1: a strided view       |
| output (V, E)                | rows, by vocabulary        | rows v0..v1: a view                  |
| token_embd, norms, rope_freqs| not split                  | the whole (embeddings: rows read)    |
| biases of q, k, v, gate, up  | as their matrix's rows     | a view                               |
| biases of attn_output, down  | not split                  | rank 0 adds it (the sum has it once) |

Query head h reads KV head h // (H / Hkv), so a rank keeps whole groups: R must divide
n_head_kv. Each attention and feed-forward block then ends in a partial sum (T, E) per
rank, which an all-reduce adds up. A column split needs its boundary on a block of the
weight's type (and of the activations' type it is multiplied with: Q8_0 or Q8_K blocks);
the feed-forward boundaries are chosen on blocks (a rank may get a block more than
another). Where a head boundary falls inside a block (a K-quant attn_output whose
H/R heads are not 256 columns apart), or n_ff has fewer blocks than ranks, that rank
keeps its columns as an F32 copy instead (the programs warn: cli.common.copies_warning).
"""
import dataclasses
from dataclasses import dataclass

import numpy as np

from ggml_py.core.quants import dequantize
from ggml_py.core.types import Type, type_traits
from ggml_py.files.gguf_reader import Weight
from ggml_py.model.config import LlamaConfig
from ggml_py.model.weights import ColumnSlice, LayerWeights, LlamaWeights, matrix_shapes


class SplitError(ValueError):
    """A model that cannot be split over this many ranks (said on every rank)."""


def _column_block(type):
    """Columns a column split must keep together: the weight's block, and that of the
    type the activations are converted to for its dot products."""
    traits = type_traits(type)
    return max(traits["blck_size"], type_traits(traits["vec_dot_type"])["blck_size"])


def even_bounds(n, size):
    """size + 1 boundaries splitting range(n) into `size` near-equal parts."""
    return [n * r // size for r in range(size + 1)]


def block_bounds(n, size, block):
    """size + 1 boundaries splitting range(n) into parts of whole blocks (the last part
    takes a partial block at the end), as equal as blocks allow; None when there are
    fewer blocks than parts."""
    n_blocks = -(-n // block)
    if n_blocks < size:
        return None
    return [min(n, n_blocks * r // size * block) for r in range(size + 1)]


@dataclass(frozen=True)
class Shard:
    """Rank `rank` of `size`: which heads, feed-forward columns and vocabulary rows it
    computes. Shapes numpy order; H, Hkv heads, D head size, F n_ff, V n_vocab."""
    rank: int
    size: int
    heads: tuple       # (h0, h1): query heads h0..h1-1
    kv_heads: tuple    # (g0, g1): KV heads g0..g1-1
    ffn: tuple         # (f0, f1): feed-forward columns f0..f1-1
    vocab: tuple       # (v0, v1): logits v0..v1-1
    vocab_bounds: tuple  # every rank's v0, and V at the end
    copies: tuple = ()   # weights this rank holds as F32 copies of its columns (misaligned)

    @classmethod
    def of(cls, config, rank, size, down_type):
        """The share of rank `rank` of `size` of a model of LlamaConfig `config`, whose
        ffn_down has type down_type; SplitError when size does not divide n_head_kv."""
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"rank {rank} of {size}")
        H, Hkv, F, V = config.n_head, config.n_head_kv, config.n_ff, config.n_vocab
        if Hkv % size:
            raise SplitError(f"tensor parallel over {size} processes needs n_head_kv divisible by "
                             f"{size}: this model has {Hkv} KV heads (and {H} query heads); run "
                             f"on a number of processes that divides {Hkv}")
        ffn = block_bounds(F, size, _column_block(down_type)) or even_bounds(F, size)
        vocab = even_bounds(V, size)
        q, kv = H // size, Hkv // size
        return cls(rank=rank, size=size, heads=(rank * q, (rank + 1) * q),
                   kv_heads=(rank * kv, (rank + 1) * kv), ffn=(ffn[rank], ffn[rank + 1]),
                   vocab=(vocab[rank], vocab[rank + 1]), vocab_bounds=tuple(vocab))

    def config(self, config):
        """The config this rank's graphs are built from: its heads and feed-forward
        columns (n_vocab stays the model's: tokens and logits are the whole vocabulary's)."""
        return dataclasses.replace(config, n_head=self.heads[1] - self.heads[0],
                                   n_head_kv=self.kv_heads[1] - self.kv_heads[0],
                                   n_ff=self.ffn[1] - self.ffn[0])

    def weights(self, weights, config):
        """(this rank's LlamaWeights, the names of those held as F32 copies)."""
        D = config.head_dim
        q_rows = (self.heads[0] * D, self.heads[1] * D)
        kv_rows = (self.kv_heads[0] * D, self.kv_heads[1] * D)
        copies = []

        def columns(w, c0, c1):
            part = column_share(w, c0, c1)
            if part.type != w.type:
                copies.append(w.name)
            return part

        layers = []
        for lw in weights.layers:
            first = self.rank == 0     # the sum of the ranks' partial outputs adds it once
            layers.append(LayerWeights(
                attn_norm=lw.attn_norm, ffn_norm=lw.ffn_norm,
                wq=rows(lw.wq, *q_rows), wk=rows(lw.wk, *kv_rows), wv=rows(lw.wv, *kv_rows),
                wo=columns(lw.wo, *q_rows),
                w_gate=rows(lw.w_gate, *self.ffn), w_up=rows(lw.w_up, *self.ffn),
                w_down=columns(lw.w_down, *self.ffn),
                bq=rows(lw.bq, *q_rows), bk=rows(lw.bk, *kv_rows), bv=rows(lw.bv, *kv_rows),
                bo=lw.bo if first else None,
                b_gate=rows(lw.b_gate, *self.ffn), b_up=rows(lw.b_up, *self.ffn),
                b_down=lw.b_down if first else None))
        shared = LlamaWeights(token_embd=weights.token_embd, layers=tuple(layers),
                              output_norm=weights.output_norm,
                              output=rows(weights.output, *self.vocab),
                              rope_freqs=weights.rope_freqs)
        return shared, tuple(dict.fromkeys(copies))


def rows(w, r0, r1):
    """Rows r0..r1-1 of a weight (a matrix's rows or a vector's elements): a view of its
    bytes; None stays None."""
    if w is None:
        return None
    return Weight(w.name, w.type, (r1 - r0,) + tuple(w.shape[1:]), w.data[r0:r1])


def column_share(w, c0, c1):
    """Columns c0..c1-1 of a matrix weight (N, K): a ColumnSlice (a view) where both ends
    fall on a block boundary, else an F32 copy of them."""
    block = _column_block(w.type)
    K = w.shape[1]
    if c0 % block == 0 and (c1 % block == 0 or c1 == K) and c1 > c0:
        return ColumnSlice(w, c0, c1 - c0)
    values = w.data if w.type == Type.F32 else dequantize(w.data, w.type, w.shape)
    return Weight(w.name, Type.F32, (w.shape[0], c1 - c0), np.ascontiguousarray(values[:, c0:c1]))


def split_matrix_shapes(f, n_ranks):
    """(model name, distinct (N, K, type)) of the matrix products the ranks of a model
    split over n_ranks run (model.weights.matrix_shapes of their shares, every rank's:
    the feed-forward split may give ranks other widths): what a tune file for it holds."""
    name, _ = matrix_shapes(f)
    config = LlamaConfig.from_gguf(f)
    whole = LlamaWeights.from_gguf(f, config)
    shapes = set()
    for rank in range(n_ranks):
        share, _ = Shard.of(config, rank, n_ranks, whole.layers[0].w_down.type).weights(whole, config)
        for lw in share.layers:
            for w in (lw.wq, lw.wk, lw.wv, lw.wo, lw.w_gate, lw.w_up, lw.w_down):
                shapes.add((w.shape[0], w.shape[1], w.type))
        shapes.add((share.output.shape[0], share.output.shape[1], share.output.type))
    return name, sorted(shapes)
