"""Many sequences per step over the paged KV cache (ggml_py/model/batch.py).

The test that matters: every sequence of a batch yields exactly what it yields alone -
bitwise the same logits at every step - whatever the other sequences are doing
(different prompt lengths, staggered arrivals and endings, one shifting its context),
greedy and seeded, every KV cache type and attention profile, 1 and 2 threads. Then the pool's pages (reuse,
a full pool, cancel), the interface and bad input.
"""
import re

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
    b = llm.batch(**{k: kwargs.pop(k) for k in ("n_ctx_seq", "keep", "share_prefix") if k in kwargs})
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
    # auto picks slim or flash per token, by its own list: never by the step's other lists
    from ggml_py.core.types import Op
    profiles = {t.profile.name for g in llm.model._graphs.values() for t in g.graph.nodes
                if t.op == Op.ATTENTION}
    assert profiles == {"auto" if attention == "auto" else attention}


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
    # entries for the tokens the text shows, none for the stop string's past it
    shown = [llm.detokenize([t]) for t, _, _ in s.logprobs]
    assert "".join(shown).startswith(s.text) and len("".join(shown[:-1])) < len(s.text)
    assert len(s.logprobs) < len(s.tokens)


def test_a_stop_string_over_two_tokens_leaves_neither_a_logprobs_entry():
    llm = gg.Llama(n_ctx=256, n_threads=1)
    free = llm.generate_batch_tokens([PROMPTS[0]], max_tokens=30, temperature=0)[0]
    pieces = [llm.detokenize([t]) for t in free]
    i = next(i for i in range(2, 20) if len(pieces[i].strip()) >= 2 and pieces[i + 1].strip())
    stop = pieces[i][2:] + pieces[i + 1]      # from inside token i to the end of token i + 1
    b = llm.batch()
    sid = b.add(PROMPTS[0], max_tokens=30, temperature=0, stop=[stop], logprobs=0)
    while b.running:
        b.step()
    s = b.sequence(sid)
    assert s.text == "".join(pieces[:i]) + pieces[i][:2] and s.tokens == free[:i + 2]
    assert [t for t, _, _ in s.logprobs] == free[:i + 1]   # token i shows in the text, i + 1 not


def test_a_stop_string_found_by_the_last_flush_ends_with_stop_and_its_tokens_have_no_entry():
    # the filter holds " a man" (it may begin the longer stop) when max_tokens ends the
    # text: the final flush finds the shorter stop, " man", and cuts there
    llm = gg.Llama(n_ctx=256, n_threads=1)
    free = llm.generate_batch_tokens([PROMPTS[0]], max_tokens=12, temperature=0)[0]
    pieces = [llm.detokenize([t]) for t in free]
    i = next(i for i in range(2, 12) if pieces[i].startswith(" ") and len(pieces[i]) > 1
             and pieces[i] not in "".join(pieces[:i]))
    b = llm.batch()
    sid = b.add(PROMPTS[0], max_tokens=i + 1, temperature=0, logprobs=0,
                stop=[pieces[i - 1] + pieces[i] + "!", pieces[i]])
    while b.running:
        b.step()
    s = b.sequence(sid)
    assert s.text == "".join(pieces[:i]) and s.finish_reason == "stop"
    assert s.tokens == free[:i + 1] and [t for t, _, _ in s.logprobs] == free[:i]


def test_an_end_of_generation_token_has_no_logprobs_entry():
    # the entries are the output's tokens, as completion_tokens counts them
    llm = gg.Llama(n_ctx=256, n_threads=1)
    b = llm.batch()
    sid = b.add(PROMPTS[0], max_tokens=10, temperature=0, logprobs=2)
    s = b.sequence(sid)
    sample, picks = s.sampler.sample, []

    def third_is_eog(logits):   # the bundled model never ends greedily on its own
        picks.append(sample(logits))
        return min(llm.tokenizer.eog_ids) if len(picks) == 3 else picks[-1]
    s.sampler.sample = third_is_eog
    while b.running:
        b.step()
    assert s.finish_reason == "stop" and s.tokens == picks[:2]
    assert [token for token, _, _ in s.logprobs] == s.tokens


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


HEAD = ("First Citizen.\nBefore we proceed any further, hear me speak.\n\nAll.\nSpeak, speak.\n\n"
        "First Citizen.\nYou are all resolved rather to die than to famish?\n\n")


def test_a_common_prefix_is_read_once_and_the_text_is_unchanged(logits_log):
    llm = gg.Llama(n_ctx=256, n_threads=2, n_seq_max=3)
    prompts = [HEAD + "All.\nResolved.", HEAD + "Second Citizen.\nWe", HEAD + "MENENIUS."]
    settings = [dict(max_tokens=10, temperature=0), dict(max_tokens=12, temperature=0.8, seed=5),
                dict(max_tokens=6, temperature=0)]
    alone = [run_alone(llm, p, logits_log, share_prefix=False, **kw) for p, kw in zip(prompts, settings)]
    assert llm.kv_pool().pages_idle == 0            # (nothing named without share_prefix)
    b = llm.batch()
    sids = [b.add(prompts[0], **settings[0])]
    b.step()                                         # the first reads the common prefix ...
    sids += [b.add(p, **kw) for p, kw in zip(prompts[1:], settings[1:])]
    b.step()                                         # ... the others start on its pages
    n_head = len(llm.tokenize(HEAD)) // 16 * 16
    assert b.n_shared_tokens >= 2 * (n_head - 16)
    pages = sum(-(-b.sequence(sid).n_cached // 16) for sid in sids)
    assert llm.kv_pages_used() == pages - b.n_shared_tokens // 16     # a shared page counts once
    while b.running:
        b.step()
    for sid, (text, tokens, rows) in zip(sids, alone):
        assert (b.sequence(sid).text, b.sequence(sid).tokens) == (text, tokens)
        got = logits_log[(b, sid)]
        assert all(np.array_equal(a.view(np.uint32), r.view(np.uint32)) for a, r in zip(got, rows))
    # the pages stay named when nobody holds them: a later batch finds them
    assert llm.kv_pages_used() == 0 and llm.kv_pool().pages_idle >= n_head // 16
    b2 = llm.batch()
    sid = b2.add(prompts[2], **settings[2])
    while b2.running:
        b2.step()
    assert b2.n_shared_tokens >= n_head - 16
    assert (b2.sequence(sid).text, b2.sequence(sid).tokens) == alone[2][:2]
    for other in (llm.batch(share_prefix=False), llm.batch(invariant=False)):
        other.add(prompts[2], **settings[2])       # (rows of invariant batches are theirs)
        other.step()
        assert other.n_shared_tokens == 0
        other.close()


def test_prompts_that_arrive_together_read_their_common_pages_once(logits_log):
    llm = gg.Llama(n_ctx=256, n_threads=1, n_seq_max=4)
    kw = [dict(max_tokens=8, temperature=0.8, seed=seed) for seed in range(4)]
    alone = [run_alone(llm, HEAD, logits_log, share_prefix=False, **k) for k in kw]
    b = llm.batch()
    sids = [b.add(HEAD, **k) for k in kw]           # one prompt, four seeds (ggml-batched -np 4)
    b.step()
    assert llm.kv_pages_used() == -(-len(llm.tokenize(HEAD)) // 16)   # the first reads it
    while b.running:
        b.step()
    assert b.n_shared_tokens == 3 * ((len(llm.tokenize(HEAD)) - 1) // 16 * 16)
    for sid, (text, tokens, rows) in zip(sids, alone):
        assert (b.sequence(sid).text, b.sequence(sid).tokens) == (text, tokens)
        assert all(np.array_equal(a.view(np.uint32), r.view(np.uint32))
                   for a, r in zip(logits_log[(b, sid)], rows))


def test_rows_planned_otherwise_are_not_shared():
    llm = gg.Llama(n_ctx=256, n_threads=1)

    def shared():
        b = llm.batch()
        b.add(HEAD + "All.", max_tokens=2, temperature=0)
        while b.running:
            b.step()
        return b.n_shared_tokens
    assert shared() == 0 and shared() > 0      # the second finds the first's pages
    llm.set_tune(None)                         # planned again: attention's limit may move
    assert shared() == 0


def test_a_cache_salt_shares_pages_only_with_the_same_salt():
    llm = gg.Llama(n_ctx=256, n_threads=1)

    def shared(salt):
        b = llm.batch()
        b.add(HEAD + "All.", max_tokens=2, temperature=0, cache_salt=salt)
        while b.running:
            b.step()
        return b.n_shared_tokens
    assert shared("alice") == 0 and shared(None) == 0 and shared("bob") == 0
    assert shared("alice") > 0 and shared(None) > 0
    with pytest.raises(TypeError, match="cache_salt must be a string"):
        llm.batch().add("ROMEO.", cache_salt=3)


def test_a_sequence_shifting_its_context_copies_the_pages_it_shares(logits_log):
    llm = gg.Llama(n_ctx=256, n_threads=2, n_seq_max=2)
    a_kw, c_kw = dict(max_tokens=60, temperature=0), dict(max_tokens=40, temperature=0)
    a_alone = run_alone(llm, HEAD + "All.", logits_log, share_prefix=False, n_ctx_seq=80, keep=4, **a_kw)
    c_alone = run_alone(llm, HEAD + "MENENIUS.", logits_log, share_prefix=False, n_ctx_seq=80, keep=4, **c_kw)
    b = llm.batch(n_ctx_seq=80, keep=4)
    a = b.add(HEAD + "All.", **a_kw)
    b.step()
    c = b.add(HEAD + "MENENIUS.", **c_kw)
    while b.running:
        b.step()
    assert b.n_shared_tokens > 0
    assert len(b.sequence(a).tokens) == 60          # shifted past its 80-token context
    assert (b.sequence(a).text, b.sequence(a).tokens) == a_alone[:2]
    assert (b.sequence(c).text, b.sequence(c).tokens) == c_alone[:2]


def test_the_pool_shares_named_pages(rng):
    pool = PagedKVCache(1, 32, 1, 8, type=gg.F32, page_size=4)     # 8 pages of 4
    pool.k[0][:], pool.v[0][:] = rng.standard_normal((2, 1, 32, 8)).astype(np.float32)
    ids = list(range(100, 110))
    pool.reserve("a", 10)
    pool.advance("a", 10, ids)                       # pages 0 and 1 full: named
    assert pool.attach_prefix("b", ids) == 8         # (its last token left to compute)
    assert list(pool.slots("b", 0, 8)) == list(pool.slots("a", 0, 8))
    assert pool.attach_prefix("c", ids[:8]) == 4 and pool.attach_prefix("d", [1, 2, 3, 4, 5]) == 0
    assert pool.pages_used == 3                      # a page held by several counts once
    with pytest.raises(ValueError, match="already holds"):
        pool.attach_prefix("a", ids)
    for seq in "abcd":
        pool.free(seq)
    assert (pool.pages_used, pool.pages_idle, pool.pages_free) == (0, 2, 8)
    assert pool.attach_prefix("e", ids) == 8 and pool.pages_idle == 0
    pool.free("e")
    pool.reserve("f", 24)                            # the six free pages first ...
    assert pool.pages_idle == 2
    pool.reserve("g", 4)                             # ... then the oldest idle one (the last
    assert pool.pages_idle == 1 and pool.pages_free == 1     # page of the prefix) loses its name
    assert pool.attach_prefix("h", ids) == 4
    for seq in "fgh":
        pool.free(seq)
    # a page about to be written loses its name, and so do the pages named after it
    other = list(range(200, 210))
    pool.reserve("a", 10)
    pool.advance("a", 10, other)
    pool.truncate("a", 4)                            # its second page is idle, still named
    assert pool.pages_idle == 2
    pool.shift("a", 1, 2, lambda rows, n: None)
    assert pool.pages_idle == 1 and pool.attach_prefix("i", other) == 0


def test_a_shift_copies_a_shared_page_first_and_a_full_pool_changes_nothing(rng):
    pool = PagedKVCache(1, 20, 1, 8, type=gg.F32, page_size=4)     # 5 pages of 4
    pool.k[0][:], pool.v[0][:] = rng.standard_normal((2, 1, 20, 8)).astype(np.float32)
    ids = list(range(9))
    pool.reserve("a", 8)
    pool.advance("a", 8, ids)
    assert pool.attach_prefix("b", ids) == 8
    pool.reserve("b", 1)
    pool.advance("b", 1, ids)
    before = pool.k[0].copy(), pool.v[0].copy()
    a_slots, b_slots = pool.slots("a", 0, 8), pool.slots("b", 0, 9)
    pool.reserve("c", 8)                             # the pool is full: b cannot copy its pages
    with pytest.raises(KVPoolFull):
        pool.shift("b", 1, 4, lambda rows, n: None)
    assert list(pool.slots("b", 0, 9)) == list(b_slots) and pool.length("b") == 9
    pool.free("c")
    pool.shift("b", 1, 4, lambda rows, n: None)      # writes positions 1..4 of b
    assert list(pool.slots("a", 0, 8)) == list(a_slots)
    assert np.array_equal(pool.k[0][:, a_slots], before[0][:, a_slots])      # a's rows untouched
    assert np.array_equal(pool.v[0][:, a_slots], before[1][:, a_slots])
    assert not set(pool.slots("b", 0, 5)) & set(a_slots)
    new = pool.slots("b", 0, 5)
    assert np.array_equal(pool.k[0][:, new], before[0][:, b_slots[[0, 5, 6, 7, 8]]])
    assert np.array_equal(pool.v[0][:, new], before[1][:, b_slots[[0, 5, 6, 7, 8]]])
    pool.advance("b", 0, ids)
    pool.free("a")
    assert pool.attach_prefix("x", [0, 5, 6, 7, 8, 9]) == 0   # moved rows are never named


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
    with pytest.raises(KeyError, match="no sequence 99 in this batch"):
        b.sequence(99)
    with pytest.raises(KeyError, match="no sequence 99 in this batch"):
        b.cancel(99)
    with pytest.raises(ValueError, match="context_shift needs a sequence's context"):
        llm.batch(n_ctx_seq=2)                     # (a shift drops a token past the kept)
    assert llm.batch(n_ctx_seq=2, context_shift=False).n_ctx_seq == 2
    with pytest.raises(ValueError, match="context_shift needs a context of 3"):
        gg.Llama(n_ctx=2, n_threads=1).generate("", context_shift=True)
    sid = b.add("ROMEO.", max_tokens=2)
    with pytest.raises(ValueError, match="still running"):
        b.forget(sid)
    b.cancel(sid)
    b.forget(sid)
    assert not b.running


def test_generate_batch_runs_to_the_end_of_the_context_as_generate_does():
    """generate_batch's context_shift and keep are generate's (off by default): without
    a shift max_tokens=-1 stops at the full context; with one, the batch shifts at the
    same token as generate (a token that would take the last slot shifts it first)."""
    llm = gg.Llama(n_ctx=64, n_threads=1)
    greedy = dict(temperature=0, ignore_eos=True)
    for kw in (dict(max_tokens=-1), dict(max_tokens=100, context_shift=True),
               dict(max_tokens=100, context_shift=True, keep=-1)):
        alone = list(llm.generate_tokens(PROMPTS[0], gg.SamplingParams(temperature=0),
                                         ignore_eos=True, **kw))
        assert llm.generate_batch_tokens([PROMPTS[0]], **greedy, **kw) == [alone]
    assert len(alone) == 100 and llm.shift_log[-1] == (5, 29)   # BOS + the prompt kept


def test_the_smallest_context_that_shifts_drops_a_token_with_nothing_after_it():
    llm = gg.Llama(n_ctx=3, n_threads=1)     # BOS kept, one token dropped, none to move
    alone = list(llm.generate_tokens("", gg.SamplingParams(temperature=0), max_tokens=10,
                                     ignore_eos=True, context_shift=True))
    assert len(alone) == 10 and llm.shift_log[-1] == (1, 1)
    assert llm.generate_batch_tokens([""], max_tokens=10, temperature=0, ignore_eos=True,
                                     context_shift=True) == [alone]


def test_a_sequence_holds_n_ctx_tokens_not_the_pools_whole_pages():
    llm = gg.Llama(n_ctx=100, n_threads=1)        # a pool of 7 pages: 112 slots
    b = llm.batch(context_shift=False)
    assert b.n_ctx_seq == 100
    sid = b.add(PROMPTS[0], max_tokens=-1, temperature=0, ignore_eos=True)
    while b.running:
        b.step()
    s = b.sequence(sid)
    assert len(s.prompt_tokens) + len(s.tokens) == 100 and s.finish_reason == "length"
    with pytest.raises(ValueError, match=r"n_ctx_seq must be in 2\.\.100"):
        llm.batch(n_ctx_seq=112)


def test_max_tokens_0_reads_the_prompt_and_generates_nothing():
    llm = gg.Llama(n_ctx=64, n_threads=1)
    assert llm.generate_batch_tokens([PROMPTS[0], PROMPTS[1]], max_tokens=0) == [[], []]
    b = llm.batch()
    sid = b.add(PROMPTS[0], max_tokens=0)
    assert b.step() == [(sid, "")] and b.sequence(sid).finish_reason == "length"
    assert llm.kv_pages_used() == 0


def test_a_batch_dropped_unclosed_gives_its_pages_back():
    import gc
    llm = gg.Llama(n_ctx=128, n_threads=1)

    def started():
        b = llm.batch()
        b.add("ROMEO. " * 20, max_tokens=100, temperature=0, ignore_eos=True)
        for _ in range(3):
            b.step()
        return b
    started()
    gc.collect()           # (its pages are freed by the next step, of any batch)
    want = llm.generate_batch(["JULIET. " * 10], max_tokens=4, temperature=0)
    assert llm.kv_pages_used() == 0
    held = started()                               # 7 of the 8 pages held by a live batch
    with pytest.raises(KVPoolFull, match="held by another batch"):
        llm.generate_batch(["JULIET. " * 10], max_tokens=4, temperature=0)
    held.close()
    assert llm.generate_batch(["JULIET. " * 10], max_tokens=4, temperature=0) == want


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
        np.testing.assert_array_equal(cache.k[il][:, :3], old_k[il][:, :3])
        np.testing.assert_array_equal(cache.k[il][:, 3:12], -8 * old_k[il][:, 11:20])
        np.testing.assert_array_equal(cache.v[il][:, 3:12], old_v[il][:, 11:20])
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
    bad = run_program("ggml_py.cli.batched", "-p", "KING", "-f", "prompts.txt", cwd=tmp_path)
    assert bad.returncode == 2 and "one of the two" in bad.stderr
    bad = run_program("ggml_py.cli.batched", "-p", "KING", "-n", "-3", cwd=tmp_path)
    assert bad.returncode == 2 and "-n -3" in bad.stderr
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n")
    bad = run_program("ggml_py.cli.batched", "-f", "latin1.txt", cwd=tmp_path)
    assert bad.returncode == 1 and "latin1.txt: not UTF-8" in bad.stderr


def test_ggml_batched_n_minus_2_runs_each_sequence_to_its_share_of_the_context(tmp_path):
    """-n -2 (and -1): no end but the context's, so each sequence holds n_ctx / -np, as
    llama.cpp's server slots (none waits for ever on another)."""
    proc = run_program("ggml_py.cli.batched", "-p", "ROMEO.", "-np", "2", "-n", "-2", "-c",
                       "64", "--temp", "0", "-t", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "32 a sequence" in proc.stderr
    lengths = re.findall(r"prompt +(\d+) tokens, generated +(\d+) \(length\)", proc.stderr)
    assert len(lengths) == 2 and all(int(a) + int(b) == 32 for a, b in lengths)


def test_ggml_bench_batch_prints_the_table_and_json(tmp_path):
    proc = run_program("ggml_py.cli.bench", "batch", "-np", "1,3", "-n", "4", "-t", "1",
                       "--rounds", "1", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    import json
    rows = json.loads(proc.stdout)["results"]
    assert [r["n_seq"] for r in rows] == [1, 3] and rows[0]["vs_single"] == 1.0
    assert all(r["rounds"] == 1 for r in rows)
    # graphs built in the untimed runs only (B = 3's larger graphs built after B = 1's would
    # have dropped them, and a single round would have rebuilt them)
    assert all(r["build_s"] == 0 for r in rows)
    assert all(r["decode_ts"] > 0 and r["kv_bytes"] > 0 for r in rows)
    assert rows[1]["kv_bytes"] > rows[0]["kv_bytes"]        # KV grows with live tokens
    for flags, says in ((["-np", "1,0"], "at least 1, got 0"), (["-n", "1"], "at least 2")):
        bad = run_program("ggml_py.cli.bench", "batch", *flags, cwd=tmp_path)
        assert bad.returncode == 2 and says in bad.stderr
    proc = run_program("ggml_py.cli.bench", "batch", "-np", "3", "-n", "2", "-t", "1",
                       "--prefix", "40", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("|   3 |"))
    shared = int(row.split("|")[3])
    assert shared >= 3 * 32          # the first run's pages of the common 40, found again
    proc = run_program("ggml_py.cli.bench", "batch", "-np", "3", "-n", "2", "-t", "1",
                       "--prefix", "40", "--no-share-prefix", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["results"][-1]["shared_tokens"] == 0
    proc = run_program("ggml_py.cli.bench", "batch", "--prefix", "-1", cwd=tmp_path)
    assert proc.returncode == 1 and "--prefix: expected a count >= 0" in proc.stderr
