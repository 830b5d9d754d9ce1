"""Context shift: when a sequence fills its context, drop the oldest tokens after the
first `keep` (half of the rest, as llama.cpp's context shift does) and go on.

The cached K rows of the tokens that stay were rotated by rope for their old
positions; rotations compose, so turning each by the angle of -n_discard positions
gives K at its new position (llama.cpp's "K-shift"), without running the model again.
"""
import numpy as np


def discard_count(n_past, keep):
    """Tokens a shift drops from a sequence of n_past with the first `keep` kept: half
    of the others (llama.cpp's n_discard = n_left / 2), at least one."""
    return max(1, (n_past - keep) // 2)


MIN_SHIFT_CONTEXT = 3   # a shift keeps at most half the context and drops a token past it


def kept_count(prompt, keep, bos_id, n_ctx=None):
    """Tokens a shift never drops: the first `keep` of the prompt (-1: all of it) and,
    as llama.cpp always keeps it, a BOS in front of them; with n_ctx, at most half of
    that context (a shift must have tokens to drop)."""
    has_bos = bool(prompt) and bos_id is not None and prompt[0] == bos_id
    rest = len(prompt) - has_bos
    kept = has_bos + (rest if keep < 0 else min(keep, rest))
    return kept if n_ctx is None else min(kept, n_ctx // 2)


def check_shift_context(n_ctx, what):
    """ValueError when a context of n_ctx tokens (`what`, for the message) cannot shift."""
    if n_ctx < MIN_SHIFT_CONTEXT:
        raise ValueError(f"context_shift needs {what} of {MIN_SHIFT_CONTEXT} tokens or more, "
                         f"not {n_ctx}: a shift drops a token past the kept ones")


def rope_rotation(config, rope_freqs=None):
    """rerope(rows, delta): rotate K rows (n, Hkv*D) float32 in place as moving each of
    their tokens by delta positions would (llama's ROPE_NORMAL: adjacent pairs)."""
    D, n_rot = config.head_dim, config.n_rot
    i = np.arange(n_rot // 2)
    inv_freq = config.rope_freq_base ** (-2.0 * i / n_rot)
    if rope_freqs is not None:
        inv_freq = inv_freq / np.asarray(rope_freqs, np.float64).reshape(-1)[:n_rot // 2]

    def rerope(rows, delta):
        if rows.size == 0:            # (nothing after the dropped tokens to move)
            return
        heads = rows.reshape(rows.shape[0], -1, D)             # (n, Hkv, D)
        angle = config.rope_freq_scale * delta * inv_freq      # (n_rot/2,)
        c, s = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
        x0, x1 = heads[..., 0:n_rot:2].copy(), heads[..., 1:n_rot:2].copy()
        heads[..., 0:n_rot:2] = x0 * c - x1 * s
        heads[..., 1:n_rot:2] = x0 * s + x1 * c
    return rerope
