"""KV cache types (f32, f16, q8_0, q4_0, int8; K and V may differ) and attention modes
(auto, graph, slim, flash) through gg.Llama: logits against the F32 cache, the single
sequence's bits against a batch's, bytes per token, context shift of quantized keys, the
programs' -ctk / -ctv / --attention, ggml-bench attn, and attention in tune files."""
import json

import numpy as np
import pytest
from llama_models import model_path

import ggml_py as gg
from ggml_py.core.types import Op, Type
from ggml_py.model import batch as batch_module
from ggml_py.model.kv_cache import KVCache
from ggml_py.model.kv_rows import KVRows, kv_type

PROMPT = "ROMEO. But soft, what light through yonder window breaks? It is the east"


@pytest.fixture(scope="module")
def f32_logits():
    """Logits of PROMPT with an F32 cache and the three-node attention (the reference)."""
    llm = gg.Llama(n_ctx=128, n_threads=1, kv_type="f32", attention="graph")
    ids = llm.tokenize(PROMPT)
    return ids, llm.eval(ids)


# the largest logit difference from the F32 cache on the bundled model (logits of size ~20;
# its Q8_0 weights quantize every activation row, so a last-bit change can move a value by a
# step: an F16 cache read by the three nodes is 0.08 away, measured)
CLOSE = {("f16", "f16"): 0.15, ("q8_0", "q8_0"): 0.15, ("int8", "int8"): 0.25,
         ("q4_0", "q4_0"): 0.8, ("q8_0", "f16"): 0.15, ("int8", "q4_0"): 0.5}


@pytest.mark.parametrize("attention", ["slim", "flash"])
@pytest.mark.parametrize("kv", list(CLOSE), ids=lambda kv: "-".join(kv))
def test_every_kv_type_gives_logits_close_to_the_f32_cache(f32_logits, kv, attention):
    ids, want = f32_logits
    llm = gg.Llama(n_ctx=128, n_threads=2, kv_type=kv[0], kv_type_v=kv[1], attention=attention,
                   n_batch=7)                        # batches of 7: rows already in the cache
    got = llm.eval(ids)
    assert np.abs(got - want).max() <= CLOSE[kv]
    assert (got.argmax(axis=1) == want.argmax(axis=1)).mean() >= 0.9
    assert (llm.model.cache.type, llm.model.cache.type_v) == tuple(map(kv_type, kv, "kv"))


@pytest.mark.parametrize("kv", ["f16", "f32"])
def test_graph_slim_and_flash_agree(kv):
    # F32 weights (no activation quantized to blocks): the three ways differ in float rounding
    # only - and, over an F16 cache, the graph's second product rounds the probabilities to
    # F16 (its vec_dot type), where the attention op keeps them in F32
    ids = list(range(1, 60))
    out = {mode: gg.Llama(model_path("f32"), n_ctx=128, n_threads=2, attention=mode,
                          kv_type=kv).eval(ids) for mode in ("graph", "slim", "flash", "auto")}
    for mode in ("slim", "flash"):
        np.testing.assert_allclose(out[mode], out["graph"], atol=2e-3 if kv == "f16" else 1e-4,
                                   rtol=0)
        np.testing.assert_allclose(out[mode], out["slim"], atol=1e-4, rtol=0)
    assert np.array_equal(out["auto"], out["slim"]) or np.array_equal(out["auto"], out["flash"])


def step_logits(monkeypatch):
    """{sequence id: [logits rows]} a Batch samples from, recorded."""
    log = {}
    sample = batch_module.Batch._sample

    def recording(self, s, logits, events):
        log.setdefault(s.id, []).append(np.array(logits))
        return sample(self, s, logits, events)
    monkeypatch.setattr(batch_module.Batch, "_sample", recording)
    return log


@pytest.mark.parametrize("kv,attention", [(("f16", "f16"), "auto"), (("int8", "int8"), "slim"),
                                          (("q4_0", "q8_0"), "flash"), (("f32", "f32"), "auto")])
def test_the_single_sequence_gives_a_batchs_bits(monkeypatch, kv, attention):
    """generate and generate_batch: the same attention op over the same rows, so the same
    logits bit for bit (prompts under 32 tokens: no BLAS in either path)."""
    log = step_logits(monkeypatch)
    llm = gg.Llama(n_ctx=128, n_threads=2, kv_type=kv[0], kv_type_v=kv[1], attention=attention)
    ids = llm.tokenize(PROMPT)[:20]
    b = llm.batch()
    sid = b.add(ids, max_tokens=6, temperature=0)
    while b.running:
        b.step()
    tokens = b.sequence(sid).tokens
    rows = [llm.eval(ids)[-1]] + [llm.eval([t])[-1] for t in tokens[:-1]]
    assert all(np.array_equal(a.view(np.uint32), r.view(np.uint32)) for a, r in zip(rows, log[sid]))
    assert "".join(llm.generate(ids, max_tokens=6, temperature=0)) == b.sequence(sid).text


def test_bytes_per_token():
    # the 1.1B shape: 22 layers, 4 KV heads of 64
    def per_token(ctk, ctv=None):
        return KVCache(22, 16, 4, 64, type=ctk, type_v=ctv).bytes_per_token
    f16 = per_token("f16")
    assert f16 == 22 * 2 * 256 * 2
    assert per_token("int8") == 22 * 2 * 4 * (64 + 4) and per_token("int8") / f16 <= 0.55
    assert per_token("q8_0") == 22 * 2 * 8 * 34 and per_token("q4_0") == 22 * 2 * 8 * 18
    assert per_token("q8_0", "f16") == 22 * (8 * 34 + 512)
    cache = KVCache(22, 16, 4, 64, type="int8")
    assert cache.nbytes == 16 * cache.bytes_per_token


@pytest.mark.parametrize("type", ["q8_0", "q4_0", "int8", "f16"])
def test_keys_written_in_numpy_match_the_graphs_set_rows(rng, type):
    """Context shift re-writes rotated keys with numpy: the same quantizers as set_rows."""
    rows = KVRows(1, 10, 2, 32, kv_type(type, "test"), Type.F16, "test")
    x = rng.standard_normal((4, 64)).astype(np.float32)
    x[0, :2] = 127, 2.5        # a value at a half: Q8_0's reference quantizer rounds it up
    ctx = gg.Context(mem_size=1 << 20)
    kv = rows.store(ctx, 0, ctx.from_numpy(x), ctx.from_numpy(x), ctx.from_numpy(
        np.array([0, 1, 2, 3], np.int32)), "test")
    gg.build_forward(kv.k, kv.v).compute(n_threads=1)
    rows.set_keys(0, np.arange(5, 9), x)
    np.testing.assert_array_equal(rows.k[0][:, 5:9], rows.k[0][:, 0:4])
    if rows.k_scales is not None:
        np.testing.assert_array_equal(rows.k_scales[0][:, 5:9], rows.k_scales[0][:, 0:4])
    held = rows.keys_f32(0, np.arange(4))
    assert np.abs(held - x).max() <= (8.0 if type == "q4_0" else 0.5)   # (a step: 127 / 8, 127 / 127)
    rows.move(0, np.arange(4), np.arange(6, 10))
    np.testing.assert_array_equal(rows.v[0][:, 6:10], rows.v[0][:, 0:4])


@pytest.mark.parametrize("kv", [("q8_0", "int8"), ("int8", "q4_0")])
def test_generate_goes_on_past_a_full_context_with_quantized_keys(kv):
    llm = gg.Llama(n_ctx=64, n_threads=1, kv_type=kv[0], kv_type_v=kv[1])
    prompt = llm.tokenize("ROMEO.")
    tokens = list(llm.generate_tokens(prompt, gg.SamplingParams(temperature=0), max_tokens=100,
                                      ignore_eos=True, context_shift=True, keep=-1))
    assert len(tokens) == 100 and llm.timings.context_shifts >= 2
    texts = llm.generate_batch(["ROMEO."], max_tokens=80, temperature=0, ignore_eos=True)
    assert texts[0]


def test_bad_kv_types_and_attention_modes_are_refused():
    with pytest.raises(ValueError, match="kv_type must be one of f32, f16, q8_0, q4_0, int8, got Q5_0"):
        gg.Llama(n_ctx=32, kv_type="q5_0")
    with pytest.raises(ValueError, match="multiple of 32, not 16"):
        gg.Llama(model_path("f32"), n_ctx=32, kv_type="q8_0")
    with pytest.raises(ValueError, match="attention='graph' reads F16 and F32 caches, not F16 / I8"):
        gg.Llama(n_ctx=32, kv_type_v="int8", attention="graph")
    with pytest.raises(ValueError, match="not Q8_0 / F32"):   # (F32 is type 0: not "no type")
        gg.Llama(n_ctx=32, kv_type="q8_0", kv_type_v="f32", attention="graph")
    with pytest.raises(ValueError, match="not I8 / I8"):      # refused before the file is read
        gg.Llama("/nonexistent/model.gguf", kv_type="int8", attention="graph")
    with pytest.raises(ValueError, match="attention must be one of auto, graph, slim, flash"):
        gg.Llama(n_ctx=32, attention="fast")


def test_the_attention_mode_sets_the_profile_of_every_attention_node():
    for mode in ("slim", "flash"):
        llm = gg.Llama(n_ctx=64, n_threads=1, attention=mode)
        llm.eval(llm.tokenize("ROMEO."))
        nodes = [t for g in llm.model._graphs.values() for t in g.graph.nodes if t.op == Op.ATTENTION]
        assert nodes and all(t.profile.name == mode for t in nodes)
    llm = gg.Llama(n_ctx=64, n_threads=1, attention="graph")
    llm.eval(llm.tokenize("ROMEO."))
    assert not any(t.op == Op.ATTENTION for g in llm.model._graphs.values() for t in g.graph.nodes)


# ---- the programs ------------------------------------------------------------------------

def test_main_takes_quantized_cache_types_and_an_attention_mode(capsys):
    from ggml_py.cli import main as main_cli
    base = ["-p", "ROMEO.", "-n", "6", "--temp", "0", "-t", "1", "-c", "64"]
    assert main_cli.cli(base + ["-ctk", "q8_0", "-ctv", "int8", "--attention", "flash"]) == 0
    quantized = capsys.readouterr().out
    assert main_cli.cli(base) == 0
    assert capsys.readouterr().out.startswith("ROMEO.") and quantized.startswith("ROMEO.")


def test_bench_attn_prints_a_row_per_length(capsys):
    from ggml_py.cli.bench import main as bench_main
    assert bench_main(["attn", "--shape", "4,2,32", "-L", "32,64", "-ctk", "f16,q4_0", "-r", "1",
                       "-t", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["length"] for r in out["results"]] == [32, 64]
    assert set(out["results"][0]["ms"]) == {"graph f16", "slim f16", "flash f16", "slim q4_0",
                                            "flash q4_0"}
    assert all(v > 0 for r in out["results"] for v in r["ms"].values())


@pytest.mark.parametrize("flag,value,says", [("--shape", "8,3,32", "Hkv dividing H"),
                                             ("-ctk", "f16,q5_0", "expected types among")])
def test_bench_attn_says_what_is_wrong_with_a_flag(capsys, flag, value, says):
    from ggml_py.cli.bench import main as bench_main
    with pytest.raises(SystemExit) as e:
        bench_main(["attn", flag, value])
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_bench_attn_cold_decode(capsys):
    from ggml_py.cli.bench import main as bench_main
    assert bench_main(["attn", "--shape", "8,2,64", "-L", "128", "-ctk", "int8", "--profiles", "slim",
                       "--decode", "--cold", "-r", "2", "-t", "1"]) == 0
    out = capsys.readouterr().out
    assert "one new token over L cached, K and V from memory" in out
    assert len([line for line in out.splitlines() if line.startswith("|   128 |")]) == 1


def test_bench_model_depth(capsys):
    from ggml_py.cli.bench import main as bench_main
    assert bench_main(["model", "-p", "0", "-n", "4", "-d", "0,40", "-r", "1", "-t", "1",
                       "-ctk", "int8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert [r["test"] for r in rows] == ["tg4", "tg4 @ d40"]
    assert rows[1]["n_depth"] == 40 and rows[1]["type_k"] == "int8"


# ---- tune data ---------------------------------------------------------------------------

def tiny_tune_data():
    """TuneData of one small MUL_MAT shape at one thread (a file needs one)."""
    from ggml_py.tune.bench import bench
    return bench([(32, 32, Type.F32)], model="x", m_values=[1, 2], thread_counts=[1])


def test_tune_files_hold_attention_times_the_planner_uses(tmp_path):
    from ggml_py.core.graph import build_forward
    from ggml_py.tune import data as tune
    from ggml_py.tune.attention import attention_case, bench_attention
    shape = (32, 4, 2, Type.F16, Type.I8)
    data = tiny_tune_data()
    data.attention = bench_attention([shape], [1], tokens=[1, 4], lengths=[16, 64], repetitions=1)
    path = tmp_path / "t.json"
    data.save(path)
    loaded = tune.load(path)
    a = loaded.attention[0]
    assert a.key == (32, 4, 2, Type.F16, Type.I8) and a.tokens == [1, 4] and a.lengths == [16, 64]
    est = loaded.attention_estimates(32, 4, 2, Type.F16, Type.I8, 1, 40, 1)
    assert [name for _, name in est] == sorted(a.times_us, key=lambda p: a.estimate(p, 1, 40, 1))
    _, node, graph = attention_case(shape, 1, 40, np.random.default_rng(0))
    row = next(r for r in graph.plan(n_threads=1, tune=loaded).rows if r.op == Op.ATTENTION)
    assert row.reason == "tuned" and node.profile.name == "auto"
    _, _, graph2 = attention_case((32, 4, 4, Type.F16, Type.F16), 1, 40, np.random.default_rng(0))
    assert next(r for r in graph2.plan(n_threads=1, tune=loaded).rows if r.op == Op.ATTENTION).reason \
        == "fallback"
    assert build_forward(node)


@pytest.mark.parametrize("slim_us,flash_us,limit", [
    ([10.0, 58.0], [17.0, 41.0], 29),   # flash overtakes slim at 30 keys (a tie goes to flash)
    ([2.0, 20.0], [10.0, 58.0], 40),    # slim faster up to the node's 40 keys
    ([10.0, 58.0], [2.0, 20.0], -1),    # flash faster everywhere
    ([17.0, 41.0], [10.0, 58.0], 40),   # flash faster only for short lists (noise): slim for all
])
def test_the_planner_takes_slim_up_to_where_flash_overtakes_it(slim_us, flash_us, limit):
    # (times for one query token at lists of 16 and 64, made here: the bench's own are noise
    # at these sizes)
    from ggml_py.tune.attention import attention_case
    from ggml_py.tune.data import AttentionTimes
    shape = (32, 4, 2, Type.F16, Type.I8)
    data = tiny_tune_data()
    data.attention = [AttentionTimes(*shape, tokens=[1], lengths=[16, 64],
                                     times_us={"slim": {1: [slim_us]}, "flash": {1: [flash_us]}})]
    _, node, graph = attention_case(shape, 1, 40, np.random.default_rng(0))
    graph.plan(n_threads=1, tune=data)
    assert node._op_param_i32(1) == limit


def test_a_malformed_attention_entry_is_refused(tmp_path):
    from ggml_py.tune import data as tune
    from ggml_py.tune.attention import bench_attention
    data = tiny_tune_data()
    data.attention = bench_attention([(32, 2, 2, Type.F16, Type.F16)], [1], tokens=[1],
                                     lengths=[8, 16], repetitions=1)
    good = data.to_json()
    for edit, message in ((lambda a: a.update(lengths=[16]), "two or more lengths"),
                          (lambda a: a["times_us"].update(fast={}), "unknown attention profile"),
                          (lambda a: a.update(type_k="Q9"), "unknown KV type"),
                          (lambda a: a["times_us"]["slim"].update({"3": [[1.0, 2.0]]}), "threads")):
        obj = json.loads(json.dumps(good))
        edit(obj["attention"][0])
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(obj))
        with pytest.raises(tune.TuneFileError, match=message):
            tune.load(path)
