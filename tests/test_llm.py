"""The Llama API: tokenize, eval, generate, perplexity."""
import math
import os
import pathlib
import threading
import warnings

import numpy as np
import pytest

from llama_models import N_VOCAB, TEXT, V, edited_model, model_path, vocab
from llama_reference import ReferenceLlama

import ggml_py as gg
from ggml_py.model.bundled import default_text_path
from ggml_py.core.graph import MAX_THREADS
from ggml_py.model.stops import until_stop
from ggml_py.model.perplexity import token_nll
from ggml_py.tools.random_model import RandomLlamaSpec, write_random_llama
from ggml_py.model.sampling import Sampler


@pytest.fixture(scope="module")
def llm():
    return gg.Llama(model_path("f32"), n_ctx=128, n_threads=2, kv_type="f32")


@pytest.fixture(scope="module")
def reference():
    return ReferenceLlama(model_path("f32"))


def test_tokenize_detokenize(llm):
    ids = llm.tokenize("Hello world")
    assert ids[0] == llm.token_bos() == 1
    assert llm.tokenize("Hello world", add_bos=False) == ids[1:]
    assert llm.tokenize(b"Hello world") == ids
    assert llm.detokenize(ids[1:]) == "Hello world"


def test_eval_matches_reference_and_continues(llm, reference):
    ids = llm.tokenize("The quick brown fox jumps over the lazy dog")
    llm.reset()
    logits = llm.eval(ids)
    assert logits.shape == (len(ids), llm.n_vocab()) and llm.n_tokens == len(ids)
    assert np.abs(logits - reference.forward(ids)).max() <= 1e-4
    llm.reset()
    first = llm.eval(ids[:4])
    rest = llm.eval(ids[4:])                  # continues the sequence, like llama-cpp-python
    np.testing.assert_allclose(np.concatenate([first, rest]), logits, atol=2e-5, rtol=0)
    llm.reset()
    assert llm.n_tokens == 0


def test_eval_in_small_batches(reference):
    small = gg.Llama(model_path("f32"), n_ctx=64, n_threads=1, n_batch=3, kv_type="f32")
    ids = small.tokenize("one two three four five six seven")
    assert np.abs(small.eval(ids) - reference.forward(ids)).max() <= 1e-4


def test_token_by_token_equals_small_batches_bit_for_bit():
    # the bundled model (Q8_0, F16 KV cache): under 32 tokens a batch runs the CPU
    # kernels, whose rows do not depend on how many come together — the attention's
    # F16 products included
    bundled = gg.Llama(n_ctx=128, n_threads=2)
    with open(default_text_path()) as f:
        ids = bundled.tokenize(f.read(2000))[:40]
    one = np.concatenate([bundled.eval(ids[i:i + 1]) for i in range(len(ids))])
    for batch in (8, 13):
        bundled.reset()
        np.testing.assert_array_equal(
            np.concatenate([bundled.eval(ids[i:i + batch]) for i in range(0, len(ids), batch)]), one)


def reference_greedy(reference, ids, n):
    ids, out = list(ids), []
    for _ in range(n):
        logits = reference.forward(ids)[-1]
        top2 = np.sort(logits)[-2:]
        assert top2[1] - top2[0] > 1e-3, "a near tie: pick another prompt"
        out.append(int(np.argmax(logits)))
        ids.append(out[-1])
    return out


def test_greedy_generation_matches_reference(llm, reference):
    prompt = llm.tokenize("Once upon a time")
    params = gg.SamplingParams(temperature=0)
    tokens = list(llm.generate_tokens(prompt, params, max_tokens=12, ignore_eos=True))
    assert tokens == reference_greedy(reference, prompt, 12)
    again = list(llm.generate_tokens(prompt, params, max_tokens=12, ignore_eos=True))
    assert again == tokens                     # deterministic, reusing the cached prefix


def test_generate_text_streams_pieces(llm):
    pieces = list(llm.generate("Once upon a time", max_tokens=12, temperature=0, ignore_eos=True))
    tokens = list(llm.generate_tokens("Once upon a time", gg.SamplingParams(temperature=0),
                                      max_tokens=12, ignore_eos=True))
    assert len(pieces) > 1 and "".join(pieces) == llm.detokenize(tokens)



def test_a_text_prompt_reads_control_token_texts_as_tokens(llm):
    # as llama-cpp-python's create_completion and llama-cli; perplexity keeps them text
    greedy = gg.SamplingParams(temperature=0)
    text = "Hi</s>there"
    special, plain = llm.tokenize(text, special=True), llm.tokenize(text)
    assert special != plain
    assert list(llm.generate_tokens(text, greedy, max_tokens=6, ignore_eos=True)) == \
        list(llm.generate_tokens(special, greedy, max_tokens=6, ignore_eos=True)) != \
        list(llm.generate_tokens(plain, greedy, max_tokens=6, ignore_eos=True))
    assert "".join(llm.generate(text, max_tokens=6, temperature=0, ignore_eos=True)) == \
        llm.detokenize(list(llm.generate_tokens(special, greedy, max_tokens=6, ignore_eos=True)))

def test_same_seed_same_text(llm):
    def text(seed):
        return "".join(llm.generate("The", max_tokens=16, temperature=1.0, seed=seed,
                                    ignore_eos=True))
    assert text(5) == text(5)
    assert len({text(5), text(6), text(7)}) > 1


def test_stops_at_eos_and_max_tokens(llm, monkeypatch):
    assert len(list(llm.generate_tokens("The", max_tokens=5, ignore_eos=True))) == 5
    draws = iter([10, 11, llm.token_eos(), 12])
    monkeypatch.setattr(Sampler, "sample", lambda self, logits: next(draws))
    assert list(llm.generate_tokens("The", max_tokens=10)) == [10, 11]


def test_ignore_eos_bans_end_of_generation(llm):
    sampler_banned = []
    original = Sampler.__init__

    def spy(self, params, banned=()):
        sampler_banned.extend(banned)
        original(self, params, banned)
    Sampler.__init__ = spy
    try:
        list(llm.generate_tokens("The", max_tokens=1, ignore_eos=True))
    finally:
        Sampler.__init__ = original
    assert llm.token_eos() in sampler_banned


def test_generation_stops_when_context_is_full():
    small = gg.Llama(model_path("f32"), n_ctx=16, n_threads=1)
    prompt = small.tokenize("Hello")
    tokens = list(small.generate_tokens(prompt, gg.SamplingParams(temperature=0), max_tokens=-1,
                                        ignore_eos=True))
    # as llama-cli and llama-cpp-python: prompt and generated tokens fill the context, the
    # last one sampled and not evaluated
    assert small.n_tokens == 15 and len(prompt) + len(tokens) == 16
    assert small.timings.prompt_tokens == len(prompt) and small.timings.eval_tokens == len(tokens) - 1
    # a prompt of n_ctx - 1 tokens: one token
    assert len(list(small.generate_tokens(list(range(1, 16)), max_tokens=-1, ignore_eos=True))) == 1


def test_generate_max_tokens_none_runs_until_the_context_is_full():
    small = gg.Llama(model_path("f32"), n_ctx=16, n_threads=1)
    text = "".join(small.generate("Hello", max_tokens=None, temperature=0, ignore_eos=True))
    assert small.n_tokens == 15 and text
    tokens = list(small.generate_tokens("Hello", max_tokens=None, ignore_eos=True))
    assert small.n_tokens == 15 and len(tokens) == 16 - len(small.tokenize("Hello"))


@pytest.mark.parametrize("pieces, stops, expected", [
    (["Hel", "lo wor", "ld"], ("lo w",), ["He", "l"]),         # a stop across pieces
    (["a", "b", "c", "d"], ("bc",), ["a"]),
    (["ab", "x", "cd"], ("abc",), ["abx", "cd"]),              # "ab" held, then released
    (["ab", "c"], ("abc",), []),                               # at the very start: nothing
    (["xy", "z!", "zz"], ("z", "y"), ["x"]),                   # the earliest stop wins
    (["one ", "two ", "three"], ("four",), ["one ", "two ", "three"]),
    (["end:", " done"], (":",), ["end"]),
    (["x", "ab"], ("abc",), ["x", "ab"]),                      # held text comes out at the end
])
def test_until_stop_cuts_at_the_first_stop_string(pieces, stops, expected):
    assert list(until_stop(iter(pieces), stops)) == expected


def test_until_stop_does_not_depend_on_how_the_text_is_split():
    rng = np.random.default_rng(4)
    for _ in range(2000):
        text = "".join(rng.choice(list("abc"), rng.integers(0, 12)))
        stops = tuple("".join(rng.choice(list("abc"), rng.integers(1, 5)))
                      for _ in range(rng.integers(1, 4)))
        ends = [i for i in (text.find(s) for s in stops) if i >= 0]
        expected = text[:min(ends)] if ends else text
        cuts = sorted(rng.choice(len(text) + 1, rng.integers(0, len(text) + 1), replace=False))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)]) if b > a]
        assert "".join(until_stop(iter(pieces), stops)) == expected, (text, stops, pieces)
        assert "".join(until_stop(iter(text), stops)) == expected


def test_generate_stops_at_a_stop_string_and_evaluates_no_further(llm):
    greedy = dict(max_tokens=24, temperature=0, ignore_eos=True)
    tokens = list(llm.generate_tokens("Once upon a time", gg.SamplingParams(temperature=0),
                                      max_tokens=24, ignore_eos=True))
    full = "".join(llm.generate("Once upon a time", **greedy))
    stop = full[len(full) // 2:len(full) // 2 + 3]
    cut = full.index(stop)
    # the token whose text completes the stop is sampled, not evaluated: the cache holds
    # the prompt and the tokens before it
    decoder, text = llm.tokenizer.decoder(strip_leading_space=False), ""
    for completing, token in enumerate(tokens):
        text += decoder.feed(token)
        if stop in text:
            break
    pieces = llm.generate("Once upon a time", stop=[stop, "\x00never"], **greedy)
    assert "".join(pieces) == full[:cut]
    assert llm.n_tokens == len(llm.tokenize("Once upon a time")) + completing
    assert "".join(llm.generate("Once upon a time", stop=stop[0] * 50, **greedy)) == full
    for bad, error in [("", ValueError), ([""], ValueError), (3, TypeError), ([b"x"], TypeError)]:
        with pytest.raises(error, match="stop"):
            llm.generate("The", stop=bad)                # checked before iterating


def test_timings_count_eval_and_keep_graph_building_apart():
    llm = gg.Llama(model_path("f32"), n_ctx=64, n_threads=1)
    t = llm.timings
    llm.eval([1, 2, 3, 4])
    llm.eval([5])                       # eval() was not counted at all
    assert (t.prompt_tokens, t.eval_tokens, t.builds) == (4, 1, 2) and t.build_s > 0
    llm.reset()
    llm.eval([1, 2, 3, 4])              # a shape built before: nothing to build, all evaluation
    assert (t.prompt_tokens, t.builds) == (8, 2)
    lines = t.lines()
    assert any(line.startswith("graph build time") and line.endswith("    2 graphs") for line in lines)
    for refused in ([10 ** 6], [1, 2, 10 ** 6], list(range(1, 100))):   # bad id, too long
        with pytest.raises(ValueError):
            llm.eval(refused)
    assert (t.prompt_tokens, t.eval_tokens) == (8, 1)          # refused calls count nothing

    # total: the time since the load, read from the Llama's clock (not a sum that
    # included the load): a clock stepped by hand, 2 s a reading while loading, then stopped
    now = [0.0]

    def loading_clock():
        now[0] += 2.0 if loading else 0.0
        return now[0]
    loading = True
    llm = gg.Llama(model_path("f32"), n_ctx=64, n_threads=1, clock=loading_clock)
    loading = False
    assert llm.timings.load_s == pytest.approx(2.0)
    now[0] += 0.25
    assert llm.timings.lines()[-1] == "      total time =     250.00 ms /     0 tokens"


def reference_perplexity(reference, tokens, n_ctx, bos):
    nll = []
    for i in range(len(tokens) // n_ctx):
        chunk = tokens[i * n_ctx:(i + 1) * n_ctx]
        logits = reference.forward([bos] + chunk[1:]).astype(np.float32)
        first = n_ctx // 2
        nll.extend(token_nll(logits[first:-1], np.asarray(chunk[first + 1:])))
    nll = np.array(nll)
    ppl = math.exp(nll.mean())
    return ppl, ppl * math.sqrt(nll.var() / (len(nll) - 1))


def test_perplexity_matches_reference(llm, reference):
    tokens = llm.tokenize(TEXT)[:200]
    seen = []
    result = llm.perplexity(tokens, n_ctx=64, callback=lambda i, n, ppl, s: seen.append((i, n, ppl)))
    ppl, err = reference_perplexity(reference, tokens, 64, llm.token_bos())
    assert result.ppl == pytest.approx(ppl, rel=1e-5)
    assert result.error == pytest.approx(err, rel=1e-3)
    assert [(i, n) for i, n, _ in seen] == [(0, 3), (1, 3), (2, 3)]
    assert seen[-1][2] == result.ppl == float(result)
    assert result.n_scored == 3 * 31 and len(result.chunk_ppl) == 3
    # an odd n_ctx scores from n_ctx // 2, as llama.cpp's `first = n_ctx/2`
    odd = llm.perplexity(tokens[:66], n_ctx=33)
    assert odd.n_scored == 2 * 16
    assert odd.ppl == pytest.approx(reference_perplexity(reference, tokens[:66], 33,
                                                         llm.token_bos())[0], rel=1e-5)


def test_perplexity_needs_two_contexts(llm):
    with pytest.raises(ValueError, match="at least 128 tokens"):
        llm.perplexity("too short", n_ctx=64)
    with pytest.raises(ValueError, match="larger than the model's context"):
        llm.perplexity(TEXT, n_ctx=256)
    with pytest.raises(ValueError, match="n_ctx 129 is larger than the model's context 128"):
        llm.perplexity(TEXT, n_ctx=129)
    with pytest.raises(ValueError, match="n_ctx must be"):
        llm.perplexity(TEXT, n_ctx=3)     # a chunk of 3 scores no token


def test_perplexity_n_chunks_past_the_end_is_all_and_n_batch_is_given_back(llm):
    n_batch = llm.n_batch
    every = llm.perplexity(TEXT, n_ctx=32, n_batch=8)
    assert llm.n_batch == n_batch
    many = llm.perplexity(TEXT, n_ctx=32, n_batch=8, n_chunks=10 ** 6)
    assert many.ppl == every.ppl and many.n_scored == every.n_scored
    assert llm.perplexity(TEXT, n_ctx=32, n_chunks=1).n_scored == 32 // 2 - 1


def test_bad_arguments():
    with pytest.raises(gg.ModelLoadError, match="no such file"):
        gg.Llama("/nonexistent/model.gguf")
    with pytest.raises(ValueError, match="kv_type"):
        gg.Llama(model_path("f32"), kv_type="q8")
    with pytest.raises(ValueError, match="Llama: kv_type must be one of f32, f16, q8_0, q4_0, "
                                         "int8, got Q5_1"):
        gg.Llama(model_path("f32"), kv_type=gg.Q5_1)
    with pytest.raises(ValueError, match="a Q8_0 KV cache needs a head size that is a multiple "
                                         "of 32, not 16"):
        gg.Llama(model_path("f32"), kv_type=gg.Q8_0)
    for same in ("F32", gg.F32, 0):          # a type by name in any case, or its number
        assert gg.Llama(model_path("f32"), n_ctx=16, kv_type=same).model.cache.type == gg.F32


def test_llama_without_a_path_loads_the_bundled_model():
    llm = gg.Llama(n_ctx=64, n_threads=1)
    assert llm.n_vocab() == 2048 and llm.config.n_ctx_train == 256
    ids = llm.tokenize("ROMEO.", add_bos=True)
    assert ids[0] == llm.token_bos() and llm.detokenize(ids[1:]) == "ROMEO."
    text = "".join(llm.generate("ROMEO.", max_tokens=8, temperature=0))
    assert text == "".join(llm.generate("ROMEO.", max_tokens=8, temperature=0)) and text.strip()



def test_a_context_past_the_training_context_is_warned_about():
    # as llama.cpp warns; the model's own context (512) or less is quiet
    with pytest.warns(gg.TrainingContextWarning,
                      match=r"^n_ctx \(1024\) > n_ctx_train \(512\) -- possible "
                                         r"training context overflow$") as caught:
        gg.Llama(model_path("f32"), n_ctx=1024, n_threads=1).close()
    assert caught[0].filename == __file__    # the caller's line, not the library's
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gg.Llama(model_path("f32"), n_ctx=512, n_threads=1).close()
        gg.Llama(model_path("f32"), n_ctx=0, n_threads=1).close()

# ---- bad input: a clear TypeError / ValueError naming the argument ------------------

@pytest.mark.parametrize("kwargs, error, match", [
    (dict(n_threads=999), ValueError, r"n_threads must be in 1\.\.256, got 999"),
    (dict(n_threads=-1), ValueError, "n_threads must be in"),
    (dict(n_threads=2.5), TypeError, "n_threads must be an integer"),
    (dict(kv_pad=0), ValueError, "kv_pad must be at least 1"),
    (dict(n_ctx=-5), ValueError, "n_ctx must be at least 0"),
    (dict(n_batch=0), ValueError, "n_batch must be at least 1"),
    (dict(make_cache="paged"), TypeError, "Llama: make_cache must be callable"),
])
def test_bad_constructor_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        gg.Llama(model_path("f32"), **{"n_ctx": 16, **kwargs})


def test_max_threads_is_the_pools_limit():
    header = os.path.join(os.path.dirname(__file__), "..", "include", "ggml_py_pool.h")
    assert f"#define GGML_PY_MAX_THREADS {MAX_THREADS}\n" in open(header).read()
    with pytest.raises(ValueError):
        gg.ThreadPool(MAX_THREADS + 1)


def test_model_path_as_bytes_or_path():
    path = model_path("f32")
    assert gg.Llama(path.encode(), n_ctx=16, n_threads=1).model_path == path
    assert gg.Llama(pathlib.Path(path), n_ctx=16, n_threads=1).model_path == path


def test_a_context_too_large_to_allocate_is_a_value_error():
    with pytest.raises(ValueError, match=r"cannot allocate the KV cache for n_ctx=1000000000000: "
                                         r"[\d.]+ GiB"):
        gg.Llama(model_path("f32"), n_ctx=10**12, n_threads=1)


def test_a_training_context_too_large_to_allocate_is_a_value_error():
    # numpy says "array is too big" (a ValueError), not MemoryError, past 2^63 bytes
    path = edited_model("ctx-2-62.gguf", keys={"llama.context_length": ([V.UINT64], 2**62)})
    with pytest.raises(ValueError, match=r"cannot allocate the KV cache for "
                                         r"n_ctx=4611686018427387904: [\d.]+ GiB"):
        gg.Llama(path, n_ctx=0, n_threads=1)


def test_training_context_of_zero_needs_an_n_ctx(tmp_path):
    path = tmp_path / "ctx0.gguf"
    write_random_llama(path, RandomLlamaSpec(n_vocab=N_VOCAB, n_ctx_train=0), vocab=vocab())
    with pytest.raises(gg.ModelLoadError, match="context_length is 0"):
        gg.Llama(path, n_ctx=0)
    with pytest.warns(UserWarning, match=r"n_ctx \(16\) > n_ctx_train \(0\)"):   # as llama.cpp
        assert gg.Llama(path, n_ctx=16, n_threads=1).n_ctx() == 16


def test_text_is_str_bytes_bytearray_or_memoryview(llm):
    ids = llm.tokenize("Hello world")
    assert llm.tokenize(bytearray(b"Hello world")) == ids
    assert llm.tokenize(memoryview(b"Hello world")) == ids
    # invalid UTF-8 bytes reach the tokenizer as they are (no U+FFFD in between)
    assert llm.tokenize(b"caf\xe9 ok") == llm.tokenizer.tokenize(b"caf\xe9 ok", add_special=True)
    for bad in (None, 123, [1, 2]):
        with pytest.raises(TypeError, match="text must be str, bytes, bytearray or memoryview"):
            llm.tokenize(bad)
    greedy = dict(max_tokens=4, temperature=0, ignore_eos=True)
    expected = "".join(llm.generate("The cat", **greedy))
    assert "".join(llm.generate(bytearray(b"The cat"), **greedy)) == expected
    assert "".join(llm.generate(memoryview(b"The cat"), **greedy)) == expected
    with pytest.raises(TypeError, match="expected token ids, got memoryview"):
        llm.eval(memoryview(b"Hi"))


def test_long_inputs_are_checked_in_one_pass(llm, monkeypatch):
    import ggml_py.model.session as llm_module
    calls = []
    monkeypatch.setattr(llm_module, "checked_int", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(llm, "n_vocab", lambda: calls.append("n_vocab") or N_VOCAB)
    ids = [5, 7] * 50_000
    for tokens in (ids, tuple(ids), np.array(ids, np.int32), np.array(ids, np.uint16),
                   [np.int64(5), 7] * 500):
        assert llm_module.token_ids(tokens) == ids[:len(tokens)]
        llm._check_vocab(llm_module.token_ids(tokens))
    assert calls == ["n_vocab"] * 5        # no id-by-id check, n_vocab read once per call
    monkeypatch.undo()
    # the slow path still refuses what is not an integer id, bools included
    for bad in ([1, True], [np.int64(1), np.True_], np.array([True]), [1, 2.0], [[1, 2]]):
        with pytest.raises(TypeError, match="token id must be an integer"):
            llm_module.token_ids(bad)
    for tokens in ([1, -1, 2 ** 63], [1, 2 ** 64], [1, -1], np.array([1, 2 ** 63], np.uint64)):
        with pytest.raises(ValueError, match=f"token id {tokens[1]} is not in 0..{N_VOCAB - 1}"):
            llm._check_vocab(llm_module.token_ids(tokens))


def test_token_ids_must_be_integers(llm):
    llm.reset()
    with pytest.raises(TypeError, match="token id must be an integer, got 1.7"):
        llm.eval([1.7])
    with pytest.raises(TypeError, match="expected token ids"):
        llm.eval("abc")
    assert llm.n_tokens == 0
    assert llm.eval(np.array([1, 2], np.int32)).shape == (2, llm.n_vocab())   # numpy ints: fine
    llm.reset()
    # ids come in order: not a set's or a dict's order; one id or a 0-D / 2-D array is no sequence
    for bad, match in [({7: "x", 3: "y"}, "in order .* got dict"), ({300, 9, 64}, "in order .* got set"),
                       (frozenset([1]), "got frozenset"), (5, "got int"), (None, "got NoneType"),
                       (np.array(5), "1-D array of token ids, got 0-D"),
                       (np.ones((2, 2), np.int32), "got 2-D"), ({1: 0}.keys(), "got dict_keys")]:
        with pytest.raises(TypeError, match=match):
            llm.eval(bad)
    assert llm.n_tokens == 0
    assert llm.eval(i for i in (1, 2)).shape == (2, llm.n_vocab())   # an iterator is in order
    llm.reset()
    import ctypes                          # llama-cpp-python's token arrays: iterate by index
    tokens = (ctypes.c_int32 * 2)(1, 2)
    assert llm.eval(tokens).shape == (2, llm.n_vocab())
    llm.reset()
    with pytest.raises(TypeError, match="got LP_c_int"):   # a pointer has no end: it was walked
        llm.eval(ctypes.cast(tokens, ctypes.POINTER(ctypes.c_int32)))

    class Indexed:                         # a sequence by __getitem__ and __len__ alone,
        def __len__(self):                 # read as far as its length says (this one's
            return 2                       # __getitem__ never ends: it was walked for good)

        def __getitem__(self, i):
            return i + 1
    assert llm.eval(Indexed()).shape == (2, llm.n_vocab())
    llm.reset()


def test_a_bad_id_anywhere_is_refused_before_any_batch_runs():
    llm = gg.Llama(model_path("f32"), n_ctx=64, n_threads=1, n_batch=4)
    for bad in (N_VOCAB, 2 ** 31, 2 ** 70, -1):
        with pytest.raises(ValueError, match=f"token id {bad} is not in 0..{N_VOCAB - 1}"):
            llm.eval([5] * 6 + [bad])
        assert llm.n_tokens == 0                 # the first batches were not kept
        with pytest.raises(ValueError, match=f"token id {bad} is not in"):
            llm.generate_tokens([1, bad])        # when called, not when iterated
    with pytest.raises(ValueError, match="token ids must be integers in 0..511"):
        llm.model.forward([2 ** 31], [0])        # the model's own check, not an OverflowError


def test_a_llama_is_not_copied_and_can_be_closed(tmp_path):
    import copy
    import gc
    import pickle
    import shutil
    path = str(shutil.copy(model_path("f32"), tmp_path / "own.gguf"))   # mapped by nobody else
    llm = gg.Llama(path, n_ctx=64, n_threads=1)
    for make_copy in (copy.copy, copy.deepcopy, pickle.dumps):   # a copy shared the cache
        with pytest.raises(TypeError, match="Llama cannot be copied or pickled"):
            make_copy(llm)
    paused = llm.generate("The cat", max_tokens=4, temperature=0)
    next(paused)

    def mapped():
        with open("/proc/self/maps") as f:
            return sum(os.path.realpath(path) in line for line in f)
    assert mapped() > 0
    llm.close()
    gc.collect()
    assert mapped() == 0                          # the file is unmapped
    for use in (lambda: llm.eval([1, 2]), lambda: next(paused), llm.n_ctx, llm.reset,
                lambda: llm.generate("x"), lambda: llm.perplexity([1] * 64, n_ctx=16)):
        with pytest.raises(RuntimeError, match="this Llama is closed"):
            use()
    assert llm.detokenize(llm.tokenize("The cat")).endswith("The cat") and llm.n_tokens == 0
    llm.close()                                   # again: nothing
    with gg.Llama(path, n_ctx=64, n_threads=1) as other:
        assert other.eval([1]).shape == (1, N_VOCAB)
    with pytest.raises(RuntimeError, match="closed"):
        other.eval([1])


def test_perplexity_refuses_a_bad_id_before_its_first_chunk():
    llm = gg.Llama(model_path("f32"), n_ctx=64, n_threads=1)
    ids = [5] * (3 * 16)
    for at in (40, 3 * 16):        # in the third chunk; in the tail no chunk scores
        tokens = ids[:at] + [N_VOCAB] + ids[at:]
        with pytest.raises(ValueError, match=f"token id {N_VOCAB} is not in"):
            llm.perplexity(tokens, n_ctx=16)
        assert llm.timings.prompt_tokens == 0       # no chunk ran
    assert llm.perplexity(ids, n_ctx=16).ppl > 0


def test_generate_checks_its_arguments_when_called(llm):
    for kwargs, match in [(dict(repeat_last_n=-5), "repeat_last_n must be in -1..2147483647"),
                          (dict(seed=-2), "seed must be at least -1"),
                          (dict(repeat_penalty=0), "repeat_penalty must be a positive number"),
                          (dict(temperature=float("nan")), "temperature must be a number")]:
        with pytest.raises(ValueError, match=match):
            llm.generate("The", **kwargs)               # not even iterated
    with pytest.raises(ValueError, match="the prompt has 200 tokens, the context 128"):
        llm.generate_tokens([1] * 200)
    assert len(list(llm.generate("The", max_tokens=3, seed=-1, ignore_eos=True))) >= 1


def test_repeat_last_n_minus_one_is_the_whole_context(llm):
    def tokens(repeat_last_n):
        params = gg.SamplingParams(temperature=0, repeat_penalty=1.5, repeat_last_n=repeat_last_n)
        return list(llm.generate_tokens("Once upon a time", params, max_tokens=24, ignore_eos=True))
    assert tokens(-1) == tokens(llm.n_ctx()) != tokens(0)


def test_perplexity_input_and_arguments(llm):
    tokens = llm.tokenize(TEXT)[:200]
    text = llm.detokenize(tokens[1:])
    expected = llm.perplexity(text, n_ctx=64, n_chunks=2).ppl
    assert llm.perplexity(text.encode(), n_ctx=64, n_chunks=2).ppl == expected
    assert llm.perplexity(bytearray(text.encode()), n_ctx=64, n_chunks=2).ppl == expected
    assert llm.perplexity(text, n_ctx=64, n_chunks=2, n_batch=None).ppl == expected
    for kwargs, match in [(dict(n_chunks=0), "n_chunks must be at least 1, or negative"),
                          (dict(n_batch=-3), "n_batch must be at least 1, got -3"),
                          (dict(n_batch=0), "n_batch must be at least 1, got 0")]:
        with pytest.raises(ValueError, match=match):
            llm.perplexity(text, n_ctx=64, **kwargs)


def test_a_paused_generator_refuses_a_sequence_another_call_changed(llm):
    greedy = dict(max_tokens=6, temperature=0, ignore_eos=True)
    llm.reset()
    alone = list(llm.generate_tokens("The cat", gg.SamplingParams(temperature=0), 6, True))
    a = llm.generate("The cat", **greedy)
    b = llm.generate("A dog", **greedy)
    next(a)
    next(b)                                   # b's prompt replaced a's sequence
    with pytest.raises(RuntimeError, match="changed by another call"):
        next(a)
    for change in (lambda: llm.eval([5]), llm.reset):
        paused = llm.generate_tokens("The cat", gg.SamplingParams(temperature=0), 6, True)
        assert next(paused) == alone[0]
        change()
        with pytest.raises(RuntimeError, match="changed by another call"):
            next(paused)
    left_alone = llm.generate_tokens("The cat", gg.SamplingParams(temperature=0), 6, True)
    assert list(left_alone) == alone          # nothing else ran: the same tokens as ever


def test_python_threads_sharing_a_llama_take_turns():
    """Each call holds the Llama: two threads' evals never interleave inside one
    (they wrote the same cache positions and overran the context before)."""
    import threading
    shared = gg.Llama(model_path("f32"), n_ctx=128, n_threads=1, kv_type="f32")
    ids = shared.tokenize("The quick brown fox")
    results, errors = [], []

    def work():
        try:
            for _ in range(3):
                results.append(shared.eval(ids))
        except BaseException as exc:   # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 6
    assert shared.n_tokens == 6 * len(ids) == shared.model.cache.n_past
    assert all(np.isfinite(r).all() for r in results)
    alone = gg.Llama(model_path("f32"), n_ctx=128, n_threads=1, kv_type="f32")
    want = [alone.eval(ids) for _ in range(6)]     # the same six evals, one after another
    for got, ref in zip(sorted(results, key=lambda r: float(r.sum())),
                        sorted(want, key=lambda r: float(r.sum()))):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_fork_child_refuses_a_llama_another_thread_was_using(llm):
    # the child has no trace of the parent's other threads: a call one of them was
    # making stopped half-way there, and its lock would never be released
    from test_pool import wait_for_child
    ids = llm.tokenize("Once upon a time")
    llm.reset()
    expected = llm.eval(ids)
    llm.reset()

    def child(use_inherited):
        code = 1
        try:
            if use_inherited:
                code = 0 if np.array_equal(llm.eval(ids), expected) else 2
            else:
                try:
                    llm.eval(ids)
                except RuntimeError as e:
                    code = 0 if "in use by another thread when the process forked" in str(e) else 3
                fresh = gg.Llama(model_path("f32"), n_ctx=128, n_threads=2, kv_type="f32")
                code = code or (0 if np.array_equal(fresh.eval(ids), expected) else 4)
        finally:
            os._exit(code)

    held, release = threading.Event(), threading.Event()

    def busy():               # a call in progress in another thread
        with llm._lock:
            held.set()
            release.wait(30)
    thread = threading.Thread(target=busy)
    thread.start()
    held.wait(30)
    try:
        pid = os.fork()
        if pid == 0:
            child(use_inherited=False)
    finally:
        release.set()
        thread.join()
    assert wait_for_child(pid, "a fork child hung on a Llama held at the fork") == 0
    pid = os.fork()           # nobody using it: the child carries on with it
    if pid == 0:
        child(use_inherited=True)
    assert wait_for_child(pid, "a fork child hung on its inherited Llama") == 0
    np.testing.assert_array_equal(llm.eval(ids), expected)
    llm.reset()


def test_a_llama_refuses_a_cache_changed_behind_its_back(llm):
    llm.reset()
    ids = llm.tokenize("Once upon a time")
    expected = llm.eval(ids)
    llm.model.cache.clear()               # the model used directly (or cut at a fork)
    with pytest.raises(RuntimeError, match="call reset"):
        llm.eval([5])                      # it ran at position 5 over an empty cache
    llm.reset()
    np.testing.assert_array_equal(llm.eval(ids), expected)
    llm.reset()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
@pytest.mark.parametrize("in_compute", [False, True])
def test_a_fork_child_refuses_a_model_another_thread_was_running_until_cleared(in_compute):
    # another thread in a LlamaModel's forward at the fork: holding its lock (which, held
    # by a thread the child does not have, blocked the child for good), or stopped inside
    # compute by the pending fork (its nodes marked as being computed). The child's model
    # refuses (its cache was half-written: freeing the lock alone gave wrong logits) until
    # its cache is cleared, then computes as before on graphs built again.
    import time
    from test_pool import wait_for_child
    from ggml_py import _core
    from ggml_py.model.llama import LlamaModel
    model = LlamaModel(model_path("f32"), n_ctx=64, n_threads=1)
    expected = model.forward([1, 2, 3], [0, 1, 2]).copy()
    model.cache.clear()
    held, release = threading.Event(), threading.Event()

    def busy():
        if in_compute:
            model.forward([1, 2, 3], [0, 1, 2])
        else:
            with model._lock:
                held.set()
                release.wait(30)
    if in_compute:
        _core._fork_wait()                # a fork pending: the forward waits inside compute
    try:
        thread = threading.Thread(target=busy)
        thread.start()
        time.sleep(0.3) if in_compute else held.wait(30)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                try:
                    model.forward([4], [3])
                    code = 2
                except RuntimeError as e:
                    code = 1 if "cache is unknown here" in str(e) else 3
                if code == 1:          # refused as it should: cleared, it must run as before
                    code = 5           # (what an exception from here on exits with)
                    model.cache.clear()
                    same = np.array_equal(model.forward([1, 2, 3], [0, 1, 2]), expected)
                    code = 0 if same else 4
            finally:
                os._exit(code)
    finally:
        if in_compute:
            _core._fork_done_in_parent()
        release.set()
    thread.join()
    assert wait_for_child(pid, "a fork child hung on a model another thread was running") == 0


def test_damaged_weights_give_a_clear_error_not_garbage():
    # a NaN in the final norm makes every logit NaN: nothing to sample, nothing to score
    def nan_norm(parts):
        for part in parts:
            if part[0] == "output_norm.weight":
                part[3] = np.full(len(part[3]) // 4, np.nan, np.float32).tobytes()
        return parts
    damaged = gg.Llama(edited_model("nan-norm.gguf", tensors=nan_norm), n_ctx=64, n_threads=1)
    assert np.isnan(damaged.eval(damaged.tokenize("Hello"))).all()
    with pytest.raises(ValueError, match="every logit is NaN or -inf"):
        list(damaged.generate("Hello", max_tokens=4))
    with pytest.raises(ValueError, match="log-probabilities that are not finite"):
        damaged.perplexity(list(range(1, 65)), n_ctx=32)


def test_perplexity_of_uniform_logits_has_no_error_bar_and_does_not_fail():
    # a zero final norm makes every logit 0: every token scores log(n_vocab), the variance
    # rounds to a hair below 0 here (-2.8e-14: sqrt failed without the guard) or above it,
    # and the +/- is NaN (llama.cpp prints none) or ~0
    def zero_norm(parts):
        for part in parts:
            if part[0] == "output_norm.weight":
                part[3] = bytes(len(part[3]))
        return parts
    uniform = gg.Llama(edited_model("zero-norm.gguf", tensors=zero_norm), n_ctx=64, n_threads=1)
    result = uniform.perplexity(list(range(1, 65)), n_ctx=32)
    assert result.ppl == pytest.approx(uniform.n_vocab(), rel=1e-6)
    assert math.isnan(result.error) or result.error < 1e-3
    # a variance of exactly 0 (two tokens scored alike): no error bar, not +/- 0
    assert math.isnan(uniform.perplexity(list(range(1, 9)), n_ctx=4).error)


def test_a_complete_stop_string_ends_the_text_at_once():
    # "ab" is complete: that a longer stop "abc" begins there too must not read on
    def pieces():
        yield "xab"
        raise AssertionError("read past a complete stop string")
    assert list(until_stop(pieces(), ("ab", "abc"))) == ["x"]


def test_generate_reuses_only_the_prompts_common_prefix():
    llm = gg.Llama(model_path("f32"), n_ctx=64, n_threads=1, kv_type="f32")
    fresh = gg.Llama(model_path("f32"), n_ctx=64, n_threads=1, kv_type="f32")
    a, b = [1, 20, 30, 40, 50, 60], [1, 20, 99, 40, 50, 60, 70]   # b parts from a at its third
    list(llm.generate(a, max_tokens=3, temperature=0))
    before = llm.timings.prompt_tokens
    got = list(llm.generate(b, max_tokens=6, temperature=0))
    assert llm.timings.prompt_tokens - before == len(b) - 2          # [1, 20] reused
    assert got == list(fresh.generate(b, max_tokens=6, temperature=0))
    before = llm.timings.prompt_tokens
    list(llm.generate(b, max_tokens=1, temperature=0))                 # the same prompt again:
    assert llm.timings.prompt_tokens - before == 0                     # its logits are kept


def test_the_same_prompt_again_starts_from_the_same_logits(monkeypatch):
    # a 40-token prompt runs as one batch (F32 weights: BLAS from 32 tokens); its last token
    # alone would run the CPU dot products, summed in another order: other logits, and
    # another text for the same seed
    prompt = [1] + [int(t) for t in np.random.default_rng(0).integers(3, N_VOCAB, 39)]
    seen = []
    sample = Sampler.sample
    monkeypatch.setattr(Sampler, "sample",
                        lambda self, logits: seen.append(logits.copy()) or sample(self, logits))

    def first_logits_and_text(llm):
        seen.clear()
        text = list(llm.generate(prompt, max_tokens=8, temperature=0.8, seed=3, ignore_eos=True))
        return seen[0], text

    llm = gg.Llama(model_path("f32"), n_ctx=128, n_threads=1)
    logits, text = first_logits_and_text(llm)
    for grow in ([], [5, 6]):        # called again, or after the sequence grew past the prompt
        llm.eval(grow) if grow else None
        again, again_text = first_logits_and_text(llm)
        assert np.array_equal(again, logits) and again_text == text
    # a cache emptied behind the Llama's back is noticed, as by any evaluation
    llm.model.cache.clear()
    with pytest.raises(RuntimeError, match="the model's cache does not hold this Llama's"):
        list(llm.generate(prompt, max_tokens=1))      # (before the first token comes)
    llm.reset()
    first_logits_and_text(llm)
    # the prompt's last token alone (the rows before it reused) is not what its batch gave
    list(llm.generate(prompt[:-1] + [7], max_tokens=1))
    other, _ = first_logits_and_text(llm)
    assert not np.array_equal(other, logits)


def test_a_prompt_stopped_part_way_counts_the_batches_it_ran(monkeypatch):
    # Ctrl-C in the third batch of 4: the two batches run are kept, and timed
    llm = gg.Llama(model_path("f32"), n_ctx=64, n_threads=1, n_batch=4, kv_type="f32")
    forward, calls = llm.model.forward, []

    def third_interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return forward(*args, **kwargs)
    monkeypatch.setattr(llm.model, "forward", third_interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.eval(list(range(1, 13)))
    assert llm.n_tokens == 8 and llm.timings.prompt_tokens == 8 and llm.timings.prompt_s > 0
    with pytest.raises(ValueError):
        llm.eval([10 ** 6])                   # refused: nothing run, nothing counted
    assert llm.timings.prompt_tokens == 8 and llm.timings.eval_tokens == 0


def test_max_tokens_zero_generates_nothing():
    llm = gg.Llama(model_path("f32"), n_ctx=64, n_threads=1, kv_type="f32")
    assert list(llm.generate("the", max_tokens=0)) == []


def test_the_context_is_checked_before_any_batch_runs():
    llm = gg.Llama(model_path("f32"), n_ctx=16, n_threads=1, n_batch=4, kv_type="f32")
    ids = list(range(1, 18))
    with pytest.raises(ValueError, match="do not fit the context of 16"):
        llm.eval(ids)                     # 17 tokens: not the first four batches, then an error
    assert llm.n_tokens == 0 and llm.model.cache.n_past == 0
    assert llm.eval(ids[:16]).shape[0] == 16                        # 16 fit
    with pytest.raises(ValueError, match="the prompt has 16 tokens, the context 16"):
        llm.generate(ids[:16])            # no room left for a token to generate


def test_a_utf8_sequence_cut_at_the_end_of_generation_still_comes_out(llm):
    ids = llm.tokenize("a€", add_bos=False)          # " a", then "€" as three byte tokens
    assert list(llm._pieces(iter(ids))) == [" a", "€"]
    assert list(llm._pieces(iter(ids[:-1]))) == [" a", "\ufffd"]   # held, then given at the end


def test_building_graphs_is_not_counted_as_evaluation(monkeypatch):
    # a clock stepped by hand: each graph build takes 0.5 s of it, each compute 0.01 s;
    # the builds are build time, not the prompt's nor the token's, and not in
    # perplexity's seconds per chunk
    import ggml_py.model.llama as llama_module
    now = [0.0]
    build, compute = llama_module.build_forward_graph, gg.Graph.compute

    def slow_build(*args, **kwargs):
        now[0] += 0.5
        return build(*args, **kwargs)

    def timed_compute(self, *args, **kwargs):
        now[0] += 0.01
        return compute(self, *args, **kwargs)
    monkeypatch.setattr(llama_module, "build_forward_graph", slow_build)
    monkeypatch.setattr(gg.Graph, "compute", timed_compute)
    llm = gg.Llama(model_path("f32"), n_ctx=64, n_threads=1, clock=lambda: now[0])
    llm.eval([1, 2, 3, 4])
    llm.eval([5])
    t = llm.timings
    assert (t.builds, t.prompt_tokens, t.eval_tokens) == (2, 4, 1)
    assert t.build_s == pytest.approx(1.0) and t.prompt_s == pytest.approx(0.01), t
    assert t.eval_s == pytest.approx(0.01), t
    seconds = []
    llm.perplexity(TEXT, n_ctx=16, n_chunks=1, callback=lambda *args: seconds.append(args[-1]))
    assert llm.timings.builds == 3 and llm.timings.build_s == pytest.approx(1.5)
    assert seconds == [pytest.approx(0.01)]           # one batch of 16: one compute
    assert "total time =    1530.00 ms /    21 tokens" in "\n".join(llm.timings.lines())


def test_a_clock_that_is_not_callable_is_refused():
    with pytest.raises(TypeError, match="Llama: clock must be callable"):
        gg.Llama(model_path("f32"), n_ctx=64, clock=1.0)


def test_token_nll_sums_the_exponentials_in_double_as_llama_cpp():
    # 100,000 logits, half 0 and half log(0.1): summed in float32 the log-sum moves by 5e-9
    x = np.zeros((1, 100_000), np.float32)
    x[0, 1::2] = np.log(np.float32(0.1))
    exps = np.exp(x[0] - x[0].max()).astype(np.float64)     # expf of each, as llama.cpp
    assert abs(token_nll(x, np.array([0]))[0] - math.log(exps.sum())) < 1e-12


def test_a_call_from_inside_another_call_of_a_llama_is_refused():
    """The Llama's lock is reentrant, so a signal handler calling reset() in the middle
    of an eval got in: the eval returned wrong logits for most rows, without an error.
    Now the handler's call raises, the eval stops at a batch with the tokens evaluated
    so far kept, and the sequence carries on from there as if whole."""
    import signal
    llm = gg.Llama(n_ctx=256, n_threads=1, n_batch=8)     # the bundled model
    ids = llm.tokenize(pathlib.Path(default_text_path()).read_text()[:4000])[:200]
    want = llm.eval(ids)
    llm.reset()

    def handler(signum, frame):
        if llm.n_tokens >= 24:            # a few batches in: something to keep
            signal.setitimer(signal.ITIMER_REAL, 0)   # once (afterwards a reset would do)
            llm.reset()
    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)   # again and again during the eval
        with pytest.raises(RuntimeError, match="reset: this Llama is in the middle of another "
                                               "call in this thread"):
            llm.eval(ids)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    n = llm.n_tokens
    assert 24 <= n < len(ids) and n % 8 == 0
    assert n == llm.model.cache.n_past and llm.tokens == ids[:n]
    rest = llm.eval(ids[n:])
    np.testing.assert_allclose(rest, want[n:], rtol=1e-5, atol=1e-5)

    # perplexity holds the Llama from its start to its end: its callback cannot change it
    calls = []

    def callback(*args):
        try:
            llm.eval([1, 2])
        except RuntimeError as exc:
            calls.append(str(exc))
    text = pathlib.Path(default_text_path()).read_text()[:20000]
    alone = llm.perplexity(text, n_ctx=64, n_chunks=3).ppl
    assert llm.perplexity(text, n_ctx=64, n_chunks=3, callback=callback).ppl == alone
    assert len(calls) == 3 and all(c.startswith("eval: this Llama is in the middle") for c in calls)
    assert llm.n_tokens == 0
