"""ggml-convert: a Hugging Face-style llama checkpoint directory -> GGUF.

    ggml-convert MODEL_DIR [--outfile OUT.gguf] [--outtype f32|f16|bf16]

The directory holds ``config.json`` (a class of config.LLAMA_CLASSES), the weights
(``*.safetensors``, or ``pytorch_model.bin`` which needs PyTorch) and the
tokenizer (``tokenizer.model`` from SentencePiece, or ``tokenizer.json``).
Tensors and metadata get llama.cpp's names, so llama.cpp and ggml_py load the
result alike.

convert() takes the steps in this order, one module each: config (config.json),
vocab (the tokenizer; sentencepiece_model reads a ``tokenizer.model``), checkpoint
(the weights), tensors (llama.cpp's names and layout) and writer (the GGUF); common
holds ConvertError and the JSON reading they share. Neither ``safetensors``,
``sentencepiece`` nor ``transformers`` is needed.

The weights are memory-mapped while the GGUF is written, so the output is written
to a temporary file and renamed into place when complete, and an output that is
one of the checkpoint's files is refused.
"""

from __future__ import annotations

import math
from pathlib import Path

from ggml_py.files.output import OutputPathError, atomic_output, check_output_path
from ggml_py.tools.convert.checkpoint import checkpoint_files, read_weights
from ggml_py.tools.convert.common import ConvertError
from ggml_py.tools.convert.config import read_config
from ggml_py.tools.convert.tensors import map_tensors
from ggml_py.tools.convert.vocab import read_vocab
from ggml_py.tools.convert.writer import write_gguf

__all__ = ["OUTTYPES", "ConvertError", "convert"]

OUTTYPES = ("f32", "f16", "bf16")


def convert(model_dir: str | Path, outfile: str | Path | None = None, outtype: str = "f16",
            log=print, vocab_only: bool = False) -> Path:
    """Convert an HF-style llama checkpoint directory to a GGUF file; returns its path.

    ``vocab_only`` writes the metadata and tokenizer without tensors (no weights needed).
    """
    model_dir = Path(model_dir)
    if outtype not in OUTTYPES:
        raise ConvertError(f"unknown --outtype {outtype!r} (choose from {', '.join(OUTTYPES)})")
    if not model_dir.is_dir():
        raise ConvertError(f"{model_dir}: not a directory")
    out = outfile if outfile is not None else model_dir / f"{model_dir.resolve().name}-{outtype}.gguf"
    inputs = {f: f"the checkpoint's {f.name}" for f in checkpoint_files(model_dir)}
    try:
        check_output_path(out, inputs)    # the path as given: Path() would drop a trailing '/'
    except OutputPathError as e:
        raise ConvertError(str(e)) from None
    out = Path(out)
    params = read_config(model_dir)
    vocab = read_vocab(model_dir, params, log)
    tensors = {} if vocab_only else map_tensors(read_weights(model_dir), params)
    log(f"{model_dir}: llama, {params.n_layer} layers, {params.n_embd} wide, vocab {params.n_vocab}, "
        f"rope pairs {'adjacent (kept)' if params.adjacent_rope else 'half (q/k permuted)'}")
    try:
        # the weights are memory-mapped from the checkpoint: never write over a file
        # in use, and let a failed run leave no half-written output
        with atomic_output(out, inputs) as tmp:
            write_gguf(Path(tmp), params, tensors, vocab, outtype, model_dir.resolve().name, log)
    except BrokenPipeError:
        raise   # `log`'s reader went away, not the output file (for the console script)
    except OutputPathError as e:   # (the path changed since it was checked)
        raise ConvertError(str(e)) from None
    except OSError as e:
        raise ConvertError(f"{out}: cannot write ({e.strerror or e})") from None
    n_params = sum(math.prod(t.shape) for t in tensors.values())
    log(f"wrote {out}: {len(tensors)} tensors, {n_params:,} parameters, "
        f"{out.stat().st_size / 1e6:.2f} MB ({outtype.upper()})")
    return out
