"""Load on ggml-server, and on llama-cpp-python's server with the same model, in one run.

    python benchmarks/serve_load.py -m tinyllama-q4_0.gguf -t 2 -n 128 --clients 1,4,16,32 \\
        --plot serve_load.png --json serve_load.json

For each number of clients N, N clients at once each stream one completion of -n tokens
(greedy; a prompt of 16 tokens each, from the bundled held-out text, as ggml-bench
batch takes them) from /v1/completions. Reported per server and N: aggregate
generated tokens/s (all tokens / the time from the first request to the last token),
time to first token and the time between tokens (median and 95th percentile over all
clients' tokens). Needs httpx (`pip install httpx`, in the test extra). ggml-server runs
with -np N (the KV pool holds N contexts of prompt + -n tokens); llama-cpp-python's server
(`pip install "llama-cpp-python[server]"`, in this Python or the one --llama-cpp-python
names; skipped when it is not installed, or with --no-llama-cpp) serves one request at a
time, as it does (with --interrupt_requests False: by default a new request would cut the
running one short). Both get -t threads. Not a test: figures vary with the machine and its
load.
"""
import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx

import ggml_py
from ggml_py.model.bundled import default_text_path

PROMPT_TOKENS = 16


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompts(n):
    """n different prompts of about PROMPT_TOKENS tokens (lines of the held-out plays)."""
    with open(default_text_path(), encoding="utf-8") as f:
        lines = [line.strip() for line in f if len(line.split()) >= 8]
    return [" ".join(line.split()[:12]) for line in lines[:n]]


def ggml_env():
    """The environment of ggml-server: the ggml_py this script imported first on its path
    (only there: another Python, --llama-cpp-python's, must not import this one's packages)."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(ggml_py.__file__)))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [package_parent] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


def start(command, url, log, env=None):
    """Start a server subprocess and wait until /v1/models answers; the Popen. It runs in
    the temporary folder (`python -m` in a checkout would import the checkout's ggml_py,
    built or not), so the paths in command are absolute."""
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                            cwd=tempfile.gettempdir())
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{command[0]} exited with {proc.returncode} (see {log.name})")
        try:
            if httpx.get(url + "/v1/models", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{command} did not start in 600 s")


def one_client(url, model, prompt, n_tokens, out):
    """Stream one completion; out gets (start, [arrival time of each token chunk], tokens)."""
    body = {"model": model, "prompt": prompt, "max_tokens": n_tokens, "temperature": 0,
            "stream": True}
    start_t, times, n = time.perf_counter(), [], 0
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=3600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0].get("text"):
                times.append(time.perf_counter())
    out.append((start_t, times, n or len(times)))


def load(url, model, n_clients, n_tokens):
    """N clients at once: the figures of one row."""
    results = []
    threads = [threading.Thread(target=one_client, args=(url, model, p, n_tokens, results))
               for p in prompts(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = min(r[0] for r in results)
    last = max(r[1][-1] for r in results if r[1])
    ttft = [r[1][0] - r[0] for r in results if r[1]]
    gaps = [b - a for r in results for a, b in zip(r[1], r[1][1:])]
    tokens = sum(r[2] for r in results)
    return {"clients": n_clients, "tokens": tokens, "tokens_per_s": tokens / (last - first),
            "ttft_median_s": statistics.median(ttft), "ttft_p95_s": percentile(ttft, 95),
            "token_median_s": statistics.median(gaps), "token_p95_s": percentile(gaps, 95)}


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


def servers(args, n_clients):
    """(name, command, env) of each server to measure (env None: this process's)."""
    n_ctx = n_clients * (PROMPT_TOKENS + args.n_tokens + 16)
    out = [] if args.no_ggml else [
        ("ggml-server", [sys.executable, "-m", "ggml_py.cli.server", "-m", args.model,
                         "-t", str(args.threads), "-np", str(n_clients), "-c", str(n_ctx),
                         "--max-queue", "0"], ggml_env())]
    if not args.no_llama_cpp:
        python = args.llama_cpp_python
        found = subprocess.run([python, "-c", "import llama_cpp.server"], capture_output=True,
                               check=False).returncode == 0
        if not found:
            print(f"llama-cpp-python's server is not installed for {python}: only ggml-server "
                  f"is measured", file=sys.stderr)
        else:
            out.append(("llama-cpp-python", [python, "-m", "llama_cpp.server", "--model",
                                             args.model, "--n_threads", str(args.threads),
                                             "--n_threads_batch", str(args.threads),
                                             "--n_ctx", str(PROMPT_TOKENS + args.n_tokens + 64),
                                             # its default lets a new request cut the
                                             # running one short: queue them instead
                                             "--interrupt_requests", "False"], None))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-n", "--n-tokens", type=int, default=128)
    p.add_argument("--clients", default="1,4,16,32")
    p.add_argument("--no-llama-cpp", action="store_true")
    p.add_argument("--no-ggml", action="store_true", help="measure llama-cpp-python's only")
    p.add_argument("--llama-cpp-python", default=sys.executable, metavar="PYTHON",
                   help="the Python that has llama-cpp-python[server] (default: this one)")
    p.add_argument("--json", metavar="FNAME")
    p.add_argument("--plot", metavar="FNAME")
    args = p.parse_args(argv)
    args.model = os.path.abspath(args.model)     # (the servers run in the temporary folder)
    counts = [int(c) for c in args.clients.split(",")]
    rows = []
    for name, command, env in servers(args, max(counts)):
        rows += measure(name, command, counts, args.n_tokens, env)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": os.path.basename(args.model), "threads": args.threads,
                       "n_tokens": args.n_tokens, "rows": rows}, f, indent=1)
    if args.plot:
        plot(rows, args.plot)


def measure(name, command, counts, n_tokens, env=None):
    """The rows of one server: started on a free port, warmed up, loaded with each N."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    rows = []
    log_name = f"serve_load_{re.sub(r'[^a-z]+', '_', name)}.log"
    log_path = os.path.join(tempfile.gettempdir(), log_name)
    with open(log_path, "w") as log:
        proc = start(command + ["--port", str(port)], url, log, env)
        try:
            model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
            load(url, model, 1, 8)            # warm up: graphs built, pages touched
            for n in counts:
                row = {"server": name, **load(url, model, n, n_tokens)}
                rows.append(row)
                print(f"{name:18s} N={n:3d}  {row['tokens_per_s']:7.2f} tok/s  "
                      f"TTFT {row['ttft_median_s']:6.2f} / {row['ttft_p95_s']:6.2f} s  "
                      f"per token {1e3 * row['token_median_s']:7.1f} / "
                      f"{1e3 * row['token_p95_s']:7.1f} ms", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
    return rows


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for name in dict.fromkeys(r["server"] for r in rows):
        mine = [r for r in rows if r["server"] == name]
        a.plot([r["clients"] for r in mine], [r["tokens_per_s"] for r in mine], "o-", label=name)
        b.plot([r["clients"] for r in mine], [r["ttft_p95_s"] for r in mine], "o-", label=name)
    a.set(xlabel="concurrent clients", ylabel="aggregate tokens/s", xscale="log")
    b.set(xlabel="concurrent clients", ylabel="time to first token, p95 (s)", xscale="log",
          yscale="log")
    a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
