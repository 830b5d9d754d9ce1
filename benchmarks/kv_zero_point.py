"""Does a zero point earn its bytes in the int8 KV cache? Perplexity of the bundled model on
its held-out plays with the cache's rows rounded to int8 per (token, head) both ways.

    python benchmarks/kv_zero_point.py [--chunks 40]

The model runs one token at a time over an F32 cache; after each token its new K and V rows
are replaced by what an int8 cache would give back: symmetric (one scale per token and
head, q = round(x / s), s = max|x| / 127: the int8 cache's rule, 4 bytes of scale) or
asymmetric (a scale and a zero point, q = round(x / s) + z, s = (max - min) / 255: 4 more
bytes, or 1 for an int8 z). Everything else in F32, so the two differ in the rounding of the
stored rows only. Also printed: the rows' relative RMS error, K and V apart. llama.cpp's
perplexity method (the second half of each chunk scored). Never part of the tests.
"""
import argparse

import numpy as np

import ggml_py as gg
from ggml_py.model.bundled import default_text_path
from ggml_py.model.perplexity import token_nll


def symmetric(x, D):
    heads = x.reshape(len(x), -1, D)
    s = np.abs(heads).max(axis=2, keepdims=True) / np.float32(127)
    q = np.rint(np.divide(heads, s, out=np.zeros_like(heads), where=s != 0))
    return (q * s).reshape(x.shape)


def asymmetric(x, D):
    heads = x.reshape(len(x), -1, D)
    lo, hi = heads.min(axis=2, keepdims=True), heads.max(axis=2, keepdims=True)
    s = (hi - lo) / np.float32(255)
    z = np.rint(np.divide(-lo, s, out=np.zeros_like(lo), where=s != 0)) - 128
    q = np.clip(np.rint(np.divide(heads, s, out=np.zeros_like(heads), where=s != 0)) + z, -128, 127)
    return ((q - z) * s).reshape(x.shape)


def run(llm, tokens, n_ctx, n_chunks, rounding):
    """(perplexity, relative RMS error of K rows, of V rows) with the rows rounded."""
    cache, D = llm.model.cache, llm.config.head_dim
    nll, count, err = 0.0, 0, np.zeros((2, 2))
    for c in range(n_chunks):
        chunk = [llm.token_bos()] + tokens[c * n_ctx + 1:(c + 1) * n_ctx]
        llm.reset()
        logits = []
        for p, t in enumerate(chunk):
            logits.append(llm.eval([t])[0])
            if rounding is not None:
                for rows in cache.k + cache.v:
                    exact = rows[p:p + 1].copy()
                    rows[p:p + 1] = rounding(exact, D)
                    which = 0 if any(rows is k for k in cache.k) else 1
                    err[which] += (((rows[p] - exact[0]) ** 2).sum(), (exact[0] ** 2).sum())
        first = n_ctx // 2
        values = token_nll(np.array(logits[first:n_ctx - 1]), np.array(chunk[first + 1:n_ctx]))
        nll += float(values.sum())
        count += len(values)
    rel = np.sqrt(err[:, 0] / np.maximum(err[:, 1], 1e-30))
    return float(np.exp(nll / count)), rel[0], rel[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunks", type=int, default=40)
    p.add_argument("-t", "--threads", type=int, default=1)
    args = p.parse_args()
    llm = gg.Llama(n_ctx=256, n_threads=args.threads, kv_type="f32", attention="slim")
    with open(default_text_path(), encoding="utf-8") as f:
        tokens = llm.tokenize(f.read(), add_bos=False)
    n_ctx = 256
    n_chunks = min(args.chunks, len(tokens) // n_ctx)
    print(f"bundled model, held-out plays, {n_chunks} chunks of {n_ctx} tokens, one token at a time\n")
    print("| rows stored as | bytes / (token, head), D = 32 | PPL | K rel. RMS error | V rel. RMS error |")
    print("|---|---:|---:|---:|---:|")
    D = llm.config.head_dim
    for name, rounding, size in (("f32", None, 4 * D), ("int8, symmetric (the cache's)", symmetric, D + 4),
                                 ("int8, scale and zero point", asymmetric, D + 8)):
        ppl, ek, ev = run(llm, tokens, n_ctx, n_chunks, rounding)
        print(f"| {name} | {size} | {ppl:.4f} | {ek:.5f} | {ev:.5f} |", flush=True)


if __name__ == "__main__":
    main()
