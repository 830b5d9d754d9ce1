"""The GGUF: hyper-parameters, tokenizer, then the tensors as f32, f16 or bf16, one at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ggml_py.files.gguf_writer import write_streamed
from ggml_py.tools.convert.checkpoint import CheckpointTensor
from ggml_py.tools.convert.config import LlamaParams
from ggml_py.tools.convert.vocab import Vocab


def _to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), round to nearest even, NaN kept quiet, like ggml."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u.astype(np.uint64) + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((u >> 16) | 64).astype(np.uint16), rounded)


def write_gguf(path: Path, p: LlamaParams, tensors: dict[str, CheckpointTensor], vocab: Vocab,
               outtype: str, name: str, log=print) -> None:
    """Write a llama GGUF to `path`: hyper-parameters, tokenizer, then the tensors as
    `outtype` (1-D tensors stay F32), one at a time; `log` gets one line per tensor."""
    import gguf

    from ggml_py.files.gguf_writer import add_llama_hparams

    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "bf16": gguf.LlamaFileType.MOSTLY_BF16}[outtype]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_file_type(file_type)
    add_llama_hparams(w, n_vocab=p.n_vocab, n_ctx=p.n_ctx, n_embd=p.n_embd, n_layer=p.n_layer,
                      n_ff=p.n_ff, n_head=p.n_head, n_head_kv=p.n_head_kv, rms_eps=p.rms_eps,
                      rope_freq_base=p.rope_theta, rope_dim=p.rope_dim,
                      rope_scale_linear=p.rope_scaling_linear)

    w.add_tokenizer_model(vocab.model)
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    if vocab.scores is not None:
        w.add_token_scores(vocab.scores)
    w.add_token_types(vocab.types)
    if vocab.merges is not None:
        w.add_token_merges(vocab.merges)
    for value, add in ((vocab.bos_id, w.add_bos_token_id), (vocab.eos_id, w.add_eos_token_id),
                       (vocab.unk_id, w.add_unk_token_id), (vocab.pad_id, w.add_pad_token_id)):
        if value is not None:
            add(value)
    w.add_add_bos_token(vocab.add_bos)
    w.add_add_eos_token(vocab.add_eos)
    if vocab.add_space_prefix is not None:
        w.add_add_space_prefix(vocab.add_space_prefix)
    if vocab.chat_template:
        w.add_chat_template(vocab.chat_template)

    def stored(tname: str, t: CheckpointTensor):
        """(gguf type, make) of a tensor: 1-D tensors (norms) stay F32 in every output
        type, as in llama.cpp."""
        kind = outtype if len(t.shape) > 1 else "f32"
        change = {"f32": lambda x: x, "f16": lambda x: x.astype(np.float16), "bf16": _to_bf16}[kind]

        def make():
            data = change(t.load())
            log(f"  {tname:<28} {str(list(t.shape)):<14} {kind.upper()}")
            return data
        return gguf.GGMLQuantizationType[kind.upper()], make

    write_streamed(w, [(tname, t.shape, *stored(tname, t)) for tname, t in tensors.items()])
