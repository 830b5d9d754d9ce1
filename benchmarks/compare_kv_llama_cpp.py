"""Decode after a long prompt and prompt speed, ggml_py against llama.cpp with the same KV
cache types, in the same run, taking turns.

    python benchmarks/compare_kv_llama_cpp.py -m tinyllama-q4_0.gguf -d 1536 -n 16 \
        --configs graph:f16:f16,auto:f16:f16,auto:q8_0:q8_0,auto:int8:int8 \
        --llama-cpp-python /path/to/venv-with-llama-cpp/bin/python

A config is attention:ctk:ctv for ggml_py (attention: graph, slim, flash or auto). llama.cpp
(llama-cpp-python's low-level API, in a worker process of the given Python that stays up
for the whole run) gets the same -ctk / -ctv, with int8 (which llama.cpp has not) as its
q8_0; its flash attention is on where V is quantized (llama.cpp needs it there) and on
auto otherwise; "graph" configs run llama.cpp with flash attention off, its own three-op
attention. Each side holds two contexts per config: one evaluates a prompt of -d random
tokens once (timed: the prompt's tokens/s, in batches of -b), the other stays empty. Then,
for --rounds rounds, each config and llama.cpp in turn decode -n tokens greedily after the
prompt (the cache cut back to it before each) and -n tokens from the empty context; the
best round of each is kept. Printed per config: decode tokens/s at depth and from empty,
their ratio, and the median over the rounds of each round's ratio (its two decodes run back
to back, so a machine that slows down between rounds moves it less than the best figures'
ratio), and llama.cpp's; then each config's decode at depth against the first config's, the
median of the rounds' ratios. --pp N adds, to each round, N prompt tokens evaluated after the
-d ones (one batch of -b at most each; the cache cut back after): the prompt speed where
attention weighs most. Never part of the tests.
"""
import argparse
import json
import subprocess
import sys
import time

import numpy as np

WORKER = "--worker"
LLAMA_CPP_TYPES = {"f32": "GGML_TYPE_F32", "f16": "GGML_TYPE_F16", "q8_0": "GGML_TYPE_Q8_0",
                   "q4_0": "GGML_TYPE_Q4_0", "int8": "GGML_TYPE_Q8_0"}


def llama_cpp_worker():
    """The llama.cpp side, run by the other Python: JSON commands on stdin, one per line,
    each answered by one JSON line on stdout."""
    import ctypes

    import llama_cpp as L
    L.llama_backend_init()
    model, ctx, contexts = None, None, {}
    n_vocab = 0

    def decode(tokens, start, want_logits):
        batch = L.llama_batch_init(len(tokens), 0, 1)
        try:
            for i, t in enumerate(tokens):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, start + i, 1
                batch.seq_id[i][0], batch.logits[i] = 0, want_logits and i == len(tokens) - 1
            batch.n_tokens = len(tokens)
            if L.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
        finally:
            L.llama_batch_free(batch)

    def greedy():
        row = np.ctypeslib.as_array(ctypes.cast(L.llama_get_logits_ith(ctx, -1),
                                                ctypes.POINTER(ctypes.c_float)), (n_vocab,))
        return int(row.argmax())

    for line in sys.stdin:
        job = json.loads(line)
        if "key" in job and job["cmd"] != "load":
            ctx = contexts[job["key"]]
        if job["cmd"] == "load":
            if model is None:
                model = L.llama_model_load_from_file(job["model"].encode(),
                                                     L.llama_model_default_params())
                n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
            cp = L.llama_context_default_params()
            cp.n_ctx, cp.n_batch, cp.n_ubatch = job["n_ctx"], job["n_batch"], job["n_batch"]
            cp.n_threads = cp.n_threads_batch = job["threads"]
            cp.type_k = getattr(L, LLAMA_CPP_TYPES[job["ctk"]])
            cp.type_v = getattr(L, LLAMA_CPP_TYPES[job["ctv"]])
            cp.flash_attn_type = getattr(L, "LLAMA_FLASH_ATTN_TYPE_" + job["flash"].upper())
            contexts[job["key"]] = L.llama_init_from_model(model, cp)
            if not contexts[job["key"]]:
                raise RuntimeError(f"llama.cpp refused the context {job}")
            print(json.dumps({"ok": True}), flush=True)
        elif job["cmd"] == "prefill":
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
            tokens, n_batch = job["tokens"], job["n_batch"]
            t0 = time.perf_counter()
            for i in range(0, len(tokens), n_batch):
                decode(tokens[i:i + n_batch], i, i + n_batch >= len(tokens))
            print(json.dumps({"s": time.perf_counter() - t0}), flush=True)
        elif job["cmd"] == "more":
            start, tokens, n_batch = job["start"], job["tokens"], job["n_batch"]
            L.llama_memory_seq_rm(L.llama_get_memory(ctx), 0, start, -1)
            t0 = time.perf_counter()
            for i in range(0, len(tokens), n_batch):
                decode(tokens[i:i + n_batch], start + i, i + n_batch >= len(tokens))
            print(json.dumps({"s": time.perf_counter() - t0}), flush=True)
        elif job["cmd"] == "decode":
            start, n = job["start"], job["n"]
            L.llama_memory_seq_rm(L.llama_get_memory(ctx), 0, start, -1)
            token = job["token"]
            t0 = time.perf_counter()
            for i in range(n):
                decode([token], start + i, True)
                token = greedy()
            print(json.dumps({"s": time.perf_counter() - t0}), flush=True)


class Worker:
    """The llama.cpp worker process: ask(job) -> its answer."""

    def __init__(self, python):
        self.proc = subprocess.Popen([python, __file__, WORKER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def ask(self, **job):
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the llama.cpp worker ended on {job['cmd']}")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def ggml_py_decode(llm, start, n, token=1):
    """Seconds to decode n tokens greedily after the first `start` of llm's sequence."""
    llm.tokens = llm.tokens[:start]            # the sequence cut back to its prompt
    llm.model.cache.truncate(start)
    t0 = time.perf_counter()
    for _ in range(n):
        token = int(np.argmax(llm._decode([token])))
    return time.perf_counter() - t0


def ggml_py_prompt(llm, start, tokens):
    """Seconds to evaluate tokens after the first `start` of llm's sequence."""
    llm.tokens = llm.tokens[:start]
    llm.model.cache.truncate(start)
    t0 = time.perf_counter()
    llm._decode(tokens)
    return time.perf_counter() - t0


def main():
    import ggml_py as gg

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-d", "--depth", type=int, default=1536, help="prompt tokens (default 1536)")
    p.add_argument("-n", "--n-gen", type=int, default=16, help="decoded tokens per run (default 16)")
    p.add_argument("-b", "--batch-size", type=int, default=512)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--pp", type=int, default=0, help="prompt tokens timed after the -d ones")
    p.add_argument("--configs", default="graph:f16:f16,auto:f16:f16,auto:int8:int8,auto:q8_0:q8_0")
    p.add_argument("--llama-cpp-python", default=None,
                   help="a Python interpreter that can import llama_cpp (none: ggml_py alone)")
    args = p.parse_args()
    configs = [tuple(c.split(":")) for c in args.configs.split(",")]
    n_ctx = args.depth + max(args.n_gen, args.pp) + 16
    worker = Worker(args.llama_cpp_python) if args.llama_cpp_python else None
    rows = []
    for attention, ctk, ctv in configs:
        llms = [gg.Llama(args.model, n_ctx=size, n_threads=args.threads, n_batch=args.batch_size,
                         kv_type=ctk, kv_type_v=ctv, attention=attention)
                for size in (n_ctx, args.n_gen + 16)]
        prompt = np.random.default_rng(0).integers(3, llms[0].n_vocab(), args.depth).tolist()
        t0 = time.perf_counter()
        llms[0]._decode(prompt)
        key = f"{attention}:{ctk}:{ctv}"
        row = {"config": key, "llms": llms,
               "prefill_ts": args.depth / (time.perf_counter() - t0), "best": [np.inf] * 6}
        if worker is not None:
            flash = "disabled" if attention == "graph" else ("enabled" if ctv != "f16" else "auto")
            for which, size in (("d", n_ctx), ("0", args.n_gen + 16)):
                worker.ask(cmd="load", key=key + which, model=args.model, n_ctx=size,
                           n_batch=args.batch_size, threads=args.threads, ctk=ctk, ctv=ctv,
                           flash=flash)
            row["their_prefill_ts"] = args.depth / worker.ask(cmd="prefill", key=key + "d",
                                                              tokens=prompt,
                                                              n_batch=args.batch_size)["s"]
        rows.append(row)
        print(f"{row['config']}: prompt of {args.depth} at {row['prefill_ts']:.1f} t/s"
              + (f" (llama.cpp {row['their_prefill_ts']:.1f})" if worker else ""), flush=True)
    for r in range(args.rounds + 1):           # round 0 warms up (graphs built)
        for row in rows:
            times = [ggml_py_decode(row["llms"][0], args.depth, args.n_gen),
                     ggml_py_decode(row["llms"][1], 0, args.n_gen)]
            if worker is not None:
                key = row["config"]
                times += [worker.ask(cmd="decode", key=key + "d", start=args.depth, n=args.n_gen,
                                     token=1)["s"],
                          worker.ask(cmd="decode", key=key + "0", start=0, n=args.n_gen,
                                     token=1)["s"]]
            times += [np.inf] * (4 - len(times))
            if args.pp:
                more = np.random.default_rng(r).integers(3, row["llms"][0].n_vocab(), args.pp).tolist()
                times.append(ggml_py_prompt(row["llms"][0], args.depth, more))
                times.append(worker.ask(cmd="more", key=row["config"] + "d", start=args.depth,
                                        tokens=more, n_batch=args.batch_size)["s"]
                             if worker is not None else np.inf)
            if r:
                row["best"] = [min(b, t) for b, t in zip(row["best"], times + [np.inf] * 2)]
                theirs = times[3] / times[2] if np.isfinite(times[2]) else np.nan
                row.setdefault("ratios", []).append((times[1] / times[0], theirs))
                row.setdefault("depth_s", []).append(times[0])
    print(f"\n{args.model}, {args.threads} threads, decode of {args.n_gen} tokens after "
          f"{args.depth} and from empty, best of {args.rounds} rounds taken in turns\n")
    print("| attention:ctk:ctv | t/s @ d | t/s empty | ratio | median ratio | llama.cpp @ d "
          "| llama.cpp empty | ratio | median ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        ts = [args.n_gen / b if np.isfinite(b) else float("nan") for b in row["best"]]
        ours, theirs = np.median(np.array(row["ratios"]), axis=0)
        print(f"| {row['config']} | {ts[0]:.2f} | {ts[1]:.2f} | {ts[0] / ts[1]:.3f} | {ours:.3f} | "
              f"{ts[2]:.2f} | {ts[3]:.2f} | {ts[2] / ts[3]:.3f} | {theirs:.3f} |")
    if len(rows) > 1:
        print(f"\ndecode at {args.depth} against {rows[0]['config']}'s, the median of the rounds' "
              "ratios (the configs' decodes of a round run within seconds of each other): "
              + ", ".join(f"{row['config']} ×{np.median(np.divide(rows[0]['depth_s'], row['depth_s'])):.3f}"
                          for row in rows[1:]))
    if args.pp:
        print(f"\nprompt of {args.pp} tokens after {args.depth} (batches of {args.batch_size}), "
              f"tokens/s, best of {args.rounds} rounds\n")
        print("| attention:ctk:ctv | ggml_py | llama.cpp | ratio |")
        print("|---|---:|---:|---:|")
        for row in rows:
            a, b = (args.pp / t if np.isfinite(t) else float("nan") for t in row["best"][4:6])
            print(f"| {row['config']} | {a:.2f} | {b:.2f} | {a / b:.3f} |")
    if worker is not None:
        worker.close()


if __name__ == "__main__":
    if WORKER in sys.argv:
        llama_cpp_worker()
    else:
        main()
