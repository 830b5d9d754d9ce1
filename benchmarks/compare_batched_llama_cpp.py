"""Batched decode of ggml_py against llama.cpp's (llama-cpp-python's low-level API) on
the same GGUF file, the same prompts and the same B, in the same run.

    python benchmarks/compare_batched_llama_cpp.py -m tinyllama-q4_0.gguf -np 1,4,16 -n 32 \
        --llama-cpp-python /path/to/venv-with-llama-cpp/bin/python

For each B: B prompts of 16 tokens (windows of the held-out text, as `ggml-bench batch`)
are read in one step, then -n tokens are decoded greedily for every sequence, B at a
time. ggml_py runs here (a Batch); llama.cpp runs in a worker process of the given
Python (one `llama_batch` per step holding a token of every sequence, each with its
own sequence id, one unified KV cache), so that llama.cpp needs no install next to
ggml_py. The two take turns, --rounds times after a warm-up each; the best round of
each is kept. Printed: aggregate decode tokens/s of both and their ratio. Never part
of the tests.
"""
import argparse
import json
import subprocess
import sys
import time

WORKER = "--worker"


def llama_cpp_worker():
    """The llama.cpp side, run by the other Python: reads a job (JSON) on stdin, prints
    {"prefill_s", "decode_s"} of one warm-up-free timed run per request."""
    import ctypes

    import llama_cpp as L
    import numpy as np
    job = json.load(sys.stdin)
    prompts, n_gen, B = job["prompts"], job["n_gen"], len(job["prompts"])
    L.llama_backend_init()
    model = L.llama_model_load_from_file(job["model"].encode(), L.llama_model_default_params())
    cp = L.llama_context_default_params()
    n_prompt = sum(map(len, prompts))
    cp.n_ctx = job["n_ctx"]
    cp.n_batch = cp.n_ubatch = max(512, n_prompt)
    cp.n_seq_max = B
    cp.n_threads = cp.n_threads_batch = job["threads"]
    cp.kv_unified = True              # one pool for all sequences, as ggml_py's
    ctx = L.llama_init_from_model(model, cp)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(max(n_prompt, B), 0, B)

    def fill(entries):
        batch.n_tokens = 0
        for token, pos, seq, wants in entries:
            i = batch.n_tokens
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, wants
            batch.n_tokens += 1

    def greedy(i):
        row = np.ctypeslib.as_array(ctypes.cast(L.llama_get_logits_ith(ctx, i),
                                                ctypes.POINTER(ctypes.c_float)), (n_vocab,))
        return int(row.argmax())

    results = []
    for _ in range(job["runs"]):
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        t0 = time.perf_counter()
        entries, last = [], []
        for seq, p in enumerate(prompts):
            entries += [(t, pos, seq, pos == len(p) - 1) for pos, t in enumerate(p)]
            last.append(len(entries) - 1)
        fill(entries)
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed on the prompts")
        tokens = [greedy(i) for i in last]
        t1 = time.perf_counter()
        for step in range(n_gen - 1):
            fill([(tokens[s], len(prompts[s]) + step, s, True) for s in range(B)])
            if L.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            tokens = [greedy(s) for s in range(B)]
        results.append({"prefill_s": t1 - t0, "decode_s": time.perf_counter() - t1})
    print(json.dumps(results))


def ggml_py_decode(llm, prompts, n_gen):
    """(prefill seconds, decode seconds) of one run of ggml_py's Batch, as the worker's."""
    b = llm.batch()
    for p in prompts:
        b.add(p, max_tokens=n_gen, temperature=0, ignore_eos=True)
    t0 = time.perf_counter()
    while b.waiting or any(len(s.ids) - s.n_cached > 1 for s in b._running):
        b.step()
    t1 = time.perf_counter()
    while b.running:
        b.step()
    return t1 - t0, time.perf_counter() - t1


def main():
    from ggml_py.cli.bench.batch import PROMPT_TOKENS, prompts as bench_prompts
    from ggml_py.cli.common import count_list, open_llama, positive_int

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-np", "--parallel", type=count_list, default=[1, 2, 4, 8, 16])
    p.add_argument("-n", "--n-gen", type=positive_int, default=32)
    p.add_argument("-t", "--threads", type=positive_int, default=2)
    p.add_argument("--rounds", type=positive_int, default=2)
    p.add_argument("--llama-cpp-python", required=True,
                   help="a Python interpreter that can import llama_cpp")
    args = p.parse_args()
    n_ctx = max(args.parallel) * (PROMPT_TOKENS + args.n_gen + 16)
    llm, _ = open_llama(args.model, n_ctx=n_ctx, n_threads=args.threads,
                        n_seq_max=max(args.parallel))
    print(f"{args.model}, {args.threads} threads, prompts of {PROMPT_TOKENS} tokens, "
          f"{args.n_gen} decoded per sequence, best of {args.rounds} rounds taken in turns\n")
    print("|   B | ggml_py decode t/s | llama.cpp decode t/s | ratio |")
    print("|----:|-------------------:|---------------------:|------:|")
    for B in args.parallel:
        prompts = bench_prompts(llm, B)
        job = json.dumps({"model": args.model, "prompts": prompts, "n_gen": args.n_gen,
                          "threads": args.threads, "n_ctx": n_ctx, "runs": 2})
        ours, theirs = [], []
        ggml_py_decode(llm, prompts, args.n_gen)                # warm-up: builds the graphs
        for _ in range(args.rounds):
            ours.append(ggml_py_decode(llm, prompts, args.n_gen)[1])
            out = subprocess.run([args.llama_cpp_python, __file__, WORKER], input=job,
                                 capture_output=True, text=True, check=True)
            theirs.append(json.loads(out.stdout.strip().splitlines()[-1])[-1]["decode_s"])
        n = B * (args.n_gen - 1)       # tokens decoded after the prompts' first ones
        a, b = n / min(ours), n / min(theirs)
        print(f"| {B:>3} | {a:>18.1f} | {b:>20.1f} | {a / b:>5.2f} |", flush=True)


if __name__ == "__main__":
    if WORKER in sys.argv:
        llama_cpp_worker()
    else:
        main()
