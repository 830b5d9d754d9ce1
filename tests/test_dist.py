"""Tensor-parallel inference over MPI (ggml_py/dist): the split of a model's weights (in
this process), and, under `mpiexec -n 2` (the `mpi` extra's mpich), the all-reduce op
against numpy, a split model against one process (greedy text of generate, a batch and a
context shift; logits; perplexity; tune data), the programs' output, a model that
cannot be split, and a rank killed mid-run. MPI runs only in the subprocesses: this
process never imports mpi4py."""
import functools
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil
import pytest
from llama_models import model_path, scratch_path, vocab

import ggml_py as gg
from ggml_py.dist.channel import top_candidates
from ggml_py.dist.launch import TERM_GRACE_S
from ggml_py.dist.llama import candidates_needed
from ggml_py.dist.shard import (
    Shard,
    SplitError,
    block_bounds,
    column_share,
    split_matrix_shapes,
)
from ggml_py.files.gguf_reader import GGUFModelFile
from ggml_py.model.bundled import default_model_path
from ggml_py.model.config import LlamaConfig
from ggml_py.model.sampling import Sampler, SamplingParams, top_k
from ggml_py.model.weights import ColumnSlice, LlamaWeights
from ggml_py.tools.random_model import RandomLlamaSpec, write_random_llama

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(gg.__file__)))
ENV = dict(os.environ, PYTHONPATH=PACKAGE_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))
CWD = tempfile.gettempdir()
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
needs_mpi = pytest.mark.skipif(MPIEXEC is None or importlib.util.find_spec("mpi4py") is None,
                               reason="needs mpi4py and mpiexec (pip install '.[mpi]')")


def mpiexec(*args, n=2, timeout=300):
    return subprocess.run([MPIEXEC, "-n", str(n), *map(str, args)], capture_output=True,
                          text=True, env=ENV, cwd=CWD, timeout=timeout, check=False)


def ranks(what, *args):
    """Rank 0's JSON line of tests/dist_ranks.py WHAT under mpiexec -n 2."""
    # python -m mpi4py: an exception on one rank aborts every rank (no hang in a collective)
    proc = mpiexec(sys.executable, "-m", "mpi4py", os.path.join(HERE, "dist_ranks.py"), what, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@functools.cache
def q4_k_path():
    """A tiny Q4_K model whose heads split on 256-column blocks (4 heads of 128, 2 KV
    heads): every share a view."""
    path = scratch_path("tiny-q4_k-512.gguf")
    write_random_llama(path, RandomLlamaSpec(n_vocab=512, n_embd=512, n_head=4, n_head_kv=2,
                                             n_ff=1024, weight_type="Q4_K", seed=12),
                       vocab=vocab())
    return path


def loaded(path):
    """(config, weights) of a model file."""
    f = GGUFModelFile(path)
    config = LlamaConfig.from_gguf(f)
    return config, LlamaWeights.from_gguf(f, config)


# ---- the split, in this process ----------------------------------------------------

@pytest.mark.parametrize("kind", ["f32", "q4_0", "q4_k"])
def test_the_ranks_shares_make_up_every_weight(kind):
    """Rows and columns of every rank's share, put together, are the whole weight; row
    shares and aligned column shares are views of the mapped bytes (no copies)."""
    c, w = loaded(model_path(kind))
    shards = [Shard.of(c, r, 2, w.layers[0].w_down.type) for r in range(2)]
    shares = [s.weights(w, c) for s in shards]
    assert [s.heads for s in shards] == [(0, c.n_head // 2), (c.n_head // 2, c.n_head)]
    assert shards[0].ffn[1] == shards[1].ffn[0] and shards[1].ffn[1] == c.n_ff
    for il, lw in enumerate(w.layers):
        parts = [share.layers[il] for share, _ in shares]
        for name in ("wq", "wk", "wv", "w_gate", "w_up"):
            rows = [getattr(p, name) for p in parts]
            assert all(np.shares_memory(r.data, getattr(lw, name).data) for r in rows)
            assert np.array_equal(np.concatenate([r.data for r in rows]), getattr(lw, name).data)
        for name in ("wo", "w_down"):
            cols, w_ = [getattr(p, name) for p in parts], getattr(lw, name)
            whole = w_.data if w_.type == gg.F32 else gg.dequantize(w_.data, w_.type, w_.shape)
            got = [np.asarray(c.data) if c.type == gg.F32 else
                   gg.dequantize(np.ascontiguousarray(c.data), c.type, c.shape) for c in cols]
            assert np.array_equal(np.concatenate(got, axis=1), whole)
            views = [isinstance(c, ColumnSlice) for c in cols]
            # Q4_K: a head boundary (64 columns) inside a 256-block: F32 copies
            assert all(views) == (kind != "q4_k" or name == "w_down"), (name, views)
    assert np.array_equal(np.concatenate([s.output.data for s, _ in shares]), w.output.data)
    copies = shares[0][1]
    assert (copies == ()) == (kind != "q4_k") and (kind != "q4_k" or
                                                   "blk.0.attn_output.weight" in copies)


def test_biases_of_summed_outputs_are_added_once():
    from llama_models import biased_model_path
    c, w = loaded(biased_model_path())
    share0, share1 = (Shard.of(c, r, 2, gg.F32).weights(w, c)[0] for r in range(2))
    assert share0.layers[0].bo is w.layers[0].bo and share1.layers[0].bo is None
    assert share0.layers[0].b_down is w.layers[0].b_down and share1.layers[0].b_down is None
    assert share1.layers[0].bq.shape == (c.n_head // 2 * c.head_dim,)


def test_a_model_whose_kv_heads_the_ranks_do_not_divide_is_refused():
    c, _ = loaded(model_path("variant"))     # one KV head
    with pytest.raises(SplitError, match=r"n_head_kv divisible by 2: this model has 1 KV head"):
        Shard.of(c, 0, 2, gg.F32)
    assert isinstance(SplitError("x"), ValueError)


def test_feed_forward_bounds_fall_on_blocks():
    assert block_bounds(704, 2, 32) == [0, 352, 704]
    assert block_bounds(160, 2, 32) == [0, 64, 160]         # 5 blocks: 2 and 3
    assert block_bounds(5632, 4, 256) == [0, 1280, 2816, 4096, 5632]
    assert block_bounds(512, 4, 256) is None                # fewer blocks than ranks


def test_a_misaligned_column_share_is_an_f32_copy():
    _, w = loaded(model_path("q4_k"))
    wo = w.layers[0].wo
    assert isinstance(column_share(wo, 0, 256), ColumnSlice)
    copy = column_share(wo, 0, 128)
    assert copy.type == gg.F32 and copy.data.flags.c_contiguous and copy.shape == (wo.shape[0], 128)


def test_split_matrix_shapes_are_every_ranks():
    f = GGUFModelFile(default_model_path())
    _, shapes = split_matrix_shapes(f, 2)
    assert (128, 256, gg.Q8_0) in shapes and (256, 128, gg.Q8_0) in shapes   # q rows, o columns
    assert (352, 256, gg.Q8_0) in shapes and (256, 352, gg.Q8_0) in shapes   # gate, down
    assert (1024, 256, gg.Q8_0) in shapes                                    # output rows


# ---- what rank 0 gathers ---------------------------------------------------------------

def test_top_candidates_keep_what_the_samplers_top_k_keeps():
    rng = np.random.default_rng(3)
    row = rng.integers(0, 6, 200).astype(np.float32)        # many ties
    for k in (1, 5, 40, 200):
        ids = top_candidates(row, k)
        kept, _ = top_k(np.arange(200), row, k)
        assert sorted(ids) == sorted(kept), k
    # split in two, each half's candidates hold the whole row's top k
    halves = [top_candidates(row[:100], 40), 100 + top_candidates(row[100:], 40)]
    union = np.full(200, -np.inf, np.float32)
    union[np.concatenate(halves)] = row[np.concatenate(halves)]
    for temperature, k in ((0, 40), (0.8, 40), (0.8, 7)):
        draws = [Sampler(SamplingParams(temperature=temperature, top_k=k, top_p=0.9, seed=s))
                 .sample(x) for x in (row, union) for s in range(5)]
        assert draws[:5] == draws[5:]


def test_candidates_a_sampler_needs():
    def needed(**kw):
        return candidates_needed(Sampler(SamplingParams(**kw), banned=kw.pop("banned", ())))
    assert needed(temperature=0) == 1
    assert needed(temperature=0.8, top_k=40) == 40
    assert candidates_needed(Sampler(SamplingParams(top_k=40), banned=[2])) == 41
    assert needed(temperature=0.8, top_k=0, top_p=0.9) is None          # every token
    assert needed(temperature=0, repeat_penalty=1.1) is None            # penalties move any
    assert needed(temperature=0, repeat_penalty=1.1, repeat_last_n=0) == 1


def test_one_process_imports_no_mpi():
    code = ("import sys, ggml_py as gg\n"
            "llm = gg.Llama(n_ctx=64)\n"
            "''.join(llm.generate('ROMEO.', max_tokens=2, temperature=0))\n"
            "assert llm.rank == 0 and llm.n_ranks == 1\n"
            "assert 'mpi4py' not in sys.modules, 'mpi4py imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV,
                          cwd=CWD, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr


def test_comm_must_be_a_communicator():
    with pytest.raises(TypeError, match="mpi4py intracommunicator"):
        gg.Llama(comm="world")


# ---- under mpiexec -n 2 --------------------------------------------------------------

@needs_mpi
def test_all_reduce_against_numpy():
    assert ranks("allreduce")["cases"] == 10


@needs_mpi
@pytest.mark.parametrize("kind,rtol,ppl_rtol", [("bundled", 2e-2, 1e-4), ("f32", 1e-4, 1e-4),
                                                ("q4_0", 2e-2, 2e-3), ("q4_k", 2e-2, 1e-4)])
def test_two_ranks_give_what_one_process_gives(kind, rtol, ppl_rtol):
    """The bundled Q8_0 model and tiny GQA models (4 query heads, 2 KV heads; F32, Q4_0,
    Q4_K), on the attention op: the same greedy and seeded text, the same text in a
    batch and across context shifts, logits within rounding (quantized activations
    round differently: rtol of the largest logit) - of a prompt, and of the same tokens
    fed through a context shift, before and after it - perplexity within 0.01 % (the
    tiny Q4_0 model's ranks have K and V products of 16 rows, below BLAS's 32, which one
    process's 32 rows take: another profile, whose rounding its random weights amplify),
    and tune data taken by every rank.

    The tiny Q4_0 model's text across a context shift (300 tokens) is not compared: now
    and then a last-bit difference of the all-reduce's sums moves one Q8_0 rounding of
    an activation, the K row written then stays in the cache, and its random weights
    make near ties of greedy choices (of 15 prompts, the logits of 3 moved on the op and
    of 4 on the three-node attention, and the text of one on each). The logits of the
    same tokens show what the shift does: the same before and after it within rounding
    (a rank that did not rotate its K rows as rank 0 does moves them after it by a fifth
    to a quarter of the largest logit, on every model here)."""
    path = {"bundled": "bundled", "q4_k": q4_k_path()}.get(kind) or model_path(kind)
    out = ranks("model", path)
    split, alone = out["split"], out["alone"]
    texts = ("greedy", "sampled", "batch") + (("shifted",) if kind != "q4_0" else ())
    for key in texts:
        assert split[key] == alone[key], key
    assert split["tuned"] == 8 and split["tuned_ranks"] == [True, True]
    assert max(out["logits_diff"]) <= rtol * out["logits_max"]
    before, after = out["shift_logits_diff"][:4], out["shift_logits_diff"][4:]
    assert max(before) <= rtol * out["shift_logits_max"], before
    assert max(after) <= rtol * out["shift_logits_max"], after
    assert abs(split["ppl"] - alone["ppl"]) <= ppl_rtol * alone["ppl"]


@needs_mpi
def test_a_v_cache_type_other_than_k_reaches_every_rank():
    out = ranks("kv_types")
    assert out["made"] == [["Q8_0"], ["Q8_0"]] and out["alone_type"] == "Q8_0"
    assert out["split"] == out["alone"]


@needs_mpi
def test_main_prints_what_one_process_prints():
    args = ["-m", default_model_path(), "-p", "ROMEO.", "-n", "32", "--temp", "0", "-s", "1"]
    one = subprocess.run([sys.executable, "-m", "ggml_py.cli.main", *args, "-t", "1"],
                         capture_output=True, text=True, env=ENV, cwd=CWD, timeout=120,
                         check=False)
    two = mpiexec(sys.executable, "-m", "ggml_py.cli.main", *args, "--tp")
    assert one.returncode == 0 and two.returncode == 0, two.stderr
    assert two.stdout == one.stdout and one.stdout.startswith("ROMEO.")
    assert two.stderr.count("system_info") == 1          # rank 0 alone logs
    assert "rank 1" not in two.stderr


@needs_mpi
def test_the_other_ranks_log_when_asked():
    """--tp-log: rank 1 says on stderr what it holds and how long it served; stdout is
    still one process's."""
    args = ["-m", default_model_path(), "-p", "ROMEO.", "-n", "8", "--temp", "0", "--tp"]
    quiet = mpiexec(sys.executable, "-m", "ggml_py.cli.main", *args)
    told = mpiexec(sys.executable, "-m", "ggml_py.cli.main", *args, "--tp-log")
    assert quiet.returncode == 0 and told.returncode == 0, told.stderr
    assert told.stdout == quiet.stdout
    # (the two processes' lines may meet mid-line in the one pipe: searched, not split)
    assert re.search(r"rank 1 of 2: \d+ of \d+ query heads, \d+ of \d+ KV heads, [\d.]+ MiB of "
                     r"weights, \d+ threads?\n", told.stderr), told.stderr
    assert re.search(r"rank 1: served rank 0's steps for [\d.]+ s\n", told.stderr), told.stderr
    assert "rank 0 of" not in told.stderr


@needs_mpi
def test_a_model_that_cannot_be_split_is_an_error_on_every_rank():
    proc = mpiexec(sys.executable, "-m", "ggml_py.cli.main", "-m", model_path("variant"),
                   "-p", "x", "--tp", timeout=120)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.count("ggml-main: error: tensor parallel over 2 processes needs "
                             "n_head_kv divisible by 2") == 2, proc.stderr
    assert "Traceback" not in proc.stderr


@needs_mpi
def test_ranks_holding_f32_copies_say_so():
    """A K-quant attn_output whose head boundary falls inside a 256-block: each rank holds
    its columns as an F32 copy, whose logits differ from one process's by more than
    rounding; rank 0 warns as the program's other warnings, the others on their own line."""
    proc = mpiexec(sys.executable, "-m", "ggml_py.cli.main", "-m", model_path("q4_k"),
                   "-p", "x", "-n", "2", "--temp", "0", "-t", "1", "--tp", timeout=120)
    assert proc.returncode == 0, proc.stderr
    # (the two processes' lines may meet mid-line in the one pipe: searched, not split)
    for prefix in ("main: warning: rank 0 holds ", "rank 1: warning: holds "):
        assert re.search(re.escape(prefix) + r"blk\.0\.attn_output\.weight, .* F32 copies .*: "
                         r"the logits differ from one process's by more than rounding\n",
                         proc.stderr), proc.stderr


@needs_mpi
@pytest.mark.parametrize("case", ["missing model", "bad flag", "missing text", "other -t"])
@pytest.mark.parametrize("odd", [0, 1])
def test_a_rank_that_stops_before_loading_ends_every_rank(case, odd):
    """Ranks given other arguments (mpiexec's `-n 1 A : -n 1 B`): a model file or text
    missing on one host, a bad flag on one rank, end every rank in one error line each
    (naming the rank), not a hang; a thread count given on one rank only still runs."""
    program = "ggml_py.cli.perplexity" if case == "missing text" else "ggml_py.cli.main"
    common = ["-c", "64", "--tp"] + (["--chunks", "1"] if case == "missing text" else
                                     ["-p", "ROMEO.", "-n", "4", "--temp", "0"])
    good = ["-m", default_model_path(), "-t", "1"]
    bad = {"missing model": ["-m", os.path.join(CWD, "no-such-model.gguf"), "-t", "1"],
           "bad flag": good + ["-b", "none"],
           "missing text": good + ["-f", os.path.join(CWD, "no-such-text.txt")],
           "other -t": ["-m", default_model_path()]}[case]
    args = [[sys.executable, "-m", program, *common, *(bad if r == odd else good)]
            for r in range(2)]
    proc = subprocess.run([MPIEXEC, "-n", "1", *args[0], ":", "-n", "1", *args[1]],
                          capture_output=True, text=True, env=ENV, cwd=CWD, timeout=120,
                          check=False)
    if case == "other -t":
        assert proc.returncode == 0 and proc.stdout.startswith("ROMEO."), proc.stderr
        return
    assert proc.returncode != 0 and proc.stdout == "", proc.stdout + proc.stderr
    assert f"error: rank {odd} stopped before loading the model" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "BAD TERMINATION" not in proc.stderr


@needs_mpi
@pytest.mark.parametrize("victim", [0, 1])
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_rank_killed_mid_run_ends_the_others(victim, signum):
    """No hang: mpiexec ends every rank within seconds of one dying, and says so. A
    SIGTERM sent to a serving rank alone (rank 0's own ends the job at once) ends every
    rank after launch.TERM_GRACE_S, where it was ignored."""
    if signum == signal.SIGTERM and victim == 0:
        pytest.skip("rank 0's SIGTERM: test_llama_cli's signal tests (it ends the program)")
    proc = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, "-m", "ggml_py.cli.main",
                             "-p", "ROMEO.", "-c", "256", "-n", "-1", "--ignore-eos", "--temp", "0",
                             "--tp"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                            cwd=CWD)
    try:
        assert proc.stdout.read(6) == b"ROMEO."         # generating
        rank = None
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if child.environ().get("PMI_RANK") == str(victim) and \
                        "ggml_py.cli.main" in child.cmdline():
                    rank = child
            except psutil.Error:
                continue
        assert rank is not None
        rank.send_signal(signum)
        killed = time.monotonic()
        rest = b"".join(proc.communicate(timeout=60)).decode(errors="replace")
        if signum == signal.SIGKILL:
            assert time.monotonic() - killed < 10
            assert proc.returncode != 0 and "Killed (signal 9)" in rest, rest
        else:
            assert TERM_GRACE_S <= time.monotonic() - killed < TERM_GRACE_S + 10
            assert proc.returncode != 0, rest
            assert f"rank {victim}: terminated (SIGTERM): ending every rank" in rest, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_mpi
def test_an_error_in_a_step_ends_every_rank(tmp_path):
    """An error while the ranks wait for each other (here: the model file changed in place
    under every rank's mapping) ends the job with a line naming the rank, not a hang."""
    path = tmp_path / "model.gguf"
    shutil.copy(default_model_path(), path)
    proc = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, "-m", "ggml_py.cli.main", "-m",
                             path, "-p", "ROMEO.", "-c", "256", "-n", "-1", "--ignore-eos",
                             "--temp", "0", "--tp"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV, cwd=CWD)
    try:
        assert proc.stdout.read(6) == b"ROMEO."
        os.utime(path, ns=(1, 1))                       # "changed in place"
        changed = time.monotonic()
        err = proc.communicate(timeout=30)[1].decode(errors="replace")
        assert time.monotonic() - changed < 10
        assert proc.returncode != 0
        assert "error: " in err and "changed in place" in err and "ending every rank" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_mpi
@pytest.mark.skipif(importlib.util.find_spec("uvicorn") is None, reason="needs the server extra")
def test_the_server_runs_on_rank_0():
    """mpiexec -n 2 ggml-server --tp: rank 0 serves HTTP, both compute; a request's text
    is what one process's batch gives; SIGTERM ends every rank."""
    import signal
    import threading
    import urllib.request
    proc = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, "-m", "ggml_py.cli.server",
                             "--tp", "--port", "0", "-c", "512", "-np", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=ENV, cwd=CWD)
    lines, ready = [], threading.Event()

    def read():
        for line in proc.stderr:
            lines.append(line)
            if "ready:" in line:
                ready.set()
        ready.set()
    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(120) and proc.poll() is None, "".join(lines)
        url = next(line.split("listening on ")[1].split()[0] for line in lines
                   if "listening on" in line)
        body = json.dumps({"prompt": "ROMEO.", "max_tokens": 24, "temperature": 0}).encode()
        request = urllib.request.Request(url + "/v1/completions", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            text = json.loads(response.read())["choices"][0]["text"]
        with pytest.warns(gg.TrainingContextWarning):      # 512 > the bundled model's 256
            alone = gg.Llama(n_ctx=512, n_threads=1, n_seq_max=2)
        assert text == alone.generate_batch(["ROMEO."], max_tokens=24, temperature=0)[0]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
