"""Many sequences per step over the paged KV cache (ggml_py/model/batch.py).

The test that matters: every sequence of a batch yields exactly what it yields alone -
bitwise the same logits at every step - whatever the other sequences are doing
(different prompt lengths, staggered arrivals and endings, one shifting its context),
greedy and seeded, every KV cache type and attention profile, 1 and 2 threads. Then the pool's pages (reuse,
a full pool, cancel), the interface and bad input.
"""
import numpy as np
import pytest

import ggml_py as gg
from ggml_py.model import batch as batch_module
from ggml_py.model.context_shift import rope_rotation
from ggml_py.model.kv_paged import KVPoolFull, PagedKVCache
from llama_models import model_path

PROMPTS = ["ROMEO.", "JULIET. O Romeo, Romeo, wherefore art thou",
           "First Citizen.\nBefore we proceed any further, hear me speak.", "KING"]


@pytest.fixture
def logits_log(monkeypatch):
    """{sid: [logits row of each step]}: every row a Batch samples from, copied."""
    log = {}
    sample = batch_module.Batch._sample

    def recording(self, s, logits, events):
        log.setdefault((self, s.id), []).append(np.array(logits))
        return sample(self, s, logits, events)
    monkeypatch.setattr(batch_module.Batch, "_sample", recording)
    return log


def run_alone(llm, prompt, log, **kwargs):
    """(text, tokens, logits rows) of prompt run alone in a batch."""
    b = llm.batch(**{k: kwargs.pop(k) for k in ("n_ctx_seq", "keep") if k in kwargs})
    sid = b.add(prompt, **kwargs)
    while b.running:
        b.step()
    s = b.sequence(sid)
    return s.text, s.tokens, log[(b, sid)]


@pytest.mark.parametrize("kind,kv_type,threads,attention", [
    ("bundled", "f16", 2, "auto"), ("f32", "f32", 1, "auto"), ("q4_0", "f16", 2, "flash"),
    ("variant", "f32", 2, "slim"),
    # every KV cache type, K and V apart, under both profiles
    ("bundled", "q8_0", 2, "slim"), ("bundled", "q4_0/int8", 1, "flash"),
    ("q4_k", "int8", 2, "slim"), ("q4_k", "q8_0/q4_0", 2, "flash"), ("heads", "int8/f16", 2, "flash")])
def test_a_sequence_yields_in_a_batch_exactly_what_it_yields_alone(kind, kv_type, threads,
                                                                   attention, logits_log):
    path = None if kind == "bundled" else model_path(kind)
    ctk, ctv = (kv_type + "/" + kv_type).split("/")[:2]
    llm = gg.Llama(path, n_ctx=256, n_threads=threads, kv_type=ctk, kv_type_v=ctv, n_seq_max=3,
                   attention=attention)
    settings = [dict(max_tokens=12, temperature=0), dict(max_tokens=20, temperature=0.9, seed=7),
                dict(max_tokens=5, temperature=0.7, seed=3), dict(max_tokens=16, temperature=0)]
    alone = [run_alone(llm, p, logits_log, **kw) for p, kw in zip(PROMPTS, settings)]

    b = llm.batch()
    sids = [b.add(PROMPTS[0], **settings[0]), b.add(PROMPTS[1], **settings[1])]
    steps = 0
    while b.running:
        b.step()
        steps += 1
        if steps == 3:       # staggered arrivals: two more join mid-way, one waits (n_seq_max 3)
            sids += [b.add(PROMPTS[2], **settings[2]), b.add(PROMPTS[3], **settings[3])]
            assert b.waiting >= 1
    for sid, (text, tokens, rows) in zip(sids, alone):
        s = b.sequence(sid)
        assert s.text == text and s.tokens == tokens
        got = logits_log[(b, sid)]
        assert len(got) == len(rows)
        assert all(np.array_equal(a.view(np.uint32), r.view(np.uint32)) for a, r in zip(got, rows))
    assert llm.kv_pages_used() == 0           # every finished sequence gave its pages back


def test_generate_batch_gives_generates_text_when_greedy():
    llm = gg.Llama(n_ctx=256, n_threads=2)
    texts = llm.generate_batch(PROMPTS, max_tokens=24, temperature=0)
    assert texts == ["".join(llm.generate(p, max_tokens=24, temperature=0)) for p in PROMPTS]
    tokens = llm.generate_batch_tokens(PROMPTS[:2], max_tokens=8, temperature=0)
    greedy = gg.SamplingParams(temperature=0)
    assert tokens == [list(llm.generate_tokens(p, greedy, max_tokens=8)) for p in PROMPTS[:2]]


def test_stop_strings_and_logprobs_per_sequence():
    llm = gg.Llama(n_ctx=256, n_threads=1)
    b = llm.batch()
    free = b.add(PROMPTS[0], max_tokens=30, temperature=0)
    while b.running:
        b.step()
    text = b.sequence(free).text
    stop = text[5:8]
    b = llm.batch()
    a = b.add(PROMPTS[0], max_tokens=30, temperature=0, stop=[stop], logprobs=3)
    c = b.add(PROMPTS[1], max_tokens=4, temperature=0)
    pieces = {a: "", c: ""}
    while b.running:
        for sid, piece in b.step():
            pieces[sid] += piece
    s = b.sequence(a)
    assert s.text == pieces[a] == text[:text.index(stop)] and s.finish_reason == "stop"
    assert b.sequence(c).finish_reason == "length" and len(b.sequence(c).tokens) == 4
    token, logprob, top = s.logprobs[0]
    assert token == s.tokens[0] and len(top) == 3 and top[0][0] == token   # greedy: the top one
    assert logprob <= 0 and top[0][1] == logprob


def test_pages_are_reused_and_freed_on_cancel():
    llm = gg.Llama(n_ctx=128, n_threads=1)
    b = llm.batch()
    a = b.add(PROMPTS[2], max_tokens=50, temperature=0)
    b.step()
    used = llm.kv_pages_used()
    assert used == -(-(len(b.sequence(a).prompt_tokens)) // 16)
    b.cancel(a)
    assert b.sequence(a).finish_reason == "cancelled" and llm.kv_pages_used() == 0
    assert not b.running and b.step() == []
    c = b.add(PROMPTS[2], max_tokens=3, temperature=0)   # takes the pages a gave back
    b.step()
    assert llm.kv_pages_used() == used
    b.close()
    assert llm.kv_pages_used() == 0 and b.sequence(c).finish_reason == "cancelled"


def test_cancel_in_the_middle_of_a_prompt_read_in_chunks():
    llm = gg.Llama(n_ctx=256, n_threads=1, n_batch=8)
    b = llm.batch()
    long = b.add(PROMPTS[2] * 3, max_tokens=5, temperature=0)
    other = b.add(PROMPTS[0], max_tokens=5, temperature=0)
    b.step()                                   # 8 rows: a chunk of the long prompt only
    s = b.sequence(long)
    assert 0 < s.n_cached < len(s.prompt_tokens) and llm.kv_pages_used() > 0
    b.cancel(long)
    assert llm.kv_pages_used() == 0
    while b.running:
        b.step()
    alone = llm.generate_batch([PROMPTS[0]], max_tokens=5, temperature=0)
    assert b.sequence(other).text == alone[0] and s.finish_reason == "cancelled"


def test_a_full_pool_preempts_and_the_text_is_unchanged(logits_log):
    """Three sequences that together need more than the pool: the youngest gives its
    pages back and is read again later; every text is what it is alone."""
    llm = gg.Llama(n_ctx=96, n_threads=1, n_seq_max=3)
    kw = dict(max_tokens=40, temperature=0.8, seed=11)
    alone = [run_alone(llm, p, logits_log, **kw)[:2] for p in PROMPTS[:3]]
    b = llm.batch()
    sids = [b.add(p, **kw) for p in PROMPTS[:3]]
    most = 0
    while b.running:
        b.step()
        most = max(most, llm.kv_pages_used())
    assert most <= llm.kv_pages_total() == 6
    assert [(b.sequence(s).text, b.sequence(s).tokens) for s in sids] == alone


def test_one_sequence_shifts_its_context_while_the_others_do_not(logits_log):
    llm = gg.Llama(n_ctx=256, n_threads=2, n_seq_max=2)
    long = dict(max_tokens=70, temperature=0, n_ctx_seq=48, keep=4)
    text, tokens, rows = run_alone(llm, PROMPTS[0], logits_log, **long)
    assert len(tokens) == 70                    # ran past its 48-token context
    short_alone = run_alone(llm, PROMPTS[1], logits_log, max_tokens=10, temperature=0)
    b = llm.batch(n_ctx_seq=48, keep=4)
    a = b.add(PROMPTS[0], max_tokens=70, temperature=0)
    c = b.add(PROMPTS[1], max_tokens=10, temperature=0)
    while b.running:
        b.step()
    assert (b.sequence(a).text, b.sequence(a).tokens) == (text, tokens)
    assert (b.sequence(c).text, b.sequence(c).tokens) == short_alone[:2]


def test_without_context_shift_a_full_sequence_ends_with_length():
    llm = gg.Llama(n_ctx=256, n_threads=1)
    b = llm.batch(n_ctx_seq=32, context_shift=False)
    sid = b.add(PROMPTS[0], max_tokens=-1, temperature=0, ignore_eos=True)
    while b.running:
        b.step()
    s = b.sequence(sid)
    assert s.finish_reason == "length" and len(s.prompt_tokens) + len(s.tokens) == 32


def test_rerope_moves_keys_as_rope_at_the_new_position(rng):
    """Rotating a K row made at position p by -d gives K made at p - d (float rounding)."""
    llm = gg.Llama(model_path("variant"), n_ctx=64, n_threads=1)
    c = llm.config
    x = rng.standard_normal((5, c.n_head_kv, c.head_dim)).astype(np.float32)
    freqs = np.asarray(llm.model.weights.rope_freqs.data, np.float32)
    ctx = gg.Context(mem_size=1 << 20)

    def roped(positions):
        out = gg.rope(ctx.from_numpy(x), ctx.from_numpy(np.array(positions, np.int32)), c.n_rot,
                      gg.ROPE_NORMAL, c.rope_freq_base, c.rope_freq_scale, ctx.from_numpy(freqs))
        gg.build_forward(out).compute(n_threads=1)
        return out.numpy().reshape(5, -1).copy()
    moved = roped([40, 41, 50, 63, 100])
    rope_rotation(c, freqs)(moved, -17)
    np.testing.assert_allclose(moved, roped([23, 24, 33, 46, 83]), atol=2e-5)


def test_the_pool(rng):
    pool = PagedKVCache(2, 40, 2, 8, page_size=16)
    assert (pool.n_pages, pool.n_slots, pool.pages_free) == (3, 48, 3)
    pool.reserve("a", 20)
    pool.reserve("b", 5)
    assert pool.pages_used == 3
    with pytest.raises(KVPoolFull, match="0 free pages"):
        pool.reserve("b", 17)
    assert pool.pages_used == 3 and pool.length("b") == 0       # nothing changed
    assert list(pool.slots("a", 14, 18)) == [14, 15, 16, 17]
    assert list(pool.slots("b", 0, 2)) == [32, 33]
    pool.free("a")
    pool.reserve("c", 1)
    assert list(pool.slots("c", 0, 1)) == [0]                   # the pages freed last go first
    with pytest.raises(ValueError, match="multiple of 32, not 8"):
        PagedKVCache(1, 16, 1, 8, type=gg.Q4_0)
    with pytest.raises(ValueError, match="must be one of f32, f16, q8_0, q4_0, int8, got Q5_0"):
        PagedKVCache(1, 16, 1, 32, type=gg.Q5_0)


def test_two_batches_of_one_llama_share_the_pool_without_mixing(logits_log):
    llm = gg.Llama(n_ctx=256, n_threads=1)
    alone = [run_alone(llm, p, logits_log, max_tokens=8, temperature=0)[:2] for p in PROMPTS[:2]]
    b1, b2 = llm.batch(), llm.batch()
    s1, s2 = b1.add(PROMPTS[0], max_tokens=8, temperature=0), b2.add(PROMPTS[1], max_tokens=8,
                                                                     temperature=0)
    assert s1 != s2
    while b1.running or b2.running:
        b1.step()
        b2.step()
    assert [(b.sequence(s).text, b.sequence(s).tokens) for b, s in ((b1, s1), (b2, s2))] == alone


def test_bad_input():
    llm = gg.Llama(n_ctx=64, n_threads=1)
    with pytest.raises(ValueError, match="list of prompts is empty"):
        llm.generate_batch([])
    with pytest.raises(TypeError, match="list of prompts"):
        llm.generate_batch("ROMEO.")
    b = llm.batch()
    with pytest.raises(ValueError, match="the prompt is empty"):
        b.add([])
    with pytest.raises(ValueError, match=r"the prompt has \d+ tokens, a sequence's context 64"):
        b.add("ROMEO. " * 40)
    with pytest.raises(ValueError, match="temperature"):
        b.add("ROMEO.", temperature=float("nan"))
    with pytest.raises(ValueError, match="n_seq_max"):
        gg.Llama(n_ctx=64, n_seq_max=0)
    with pytest.raises(ValueError, match="n_ctx_seq"):
        llm.batch(n_ctx_seq=1000)
    with pytest.raises(KeyError):
        b.sequence(99)
    sid = b.add("ROMEO.", max_tokens=2)
    with pytest.raises(ValueError, match="still running"):
        b.forget(sid)
    b.cancel(sid)
    b.forget(sid)
    assert not b.running


def test_generate_runs_past_a_full_context_with_context_shift():
    """-n -1 as llama-cli: the context of 64 fills, half of it after the kept prompt is
    dropped, generation goes on; without context_shift it stops at the full context."""
    llm = gg.Llama(n_ctx=64, n_threads=1)
    greedy = gg.SamplingParams(temperature=0)
    prompt = llm.tokenize("ROMEO.")
    tokens = list(llm.generate_tokens(prompt, greedy, max_tokens=150, ignore_eos=True,
                                      context_shift=True, keep=-1))
    assert len(tokens) == 150 and llm.timings.context_shifts >= 3
    assert llm.tokens[:len(prompt)] == prompt and llm.n_tokens < 64     # the prompt kept
    stopped = list(llm.generate_tokens(prompt, greedy, max_tokens=150, ignore_eos=True))
    assert len(prompt) + len(stopped) == 64 and stopped == tokens[:len(stopped)]


def test_shift_moves_rows_down_and_rotates_keys(rng):
    from ggml_py.model.kv_cache import KVCache
    cache = KVCache(2, 32, 2, 8, type=gg.F32)
    for a in cache.k + cache.v:
        a[:] = rng.standard_normal(a.shape)
    cache.begin(np.arange(20, dtype=np.int32))
    old_k, old_v = [a.copy() for a in cache.k], [a.copy() for a in cache.v]

    def rerope(rows, delta):
        rows *= delta        # a stand-in rotation that shows it was applied, once
    cache.shift(3, 8, rerope)
    assert cache.n_past == 12
    for il in range(2):
        np.testing.assert_array_equal(cache.k[il][:3], old_k[il][:3])
        np.testing.assert_array_equal(cache.k[il][3:12], -8 * old_k[il][11:20])
        np.testing.assert_array_equal(cache.v[il][3:12], old_v[il][11:20])
    with pytest.raises(ValueError, match="cannot drop"):
        cache.shift(10, 8, rerope)


# ---- the programs ---------------------------------------------------------------------

def run_program(module, *args, cwd):
    import os
    import subprocess
    import sys
    parent = os.path.dirname(os.path.dirname(os.path.abspath(gg.__file__)))
    env = dict(os.environ, PYTHONPATH=parent + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300)


def test_ggml_batched_streams_each_sequence_as_generate_gives_it(tmp_path):
    prompts = ["ROMEO.", "", "JULIET. O Romeo", "KING"]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    proc = run_program("ggml_py.cli.batched", "-f", "prompts.txt", "-np", "2", "-n", "16",
                       "--temp", "0", "-t", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    texts = {}
    for line in proc.stdout.splitlines():
        sid, _, text = line.partition("] ")
        texts.setdefault(int(sid[1:]), []).append(text)
    llm = gg.Llama(n_threads=1)
    want = ["".join(llm.generate(p, max_tokens=16, temperature=0)) for p in prompts if p]
    assert ["\n".join(texts[i]) for i in range(3)] == [w.rstrip("\n") for w in want]
    assert proc.stderr.count("(length)") + proc.stderr.count("(stop)") == 3
    assert "generated tokens/s in all" in proc.stderr
    bad = run_program("ggml_py.cli.batched", "-n", "3", cwd=tmp_path)
    assert bad.returncode == 2 and "give a prompt" in bad.stderr


def test_ggml_bench_batch_prints_the_table_and_json(tmp_path):
    proc = run_program("ggml_py.cli.bench", "batch", "-np", "1,3", "-n", "4", "-t", "1",
                       "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    import json
    rows = json.loads(proc.stdout)["results"]
    assert [r["n_seq"] for r in rows] == [1, 3] and rows[0]["vs_single"] == 1.0
    assert all(r["decode_ts"] > 0 and r["kv_bytes"] > 0 for r in rows)
    assert rows[1]["kv_bytes"] > rows[0]["kv_bytes"]        # KV grows with live tokens
