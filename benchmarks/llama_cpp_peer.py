"""llama.cpp (llama-cpp-python) behind a pipe, for benchmarks/compare_llama_cpp.py.

Run by that script with the Python of an environment that has llama-cpp-python
(its --peer-python), so that llama.cpp needs no place in ggml_py's environment and
runs in a process of its own. Imports neither ggml_py nor anything but numpy and
llama_cpp. One JSON request a line on stdin, one JSON answer a line on stdout:

    {"cmd": "load", "path": ..., "n_ctx": 512, "n_threads": 2, "logits_all": false}
    {"cmd": "tokenize", "text": ..., "add_bos": true}          -> {"tokens": [...]}
    {"cmd": "logits", "tokens": [...]}                         -> {"logits": base64 float32, "shape": [T, V]}
    {"cmd": "perplexity", "tokens": [...], "n_ctx": 256, "add_bos": true, "bos": 1}
                                                               -> {"ppl": ...}
    {"cmd": "pp", "tokens": [...]}                             -> {"seconds": ...}
    {"cmd": "tg", "first": 1, "tokens": [...]}                 -> {"seconds": ...}
    {"cmd": "info"}                                            -> {"version": ..., "system_info": ...}

pp evaluates the tokens from an empty cache and times it; tg evaluates `first`
from an empty cache untimed, then times one eval per token (as llama-bench). An
error answers {"error": "..."} and the server goes on.
"""
import base64
import json
import sys
import time

import numpy as np


def token_nll(logits, targets):
    """-log softmax(logits)[target] per row, in float64."""
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    return lse - x[np.arange(len(targets)), targets]


class Server:
    def __init__(self):
        self.lc = None

    def load(self, path, n_ctx, n_threads, logits_all=False):
        import llama_cpp
        self.lc = None     # free the last one first: two 1.1B models at once double the memory
        self.lc = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=n_threads,
                                  n_threads_batch=n_threads, n_batch=n_ctx,
                                  logits_all=logits_all, verbose=False)
        return {}

    def info(self):
        import llama_cpp
        return {"version": llama_cpp.__version__,
                "system_info": llama_cpp.llama_print_system_info().decode()}

    def tokenize(self, text, add_bos):
        return {"tokens": self.lc.tokenize(text.encode(), add_bos=add_bos)}

    def logits(self, tokens):
        self.lc.reset()
        self.lc.eval(tokens)
        scores = np.ascontiguousarray(self.lc.scores[:len(tokens)], np.float32)
        return {"logits": base64.b64encode(scores.tobytes()).decode(), "shape": list(scores.shape)}

    def perplexity(self, tokens, n_ctx, add_bos, bos):
        """llama.cpp's perplexity method: the second half of each chunk scored."""
        first = n_ctx // 2
        nll, count = 0.0, 0
        for i in range(len(tokens) // n_ctx):
            chunk = tokens[i * n_ctx:(i + 1) * n_ctx]
            if add_bos:
                chunk = [bos] + chunk[1:]
            self.lc.reset()
            self.lc.eval(chunk)
            logits = np.asarray(self.lc.scores[first:n_ctx - 1], np.float32)
            values = token_nll(logits, np.asarray(tokens[i * n_ctx + first + 1:(i + 1) * n_ctx]))
            nll += float(values.sum())
            count += len(values)
        return {"ppl": float(np.exp(nll / count))}

    def pp(self, tokens):
        self.lc.reset()
        start = time.perf_counter()
        self.lc.eval(tokens)
        return {"seconds": time.perf_counter() - start}

    def tg(self, first, tokens):
        self.lc.reset()
        self.lc.eval([first])
        start = time.perf_counter()
        for t in tokens:
            self.lc.eval([t])
        return {"seconds": time.perf_counter() - start}


def main():
    server = Server()
    out = sys.stdout
    sys.stdout = sys.stderr      # anything llama.cpp's bindings print stays off the pipe
    for line in sys.stdin:
        request = json.loads(line)
        cmd = request.pop("cmd")
        if cmd == "quit":
            break
        try:
            answer = getattr(server, cmd)(**request)
        except Exception as e:      # noqa: BLE001 - reported to the caller, which stops with it
            answer = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
