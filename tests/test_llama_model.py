"""The llama graph against the float64 reference, the KV cache, and GGUF loading."""

import os
import struct

import gguf
import numpy as np
import pytest

from llama_models import (BIASES, GgmlRule, SPECS, V, biased_model_path, edited_model, gguf_bytes,
                          gguf_parts, model_path, scratch_path, vocab)
from llama_reference import ReferenceLlama

from ggml_py.files.gguf_reader import GGUFModelFile, ModelLoadError
from ggml_py.model.kv_cache import KVCache
from ggml_py.model.config import LlamaConfig
from ggml_py.model.llama import LlamaModel
from ggml_py.tools.random_model import RandomLlamaSpec, random_weights, write_random_llama
from ggml_py.core.types import Op, Type

RNG = np.random.default_rng(1234)
TOKENS = RNG.integers(0, 512, 48).astype(np.int32)


def forward_all(model, tokens, batch):
    """Logits of tokens fed in batches of `batch`, from an empty cache."""
    model.cache.clear()
    out = []
    for start in range(0, len(tokens), batch):
        chunk = tokens[start:start + batch]
        out.append(model.forward(chunk, np.arange(start, start + len(chunk))).copy())
    return np.concatenate(out)


@pytest.fixture(scope="module")
def references():
    return {kind: ReferenceLlama(model_path(kind)) for kind in SPECS}


# ---- logits against the reference ------------------------------------------------

@pytest.mark.parametrize("kind", ["f32", "variant", "heads"])
def test_f32_model_f32_cache_matches_reference(kind, references):
    model = LlamaModel(model_path(kind), n_ctx=64, kv_type=Type.F32, n_threads=2)
    logits = forward_all(model, TOKENS, batch=48)
    expected = references[kind].forward(TOKENS)
    assert np.abs(logits - expected).max() <= 1e-4


@pytest.mark.parametrize("names", [tuple(BIASES), ("attn_q", "attn_k", "attn_v")])
def test_bias_tensors_are_added_as_llama_cpp_adds_them(names):
    # llama.cpp loads blk.N.{attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down}.bias
    # when present (e.g. Qwen-style q/k/v biases in a llama file)
    path = biased_model_path(names)
    model = LlamaModel(path, n_ctx=64, kv_type=Type.F32, n_threads=2)
    assert all(layer.bq is not None for layer in model.weights.layers)
    logits = forward_all(model, TOKENS, batch=16)
    expected = ReferenceLlama(path).forward(TOKENS)
    assert np.abs(logits - expected).max() <= 1e-4
    plain = ReferenceLlama(model_path("f32")).forward(TOKENS)
    assert np.abs(plain - expected).max() > 1e-2     # the biases do change the logits


def test_f16_cache_within_f16_rounding(references):
    model = LlamaModel(model_path("f32"), n_ctx=64, kv_type=Type.F16, n_threads=1)
    logits = forward_all(model, TOKENS, batch=48)
    ref = references["f32"]
    # K, V are stored as f16, and q and the probabilities rounded to f16 to meet them (as ggml)
    assert np.abs(logits - ref.forward(TOKENS, kv_dtype=np.float16)).max() <= 1e-2
    assert np.abs(logits - ref.forward(TOKENS)).max() <= 5e-2


def test_f16_model_within_f16_rounding(references):
    # F16 weights multiply activations rounded to F16 (as ggml does): relative error ~1e-3
    model = LlamaModel(model_path("f16"), n_ctx=64, kv_type=Type.F16, n_threads=2)
    logits = forward_all(model, TOKENS, batch=48)
    expected = references["f16"].forward(TOKENS, kv_dtype=np.float16)
    assert np.abs(logits - expected).max() <= 2e-3 * np.abs(expected).max()


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_k"])
def test_quantized_models_within_activation_quantization(kind, references):
    # The reference uses the stored (de-quantized) weights, so only the kernels'
    # own error shows: none for the BLAS path (f32 sgemm), and the rounding of
    # activations to Q8_0 / Q8_K for the dot products (decode, and a 48-token
    # prefill by the built-in rule).
    model = LlamaModel(model_path(kind), n_ctx=64, kv_type=Type.F32, n_threads=2)
    expected = references[kind].forward(TOKENS)
    scale = np.abs(expected).max()
    model.set_tune(GgmlRule())
    prefill = forward_all(model, TOKENS, batch=48)
    assert [n.profile.name for n in model.graph(48, 64, 48).graph.nodes
            if n.op == Op.MUL_MAT and n.src[0].type != Type.F32][:1] == ["blas-mt"]
    assert np.abs(prefill - expected).max() <= 1e-5 * scale
    model.set_tune(None)
    for batch in (48, 1):
        got = forward_all(model, TOKENS, batch=batch)
        assert np.abs(got - expected).max() <= 3e-2 * scale
        assert (got.argmax(1) == expected.argmax(1)).mean() >= 0.9
    assert [n.profile.name for n in model.graph(48, 64, 48).graph.nodes
            if n.op == Op.MUL_MAT and n.src[0].type != Type.F32][:1] == ["cpu"]


@pytest.mark.parametrize("kind", ["q4_0", "q4_k", "q5_k", "q6_k"])
def test_rows_interleaved_give_the_same_logits(kind):
    """repack (the default) gives each Q4_0, Q4_K, Q5_K and Q6_K matrix a copy with its rows interleaved
    by eight, which MUL_MAT's SIMD kernels read instead: the logits are those of the file's
    own layout bit for bit, prefill and decode; the embeddings (get_rows) keep theirs."""
    plain = LlamaModel(model_path(kind), n_ctx=64, kv_type=Type.F32, n_threads=2, repack=False)
    packed = LlamaModel(model_path(kind), n_ctx=64, kv_type=Type.F32, n_threads=2)
    layer = packed.weights.layers[0]
    assert all(getattr(layer, name).rows8 is not None for name in ("wq", "wk", "wv", "wo", "w_gate",
                                                                   "w_up", "w_down"))
    assert packed.weights.token_embd.rows8 is None and plain.weights.layers[0].wq.rows8 is None
    for batch in (48, 1):
        np.testing.assert_array_equal(forward_all(packed, TOKENS, batch=batch),
                                      forward_all(plain, TOKENS, batch=batch))


@pytest.mark.parametrize("batch", [1, 5, 16])
def test_batches_equal_one_pass(batch):
    model = LlamaModel(model_path("variant"), n_ctx=64, kv_type=Type.F32, n_threads=2, kv_pad=16)
    whole = forward_all(model, TOKENS, batch=len(TOKENS))
    np.testing.assert_allclose(forward_all(model, TOKENS, batch=batch), whole, atol=2e-5, rtol=0)


@pytest.mark.parametrize("n_out", [1, 4])
def test_last_rows_only(n_out):
    model = LlamaModel(model_path("f32"), n_ctx=64, kv_type=Type.F32, n_threads=1)
    all_rows = forward_all(model, TOKENS[:10], batch=10)
    model.cache.clear()
    last = model.forward(TOKENS[:10], np.arange(10), n_out=n_out)
    assert last.shape == (n_out, 512)
    np.testing.assert_allclose(last, all_rows[-n_out:], atol=1e-5, rtol=0)


def test_more_output_rows_than_tokens_are_refused_and_the_cache_untouched():
    model = LlamaModel(model_path("f32"), n_ctx=64, kv_type=Type.F32, n_threads=1)
    with pytest.raises(ValueError, match=r"^forward: n_out must be in 1\.\.3, got 5$"):
        model.forward(TOKENS[:3], np.arange(3), n_out=5)
    assert model.cache.n_past == 0


# ---- graphs built once, nothing allocated per call --------------------------------

def test_graphs_are_cached_and_calls_allocate_nothing():
    model = LlamaModel(model_path("f32"), n_ctx=128, kv_type=Type.F16, n_threads=1, kv_pad=32)
    model.forward(TOKENS[:8], np.arange(8))
    for pos in range(8, 40):                      # crosses the 32-slot window once
        model.forward(TOKENS[pos:pos + 1], [pos], n_out=1)
    assert sorted(model._graphs) == [(1, 32, 1), (1, 64, 1), (8, 32, 8)]
    graph = model._graphs[(1, 64, 1)]
    used = graph.ctx.used
    for pos in range(40, 48):
        model.forward(TOKENS[pos:pos + 1], [pos], n_out=1)
    assert model._graphs[(1, 64, 1)] is graph and graph.ctx.used == used


@pytest.mark.parametrize("attention", ["graph", "auto"])
def test_graphs_share_one_buffer_and_are_not_rebuilt_past_sixteen_windows(monkeypatch, attention):
    # 20 windows of 16 slots: a sequence fed in batches of 16 needs 20 graphs, more than
    # the 16 once kept, which made every graph be rebuilt (and reallocated) every time
    import ggml_py.model.llama as llama
    builds = []
    build = llama.build_forward_graph
    monkeypatch.setattr(llama, "build_forward_graph", lambda *a, **k: builds.append(a[3:6]) or build(*a, **k))
    model = LlamaModel(model_path("f32"), n_ctx=320, kv_type=Type.F32, n_threads=2, kv_pad=16,
                       attention=attention)
    tokens = np.resize(TOKENS, 320)

    def one_pass():
        model.cache.clear()
        return forward_all(model, tokens, batch=16)

    first = one_pass()
    # the buffer is sized for 16 tokens over the whole context at once: no window to come
    # grows it (which would drop the graphs built so far), so each is built once
    assert len(builds) == 20 and len(set(builds)) == 20
    second = one_pass()
    np.testing.assert_array_equal(one_pass(), second)
    assert len(builds) == 20, builds[20:]                     # the later passes built nothing
    np.testing.assert_allclose(first, second, atol=2e-5, rtol=0)
    graphs = list(model._graphs.values())
    assert len(graphs) == 20
    # one buffer of intermediates and one work buffer for all of them (as ggml's compute buffer)
    assert all(np.shares_memory(g.logits, model._intermediates) for g in graphs)
    if attention == "graph":     # not a mask per graph
        assert all(np.shares_memory(g.mask, model._masks) for g in graphs)
    else:                        # no mask: the attention op's slot lists
        assert all(g.mask is None and g.kv_index.size == 2 * 16 + K for g, (_, K, _) in
                   zip(graphs, model._graphs))
    assert len({id(g.graph._work) for g in graphs}) == 1


def test_forwards_from_two_threads_take_turns():
    import threading
    model = LlamaModel(model_path("f32"), n_ctx=64, kv_type=Type.F32, n_threads=1)
    alone = model.forward(TOKENS[:8], np.arange(8)).copy()
    results, errors = [], []

    def run():
        try:
            for _ in range(20):
                logits = model.forward(TOKENS[:8], np.arange(8))
                # the logits are the graph's own buffer: copied while no forward runs (the
                # other thread's may be writing intermediates there as soon as this one returns)
                with model._lock:
                    results.append(logits.copy())
        except Exception as exc:     # noqa: BLE001 - the test fails on it
            errors.append(exc)
    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and all(np.array_equal(r, alone) for r in results)


def test_built_graphs_are_kept_least_recently_used_first_out():
    model = LlamaModel(model_path("f32"), n_ctx=64, kv_type=Type.F32, n_threads=1, kv_pad=16)
    assert model.max_graphs == max(16, 2 * 64 // 16 + 8)         # 16 at least
    model.max_graphs = 3
    for K in (16, 32, 48):                   # (one batch size: its buffers fit every window)
        model.graph(1, K, 1)
    model.graph(1, 16, 1)                    # used again: the least recently used is now K=32
    model.graph(1, 64, 1)
    assert list(model._graphs) == [(1, 48, 1), (1, 16, 1), (1, 64, 1)] and model.n_built == 4
    many = LlamaModel(model_path("f32"), n_ctx=4096, kv_type=Type.F32, n_threads=1, kv_pad=16)
    assert many.max_graphs == 64                                  # 64 at most


def test_a_new_thread_count_plans_the_cached_graphs_again():
    """A graph planned for one thread, then run on two, would dispatch every small stage
    to the workers (which stages are worth threads depends on the count)."""
    def plans(model):
        model.forward(np.array([1, 2, 3]), np.array([0, 1, 2]))
        return [[(s.valid, s.parallel, s.wait) for s in t.profile.stages]
                for g in model._graphs.values() for t in g.graph.nodes]

    model = LlamaModel(model_path("q8_0"), n_ctx=64, n_threads=1)
    one = plans(model)
    model.n_threads = 2
    two = LlamaModel(model_path("q8_0"), n_ctx=64, n_threads=2)
    assert model.n_threads == 2 and plans(model) == plans(two) != one
    with pytest.raises(ValueError):
        model.n_threads = 0


def test_the_cache_the_graphs_are_built_over_is_not_replaced():
    model = LlamaModel(model_path("f32"), n_ctx=16, n_threads=1)
    with pytest.raises(AttributeError):
        model.cache = KVCache(1, 16, 1, 64, type=Type.F32)


def test_a_refused_forward_leaves_the_cache_as_it_was():
    model = LlamaModel(model_path("f32"), n_ctx=64, kv_type=Type.F32, n_threads=1)
    fresh = model.forward(TOKENS[:1], [0]).copy()
    model.cache.clear()
    with pytest.raises(ValueError, match="n_out must be in 1..4"):
        model.forward(TOKENS[:4], np.arange(4), n_out=0)
    assert model.cache.n_past == 0 and (model.cache.slot_pos == -1).all()
    np.testing.assert_array_equal(model.forward(TOKENS[:1], [0]), fresh)


def test_a_forward_failing_over_a_held_position_forgets_it_and_every_later_one():
    # its compute may have overwritten that position's row before failing (Ctrl-C)
    model = LlamaModel(model_path("f32"), n_ctx=64, kv_type=Type.F32, n_threads=1)
    full = forward_all(model, TOKENS[:6], batch=6)
    g = model.graph(1, model.cache.window(model.kv_pad), 1)
    compute = g.graph.compute

    def compute_then_interrupt(*args, **kwargs):
        compute(*args, **kwargs)
        raise KeyboardInterrupt
    g.graph.compute = compute_then_interrupt
    with pytest.raises(KeyboardInterrupt):
        model.forward(TOKENS[7:8], [1])          # position 1 again, another token
    g.graph.compute = compute
    assert model.cache.n_past == 1
    again = model.forward(TOKENS[1:6], np.arange(1, 6))
    np.testing.assert_array_equal(again, full[1:])


def test_kv_window_hides_unused_slots():
    # a wide window (most slots empty or stale) gives the same logits as a tight one
    tight = LlamaModel(model_path("f32"), n_ctx=64, kv_type=Type.F32, n_threads=1, kv_pad=8)
    wide = LlamaModel(model_path("f32"), n_ctx=64, kv_type=Type.F32, n_threads=1, kv_pad=64)
    wide.cache.k[0][:] = 1e4                        # garbage in slots nobody may see
    np.testing.assert_allclose(forward_all(wide, TOKENS[:12], 3),
                               forward_all(tight, TOKENS[:12], 3), atol=2e-5, rtol=0)


def test_cache_truncate_continues_from_prefix():
    model = LlamaModel(model_path("f32"), n_ctx=64, kv_type=Type.F32, n_threads=1)
    full = forward_all(model, TOKENS[:16], batch=16)
    model.cache.truncate(10)
    again = model.forward(TOKENS[10:16], np.arange(10, 16)).copy()
    np.testing.assert_allclose(again, full[10:], atol=2e-5, rtol=0)


def test_positions_beyond_context_raise():
    model = LlamaModel(model_path("f32"), n_ctx=16, n_threads=1)
    with pytest.raises(ValueError, match="context of 16"):
        model.forward([1, 2], [15, 16])
    with pytest.raises(ValueError, match="token ids"):
        model.forward([512], [0])
    with pytest.raises(ValueError, match="token ids"):
        model.forward([-1], [0])
    # not cast first: 2**32 + 3 wrapped to slot 3, 2.9 was cut to 2, and two tokens
    # at one position wrote one cache row from two threads
    for positions, match in [([0, 2 ** 32 + 3], "context of 16"), ([0.0, 2.9], "must be integers"),
                             ([3, 3], "distinct"), ([-1, 0], "context of 16")]:
        with pytest.raises(ValueError, match=match):
            model.forward([1, 2], np.array(positions))
    assert model.cache.n_past == 0 and (model.cache.slot_pos == -1).all()


# ---- loading -------------------------------------------------------------------

def test_config_from_metadata():
    c = LlamaConfig.from_gguf(GGUFModelFile(model_path("variant")))
    spec = SPECS["variant"]
    assert (c.n_vocab, c.n_embd, c.n_layer, c.n_head, c.n_head_kv, c.n_ff) == \
        (512, spec.n_embd, spec.n_layer, spec.n_head, 1, spec.n_ff)
    assert c.head_dim == c.n_rot == spec.n_embd // spec.n_head
    assert c.rope_freq_base == 50000.0 and c.rope_freq_scale == 0.5
    assert c.rms_eps == pytest.approx(1e-5) and c.n_ctx_train == spec.n_ctx_train


def with_keys(name, keys):
    """model_path("f32") with extra metadata (strings as STRING, numbers as FLOAT32)."""
    return edited_model(name, keys={key: (STR if isinstance(value, str) else F32, value)
                                    for key, value in keys.items()})


@pytest.mark.parametrize("keys, freq_scale", [
    ({}, 1.0),                                                        # no scaling
    ({"llama.rope.scaling.factor": 4.0}, 0.25),                       # type linear unless named
    ({"llama.rope.scale_linear": 4.0}, 0.25),                         # the older key
    ({"llama.rope.scaling.factor": 2.0, "llama.rope.scale_linear": 4.0}, 0.5),   # new key first
    ({"llama.rope.scaling.type": "none", "llama.rope.scale_linear": 4.0}, 1.0),  # none: no scaling
    ({"llama.rope.scale_linear": 0.0}, 1.0),                          # 0: no scaling
])
def test_rope_scaling_keys_read_as_llama_cpp_reads_them(keys, freq_scale):
    path = with_keys("rope-keys.gguf", keys)
    assert LlamaConfig.from_gguf(GGUFModelFile(path)).rope_freq_scale == freq_scale
    assert ReferenceLlama(path).freq_scale == freq_scale


@pytest.mark.parametrize("keys, match", [
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}, "yarn"),
    ({"llama.rope.scale_linear": -2.0}, "rope.scale_linear -2.0 must be a finite number >= 0"),
])
def test_rope_scaling_we_cannot_run_is_refused(keys, match):
    path = with_keys("rope-bad.gguf", keys)
    with pytest.raises(ModelLoadError, match=match):
        LlamaConfig.from_gguf(GGUFModelFile(path))


def test_rope_attn_factor_scales_the_rotated_q_and_k_as_llama_cpp():
    # llama.cpp multiplies rope's cos and sin by rope.scaling.attn_factor for every scaling type
    path = with_keys("rope-attn-factor.gguf", {"llama.rope.scaling.attn_factor": 1.7})
    model = LlamaModel(path, n_ctx=64, kv_type=Type.F32, n_threads=1)
    assert model.config.rope_attn_factor == pytest.approx(1.7)
    logits = forward_all(model, TOKENS, batch=16)
    expected = ReferenceLlama(path).forward(TOKENS)
    assert np.abs(logits - expected).max() <= 1e-4
    plain = ReferenceLlama(model_path("f32")).forward(TOKENS)
    assert np.abs(plain - expected).max() > 1e-2     # the factor does change the logits


@pytest.mark.parametrize("keys, match", [
    ({"llama.rope.dimension_count": ([V.UINT32], 8)}, "rope.dimension_count 8 must equal the head size"),
    ({"llama.attention.key_length": ([V.UINT32], 16), "llama.attention.value_length": ([V.UINT32], 8)},
     "attention.value_length 8 differs from the head size 16$"),
    ({"llama.attention.value_length": ([V.UINT32], 8)}, "attention.value_length 8 differs from the head size 16$"),
    # llama.cpp's V heads default to embedding_length / head_count, not to key_length
    ({"llama.attention.key_length": ([V.UINT32], 32)},
     "attention.value_length is missing: llama.cpp takes it as embedding_length / head_count = 16"),
    ({"llama.attention.key_length": ([V.UINT32], 0)}, "'llama.attention.key_length' = 0 must be at least 1"),
    ({"llama.attention.head_count": ([V.UINT32], 3), "llama.attention.head_count_kv": ([V.UINT32], 1)},
     "embedding_length 64 is not a multiple of head_count 3 \\(and no attention.key_length"),
    ({"llama.attention.layer_norm_rms_epsilon": None}, "layer_norm_rms_epsilon"),
    ({"llama.expert_used_count": ([V.UINT32], 2)}, "expert_used_count is set but expert_count is not"),
    ({"llama.block_count": ([V.UINT32], 513)}, "block_count 513 is more than 512"),
    ({"llama.attention.head_count": ([V.UINT32], 8), "llama.attention.head_count_kv": ([V.UINT32], 3)},
     "head_count 8 is not a multiple of head_count_kv 3"),
    ({"llama.expert_count": ([V.UINT32], 1)}, "mixture-of-experts llama models are not supported"),
    ({"llama.rope.scaling.attn_factor": ([V.FLOAT32], 0.0)}, "attn_factor' = 0.0 must be a finite number > 0"),
    # heads of one dimension (64 x 1: the matrices keep their shapes): loaded, then the first
    # forward failed in rope, as llama.cpp's rope asserts an even count at its first token
    ({"llama.attention.head_count": ([V.UINT32], 64), "llama.attention.head_count_kv": ([V.UINT32], 32),
      "llama.rope.dimension_count": None},
     "the head size 1 \\(embedding_length / head_count\\) is odd: rope rotates pairs of dimensions$"),
    ({"llama.attention.key_length": ([V.UINT32], 3), "llama.attention.value_length": ([V.UINT32], 3),
      "llama.rope.dimension_count": ([V.UINT32], 3)},
     "the head size 3 \\(attention.key_length\\) is odd"),
])
def test_files_llama_cpp_refuses_are_refused(keys, match):
    with pytest.raises(ModelLoadError, match=match):
        LlamaConfig.from_gguf(GGUFModelFile(edited_model("llama-cpp-refuses.gguf", keys=keys)))


def test_512_blocks_are_llama_cpps_limit_not_past_it():
    keys = {"llama.block_count": ([V.UINT32], 512)}
    path = edited_model("blocks-512.gguf", keys=keys)
    assert LlamaConfig.from_gguf(GGUFModelFile(path)).n_layer == 512


def test_the_head_size_comes_from_key_length():
    # 4 heads of 24 in a 64-wide model: Q (96, 64), K and V (48, 64), the output (64, 96)
    model = LlamaModel(model_path("heads"), n_ctx=16, n_threads=1)
    c, layer = model.config, model.weights.layers[0]
    assert (c.n_embd, c.head_dim, c.n_rot) == (64, 24, 24)
    assert (layer.wq.shape, layer.wk.shape, layer.wo.shape) == ((96, 64), (48, 64), (64, 96))
    # the key is written only where it is needed
    fields = gguf.GGUFReader(model_path("heads")).fields
    assert fields["llama.attention.key_length"].contents() == 24
    assert "llama.attention.key_length" not in gguf.GGUFReader(model_path("f32")).fields


@pytest.mark.parametrize("head_dim", [0, 64, 2, "biases"])
def test_unpacked_intermediates_give_the_same_logits(head_dim):
    # packed=False gives every intermediate its own arena bytes; a hand-made estimate of
    # them ran short for heads wider (8 of 64 in 64: Q is 512 wide) or narrower (8 of 2)
    # than n_embd / n_head, and for biases at 512 tokens
    if head_dim == "biases":
        path, tokens = biased_model_path(), [i % 512 for i in range(1, 513)]
    else:
        path, tokens = scratch_path(f"heads-of-{head_dim}.gguf"), list(range(1, 65))
        write_random_llama(path, RandomLlamaSpec(n_vocab=300, n_head=8, n_head_kv=8,
                                                 head_dim=head_dim, n_ff=64, n_layer=1))
    n_ctx = len(tokens)
    packed = forward_all(LlamaModel(path, n_ctx=n_ctx, kv_type=Type.F32, n_threads=1), tokens, n_ctx)
    unpacked = LlamaModel(path, n_ctx=n_ctx, kv_type=Type.F32, n_threads=1, packed=False)
    np.testing.assert_array_equal(forward_all(unpacked, tokens, n_ctx), packed)


def test_weights_are_used_in_place():
    model = LlamaModel(model_path("variant"), n_ctx=16, n_threads=1)
    mapped = model.file.reader.data
    w = model.weights
    for weight in (w.token_embd, w.layers[0].wq, w.layers[1].w_down, w.rope_freqs):
        assert np.shares_memory(weight.data, mapped)
    assert w.output.name == "token_embd.weight"          # tied: no output.weight in the file
    graph = model.graph(1, 16, 1)
    leaf = next(t for t in graph.graph.leafs if t.name == "blk.0.attn_q.weight")
    start = mapped.ctypes.data
    assert start <= leaf.data_ptr < start + mapped.nbytes


def write_bad_model(name, weights=None, spec=RandomLlamaSpec(n_vocab=512)):
    path = scratch_path(name)
    write_random_llama(path, spec, vocab=vocab(), weights=weights)
    return path


def bad_files():
    """(path, expected message fragment) for each kind of bad file."""
    spec = RandomLlamaSpec(n_vocab=512)
    files = []
    missing = random_weights(spec)
    del missing["blk.1.ffn_up.weight"]
    files.append((write_bad_model("missing.gguf", missing), "missing tensor 'blk.1.ffn_up.weight'"))
    wrong = random_weights(spec)
    wrong["blk.0.attn_k.weight"] = wrong["blk.0.attn_q.weight"]
    files.append((write_bad_model("shape.gguf", wrong), "'blk.0.attn_k.weight' has shape (64, 64)"))
    odd = random_weights(spec)
    odd["blk.0.attn_v.weight"] = (np.zeros((32, 66), np.uint8),   # one 256-element block a row
                                  gguf.GGMLQuantizationType.IQ2_XXS)
    files.append((write_bad_model("iq2.gguf", odd), "IQ2_XXS, which ggml_py does not support"))
    ints = random_weights(spec)
    ints["blk.0.attn_q.weight"] = (np.zeros((64, 64), np.int8).view(np.uint8),
                                   gguf.GGMLQuantizationType.I8)
    files.append((write_bad_model("i8.gguf", ints), "no dot-product kernel for I8"))
    ints = random_weights(spec)
    ints["token_embd.weight"] = (np.zeros((512, 64), np.int32).view(np.uint8),
                                 gguf.GGMLQuantizationType.I32)
    files.append((write_bad_model("i32.gguf", ints), "cannot convert I32 rows to F32"))

    arch = scratch_path("arch.gguf")
    writer = gguf.GGUFWriter(arch, "mamba")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    files.append((arch, "unknown architecture 'mamba'"))

    # an array whose count runs past the end: refused at once (it was walked item by
    # item, 2^40 of them, while memory grew)
    kvs, parts = gguf_parts(model_path("f32"))
    lying = gguf_bytes(kvs + [("general.junk", [V.ARRAY, V.UINT8], [1, 2, 3])], parts)
    at = lying.index(b"general.junk") + len("general.junk") + 8     # after the two type ids
    lying = lying[:at] + struct.pack("<Q", 2 ** 40) + lying[at + 8:]
    path = scratch_path("lying-count.gguf")
    open(path, "wb").write(lying)
    files.append((path, "an array of 1099511627776 items at byte"))

    good = open(model_path("f32"), "rb").read()
    truncated = scratch_path("truncated.gguf")
    open(truncated, "wb").write(good[: len(good) // 2])
    files.append((truncated, "truncated: tensor 'blk.0.ffn_down.weight' ends at byte"))
    for n in (6, 12, 100):     # cut inside the version, the counts, the metadata
        header_only = scratch_path(f"header{n}.gguf")
        open(header_only, "wb").write(good[:n])
        files.append((header_only, "truncated or corrupt GGUF file (1 item of uint"
                      if n != 12 else "truncated or corrupt GGUF file (2 items of uint64 at byte 8"))
    for version in (1, 9):     # not "truncated or corrupt" (the reader's wording)
        other = scratch_path(f"version{version}.gguf")
        open(other, "wb").write(good[:4] + struct.pack("<I", version) + good[8:])
        files.append((other, f"GGUF version {version} is not supported (only 2 and 3"))
    magic = scratch_path("magic.gguf")
    open(magic, "wb").write(b"GGML" + good[4:200])
    files.append((magic, "not a GGUF file"))
    # a flipped bit in the first value's type; a key name that is not UTF-8 (numpy's and
    # Python's own messages, "np.uint32(2056) is not a valid GGUFValueType", before)
    key_length = struct.unpack_from("<Q", good, 24)[0]
    at = 32 + key_length                                  # the first key's value type
    for name, edit, fragment in [
            ("value-type.gguf", good[:at] + struct.pack("<I", 2056) + good[at + 4:],
             f"the metadata value type at byte {at} is 2056, which GGUF does not have"),
            ("key-name.gguf", good[:32] + b"\xff" + good[33:],
             "a key or tensor name is not UTF-8 text: byte 0xff")]:
        open(scratch_path(name), "wb").write(edit)
        files.append((scratch_path(name), fragment))
    # a tensor of no dimensions is one value, as llama.cpp reads it (the reader failed on
    # "tuple index out of range"); more than 4 are refused, as llama.cpp refuses them
    kvs, parts = gguf_parts(model_path("f32"))
    parts[-1][1] = []
    open(scratch_path("no-dims.gguf"), "wb").write(gguf_bytes(kvs, parts))
    files.append((scratch_path("no-dims.gguf"), f"tensor '{parts[-1][0]}' has shape (), expected"))
    parts[-1][1] = [1, 1, 1, 1, 1]
    open(scratch_path("5-dims.gguf"), "wb").write(gguf_bytes(kvs, parts))
    files.append((scratch_path("5-dims.gguf"), f"tensor '{parts[-1][0]}' has 5 dimensions (at most 4)"))
    parts[-1][1], parts[-1][2] = [], int(gguf.GGMLQuantizationType.Q8_0)
    open(scratch_path("q8-no-dims.gguf"), "wb").write(gguf_bytes(kvs, parts))
    files.append((scratch_path("q8-no-dims.gguf"), "has 1 elements per row, not a multiple of its "
                  "block size 32"))
    files.append((scratch_path("absent.gguf"), "no such file"))
    loop = scratch_path("loop.gguf")
    if not os.path.lexists(loop):
        os.symlink(os.path.basename(loop), loop)           # a link to itself
    files.append((loop, "a symbolic link that leads to no file (its target is missing, or "
                        "the links form a loop)"))
    return files


def test_the_gguf_version_is_read_in_the_files_byte_order():
    from ggml_py.files.gguf_file import _gguf_version
    assert _gguf_version(struct.pack("<I", 3)) == 3 and _gguf_version(struct.pack(">I", 3)) == 3
    assert _gguf_version(struct.pack("<I", 9)) == 9 and _gguf_version(b"\x03\x00") is None


def test_bad_files_raise_one_clear_error():
    for path, fragment in bad_files():
        with pytest.raises(ModelLoadError) as info:
            LlamaModel(path, n_ctx=16, n_threads=1)
        message = str(info.value)
        assert message.startswith(f"{path}: "), message
        assert fragment in message, message
        assert "\n" not in message
        assert isinstance(info.value, ValueError)


def test_a_fifo_is_refused_not_waited_on(tmp_path, unblocked):
    os.mkfifo(tmp_path / "fifo.gguf")     # its open would wait for a writer
    error = unblocked(tmp_path / "fifo.gguf", lambda: LlamaModel(tmp_path / "fifo.gguf", n_ctx=16))
    assert isinstance(error, ModelLoadError) and "fifo.gguf: not a regular file" in str(error)


# ---- bad metadata and tensor infos (raw GGUF files) ---------------------------------

def load_error(path):
    """The one-line ModelLoadError message of loading path, checked to name the file."""
    with pytest.raises(ModelLoadError) as info:
        LlamaModel(path, n_ctx=16, n_threads=1)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    return message[len(path) + 2:]


U32, I32, U64, F32, STR, BOOL = [V.UINT32], [V.INT32], [V.UINT64], [V.FLOAT32], [V.STRING], [V.BOOL]


@pytest.mark.parametrize("key, typed, problem", [
    # as llama.cpp: an integer key must have an integer GGUF type (no cutting 4.5 to 4)
    ("attention.head_count", (F32, float("inf")), "= inf (FLOAT32) is not int"),
    ("attention.head_count", (F32, 4.5), "= 4.5 (FLOAT32) is not int"),
    ("attention.head_count", (F32, 4.0), "= 4.0 (FLOAT32) is not int"),
    ("attention.head_count", (STR, "4"), "= '4' (STRING) is not int"),
    ("attention.head_count", (BOOL, True), "= True (BOOL) is not int"),
    ("context_length", (F32, float("inf")), "= inf (FLOAT32) is not int"),
    ("feed_forward_length", ([V.ARRAY, V.UINT32], [160, 160]), "= an array of 2 UINT32 is not int"),
    ("rope.freq_base", (STR, "1e4"), "= '1e4' (STRING) is not float"),
    # counts and sizes
    ("block_count", (I32, -1), "= -1 must be at least 1"),
    ("block_count", (U32, 0), "= 0 must be at least 1"),
    ("embedding_length", (U32, 0), "= 0 must be at least 1"),
    ("feed_forward_length", (I32, -160), "= -160 must be at least 1"),
    ("attention.head_count", (U32, 0), "= 0 must be at least 1"),
    ("attention.head_count_kv", (I32, -2), "= -2 must be at least 1"),
    ("context_length", (I32, -5), "= -5 must be at least 0"),
    ("vocab_size", (U32, 0), "= 0 must be at least 1"),
    # values the forward pass cannot use
    ("rope.freq_base", (F32, 0.0), "= 0.0 must be a finite number > 0 (in float32)"),
    ("rope.freq_base", (F32, -1e4), "= -10000.0 must be a finite number > 0 (in float32)"),
    ("rope.freq_base", (F32, float("nan")), "= nan must be a finite number > 0 (in float32)"),
    ("rope.freq_base", (F32, float("inf")), "= inf must be a finite number > 0 (in float32)"),
    ("rope.freq_base", (F32, 1e-45), "= 1.401298464324817e-45 turns rope's angles past float32 "
                                     "(9.04e+41 at position 512)"),
    ("attention.layer_norm_rms_epsilon", (F32, -1.0), "= -1.0 must be a finite number >= 0 (in float32)"),
    ("attention.layer_norm_rms_epsilon", (F32, float("nan")), "= nan must be a finite number >= 0 (in float32)"),
    ("attention.layer_norm_rms_epsilon", (F32, float("inf")), "= inf must be a finite number >= 0 (in float32)"),
    # in float64 but not in float32, where the ops take them
    ("rope.freq_base", ([V.FLOAT64], 1e308), "= 1e+308 must be a finite number > 0 (in float32)"),
    ("rope.freq_base", ([V.FLOAT64], 1e-50), "= 1e-50 must be a finite number > 0 (in float32)"),
    ("rope.scaling.attn_factor", ([V.FLOAT64], 1e38),
     "= 1e+38 makes the attention scale attn_factor²/√16 beyond float32"),
])
def test_bad_metadata_is_refused_naming_the_key(key, typed, problem):
    path = edited_model("bad-key.gguf", keys={f"llama.{key}": typed})
    assert load_error(path) == f"metadata 'llama.{key}' {problem}"


def test_metadata_of_any_integer_width_is_read():
    path = edited_model("int-widths.gguf", keys={
        "llama.attention.head_count": (I32, 4), "llama.block_count": (U64, 2),
        "llama.rope.freq_base": (U32, 20000), "llama.attention.layer_norm_rms_epsilon": (F32, 0.0)})
    c = LlamaConfig.from_gguf(GGUFModelFile(path))
    assert (c.n_head, c.n_layer, c.rope_freq_base, c.rms_eps) == (4, 2, 20000.0, 0.0)
    assert type(c.rope_freq_base) is float


@pytest.mark.parametrize("typed, name", [
    (None, "F32"),                                    # absent: the type of most weight bytes
    ((U32, 1), "F16"),
    ((U32, 9999), "unknown type"),
    ((F32, float("inf")), "unknown type"),
    (([V.ARRAY, V.UINT32], [1, 2]), "unknown type"),
])
def test_file_type_name_never_fails(typed, name):
    path = edited_model("ftype.gguf", keys={"general.file_type": typed})
    assert GGUFModelFile(path).file_type_name() == name


def test_without_a_file_type_norms_do_not_count(tmp_path):
    # the type of most bytes among matrices, as llama.cpp guesses it: 1-D tensors left out
    path = tmp_path / "guess.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_tensor("a.weight", np.zeros((16, 32), np.float16))     # 1,024 bytes of F16
    w.add_tensor("b.weight", np.zeros((10, 25), np.float32))     # 1,000 bytes of F32
    w.add_tensor("norm.weight", np.zeros(64, np.float32))        # + 256 bytes of F32, 1-D
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    assert GGUFModelFile(path).file_type_name() == "F16"


def test_a_quantized_norm_weight_is_refused_by_name(tmp_path):
    from ggml_py.core.quants import quantize
    spec = RandomLlamaSpec(n_vocab=512)
    weights = random_weights(spec)
    norm = np.ascontiguousarray(weights["blk.0.attn_norm.weight"])
    weights["blk.0.attn_norm.weight"] = (quantize(norm, Type.Q8_0), gguf.GGMLQuantizationType.Q8_0)
    write_random_llama(tmp_path / "qnorm.gguf", spec, weights=weights)
    with pytest.raises(ModelLoadError, match="tensor 'blk.0.attn_norm.weight' is Q8_0; norm "
                                             "weights must be F32, F16 or BF16"):
        LlamaModel(tmp_path / "qnorm.gguf", n_ctx=16, n_threads=1)


@pytest.mark.parametrize("weight_type, file_type", [("Q3_K", 11), ("Q4_K", 14), ("Q5_K", 16)])
def test_a_random_k_quant_model_records_llama_cpps_small_file_type(tmp_path, weight_type,
                                                                   file_type):
    # MOSTLY_Q3_K_S, MOSTLY_Q4_K_S, MOSTLY_Q5_K_S
    path = tmp_path / "k.gguf"
    write_random_llama(path, RandomLlamaSpec(n_vocab=512, n_embd=256, n_ff=512,
                                             weight_type=weight_type))
    assert GGUFModelFile(path).get("general.file_type") == file_type


def resized_vocab(n):
    """Metadata edits giving model_path('f32') a tokenizer of n tokens (cut, or padded
    with made-up ones)."""
    keys = {}
    for key, types, value in gguf_parts(model_path("f32"))[0]:
        if key == "tokenizer.ggml.tokens":
            keys[key] = (types, (value + [f"<extra_{i}>" for i in range(n)])[:n])
        elif key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            keys[key] = (types, (value + [value[-1]] * n)[:n])
    return keys


@pytest.mark.parametrize("n_tokens, vocab_size, problem", [
    (500, None, "the tokenizer has 500 tokens, the model 512 (rows of token_embd.weight)"),
    (600, None, "the tokenizer has 600 tokens, the model 512 (rows of token_embd.weight)"),
    (512, (U32, 600), "the tokenizer has 512 tokens, the model 600 (llama.vocab_size)"),
    # the embedding and output matrices have a row per token
    (600, (U32, 600), "tensor 'token_embd.weight' has shape (512, 64), expected (600, 64)"),
])
def test_vocabulary_must_match_the_model(n_tokens, vocab_size, problem):
    # as llama.cpp, whose n_vocab is the token count: refused at load, not mid-generation
    keys = {**resized_vocab(n_tokens), "llama.vocab_size": vocab_size}
    assert load_error(edited_model("vocab.gguf", keys=keys)) == problem


def extra_tensor(name, ne=(4,)):
    return lambda ts: ts + [[name, list(ne), 0, np.zeros(int(np.prod(ne)), np.float32).tobytes()]]


@pytest.mark.parametrize("edit, problem", [
    # a 2-layer file read as 1 layer would run a different (truncated) model
    (dict(keys={"llama.block_count": (U32, 1)}),
     "wrong number of tensors: a llama model of block_count 1 uses 12 of the file's 21; not used: "
     "'blk.1.attn_norm.weight', 'blk.1.attn_q.weight', 'blk.1.attn_k.weight', "
     "'blk.1.attn_v.weight', ..."),
    (dict(tensors=extra_tensor("foo.bar")),
     "wrong number of tensors: a llama model of block_count 2 uses 21 of the file's 22; "
     "not used: 'foo.bar'"),
    (dict(tensors=extra_tensor("blk.2.attn_q.weight", (64, 64))),
     "not used: 'blk.2.attn_q.weight'"),
    (dict(tensors=extra_tensor("blk.0.attn_rot_embd")), "not used: 'blk.0.attn_rot_embd'"),
])
def test_every_tensor_must_be_used(edit, problem):
    message = load_error(edited_model("extra.gguf", **edit))
    assert message.endswith(problem), message


def natural_offsets(tensors, alignment=32):
    offsets, at = [], 0
    for _, _, _, raw in tensors:
        offsets.append(at)
        at += -(-len(raw) // alignment) * alignment
    return offsets


def with_offset(name, shift=0, like=None):
    """gguf_bytes offsets where tensor `name` is moved by shift bytes or onto tensor `like`."""
    _, tensors = gguf_parts(model_path("f32"))
    names = [t[0] for t in tensors]
    offsets = natural_offsets(tensors)
    i = names.index(name)
    offsets[i] = offsets[names.index(like)] if like else offsets[i] + shift
    return offsets


@pytest.mark.parametrize("offsets, problem", [
    # as llama.cpp's gguf reader: data in order, each tensor at the aligned running sum
    (with_offset("output.weight", like="token_embd.weight"),
     "tensor 'output.weight' has offset 0, expected 476416"),
    (with_offset("blk.1.ffn_down.weight", shift=2),
     "tensor 'blk.1.ffn_down.weight' has offset 435202, expected 435200"),
    (with_offset("token_embd.weight", shift=1),
     "tensor 'token_embd.weight' has offset 1, expected 0"),
])
def test_overlapping_or_misaligned_tensor_data_is_refused(offsets, problem):
    message = load_error(edited_model("offsets.gguf", offsets=offsets))
    assert message == problem + " (tensor data must follow in order, aligned to 32 bytes)"


def retyped(name, type_id, nbytes=None):
    def edit(ts):
        for t in ts:
            if t[0] == name:
                t[2] = type_id
                if nbytes is not None:
                    t[3] = bytes(nbytes)
        return ts
    return edit


def duplicate(name):
    return lambda ts: ts + [next(list(t) for t in ts if t[0] == name)]


@pytest.mark.parametrize("edit, problem", [
    (dict(tensors=retyped("blk.0.attn_q.weight", 99)),
     "tensor 'blk.0.attn_q.weight' has type id 99, a tensor type ggml_py does not know"),
    (dict(tensors=retyped("blk.0.attn_q.weight", 4)),       # Q4_2, removed from ggml
     "tensor 'blk.0.attn_q.weight' has type id 4, a tensor type ggml_py does not know"),
    (dict(tensors=retyped("blk.0.ffn_down.weight", gguf.GGMLQuantizationType.Q4_K, 64 * 144)),
     "tensor 'blk.0.ffn_down.weight' of type Q4_K has 160 elements per row, not a multiple of "
     "its block size 256"),
    (dict(tensors=duplicate("output_norm.weight")), "duplicate tensor name 'output_norm.weight'"),
    (dict(keys={"general.alignment": (U32, 0)}),
     "general.alignment = 0 (UINT32) must be a UINT32 power of two"),
    (dict(keys={"general.alignment": (U32, 48)}, alignment=48),
     "general.alignment = 48 (UINT32) must be a UINT32 power of two"),
    (dict(keys={"general.alignment": (U64, 32)}),
     "general.alignment = 32 (UINT64) must be a UINT32 power of two"),
])
def test_bad_tensor_infos_each_have_their_own_message(edit, problem):
    assert load_error(edited_model("infos.gguf", **edit)) == problem


def test_a_file_aligned_to_two_bytes_loads_with_aligned_weights():
    # general.alignment 2 is valid GGUF; F32 data then starts 2 bytes off a 4-byte boundary,
    # which the kernels (typed pointers) must not read: such a weight is copied
    kvs, tensors = gguf_parts(model_path("f32"))
    for pad in range(4):
        path = scratch_path("align2.gguf")
        with open(path, "wb") as f:
            f.write(gguf_bytes(kvs + [("x.pad", [V.STRING], "p" * pad), ("general.alignment", [V.UINT32], 2)],
                               tensors, alignment=2))
        reader = gguf.GGUFReader(path)
        if any(t.data.ctypes.data % 4 for t in reader.tensors if t.tensor_type == gguf.GGMLQuantizationType.F32):
            break
    else:
        pytest.fail("no padding gave misaligned F32 data")
    from ggml_py.core.types import data_alignment
    models = [LlamaModel(p, n_ctx=16, n_threads=1) for p in (model_path("f32"), path)]
    w = models[1].weights
    weights = [w.token_embd, w.output_norm, w.output] + [x for layer in w.layers
                                                          for x in vars(layer).values() if x is not None]
    assert all(x.data.ctypes.data % data_alignment(x.type) == 0 for x in weights)
    logits = [m.forward(TOKENS[:8], np.arange(8)).copy() for m in models]
    np.testing.assert_array_equal(*logits)


@pytest.mark.parametrize("changes, error, match", [
    (dict(n_embd=60, n_head=4), ValueError, "the head size 15 must be even"),
    (dict(n_embd=64, n_head=3), ValueError, r"must be n_head \(3\) heads, or head_dim given"),
    (dict(n_embd=64, n_head=3, head_dim=5), ValueError, "the head size 5 must be even"),
    (dict(head_dim=-2), ValueError, "head_dim must be at least 0"),
    (dict(head_dim=4, n_head=4, weight_type="Q4_0"), ValueError,
     "n_head [*] head_dim 16 is not a multiple of Q4_0's block of 32"),
    (dict(n_head=4, n_head_kv=3), ValueError, "multiple of n_head_kv"),
    (dict(n_head=0), ValueError, "n_head must be at least 1"),
    (dict(n_layer=-1), ValueError, "n_layer must be at least 1"),
    (dict(n_ff=0), ValueError, "n_ff must be at least 1"),
    (dict(n_embd=2.5), TypeError, "n_embd must be an integer"),
    (dict(rms_eps=-1.0), ValueError, "rms_eps must be a finite number"),
    (dict(rope_freq_base=0.0), ValueError, "rope_freq_base must be"),
    (dict(weight_type="Q9"), ValueError, "weight_type 'Q9' is not a type"),
    (dict(weight_type="Q8_K"), ValueError, "weight_type 'Q8_K'"),
    (dict(weight_type="Q4_K"), ValueError, "n_embd 64 is not a multiple of Q4_K's block of 256"),
    (dict(weight_type="Q4_0", n_ff=176), ValueError, "n_ff 176 is not a multiple of Q4_0's block of 32"),
])
def test_random_specs_that_would_write_unusable_files_are_refused(changes, error, match):
    # they wrote files ggml_py then refused, or stopped half-way with a partial file
    with pytest.raises(error, match=match):
        RandomLlamaSpec(**changes)


def test_duplicate_metadata_keys_are_refused():
    kvs, tensors = gguf_parts(model_path("f32"))
    path = scratch_path("dup-key.gguf")
    open(path, "wb").write(gguf_bytes(kvs + [("llama.block_count", U32, 1)], tensors))
    assert load_error(path) == "duplicate metadata key 'llama.block_count'"


SPLIT = {"split.no": ([V.UINT16], 0), "split.count": ([V.UINT16], 2),
         "split.tensors.count": (I32, 40)}    # the first shard's keys, as gguf-split writes them


def test_big_endian_and_split_files_are_refused():
    # llama.cpp refuses both: a byte order not the host's ("mismatch between the host and
    # model endianness"), and a shard alone (it loads the others; ggml_py does not)
    big = edited_model("big-endian.gguf", order=">")
    assert load_error(big) == ("big-endian GGUF file: ggml_py, like llama.cpp, reads only files "
                               "in this host's byte order (little-endian)")
    assert load_error(edited_model("shard.gguf", keys=SPLIT)) == (
        "one shard of a split GGUF model (split.count = 2): split GGUF files are not supported; "
        "merge them first (llama.cpp's gguf-split --merge)")
    whole = edited_model("one-split.gguf", keys={**SPLIT, "split.count": ([V.UINT16], 1)})
    assert LlamaModel(whole, n_ctx=16, n_threads=1).config.n_layer == SPECS["f32"].n_layer


def test_tensor_past_the_end_of_the_file_is_truncation():
    good = open(model_path("f32"), "rb").read()
    path = scratch_path("short.gguf")
    open(path, "wb").write(good[:-1000])
    assert load_error(path) == f"truncated: tensor 'output.weight' ends at byte {len(good)}, " \
                               f"the file has {len(good) - 1000}"


@pytest.mark.parametrize("dtype, type_id", [(np.float16, 1), ("bf16", 30)])
def test_half_precision_norms_and_rope_freqs_equal_f32_ones(dtype, type_id):
    # the same values stored as F16 / BF16 and as F32 give the same model
    def rounded(values):
        if dtype == "bf16":
            half = (values.view(np.uint32) >> 16).astype(np.uint16)
            return half, (half.astype(np.uint32) << 16).view(np.float32)
        half = values.astype(np.float16)
        return half, half.astype(np.float32)

    def norms(as_half):
        def edit(ts):
            for t in ts:
                if len(t[1]) == 1:                  # norms and rope_freqs
                    half, wide = rounded(np.frombuffer(t[3], np.float32))
                    t[2], t[3] = (type_id, half.tobytes()) if as_half else (0, wide.tobytes())
            return ts
        return edit

    half = LlamaModel(edited_model("norms-half.gguf", "variant", tensors=norms(True)), n_ctx=16,
                      kv_type=Type.F32, n_threads=1)
    wide = LlamaModel(edited_model("norms-f32.gguf", "variant", tensors=norms(False)), n_ctx=16,
                      kv_type=Type.F32, n_threads=1)
    assert half.weights.rope_freqs.type == half.weights.layers[0].attn_norm.type == Type.F32
    np.testing.assert_array_equal(forward_all(half, TOKENS[:8], 8),
                                  forward_all(wide, TOKENS[:8], 8))
