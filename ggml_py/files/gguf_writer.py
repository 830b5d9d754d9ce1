"""What every llama GGUF this project writes carries (convert, random models), and
how its tensors are written one at a time (output_file.atomic_output makes the file
appear whole or not at all)."""
import math

import gguf
import numpy as np


def write_streamed(writer, tensors):
    """Write a GGUF's header, metadata and tensors, the tensors one at a time, and close it.

    tensors: [(name, numpy-order shape, gguf.GGMLQuantizationType, make)], in file order;
    make() returns the tensor's data (a numpy array of exactly its bytes) and is called
    only when that tensor is written, so that no more than one is held in memory.
    """
    for name, shape, qtype, _ in tensors:
        writer.add_tensor_info(name, shape, np.dtype(np.float32), tensor_nbytes(shape, qtype),
                               raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, shape, qtype, make in tensors:
        data = np.ascontiguousarray(make())
        if data.nbytes != tensor_nbytes(shape, qtype):
            raise ValueError(f"{name}: {data.nbytes} bytes of data for {qtype.name} "
                             f"{tuple(shape)}, which takes {tensor_nbytes(shape, qtype)}")
        writer.write_tensor_data(data)
        del data     # let it go before the next one is made
    writer.close()


def tensor_nbytes(shape, qtype):
    """Bytes of a tensor of `qtype` with numpy-order `shape` (rows of whole blocks)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return math.prod(shape[:-1]) * (shape[-1] // block) * size


def add_llama_hparams(writer, *, n_vocab, n_ctx, n_embd, n_layer, n_ff, n_head, n_head_kv,
                      rms_eps, rope_freq_base, rope_dim, rope_scale_linear=None):
    """The `llama.*` hyper-parameters, under llama.cpp's key names. rope_dim is the head
    size (llama rotates whole heads); attention.key_length / value_length carry it where it
    is not n_embd / n_head."""
    writer.add_vocab_size(n_vocab)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(rms_eps)
    writer.add_rope_freq_base(rope_freq_base)
    writer.add_rope_dimension_count(rope_dim)
    if rope_dim * n_head != n_embd:
        writer.add_key_length(rope_dim)
        writer.add_value_length(rope_dim)
    if rope_scale_linear:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope_scale_linear)
