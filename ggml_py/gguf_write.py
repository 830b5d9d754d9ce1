"""What every llama GGUF this project writes carries (convert, random models),
and how it reaches the disk (whole or not at all)."""
import contextlib
import errno
import os
import secrets

import gguf


def names_a_directory(path):
    """Whether no file can be made at `path`: it is a directory, or ends in a
    separator (`out/`: the rename at the end of a long run would fail)."""
    path = os.fspath(path)
    return os.path.isdir(path) or path.endswith((os.sep, os.altsep or os.sep))


@contextlib.contextmanager
def atomic_output(path):
    """Yield a new, empty temporary path beside `path`; when the block completes it is
    renamed to `path`, and when the block raises it is removed.

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
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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
