"""A llama model's weights from its GGUF file (memory-mapped, checked against the
config), and the matrix products they make."""
import dataclasses
import os
from dataclasses import dataclass

import numpy as np

from ggml_py.core.memory import huge_page_bytes
from ggml_py.core.quants import ROWS8_TYPES, interleave_rows8
from ggml_py.core.types import row_bytes
from ggml_py.files.gguf_reader import USE_MATMUL, USE_NORM, USE_ROWS, GGUFModelFile
from ggml_py.model.config import LlamaConfig
from ggml_py.tune.bench import weight_type


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


# LayerWeights' fields that are mul_mat's left operand
MATMUL_FIELDS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def with_rows8(weights, release=None, n_threads=1):
    """`weights` (LlamaWeights) with every Q4_0, Q4_K, Q5_K or Q6_K matrix of a multiple of 8 rows
    given its rows interleaved by eight (Weight.rows8, a copy in memory): the layout
    MUL_MAT's SIMD kernels read fastest (docs/llama.md, "Weights in memory"). The token
    embeddings are not (get_rows reads them); an output matrix tied to them is, as a
    matrix of its own. A ColumnSlice (a process's share of a matrix split by its columns)
    gets its columns packed and interleaved. release(data), if given, is called on each
    whole matrix's bytes once copied (GGUFModelFile.release_pages: the scalar kernels, a
    BLAS profile and get_rows of tied embeddings read them back from the file). The copies
    are made on n_threads threads (the copying releases the GIL), into one block of memory
    on 2 MiB pages where the system gives them (core.memory): the block stays mapped while
    any copy in it is held."""
    def packed(w):
        return w is not None and w.type in ROWS8_TYPES and len(w.shape) == 2 and w.shape[0] % 8 == 0

    # each copy's place in the block, on a cache line
    matrices = [w for lw in weights.layers for name, w in vars(lw).items() if name in MATMUL_FIELDS]
    places, total = {}, 0
    for w in matrices + [weights.output]:
        if packed(w) and id(w) not in places:
            places[id(w)] = total
            total += (w.nbytes + 63) // 64 * 64
    block = huge_page_bytes(total)

    def interleaved(w):
        if not packed(w):
            return w
        data = np.ascontiguousarray(w.data).view(np.uint8)      # packs a slice
        place = places[id(w)]
        out = block[place:place + data.nbytes].reshape(data.shape)
        copy = dataclasses.replace(w, rows8=interleave_rows8(data, w.type, out=out))
        if release is not None and not isinstance(w, ColumnSlice):   # a slice shares its pages
            release(w.data)
        return copy
    # the copies' first touch of their memory (page faults), not the copying, takes most of
    # the time: threads share it out (imported here: concurrent.futures registers fork
    # handlers of its own, which a program that never repacks need not carry)
    from concurrent.futures import Future, ThreadPoolExecutor
    with ThreadPoolExecutor(max(1, n_threads)) as pool:
        futures = {}     # one copy of a matrix that appears twice

        def copy_of(w):
            if id(w) not in futures:
                futures[id(w)] = pool.submit(interleaved, w)
            return futures[id(w)]
        layers = [{name: copy_of(w) if name in MATMUL_FIELDS else w
                   for name, w in vars(lw).items()} for lw in weights.layers]
        output = copy_of(weights.output)
        layers = tuple(LayerWeights(**{name: w.result() if isinstance(w, Future) else w
                                       for name, w in lw.items()}) for lw in layers)
        return dataclasses.replace(weights, layers=layers, output=output.result())


@dataclass(frozen=True)
class ColumnSlice:
    """Columns start .. start + n of a weight matrix `whole` (N, K), read in place: the
    graph takes a view of those columns in the whole matrix's rows (one process's share
    of a matrix split by its input columns: ggml_py/dist). start and n are multiples of
    the type's block size."""
    whole: object     # the Weight (N, K)
    start: int
    n: int
    rows8: object = None   # Q4_0, Q4_K, Q5_K, Q6_K: the slice's rows packed and interleaved (with_rows8)

    @property
    def name(self):
        """The whole matrix's name."""
        return self.whole.name

    @property
    def type(self):
        """The whole matrix's type."""
        return self.whole.type

    @property
    def shape(self):
        """(N, n)."""
        return (self.whole.shape[0], self.n)

    @property
    def offset(self):
        """Bytes from a row's start to its first column of the slice."""
        return row_bytes(self.type, self.start)

    @property
    def data(self):
        """The slice's bytes in every row: a strided view of the whole matrix's data."""
        if self.whole.data.dtype == np.uint8:     # raw blocks: (N, bytes per row)
            return self.whole.data[:, self.offset:self.offset + row_bytes(self.type, self.n)]
        return self.whole.data[:, self.start:self.start + self.n]

    @property
    def nbytes(self):
        """Bytes of the slice (its share of the whole's)."""
        return self.shape[0] * row_bytes(self.type, self.n)


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
