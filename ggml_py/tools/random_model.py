"""Write llama-architecture GGUF files with random weights, for tests and benchmarks.

The file has what llama.cpp's converter writes for a llama model: hyper-parameters
under `llama.*`, a SentencePiece tokenizer, and the tensors `token_embd`,
`blk.N.{attn_norm,attn_q,attn_k,attn_v,attn_output,ffn_norm,ffn_gate,ffn_up,ffn_down}`,
`output_norm` and (unless tied) `output`. The vocabulary is either the first
`n_vocab` entries of another GGUF's SentencePiece vocabulary (a prefix of a
SentencePiece vocabulary is itself a valid one: byte tokens come first, merges
are ordered by score) or a small built-in one.
"""
from dataclasses import dataclass

import numpy as np

SPM_SPACE = "\u2581"
# SentencePiece token types (llama.cpp's llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_BYTE = 1, 2, 3, 6


@dataclass(frozen=True)
class RandomLlamaSpec:
    """Shape of a random model. head_dim 0 means n_embd / n_head."""
    n_vocab: int = 512
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 160
    head_dim: int = 0                     # > 0: heads of this size (attention.key_length)
    n_ctx_train: int = 512
    rope_freq_base: float = 10000.0
    rope_scale_linear: float = 0.0        # > 0: write rope.scaling.type=linear and factor
    rope_freqs: bool = False              # write a rope_freqs.weight tensor (Llama 3.1 style)
    rms_eps: float = 1e-5
    tied_output: bool = False             # no output.weight: the embeddings are reused
    weight_type: str = "F32"              # F32, F16, BF16 or any quantized type of ggml_py
    seed: int = 0

    def __post_init__(self):
        """ValueError / TypeError for a shape that would write a file ggml_py refuses."""
        import math

        from ggml_py.core.types import type_traits
        from ggml_py.core.types import Type, checked_int
        for name in ("n_vocab", "n_embd", "n_layer", "n_head", "n_head_kv", "n_ff"):
            checked_int(name, getattr(self, name), low=1)
        checked_int("n_ctx_train", self.n_ctx_train, low=0)
        checked_int("head_dim", self.head_dim, low=0)
        checked_int("seed", self.seed, low=0)
        if not self.head_dim and self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} must be n_head ({self.n_head}) heads, or "
                             f"head_dim given")
        if self.head_size % 2:
            raise ValueError(f"the head size {self.head_size} must be even (rope rotates pairs)")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head {self.n_head} must be a multiple of n_head_kv {self.n_head_kv}")
        for name, low in (("rope_freq_base", 0.0), ("rms_eps", 0.0), ("rope_scale_linear", 0.0)):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= low
                    and (value > 0 or name != "rope_freq_base")):
                raise ValueError(f"{name} must be a finite number >= 0 (> 0 for the base), got {value!r}")
        name = self.weight_type.upper() if isinstance(self.weight_type, str) else None
        if name not in Type.__members__ or not type_traits(Type[name])["has_vec_dot"]:
            raise ValueError(f"weight_type {self.weight_type!r} is not a type ggml_py has a "
                             f"matrix product for")
        block = type_traits(Type[name])["blck_size"]
        for what, size in (("n_embd", self.n_embd), ("n_ff", self.n_ff),
                           ("n_head * head_dim", self.n_head * self.head_size)):
            if size % block:
                raise ValueError(f"{what} {size} is not a multiple of {name}'s "
                                 f"block of {block} (rows of the matrices)")

    @property
    def head_size(self):
        """The size of a head: head_dim, or n_embd / n_head."""
        return self.head_dim or self.n_embd // self.n_head


def builtin_spm_vocab(n_vocab):
    """A small SentencePiece vocabulary: <unk> <s> </s>, 256 byte tokens, then pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_BYTE] * 256
    pieces = [SPM_SPACE]
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    pieces += [SPM_SPACE + c for c in letters] + list(letters)
    pieces += [c.upper() for c in letters] + [SPM_SPACE + c.upper() for c in letters]
    pieces += list("0123456789.,;:!?'\"-()")
    words = ["the", "and", "to", "of", "in", "is", "it", "that", "was", "he", "for", "on",
             "are", "with", "as", "his", "they", "be", "at", "one", "have", "this", "from",
             "or", "had", "by", "not", "word", "but", "what", "some", "we", "can", "out"]
    pieces += [SPM_SPACE + w for w in words]
    pairs = [a + b for a in letters[:12] for b in letters[:12]]
    pieces += pairs + [SPM_SPACE + p for p in pairs]
    seen, unique = set(tokens), []
    for p in pieces:
        if p not in seen:
            seen.add(p)
            unique.append(p)
    n_pieces = max(0, n_vocab - len(tokens))
    if n_pieces > len(unique):
        raise ValueError(f"the built-in vocabulary has at most {len(tokens) + len(unique)} tokens")
    tokens += unique[:n_pieces]
    types += [TOKEN_NORMAL] * n_pieces
    scores = [0.0] * 259 + [-float(i) for i in range(n_pieces)]
    return {"model": "llama", "tokens": tokens, "scores": scores, "token_type": types,
            "bos": 1, "eos": 2, "unk": 0}


def spm_vocab_from_gguf(path, n_vocab):
    """The first n_vocab tokens of a GGUF file's SentencePiece vocabulary."""
    from ggml_py.files.gguf_metadata import read_gguf_metadata
    meta = read_gguf_metadata(path)
    if meta.get("tokenizer.ggml.model") != "llama":
        raise ValueError(f"{path}: not a SentencePiece (llama) vocabulary")
    tokens = meta["tokenizer.ggml.tokens"]
    n = len(tokens) if n_vocab is None else n_vocab
    if not 1 <= n <= len(tokens):
        raise ValueError(f"{path}: has {len(tokens)} tokens, asked for {n}")
    return {"model": "llama", "tokens": tokens[:n], "scores": meta["tokenizer.ggml.scores"][:n],
            "token_type": meta["tokenizer.ggml.token_type"][:n],
            "bos": meta.get("tokenizer.ggml.bos_token_id", 1),
            "eos": meta.get("tokenizer.ggml.eos_token_id", 2),
            "unk": meta.get("tokenizer.ggml.unknown_token_id", 0)}


def iter_random_weights(spec):
    """(name, float32 array in numpy order) for each tensor of a random llama model."""
    rng = np.random.default_rng(spec.seed)
    hd = spec.head_size
    n_embd_kv = hd * spec.n_head_kv

    def matrix(rows, cols):
        m = rng.standard_normal((rows, cols), dtype=np.float32)
        m *= np.float32(1.0 / np.sqrt(cols))
        return m

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    yield "token_embd.weight", rng.standard_normal((spec.n_vocab, spec.n_embd), dtype=np.float32)
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", norm(spec.n_embd)
        yield p + "attn_q.weight", matrix(hd * spec.n_head, spec.n_embd)
        yield p + "attn_k.weight", matrix(n_embd_kv, spec.n_embd)
        yield p + "attn_v.weight", matrix(n_embd_kv, spec.n_embd)
        yield p + "attn_output.weight", matrix(spec.n_embd, hd * spec.n_head)
        yield p + "ffn_norm.weight", norm(spec.n_embd)
        yield p + "ffn_gate.weight", matrix(spec.n_ff, spec.n_embd)
        yield p + "ffn_up.weight", matrix(spec.n_ff, spec.n_embd)
        yield p + "ffn_down.weight", matrix(spec.n_embd, spec.n_ff)
    yield "output_norm.weight", norm(spec.n_embd)
    if not spec.tied_output:
        yield "output.weight", matrix(spec.n_vocab, spec.n_embd)
    if spec.rope_freqs:
        yield "rope_freqs.weight", (1.0 + rng.uniform(0, 8, hd // 2)).astype(np.float32)


def random_weights(spec):
    """{name: float32 array (numpy order)} for a random llama model."""
    return dict(iter_random_weights(spec))


def write_random_llama(path, spec=RandomLlamaSpec(), vocab=None, weights=None):
    """Write a llama GGUF to path.

    vocab: a dict like builtin_spm_vocab()'s (default: the built-in one).
    weights: {name: float32 array, or (uint8 block bytes, gguf type) written as is}.
    Matrices are stored as spec.weight_type; norms and rope_freqs stay F32.
    """
    import gguf

    from ggml_py.files.gguf_writer import add_llama_hparams
    vocab = vocab or builtin_spm_vocab(spec.n_vocab)
    if len(vocab["tokens"]) != spec.n_vocab:
        raise ValueError(f"vocabulary has {len(vocab['tokens'])} tokens, spec says {spec.n_vocab}")
    # one float32 tensor at a time: only the converted weights are held until written
    items = weights.items() if weights is not None else iter_random_weights(spec)
    qtype = gguf.GGMLQuantizationType[spec.weight_type.upper()]

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("random llama")
    add_llama_hparams(writer, n_vocab=spec.n_vocab, n_ctx=spec.n_ctx_train, n_embd=spec.n_embd,
                      n_layer=spec.n_layer, n_ff=spec.n_ff, n_head=spec.n_head,
                      n_head_kv=spec.n_head_kv, rms_eps=spec.rms_eps,
                      rope_freq_base=spec.rope_freq_base, rope_dim=spec.head_size,
                      rope_scale_linear=spec.rope_scale_linear)
    # llama.cpp's ftype of a file whose matrices are all `qtype` (MOSTLY_<type>)
    ftype = "ALL_F32" if qtype == gguf.GGMLQuantizationType.F32 else f"MOSTLY_{qtype.name}"
    if qtype.name in ("Q3_K", "Q4_K", "Q5_K"):
        ftype += "_S"    # single-type K files are llama.cpp's _S flavours' base type
    writer.add_file_type(int(gguf.LlamaFileType[ftype]) if ftype in gguf.LlamaFileType.__members__
                         else int(gguf.LlamaFileType.GUESSED))
    writer.add_tokenizer_model(vocab["model"])
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocab["tokens"])
    writer.add_token_scores(vocab["scores"])
    writer.add_token_types(vocab["token_type"])
    writer.add_bos_token_id(vocab["bos"])
    writer.add_eos_token_id(vocab["eos"])
    writer.add_unk_token_id(vocab["unk"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    for name, array in items:
        if isinstance(array, tuple):          # (bytes in numpy order, gguf type): written as is
            data, raw_type = array
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=raw_type)
        elif array.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, array)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, array.astype(np.float16))
        else:   # our own reference quantizers (every type, K-quants included)
            from ggml_py.core.quants import quantize
            data = quantize(np.ascontiguousarray(array, np.float32), int(qtype))
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
