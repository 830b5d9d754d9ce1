"""Samplers: llama.cpp's semantics on small hand-made logits."""
import math
import platform

import numpy as np
import pytest

from ggml_py.model.sampling import (Sampler, SamplingParams, apply_penalties, draw, min_p, top_k,
                              top_p)

LOGITS = np.array([1.0, 3.0, -2.0, 2.0, 0.5], np.float32)


def test_repeat_penalty_divides_positive_and_multiplies_negative():
    x = LOGITS.copy()
    apply_penalties(x, [1, 2, 2], repeat_penalty=2.0)
    np.testing.assert_allclose(x, [1.0, 1.5, -4.0, 2.0, 0.5])


def test_frequency_and_presence_penalties():
    x = LOGITS.copy()
    apply_penalties(x, [3, 3, 0], repeat_penalty=1.0, frequency_penalty=0.5, presence_penalty=0.25)
    np.testing.assert_allclose(x, [1.0 - 0.75, 3.0, -2.0, 2.0 - 1.25, 0.5])


def test_top_k_keeps_k_highest_sorted():
    ids, x = top_k(np.arange(5), LOGITS, 3)
    assert ids.tolist() == [1, 3, 0] and x.tolist() == [3.0, 2.0, 1.0]
    ids, _ = top_k(np.arange(5), LOGITS, 0)            # 0: all, sorted
    assert ids.tolist() == [1, 3, 0, 4, 2]


def test_top_p_keeps_smallest_prefix_reaching_p():
    ids, x = top_k(np.arange(5), LOGITS, 0)
    p = np.exp(x) / np.exp(x).sum()                    # 0.61, 0.22, 0.08, ...
    assert top_p(ids, x, p[0] - 1e-3)[0].tolist() == [1]
    assert top_p(ids, x, p[0] + 1e-3)[0].tolist() == [1, 3]
    assert top_p(ids, x, 1.0)[0].tolist() == ids.tolist()


def test_top_p_edges_as_llama_cpp():
    # a prefix whose probability equals p exactly is enough (llama.cpp: cum >= p)
    two = np.array([0.0, 0.0], np.float32)
    assert top_p(np.arange(2), two, 0.5)[0].tolist() == [0]
    # p >= 1 is off, even where the last candidates' share rounds to nothing
    far = np.array([0.0, -30.0], np.float32)
    assert top_p(np.arange(2), far, 1.0)[0].tolist() == [0, 1]
    # a p the float32 running sum never reaches keeps every candidate (12 equal logits sum
    # to 0.9999999 in float32)
    assert top_p(np.arange(12), np.zeros(12, np.float32), 0.99999995)[0].size == 12


def test_top_k_of_all_but_one_drops_the_lowest():
    assert top_k(np.arange(5), LOGITS, 4)[0].tolist() == [1, 3, 0, 4]


def test_top_k_keeps_the_lowest_ids_among_ties():
    flat = np.zeros(1000, np.float32)
    assert top_k(np.arange(1000), flat, 40)[0].tolist() == list(range(40))
    x = np.array([1, 1, -1, 2, 0, 1, 2, -3, 2, 1], np.float32)   # 2 at 3, 6, 8; 1 at 0, 1, 5, 9
    assert top_k(np.arange(10), x, 1)[0].tolist() == [3]          # greedy's choice
    assert top_k(np.arange(10), x, 5)[0].tolist() == [3, 6, 8, 0, 1]
    top_1 = Sampler(SamplingParams(temperature=0.8, top_k=1, seed=1))
    assert top_1.sample(x) == Sampler(SamplingParams(temperature=0)).sample(x) == 3


def test_penalties_are_float32_steps_as_llama_cpp():
    # logit -= float(count) * freq + float(count > 0) * presence, all in float32
    rng = np.random.default_rng(0)
    x = rng.normal(0, 5, 1000).astype(np.float32)
    history = rng.integers(0, 1000, 3000)
    ids, counts = np.unique(history, return_counts=True)
    for freq, presence in ((0.1, 0.1), (0.3, 0.7), (1.1, 0.0), (0.0, 0.3)):
        want = x.copy()
        v = want[ids]
        v = np.where(v <= 0, v * np.float32(1.1), v / np.float32(1.1))
        want[ids] = v - (counts.astype(np.float32) * np.float32(freq) + np.float32(presence))
        got = apply_penalties(x.copy(), history, 1.1, freq, presence)
        assert got.tobytes() == want.tobytes()


def test_the_last_vocabulary_id_is_penalised_too():
    x = LOGITS.copy()
    apply_penalties(x, [4], repeat_penalty=2.0)
    assert x[4] == 0.25 and x[:4].tolist() == LOGITS[:4].tolist()


@pytest.mark.parametrize("n, p, kept", [(20, 0.5, 10), (40, 0.95, 39)])
def test_top_p_sums_in_float32_as_llama_cpp(n, p, kept):
    # n equal logits: each probability is float32(1/n); in float32 the running
    # sum reaches p one token sooner (20, 0.5) or later (40, 0.95) than in
    # float64 — the counts llama.cpp keeps
    ids, _ = top_p(np.arange(n), np.zeros(n, np.float32), p)
    assert len(ids) == kept


def test_min_p_threshold_is_the_c_librarys_logf():
    # llama.cpp keeps logit >= best + logf(p): glibc's logf(0.81327021f) is
    # -0.20669186f, numpy's float32 log one ulp lower; a logit between is dropped
    p = 0.8132702112197876
    below = np.nextafter(np.float32(-0.20669186), np.float32(-1))
    ids, _ = min_p(np.arange(2), np.array([0.0, below], np.float32), p)
    assert ids.tolist() == [0]
    ids, _ = min_p(np.arange(2), np.array([0.0, -0.20669186], np.float32), p)
    assert ids.tolist() == [0, 1]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's logf")
def test_min_p_cuts_where_llama_cpp_cuts_when_logf_is_not_correctly_rounded():
    # glibc's logf(0.0010000259f) is one ulp above the correctly rounded log: a logit at
    # the correctly rounded value is dropped by llama.cpp's min-p (measured: it keeps 1)
    p = float(np.float32(0.00100002589))
    at_log = np.float32(math.log(np.float32(p)))
    ids, _ = min_p(np.arange(2), np.array([0.0, at_log], np.float32), p)
    assert ids.tolist() == [0]


def test_draw_follows_the_distribution():
    rng = np.random.default_rng(0)
    x = np.log(np.array([0.7, 0.2, 0.1], np.float32))
    counts = np.bincount([draw(x, rng) for _ in range(4000)], minlength=3) / 4000
    np.testing.assert_allclose(counts, [0.7, 0.2, 0.1], atol=0.03)


def test_greedy_is_argmax_after_penalty():
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0))
    assert s.sample(LOGITS) == 1
    s.accept(1)                                        # 3.0 -> 1.5: now token 3 (2.0) wins
    assert s.sample(LOGITS) == 3


def test_repeat_window_is_the_last_n_tokens():
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=10.0, repeat_last_n=2))
    s.accept_all([1, 3, 0])                            # token 1 has left the window
    assert list(s.history) == [3, 0]
    assert s.sample(LOGITS) == 1


def test_banned_tokens_never_drawn():
    s = Sampler(SamplingParams(temperature=0), banned=[1])
    assert s.sample(LOGITS) == 3


def test_low_temperature_sharpens():
    logits = np.array([1.0, 0.9, 0.8], np.float32)
    cold = Sampler(SamplingParams(temperature=0.01, top_k=0, top_p=1.0, min_p=0.0, seed=1))
    assert {cold.sample(logits) for _ in range(50)} == {0}
    hot = Sampler(SamplingParams(temperature=5.0, top_k=0, top_p=1.0, min_p=0.0, seed=1))
    assert {hot.sample(logits) for _ in range(200)} == {0, 1, 2}


@pytest.mark.parametrize("seed", [0, 7])
def test_same_seed_same_tokens(seed):
    logits = np.random.default_rng(3).standard_normal(1000).astype(np.float32)
    params = SamplingParams(temperature=1.0, top_k=100, top_p=0.9, min_p=0.01, seed=seed)
    runs = [[Sampler(params).sample(logits) for _ in range(1)] for _ in range(2)]
    a, b = Sampler(params), Sampler(params)
    assert [a.sample(logits) for _ in range(30)] == [b.sample(logits) for _ in range(30)]
    assert runs[0] == runs[1]
    other = Sampler(SamplingParams(temperature=1.0, top_k=100, top_p=0.9, min_p=0.01, seed=seed + 1))
    a = Sampler(params)
    assert [a.sample(logits) for _ in range(30)] != [other.sample(logits) for _ in range(30)]


def test_repeat_window_minus_one_is_every_token():
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=10.0, repeat_last_n=-1))
    s.accept_all([1, 3, 0])                            # llama.cpp's -1: the whole context
    assert list(s.history) == [1, 3, 0]
    assert s.sample(LOGITS) == 4                       # 1, 3 and 0 penalised


def test_seed_minus_one_draws_a_random_seed():
    s = Sampler(SamplingParams(temperature=1.0, seed=-1))    # as the CLI's -s -1
    assert 0 <= s.sample(LOGITS) < len(LOGITS)


@pytest.mark.parametrize("params, error, match", [
    (dict(repeat_penalty=0.0), ValueError, "repeat_penalty must be a positive number"),
    (dict(repeat_penalty=-1.0), ValueError, "repeat_penalty"),
    (dict(repeat_penalty=float("inf")), ValueError, "repeat_penalty"),
    (dict(repeat_penalty=float("nan")), ValueError, "repeat_penalty"),
    (dict(temperature=float("nan")), ValueError, "temperature must be a number"),
    (dict(top_p=float("nan")), ValueError, "top_p"),
    (dict(min_p=float("nan")), ValueError, "min_p"),
    (dict(repeat_last_n=-2), ValueError, "repeat_last_n must be in -1..2147483647, got -2"),
    (dict(repeat_last_n=2.5), TypeError, "repeat_last_n must be an integer"),
    (dict(top_k=1.5), TypeError, "top_k must be an integer"),
    (dict(seed=-2), ValueError, "seed must be at least -1"),
    (dict(temperature=None), TypeError, "temperature must be a number, got None"),
    (dict(repeat_penalty=None), TypeError, "repeat_penalty must be a number, got None"),
    (dict(top_p="0.9"), TypeError, "top_p must be a number"),
    # integers no float holds (math.isnan raised OverflowError on them)
    (dict(temperature=10 ** 400), ValueError, "temperature must be a number a float holds"),
    (dict(min_p=-10 ** 400), ValueError, "min_p must be a number a float holds"),
    (dict(repeat_penalty=10 ** 5000), ValueError, "repeat_penalty must be a number a float holds"),
])
def test_bad_params_are_refused(params, error, match):
    with pytest.raises(error, match=match):
        SamplingParams(**params)


def test_a_nan_logit_is_never_drawn_nor_poisons_the_draw():
    nan = float("nan")
    s = Sampler(SamplingParams(seed=1, top_k=0, min_p=0.0))
    assert {s.sample([1.0, 2.0, 0.0, nan]) for _ in range(300)} == {0, 1, 2}   # was always 1
    assert Sampler(SamplingParams(temperature=0)).sample([1.0, nan, 2.0, 0.0]) == 2
    hot = Sampler(SamplingParams(seed=3, temperature=float("inf"), top_k=0, top_p=1.0, min_p=0.0))
    assert {hot.sample([1.0, 2.0, -np.inf, 0.0]) for _ in range(300)} == {0, 1, 3}



@pytest.mark.filterwarnings("error")      # and numpy says nothing about the overflows
def test_infinite_and_overflowing_logits_draw_sensibly():
    inf = float("inf")
    loose = dict(top_k=0, top_p=1.0, min_p=0.0)
    s = Sampler(SamplingParams(seed=1, **loose))
    assert {s.sample([1.0, inf, 2.0, 0.0]) for _ in range(50)} == {1}      # +inf wins
    assert {s.sample([inf, 1.0, inf, 0.0]) for _ in range(200)} == {0, 2}  # evenly among them
    assert {s.sample([3e38, -3e38, 3e38, 0.0]) for _ in range(200)} == {0, 2}
    # a temperature so small that the highest logit overflows: greedy
    for logits, best in (([1.0, 3.0, 2.0, 0.5], 1), ([-1.0, -3.0, -2.0, -0.5], 3)):
        for temperature in (1e-39, 1e-50):           # 1e-50: 0 in float32
            cold = Sampler(SamplingParams(seed=2, temperature=temperature, **loose))
            assert {cold.sample(logits) for _ in range(50)} == {best}
    # a penalty of -inf lifts the tokens it penalises to +inf; -3e38 overflows there too
    for penalty in (dict(presence_penalty=-inf), dict(frequency_penalty=-3e38)):
        pushed = Sampler(SamplingParams(seed=3, **loose, **penalty))
        pushed.accept_all([0, 0])
        assert {pushed.sample([3.0, 5.0, 4.0, 1.0]) for _ in range(50)} == {0}

def test_history_ids_outside_the_vocabulary_penalise_nothing():
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=100.0))
    for token in (-1, 3, 7, 2 ** 40):                # 3: one past the last id
        s.accept(token)
    assert s.sample([1.0, 0.0, 5.0]) == 2          # -1 penalised the last token before



def test_temperature_zero_is_greedy():
    assert SamplingParams(temperature=0).greedy and SamplingParams(temperature=-1).greedy
    assert not SamplingParams(temperature=1e-6).greedy

def test_the_chain_filters_in_llama_cpps_order_then_applies_the_temperature():
    logits = np.array([2.0, 1.0, 0.0, -1.0], np.float32)   # p 0.64, 0.24, 0.09, 0.03

    def drawn(**params):
        sampler = Sampler(SamplingParams(seed=1, top_k=0, **params))
        return {sampler.sample(logits) for _ in range(3000)}
    # top-p 0.9 keeps three, min-p 0.1 keeps those three; min-p first would leave top-p
    # three renormalised ones, of which it keeps two
    assert drawn(temperature=1.0, top_p=0.9, min_p=0.1) == {0, 1, 2}
    # the temperature flattens what the filters left: applied first, top-p 0.9 would keep four
    assert drawn(temperature=10.0, top_p=0.9, min_p=0.0) == {0, 1, 2}
