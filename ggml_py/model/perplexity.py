"""Perplexity by llama.cpp's method (`llama-perplexity`, default mode).

1. Tokenize the whole text once, with BOS if the vocabulary adds one.
2. Cut it into n_chunk = len(tokens) // n_ctx chunks of n_ctx tokens (the tail
   is dropped); at least 2 * n_ctx tokens are needed.
3. Each chunk starts from an empty cache; its first token is replaced by BOS
   (when the vocabulary adds BOS), and it is evaluated in batches of n_batch.
4. Only the second half is scored: with first = n_ctx // 2, the logits at
   positions first .. n_ctx - 2 predict tokens first + 1 .. n_ctx - 1, so every
   scored token has at least n_ctx / 2 tokens of context.
5. nll = sum of -log softmax(logits)[next token] (float max, double sums, as
   llama.cpp), PPL = exp(nll / count) printed after each chunk as `[i]ppl,`.
6. Final estimate: PPL = exp(mean nll) +/- PPL * sqrt((mean(nll^2) - mean(nll)^2) / (count - 1)).
"""
import math
from dataclasses import dataclass

import numpy as np

from ggml_py.core.types import checked_int


@dataclass(frozen=True)
class PerplexityResult:
    """ppl and its +/- (llama.cpp's Final estimate), and the running value after each chunk."""
    ppl: float
    error: float
    chunk_ppl: tuple
    n_ctx: int
    n_scored: int

    def __float__(self):
        return self.ppl


def token_nll(logits, tokens):
    """-log p(tokens[i] | logits[i]) for each row, as llama.cpp computes it: (n,) float64."""
    logits = np.asarray(logits, np.float32)
    max_logit = logits.max(axis=1, keepdims=True)
    sum_exp = np.exp(logits - max_logit).sum(axis=1, dtype=np.float64)
    picked = logits[np.arange(len(tokens)), tokens].astype(np.float64)
    return -(picked - max_logit[:, 0].astype(np.float64) - np.log(sum_exp))


# llama.cpp's llama-perplexity and llama-cli refuse such a vocabulary too (an EOS after
# the text would be scored, or generation would start after it)
ADD_EOS_REFUSED = ("this vocabulary adds an EOS token after every text (tokenizer.ggml."
                   "add_eos_token); a decoder-only model cannot run on such input")


def perplexity(llm, text, n_ctx=512, n_batch=None, n_chunks=-1, callback=None):
    """Perplexity of text under llm (a Llama) with chunks of n_ctx tokens.

    text: str or UTF-8 bytes (bytearray, memoryview), or token ids already tokenized with BOS.
    n_batch: tokens per evaluation (None: llm.n_batch), capped at n_ctx.
    n_chunks: score at most this many chunks (negative: all of them; 0 is refused).
    callback(i, n_chunk, running_ppl, seconds) is called after each chunk (seconds: its
    evaluation and scoring, less the one-off building of graphs; the Llama is busy: a call
    into it from there raises RuntimeError). Counted in llm.timings. Holds the Llama
    throughout (other threads' calls wait) and leaves its sequence empty.
    Raises ValueError if the text is shorter than 2 * n_ctx tokens.
    """
    with llm._turn("perplexity"):
        return _perplexity(llm, text, n_ctx, n_batch, n_chunks, callback)


def _perplexity(llm, text, n_ctx, n_batch, n_chunks, callback):
    n_ctx = checked_int("perplexity: n_ctx", n_ctx, low=4)
    if n_batch is not None:
        n_batch = checked_int("perplexity: n_batch", n_batch, low=1)
    if checked_int("perplexity: n_chunks", n_chunks) == 0:
        raise ValueError("perplexity: n_chunks must be at least 1, or negative for all chunks; got 0")
    if llm.tokenizer.add_eos:
        raise ValueError(f"perplexity: {ADD_EOS_REFUSED}")
    tokens = llm._input_ids(text, add_bos=True, special=False)   # as llama-perplexity
    llm._check_vocab(tokens)    # every id before the first chunk (and those of the tail no chunk scores)
    if n_ctx > llm.n_ctx():
        raise ValueError(f"perplexity: n_ctx {n_ctx} is larger than the model's context "
                         f"{llm.n_ctx()} (load it with a larger n_ctx)")
    if len(tokens) < 2 * n_ctx:
        raise ValueError(f"perplexity: you need at least {2 * n_ctx} tokens to evaluate "
                         f"perplexity with a context of {n_ctx}; the text tokenizes to only "
                         f"{len(tokens)} tokens")
    n_chunk_max = len(tokens) // n_ctx
    n_chunk = n_chunk_max if n_chunks < 0 else min(n_chunks, n_chunk_max)
    add_bos = llm.tokenizer.add_bos
    first = n_ctx // 2
    saved_batch = llm.n_batch
    llm.n_batch = min(saved_batch if n_batch is None else n_batch, n_ctx)
    logits = np.empty((n_ctx - first, llm.n_vocab()), np.float32)
    nll = nll2 = 0.0
    count = 0
    running = []
    try:
        for i in range(n_chunk):
            t0 = llm.timings.clock()
            chunk = tokens[i * n_ctx:(i + 1) * n_ctx]
            if add_bos:
                chunk = [llm.token_bos()] + chunk[1:]
            llm._reset()
            built = llm.model.build_s
            llm._timed_decode(chunk, prompt=True, out=logits, first_output=first)
            built = llm.model.build_s - built     # a graph built once, not a chunk's work
            # logits row j (position first + j) predicts token first + j + 1
            values = token_nll(logits[:-1], np.asarray(tokens[i * n_ctx + first + 1:(i + 1) * n_ctx]))
            bad = len(values) - int(np.count_nonzero(np.isfinite(values)))
            if bad:
                raise ValueError(f"perplexity: chunk {i + 1} has {bad} log-probabilities that are "
                                 f"not finite (NaN or inf logits): the model's weights are damaged")
            nll += float(values.sum())
            nll2 += float((values * values).sum())
            count += len(values)
            running.append(math.exp(nll / count))
            if callback is not None:
                callback(i, n_chunk, running[-1], llm.timings.clock() - t0 - built)
    finally:
        llm.n_batch = saved_batch
        llm._reset()
    mean, mean2 = nll / count, nll2 / count
    ppl = math.exp(mean)
    var = mean2 - mean * mean
    error = ppl * math.sqrt(var / (count - 1)) if var > 0 and count > 1 else float("nan")
    return PerplexityResult(ppl=ppl, error=error, chunk_ppl=tuple(running), n_ctx=n_ctx,
                            n_scored=count)
