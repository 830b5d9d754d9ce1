"""What every llama GGUF this project writes carries (convert, random models),
and how it reaches the disk (whole or not at all)."""
import contextlib
import errno
import math
import os
import secrets
import signal
import threading

import gguf
import numpy as np


def names_a_directory(path):
    """Whether no file can be made at `path`: it is a directory, or ends in a
    separator (`out/`: the rename at the end of a long run would fail)."""
    path = os.fspath(path)
    return os.path.isdir(path) or path.endswith((os.sep, os.altsep or os.sep))


@contextlib.contextmanager
def atomic_output(path):
    """Yield a new, empty temporary path beside `path`; when the block completes it is
    renamed to `path`, and when the block raises, or SIGTERM comes (see
    _termination_raises; the process then exits with status 143), it is removed.

    A failed run leaves neither a half-written file nor a damaged old one, and the
    inputs of a run (memory-mapped) are never truncated under it. The temporary file
    is made in the output's directory, so the rename does not cross file systems; it
    gets the permissions a plain `open(path, "w")` would (0666 less the umask).
    """
    path = os.fspath(path)
    if names_a_directory(path):   # refused before the work, not at the rename after it
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    folder, base = os.path.split(os.path.abspath(path))
    while True:
        tmp = os.path.join(folder, f".{base}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:
            continue
    try:
        with _termination_raises():
            yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _termination_raises():
    """Within the block, SIGTERM (`kill`, `timeout`, a service manager stopping the job)
    raises SystemExit(143) rather than killing the process at once, so that the block's
    cleanup runs; only in the main thread, and only where SIGTERM has its default action
    (a program's own handler is left alone). The default is put back after."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is terminate:   # not one set within the block
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


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
