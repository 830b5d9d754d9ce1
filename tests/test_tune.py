"""mulmat-tune: estimates, file round trip and rejection, planner choice."""
import dataclasses
import json
import os
import shutil
import threading

import numpy as np
import pytest

import ggml_py as gg
from ggml_py.tune import data as tune
from ggml_py.tune.data import ProfileTimes, ShapeTimes, TuneData, TuneFileError, interpolate
from ggml_py.tune.bench import bench, distinct_profiles, extend_to_rows, preset_shapes, row_counts
from ggml_py.cli.tune import analyze, main as tune_main


def test_interpolate_inside_and_past_both_ends():
    xs, ys = [1, 2, 4, 8], [10.0, 20.0, 40.0, 60.0]
    assert interpolate(xs, ys, 1) == 10.0
    assert interpolate(xs, ys, 3) == pytest.approx(30.0)
    assert interpolate(xs, ys, 6) == pytest.approx(50.0)
    assert interpolate(xs, ys, 16) == pytest.approx(100.0)   # last segment's slope: 5 per M
    assert interpolate([2, 4], [10.0, 30.0], 1) == pytest.approx(0.0)
    assert interpolate([2, 4], [10.0, 40.0], 1) == 0.0     # clamped: the line gives -5
    # past the last M the line runs back to the nearest earlier time below the last one:
    # a falling last segment (noise) neither reaches 0 nor stops the growth ...
    assert interpolate([1, 2, 4, 8], [7446.0, 7734.0, 15467.0, 8109.0], 16) == \
        pytest.approx(8109.0 + (8109.0 - 7734.0) / 6 * 8)
    # ... nor does a flat one (a time held down to the later one): a file benched up to
    # M=4 keeps growing at M=512 (it stayed at 844.3, 180 times too low)
    assert interpolate([1, 2, 4], [422.3, 844.3, 844.3], 512) == \
        pytest.approx(844.3 + (844.3 - 422.3) / 3 * 508)
    assert interpolate([1, 2], [10.0, 4.0], 512) == 4.0      # nothing below the last: flat
    assert interpolate([1, 2, 4], [5.0, 5.0, 5.0], 64) == 5.0
    assert interpolate([1, 2], [-10.0, -5.0], 2.5) == 0.0    # never below 0 there either
    with pytest.raises(ValueError, match="two or more"):
        interpolate([4], [7.0], 100)
    with pytest.raises(ValueError, match="bench needs two or more Ms"):
        bench([(32, 32, gg.F32)], m_values=[1], thread_counts=(1,))
    with pytest.raises(ValueError, match="bench: 1025 shapes, more than a tune file holds"):
        bench([(32, n, gg.F32) for n in range(1, 1026)], m_values=[1, 2], thread_counts=(1,))
    with pytest.raises(ValueError, match="bench: a shape is given twice"):
        bench([[32, 32, gg.F32], (32, 32, "f32")], m_values=[1, 2], thread_counts=(1,))


def test_extend_to_rows_is_a_straight_line_per_stage():
    times = [{"init": 5.0, "compute": 100.0}, {"init": 5.0, "compute": 190.0}]
    assert extend_to_rows(1000, [100, 200], times) == {"init": 5.0, "compute": pytest.approx(910.0)}
    assert extend_to_rows(64, [64], [{"compute": 3.0}]) == {"compute": 3.0}
    assert extend_to_rows(64, [16], [{"compute": 3.0}]) == {"compute": 12.0}   # one slice: in proportion
    # a line that falls (the larger slice timed faster) is held at 0, never negative
    assert extend_to_rows(100, [10, 20], [{"compute": 5.0}, {"compute": 1.0}]) == {"compute": 0.0}


def test_times_bounded_in_m():
    from ggml_py.tune.bench import bounded_in_m
    m = [1, 2, 4, 8, 16, 32]
    # quick samples (False) bound nothing, and are only held to M/M' times the M' before
    assert bounded_in_m(m, [1.0, 0.5, 2.0, 9.0, 3.0, 5.0], [True, False, True, False, True, True]) \
        == [1.0, 0.5, 2.0, 4.0, 3.0, 5.0]
    assert bounded_in_m(m, [1.0, 0.5, 5.0, 9.0, 3.0, 5.0], [True, False, True, False, True, True]) \
        == [1.0, 0.5, 3.0, 6.0, 3.0, 5.0]
    # never falling as M grows
    assert bounded_in_m(m, [1.0, 5.0, 2.0, 3.0, 2.5, 5.0]) == [1.0, 2.0, 2.0, 2.5, 2.5, 5.0]
    # never more than doubling when M doubles (9.0 at M=32 was inflated)
    assert bounded_in_m(m, [1.0, 2.0, 4.0, 4.0, 4.0, 9.0]) == [1.0, 2.0, 4.0, 4.0, 4.0, 8.0]
    assert bounded_in_m([1, 4], [1.0, 3.9]) == [1.0, 3.9]
    # uncapped (a profile tiled over rows): exact times may grow faster than M,
    # never fall; quick samples are still held to M/M' times the M' before
    assert bounded_in_m(m, [1.0, 2.0, 4.0, 4.0, 4.0, 9.0], capped=False) == [1.0, 2.0, 4.0, 4.0, 4.0, 9.0]
    assert bounded_in_m(m, [1.0, 5.0, 2.0, 3.0, 2.5, 5.0], capped=False) == [1.0, 2.0, 2.0, 2.5, 2.5, 5.0]
    assert bounded_in_m(m, [1.0, 0.5, 5.0, 9.0, 3.0, 5.0], [True, False, True, False, True, True],
                        capped=False) == [1.0, 0.5, 3.0, 6.0, 3.0, 5.0]


def test_row_counts_sample_only_where_a_slice_behaves_like_the_whole():
    caches = [1 << 20, 32 << 20]   # L2 (both cores), LLC
    q4_row, f32_row = gg.row_bytes(gg.Q4_0, 2048), 4 * 2048
    assert row_counts(2048, 2048, 1, q4_row, caches) == [2048]            # cheap: whole
    # exactly the flop budget (2 N K M = 2e8) is still measured whole
    assert row_counts(10000, 10000, 1, 40000, [32 << 20]) == [10000]
    assert row_counts(32000, 2048, 512, q4_row, caches) == [32, 4000]     # a few rows and N/8
    assert row_counts(2048, 5632, 512, q4_row, caches) == [32, 1024]
    assert row_counts(1024, 5632, 512, q4_row, caches) == [1024]          # too few rows to sample
    # memory-bound: the slice must outgrow the largest cache the whole weight outgrows
    assert row_counts(32000, 2048, 4, q4_row, caches) == [32000]          # 2 x 32 MiB of Q4_0 > N/2
    assert row_counts(32000, 2048, 4, q4_row + f32_row, caches) == [32, 7183]
    assert row_counts(32000, 2048, 4, q4_row, [1 << 20, 64 << 20]) == [32, 4000]  # fits the LLC: past L2
    assert row_counts(32000, 2048, 4, q4_row, [8 << 20, 64 << 20]) == [32, 14564]
    assert row_counts(32000, 2048, 4, q4_row, []) == [32, 4000]           # no caches: a plain sample
    assert row_counts(32000, 2048, 64, q4_row, caches) == [32, 4000]      # compute-bound on Q4_0 rows


def test_quick_samples_rank_profiles_cheaply():
    from ggml_py.tune.bench import quick_row_counts
    q4_row, f32_row = gg.row_bytes(gg.Q4_0, 2048), 4 * 2048
    assert quick_row_counts(2048, 2048, 8, q4_row + f32_row, tiled=False) == [2048]   # cheap: whole
    assert quick_row_counts(32000, 2048, 1, q4_row + f32_row, tiled=False) == [1024]  # many bytes
    assert quick_row_counts(32000, 2048, 512, q4_row + f32_row, tiled=False) == [1024]
    assert quick_row_counts(32000, 2048, 64, q4_row, tiled=True) == [762]             # 2e8 flops
    assert quick_row_counts(32000, 2048, 512, q4_row, tiled=True) == [256]
    assert quick_row_counts(1024, 2048, 512, q4_row + f32_row, tiled=False) == [1024]


def sample_small_weights(monkeypatch):
    """Shrink ggml-tune's thresholds so that a 1024-row weight is sampled:
    quick samples of 128 rows; exact rows 8 and 128 (N/8)."""
    from ggml_py.tune import bench as tb
    monkeypatch.setattr(tb, "FLOP_BUDGET", 1e4)
    monkeypatch.setattr(tb, "FEW_ROWS", 8)
    monkeypatch.setattr(tb, "MIN_SAMPLE_ROWS", 128)
    monkeypatch.setattr(tb, "QUICK_MIN_ROWS", 128)


def test_bench_ranks_on_quick_samples_and_measures_contenders_exactly(monkeypatch):
    from ggml_py.tune import bench as tb
    sample_small_weights(monkeypatch)
    runs = []   # (M, profile, threads, weight rows) of every timed case, in order
    time_stages = tb.time_stages

    def recording(graph, profile, pool):
        node = graph.nodes[-1]
        runs.append((node.shape[0], profile.name, pool.n_threads, node.shape[1]))
        return time_stages(graph, profile, pool)

    monkeypatch.setattr(tb, "time_stages", recording)
    data = bench([(1024, 64, gg.F32)], m_values=[1, 16], thread_counts=[1, 2])
    shape = data.shape(1024, 64, gg.F32)
    cases = {(p.profile.name, t) for p in shape.profiles for t in p.times_us}
    sweep_of_m1 = runs[:next(i for i, r in enumerate(runs) if r[0] == 16)]
    for m in (1, 16):
        # every case ranks on the quick sample ...
        assert {(name, t) for mm, name, t, rows in runs if mm == m and rows == 128} == cases
        # ... and at each thread count at least the fastest goes on to exact rows
        for t in (1, 2):
            assert any(r[0] == m and r[2] == t and r[3] == 8 for r in runs)
    # before the second looks, the slice the quick sample shares with the exact rows ran once
    assert all(sweep_of_m1.count((1, name, t, 128)) == 1 for name, t in cases)
    assert all(v >= 0 for p in shape.profiles for per in p.times_us.values()
               for values in per.values() for v in values)


def test_an_interrupted_quick_sample_does_not_put_a_profile_out_of_the_race(monkeypatch):
    from ggml_py.tune import bench as tb
    sample_small_weights(monkeypatch)
    per_row = {("cpu", 1): 1.0, ("blas", 1): 1.1, ("cpu", 2): 0.5, ("blas", 2): 0.6, ("blas-mt", 2): 0.52}
    runs = []

    def fake_time_stages(graph, profile, pool):   # times in proportion to rows x M
        node = graph.nodes[-1]
        m, rows, t = node.shape[0], node.shape[1], pool.n_threads
        runs.append((m, profile.name, t, rows))
        us = per_row[profile.name, t] * rows * m
        if (m, profile.name, t, rows) == (16, "blas-mt", 2, 128):
            us *= 100   # interrupted
        return {"compute": us, "init": 0.0} if profile.init.valid else {"compute": us}

    monkeypatch.setattr(tb, "time_stages", fake_time_stages)
    data = bench([(1024, 64, gg.F32)], m_values=[1, 16], thread_counts=[1, 2])
    assert (16, "blas-mt", 2, 8) in runs   # measured on exact rows all the same
    times = {p.name: us for us, p in data.estimates(1024, 64, gg.F32, 16, 2)}
    assert times["blas-mt"] == pytest.approx(0.52 * 1024 * 16)   # not the interrupted sample
    assert min(times, key=times.get) == "cpu"


def test_only_profiles_slower_than_m_are_capped_by_a_smaller_ms_time(monkeypatch):
    # `cpu` grows a little faster than M (2.3x from M=16 to 32): its own times are
    # kept; `blas` timed 3x too slow at M=32 is still lowered to twice its M=16 time
    from ggml_py.tune import bench as tb
    sample_small_weights(monkeypatch)
    per_row = {"cpu": {1: 1.0, 16: 1.0, 32: 1.15}, "blas": {1: 50.0, 16: 1.2, 32: 3 * 1.2}}

    def fake_time_stages(graph, profile, pool):   # times in proportion to rows x M
        node = graph.nodes[-1]
        m, rows = node.shape[0], node.shape[1]
        us = per_row[profile.name][m] * rows * m
        return {"compute": us, "init": 0.0} if profile.init.valid else {"compute": us}

    monkeypatch.setattr(tb, "time_stages", fake_time_stages)
    data = bench([(1024, 64, gg.F32)], m_values=[1, 16, 32], thread_counts=[1])
    times = {p.name: us for us, p in data.estimates(1024, 64, gg.F32, 32, 1)}
    assert times["cpu"] == pytest.approx(1.15 * 1024 * 32)
    assert times["blas"] == pytest.approx(2 * 1.2 * 1024 * 16)


def test_passes_sweep_every_shape_in_turn_and_keep_the_fastest(monkeypatch):
    from ggml_py.tune import bench as tb
    sample_small_weights(monkeypatch)
    slowdown = [1.0, 0.5, 0.8]   # the machine during each pass: the second was the quietest
    sweeps = []                  # N of each shape's sweep, in order
    sweep = tb.ShapeSweeps.sweep

    def recording_sweep(self, bar=None):
        sweeps.append(self.ct.sb.n)
        return sweep(self, bar)

    def fake_time_stages(graph, profile, pool):   # in proportion to rows x M; cpu 10x cheaper
        node = graph.nodes[-1]
        us = node.shape[0] * node.shape[1] * (1 if profile.name == "cpu" else 10)
        us *= slowdown[(len(sweeps) - 1) // 2]
        return {"compute": us, "init": 0.0} if profile.init.valid else {"compute": us}

    monkeypatch.setattr(tb.ShapeSweeps, "sweep", recording_sweep)
    monkeypatch.setattr(tb, "time_stages", fake_time_stages)
    shapes = [(512, 64, gg.F32), (1024, 64, gg.F32)]
    data = bench(shapes, m_values=[1, 4], thread_counts=[1], passes=3)
    assert sweeps == [512, 1024] * 3   # each pass sweeps every shape, one after another
    for n, k, type in shapes:
        times = {p.name: us for us, p in data.estimates(n, k, type, 4, 1)}
        assert times["cpu"] == pytest.approx(0.5 * n * 4)   # the quietest pass


def test_profiles_with_the_same_code_are_benched_once():
    q = gg.task_profiles(gg.Op.MUL_MAT, gg.Q4_0, gg.F32)
    f = gg.task_profiles(gg.Op.MUL_MAT, gg.F32, gg.F32)
    names = lambda profiles: [p.name for p in profiles]
    assert names(distinct_profiles(q, 1)) == ["cpu", "blas"]
    assert names(distinct_profiles(q, 2)) == ["cpu", "blas-split", "blas-mt"]
    assert names(distinct_profiles(f, 1)) == ["cpu", "blas"]
    assert names(distinct_profiles(f, 2)) == ["cpu", "blas", "blas-mt"]


def synthetic_data(thread_counts=(1, 2)):
    """CPU cheap at small M, BLAS cheap at large M: crossover at M=32."""
    cpu = gg.task_profiles(gg.Op.MUL_MAT, gg.F32, gg.F32)[0]
    m_values = [1, 2, 4, 8, 16, 32, 64]
    cpu_times = {t: {"init": [1.0] * 7, "compute": [10.0 * m / t for m in m_values]}
                 for t in thread_counts}
    fake_blas = gg.TaskProfile(1, "blas", compute=gg.StageFlags(True, False, True))
    blas_times = {t: {"compute": [160.0 + 5.0 * m for m in m_values]} for t in thread_counts}
    # blas-mt, benched from 2 threads on (as ggml-tune does), never the fastest here
    blas_mt = next(p for p in gg.task_profiles(gg.Op.MUL_MAT, gg.F32, gg.F32) if p.name == "blas-mt")
    blas_mt_times = {t: {"compute": [200.0 + 5.0 * m for m in m_values]} for t in thread_counts if t > 1}
    shape = ShapeTimes(64, 64, gg.F32, [ProfileTimes(cpu, cpu_times), ProfileTimes(fake_blas, blas_times),
                                        ProfileTimes(blas_mt, blas_mt_times)])
    return TuneData(model="synthetic", m_values=m_values, thread_counts=list(thread_counts),
                    shapes=[shape])


def test_estimates_pick_the_fastest_and_extrapolate():
    data = synthetic_data()
    (t, p), _ = data.estimates(64, 64, gg.F32, 4, 1)
    assert p.name == "cpu" and t == pytest.approx(41.0)
    (t, p), _ = data.estimates(64, 64, gg.F32, 128, 1)
    assert p.name == "blas" and t == pytest.approx(160 + 5 * 128)
    assert data.estimates(64, 64, gg.F32, 4, 3) == []       # past the thread counts benched
    assert data.estimates(64, 65, gg.F32, 4, 1) == []       # shape not benched
    assert data.estimates(64, 64, gg.F32, 4, 1).between is None


def test_thread_counts_between_benched_ones_are_interpolated_in_one_over_n():
    # cpu's compute takes 10 M / n µs, its init 1 µs: a line in 1/n, met exactly between
    # 1 and 4 threads; blas (one thread, 160 + 5 M) stands for blas-mt at one thread
    data = synthetic_data(thread_counts=(1, 4))
    for n in (2, 3):
        found = data.estimates(64, 64, gg.F32, 8, n)
        assert found.between == (1, 4)
        times = {p.name: t for t, p in found}
        assert times["cpu"] == pytest.approx(1.0 + 80.0 / n)
        w = (1 / n - 1 / 4) / (1 - 1 / 4)
        assert times["blas-mt"] == pytest.approx(w * 200 + (1 - w) * 240)
        assert times["blas"] == pytest.approx(200.0)       # one thread's work at any count
    assert data.estimates(64, 64, gg.F32, 8, 5) == []      # past the last: not guessed
    assert data.estimates(64, 64, gg.F32, 8, 4).between is None


def test_a_plan_at_an_unbenched_thread_count_is_marked_estimated():
    data = synthetic_data(thread_counts=(1, 4))
    graph, _, _ = mul_mat_graph(4)
    row = graph.plan(2, tune=data).rows[-1]
    assert (row.reason, row.profile.name) == ("estimated", "cpu")
    assert row.estimate_us == pytest.approx(1.0 + 40.0 / 2)
    assert "estimated" in str(graph.plan(2, tune=data))
    assert graph.plan(4, tune=data).rows[-1].reason == "tuned"
    assert graph.plan(5, tune=data).rows[-1].reason == "fallback"


def test_file_round_trip(tmp_path):
    data = synthetic_data()
    path = tmp_path / "tune.json"
    data.save(path)
    loaded = tune.load(path, model="synthetic")
    assert loaded.to_json() == data.to_json()


def write_json(path, obj):
    path.write_text(json.dumps(obj))
    return path


@pytest.mark.parametrize("edit, match", [
    (lambda o: o.update(format="something-else"), "not a ggml_py-mulmat-tune file"),
    (lambda o: o.update(version=99), "version 99"),
    (lambda o: o["system"].update(cpu="Another CPU"), "benched with cpu"),
    (lambda o: o["system"].update(features="AVX = 0"), "benched with features"),
    (lambda o: o["system"].update(ggml_py="0.0.1"), "benched with ggml_py"),
    (lambda o: o["system"].update(blas="OpenBLAS 0.3.0 DYNAMIC_ARCH Haswell"), "benched with blas"),
    (lambda o: o["system"].pop("blas"), "benched with blas None"),
    (lambda o: o.update(m_values=[4, 2, 1, 8, 16, 32, 64]), "ascending"),
    # two equal Ms would divide by zero when estimating between them
    (lambda o: o.update(m_values=[1, 2, 2, 8, 16, 32, 64]), "distinct"),
    (lambda o: o["system"].update(kernels="scalar reference"), "benched with kernels"),
    (lambda o: o["shapes"][0]["profiles"][0]["times_us"]["1"].update(compute=[1.0, 2.0]), "one time in"),
    (lambda o: o["shapes"][0]["profiles"][0]["times_us"]["1"].update(compute=[1.0] * 8), "one time in"),
    (lambda o: o["shapes"][0]["profiles"][0]["times_us"]["1"].update(compute=[-1.0] * 7), "one time in"),
    # finite, but summed over the stages it would be inf: every profile tied
    (lambda o: o["shapes"][0]["profiles"][0]["times_us"]["1"].update(compute=[1e308] * 7), "one time in"),
    (lambda o: o["shapes"][0].update(type="Q9_9"), "malformed"),
    (lambda o: o["shapes"][0].pop("n"), r"malformed tune file \(no 'n' key\)"),
    (lambda o: o["shapes"][0]["profiles"][0].update(stages=[[1, 1, 0]]), "stages"),
    # values of the wrong kind, which Python would otherwise take in its stride
    (lambda o: o.update(system=["a", "list"]), "system must be an object"),
    (lambda o: o.update(version=True), "version True"),
    (lambda o: o.update(m_values="1248"), "m_values must be a list"),
    (lambda o: o.update(m_values=[1.5, 2, 4, 8, 16, 32, 64]), "m_values must be an integer"),
    (lambda o: o.update(m_values=[1]), "m_values must hold two or more Ms"),
    (lambda o: o.update(thread_counts=[]), "thread_counts is empty"),
    (lambda o: o.update(thread_counts=[0, 1, 2]), "thread_counts must be >= 1"),
    (lambda o: o.update(shapes=[]), "no shapes"),
    # a load time that grew with the square of the shapes (8,000: 48 s)
    (lambda o: o.update(shapes=o["shapes"] * 1025), "1025 shapes, more than a model has"),
    (lambda o: o["shapes"].append(o["shapes"][0]), "64x64 F32 appears twice"),
    (lambda o: o["shapes"][0].update(n=0), "n must be >= 1"),
    (lambda o: o["shapes"][0].update(profiles=[]), "has no profiles"),
    (lambda o: o["shapes"][0]["profiles"][0]["times_us"]["1"].update(compute="1234567"),
     "compute must be a list"),
    (lambda o: o["shapes"][0]["profiles"][0]["times_us"]["1"].update(compute=[True] * 7),
     "one time in"),
    (lambda o: o["shapes"][0]["profiles"][0]["times_us"]["1"].pop("compute"),
     r"times for stages \['init'\], but it runs \['compute', 'init'\]"),
    (lambda o: o["shapes"][0]["profiles"][1]["times_us"]["1"].update(init=[1.0] * 7),
     "but it runs"),
    (lambda o: o["shapes"][0]["profiles"][0]["times_us"].update({"4": {}}), "'4' threads"),
    (lambda o: o["shapes"][0]["profiles"].append(o["shapes"][0]["profiles"][0]),
     "profile id 0 appears twice"),
    # flags that are not this build's: the executor would run the kernels wrongly
    (lambda o: o["shapes"][0]["profiles"][1].update(stages=[[0, 0, 0], [1, 1, 1], [0, 0, 0]]),
     "'blas' \\(id 1\\) is not one of this build's MUL_MAT profiles for F32"),
    (lambda o: o["shapes"][0]["profiles"][1].update(name="turbo"), "'turbo'"),
    # a time no float holds: a one-line message, not an OverflowError's
    (lambda o: o["shapes"][0]["profiles"][0]["times_us"]["1"].update(init=[10 ** 400] * 7),
     "init: need one time in 0 .. 1e\\+12 µs per M \\(7\\)\\)$"),
    # an M no float holds (the estimates would raise OverflowError at plan time)
    (lambda o: o.update(m_values=[1, 2, 4, 8, 16, 32, 10 ** 400]), "m_values must be <= 2147483647"),
    # a thread count, or one profile at one, without times: the choice would go to the others
    (lambda o: o.update(thread_counts=[1, 2, 3]),
     "64x64 F32: times at 3 threads for no profile; ggml-tune benches cpu, blas, blas-mt"),
    (lambda o: o["shapes"][0]["profiles"][0]["times_us"].pop("2"),
     "times at 2 threads for blas, blas-mt; ggml-tune benches cpu, blas, blas-mt"),
    (lambda o: o["shapes"][0]["profiles"][2]["times_us"].update({"1": {"compute": [1.0] * 7}}),
     "times at 1 thread for cpu, blas, blas-mt; ggml-tune benches cpu, blas"),
    # thread counts written otherwise than str(n): "02" and "2" would both be 2, the last winning
    (lambda o: o["shapes"][0]["profiles"][0]["times_us"].update({"02": o["shapes"][0]["profiles"][0]["times_us"]["2"]}),
     "'02' threads"),
    (lambda o: o["shapes"][0]["profiles"][0]["times_us"].update({"\u0661": {}}), "threads; the keys are"),
    # more threads than a pool may have; flags written as JSON booleans
    (lambda o: o.update(thread_counts=[1, 2, 257]), "thread_counts must be <= 256"),
    (lambda o: o["shapes"][0]["profiles"][0].update(stages=[[True, True, False]] * 2 + [[0, 0, 0]]),
     "3 lists of 3 flags"),
])
def test_bad_files_are_rejected_with_a_reason(tmp_path, edit, match):
    obj = synthetic_data().to_json()
    edit(obj)
    with pytest.raises(TuneFileError, match=match):
        tune.load(write_json(tmp_path / "bad.json", obj))


@pytest.mark.parametrize("edit, match", [
    (lambda o: o.update(thread_counts=[1, 2, 3]), "times at 3 threads for no profile"),
    # blas-mt is blas at one thread: a column of it there is not what ggml-tune writes
    (lambda o: o["shapes"][0]["profiles"][2]["times_us"].update({"1": {"compute": [1.0] * 7}}),
     "times at 1 thread for cpu, blas, blas-mt; ggml-tune benches cpu, blas"),
    (lambda o: o["shapes"][0]["profiles"][0]["times_us"].pop("2"),
     "times at 2 threads for blas, blas-mt; ggml-tune benches cpu, blas, blas-mt"),
])
def test_a_file_from_another_machine_is_still_checked_whole(tmp_path, edit, match):
    # ggml-tune analyze reads files of other machines (check_system=False): their
    # profiles are not this build's, but every one of them must be timed where ggml-tune
    # times it, or the table would show a winner among what is left
    obj = synthetic_data().to_json()
    obj["system"].update(cpu="Another CPU", blas="another BLAS")
    assert tune.load(write_json(tmp_path / "good.json", obj), check_system=False).shapes
    edit(obj)
    with pytest.raises(TuneFileError, match=match):
        tune.load(write_json(tmp_path / "bad.json", obj), check_system=False)


def test_load_checks_its_thread_count(tmp_path):
    path = tmp_path / "t.json"
    synthetic_data().save(path)
    assert tune.load(path, n_threads=2).thread_counts == [1, 2]
    with pytest.raises(ValueError, match="load: n_threads must be in 1..256, got 0") as info:
        tune.load(path, n_threads=0)        # asked wrongly: not the file's fault
    assert not isinstance(info.value, TuneFileError)


def test_a_key_twice_in_one_object_is_rejected(tmp_path):
    # json.loads would keep the last silently
    text = json.dumps(synthetic_data().to_json())
    (tmp_path / "dup.json").write_text(text.replace('"model": ', '"model": "other", "model": ', 1))
    with pytest.raises(TuneFileError, match="key 'model' appears twice in one object"):
        tune.load(tmp_path / "dup.json")


def test_truncated_missing_and_other_model_files(tmp_path):
    path = tmp_path / "tune.json"
    synthetic_data().save(path)
    text = path.read_text()
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    with pytest.raises(TuneFileError, match="truncated"):
        tune.load(tmp_path / "cut.json")
    with pytest.raises(TuneFileError, match="cannot read"):
        tune.load(tmp_path / "missing.json")
    with pytest.raises(TuneFileError, match="benched for model 'synthetic', not 'other'"):
        tune.load(path, model="other")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TuneFileError):
        tune.load(tmp_path / "binary.json")


@pytest.mark.parametrize("text", ['{"format": "ggml_py-mulmat-tune", "version": 1e999}',
                                  "[" * 100000 + "]" * 100000])
def test_numbers_and_nesting_beyond_python_are_rejected(tmp_path, text):
    obj = synthetic_data().to_json()
    (tmp_path / "big.json").write_text(json.dumps(obj).replace('"n": 64', '"n": 1e999'))
    with pytest.raises(TuneFileError, match="n must be an integer"):
        tune.load(tmp_path / "big.json")
    (tmp_path / "odd.json").write_text(text)
    with pytest.raises(TuneFileError):
        tune.load(tmp_path / "odd.json")


def test_a_huge_or_endless_file_is_not_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(tune, "MAX_FILE_BYTES", 1000)
    (tmp_path / "big.json").write_text(" " * 2000)
    with pytest.raises(TuneFileError, match="over"):
        tune.load(tmp_path / "big.json")
    with pytest.raises(TuneFileError, match="not a regular file or a pipe"):
        tune.load("/dev/zero")            # a device: endless
    read, write = os.pipe()               # a pipe kept open: endless too, read up to the limit
    os.write(write, b" " * 2000)
    errors = []

    def load():
        try:
            tune.load(f"/dev/fd/{read}")
        except TuneFileError as exc:
            errors.append(str(exc))
    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(10)
    read_to_the_end = reader.is_alive()   # waiting for an end that never comes
    os.close(write)                       # (frees it)
    reader.join(10)
    os.close(read)
    assert not read_to_the_end and len(errors) == 1 and "over" in errors[0]


def test_a_pipe_is_read_and_a_fifo_without_writer_is_not_waited_on(tmp_path, unblocked):
    synthetic_data().save(tmp_path / "t.json")
    read, write = os.pipe()               # as `--tune-file <(zcat t.json.gz)`
    writer = threading.Thread(target=lambda: (os.write(write, (tmp_path / "t.json").read_bytes()),
                                              os.close(write)))
    writer.start()
    assert tune.load(f"/dev/fd/{read}", check_system=False).thread_counts == [1, 2]
    writer.join()
    os.close(read)
    os.mkfifo(tmp_path / "fifo.json")     # nobody writes: read as empty, at once
    error = unblocked(tmp_path / "fifo.json", lambda: tune.load(tmp_path / "fifo.json"))
    assert isinstance(error, TuneFileError) and "corrupt or truncated" in str(error)
    with pytest.raises(TuneFileError, match="Is a directory"):
        tune.load(tmp_path)


def test_thread_counts_in_any_order_are_read_as_a_set(tmp_path):
    obj = synthetic_data().to_json()
    obj["thread_counts"] = [2, 1, 2]              # as an older tune_vs_oracle.py wrote them
    assert tune.load(write_json(tmp_path / "t.json", obj)).thread_counts == [1, 2]


def test_a_missing_model_is_reported_as_missing_not_compared_with_the_output(tmp_path, capsys):
    out = tmp_path / "t.json"
    out.write_text("{}")
    assert tune_main(["-m", str(tmp_path / "none.gguf"), "-o", str(out), "-q"]) == 1
    assert "none.gguf: no such file" in capsys.readouterr().err


def test_a_file_benched_at_other_thread_counts_is_refused_when_asked(tmp_path):
    synthetic_data(thread_counts=(1,)).save(tmp_path / "t.json")
    assert tune.load(tmp_path / "t.json", n_threads=1).thread_counts == [1]
    with pytest.raises(TuneFileError, match="benched at 1 thread, not at 2 nor on both sides"):
        tune.load(tmp_path / "t.json", n_threads=2)
    synthetic_data(thread_counts=(1, 4)).save(tmp_path / "t.json")
    assert tune.load(tmp_path / "t.json", n_threads=3).thread_counts == [1, 4]   # between
    with pytest.raises(TuneFileError, match="benched at 1, 4 threads, not at 5"):
        tune.load(tmp_path / "t.json", n_threads=5)


def test_the_plan_runs_the_nodes_own_flags_whatever_the_file_says(tmp_path):
    # read without the build check (as `ggml-tune analyze` does), a file whose
    # blas COMPUTE claims to run on every thread must still not make it so
    obj = synthetic_data().to_json()
    obj["shapes"][0]["profiles"][1]["stages"] = [[0, 0, 0], [1, 1, 0], [0, 0, 0]]
    obj["shapes"][0]["profiles"][1]["times_us"]["2"]["compute"] = [1.0] * 7   # the fastest
    data = tune.load(write_json(tmp_path / "flags.json", obj), check_system=False)
    graph, y, ref = mul_mat_graph(64)
    row = graph.plan(2, tune=data).rows[-1]
    assert row.reason == "tuned" and row.profile == graph.nodes[-1].profiles()[1]
    assert not row.profile.compute.parallel
    graph.compute(n_threads=2)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-4)



def test_a_profile_whose_stages_differ_from_the_nodes_is_not_taken(tmp_path):
    # same ids, but each profile's INIT valid where the node's is not (or the other way
    # round): another code path than the one benched, so no estimate is trusted
    obj = synthetic_data().to_json()
    for profile in obj["shapes"][0]["profiles"]:
        now_valid = 1 - profile["stages"][0][0]
        profile["stages"][0] = [now_valid, 0, 0]
        for times in profile["times_us"].values():
            times.pop("init", None)
            if now_valid:
                times["init"] = [1.0] * 7
    data = tune.load(write_json(tmp_path / "paths.json", obj), check_system=False)
    graph, _, _ = mul_mat_graph(64)
    assert graph.plan(2, tune=data).rows[-1].reason == "fallback"

def test_save_replaces_a_file_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    synthetic_data().save(path)
    before = path.read_text()

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(json, "dump", fail)
    with pytest.raises(OSError):
        synthetic_data(thread_counts=(1,)).save(path)
    assert path.read_text() == before and [p.name for p in tmp_path.iterdir()] == ["t.json"]


def test_where_a_tune_file_cannot_go(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    for path, match in [("", "needs a name"), (tmp_path, "is a directory"),
                        (tmp_path / "no" / "t.json", "no such folder"),
                        (f"{tmp_path}/new/", "is a directory"), (f"{model}/", "is a directory"),
                        ("/dev/null", "not a regular file"), (model, "is the model file")]:
        with pytest.raises(TuneFileError, match=match):
            tune.check_writable(str(path), not_over=model)
    tune.check_writable(str(tmp_path / "t.json"), not_over=model)
    assert [p.name for p in tmp_path.iterdir()] == ["model.gguf"]   # leaves nothing behind
    for path, match in [("", "needs a name"), ("/dev/null", "not a regular file")]:
        with pytest.raises(TuneFileError, match=match):      # save's own checks, the same rules
            synthetic_data().save(path)


def mul_mat_graph(m, contiguous=True):
    rng = np.random.default_rng(0)
    ctx = gg.Context(mem_size=8 << 20)
    a = ctx.from_numpy(rng.standard_normal((64, 64)).astype(np.float32))
    if contiguous:
        b = ctx.from_numpy(rng.standard_normal((m, 64)).astype(np.float32))
    else:
        b = gg.transpose(ctx.from_numpy(rng.standard_normal((64, m)).astype(np.float32)))
    y = gg.mul_mat(a, b)
    return gg.build_forward(y), y, b.numpy() @ a.numpy().T if contiguous else None


def test_a_shape_is_matched_by_n_and_k_not_the_other_way_round():
    # a (96, 64) weight: N = 96 rows of K = 64; data for 96x64 is its, data for 64x96 is not
    for n, k, reason in ((96, 64, "tuned"), (64, 96, "fallback")):
        data = synthetic_data()
        data.shapes[0] = dataclasses.replace(data.shapes[0], n=n, k=k)
        ctx = gg.Context(mem_size=1 << 20)
        y = gg.mul_mat(ctx.new_tensor(gg.F32, (96, 64)), ctx.new_tensor(gg.F32, (4, 64)))
        assert gg.build_forward(y).plan(1, tune=data).rows[-1].reason == reason


def test_plan_uses_tune_data_and_falls_back():
    data = synthetic_data()
    graph, y, _ = mul_mat_graph(4)
    row = graph.plan(1, tune=data).rows[-1]
    assert (row.reason, row.profile.name) == ("tuned", "cpu")
    assert row.estimate_us == pytest.approx(41.0)
    row = graph.plan(3, tune=data).rows[-1]          # past the thread counts in the data
    assert row.reason == "fallback" and row.estimate_us is None
    # ggml's rule, on one thread: 64 x 64 x 4 multiply-adds are too few for three
    default = graph.nodes[-1].default_profile()
    assert row.profile == default.with_stage("init", parallel=False).with_stage("compute", parallel=False)
    row = graph.plan(2).rows[-1]
    assert row.reason == "fallback"


def test_tune_data_of_the_wrong_kind_is_a_type_error_and_changes_nothing(tmp_path):
    graph, _, _ = mul_mat_graph(4)
    with pytest.raises(TypeError, match="plan: tune must be a TuneData or None, got dict"):
        graph.plan(1, tune={"x": 1})
    from llama_models import model_path
    tokens = [1, 300, 301, 302]
    llm = gg.Llama(model_path("f32"), n_ctx=32, n_threads=1)
    before = llm.eval(tokens).copy()
    for bad in ({"x": 1}, 3, [synthetic_data()]):
        with pytest.raises(TypeError, match="set_tune: tune must be a TuneData or None"):
            llm.set_tune(bad)
        assert llm.model.tune is None
    llm.reset()
    np.testing.assert_array_equal(llm.eval(tokens), before)   # the Llama still runs
    with pytest.raises(TuneFileError, match="missing.json: cannot read tune file"):
        llm.set_tune(bytes(tmp_path / "missing.json"))   # bytes name a file, as a model path does


def test_batched_products_are_left_to_ggmls_rule():
    # tune data times one product of M rows; (2, M, K) x (N, K) is two products
    data = synthetic_data()
    ctx = gg.Context(mem_size=8 << 20)
    a = ctx.from_numpy(np.ones((64, 64), np.float32))
    y = gg.mul_mat(a, ctx.from_numpy(np.ones((2, 4, 64), np.float32)))
    row = gg.build_forward(y).plan(1, tune=data).rows[-1]
    assert row.reason == "fallback" and row.profile == y.default_profile()


def test_plan_never_chooses_a_profile_the_node_lacks():
    # the synthetic data says "blas" is fastest at M=64; a transposed (non-contiguous)
    # operand only has the CPU profile, so the planner must keep it
    data = synthetic_data()
    graph, y, _ = mul_mat_graph(64, contiguous=False)
    node = graph.nodes[-1]
    assert [p.name for p in node.profiles()] == ["cpu"]
    row = graph.plan(1, tune=data).rows[-1]
    assert row.profile.name == "cpu"


def test_profiles_set_by_hand_are_kept():
    data = synthetic_data()
    graph, y, _ = mul_mat_graph(4)
    node = graph.nodes[-1]
    node.profile = node.profile.with_stage("compute", parallel=False)
    row = graph.plan(1, tune=data).rows[-1]
    assert row.reason == "user" and not row.profile.compute.parallel


def test_bench_measures_every_profile_and_stage(tmp_path):
    shapes = [(96, 64, gg.F32)]
    data = bench(shapes, model="tiny", m_values=[1, 4, 16], thread_counts=[1, 2], passes=1)
    shape = data.shape(96, 64, gg.F32)
    names = {p.profile.name for p in shape.profiles}
    shape_profiles = gg.task_profiles(gg.Op.MUL_MAT, gg.F32, gg.F32)
    assert {p.name for p in shape_profiles} <= names
    for p in shape.profiles:
        assert set(p.times_us) == {t for t in (1, 2) if p.profile in distinct_profiles(shape_profiles, t)}
        for t, per in p.times_us.items():
            valid = {s for s, f in zip(("init", "compute", "finalize"), p.profile.stages) if f.valid}
            assert set(per) == valid
            assert all(len(v) == 3 and all(x >= 0 for x in v) for v in per.values())
    data.save(tmp_path / "t.json")
    assert tune.load(tmp_path / "t.json").to_json() == data.to_json()
    # a tuned plan computes the same numbers
    graph, y, ref = mul_mat_graph(4)
    graph.plan(2, tune=data)
    graph.compute(n_threads=2)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-4)


def test_cli_bench_and_analyze(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert tune_main(["--model-shape", "1.1B", "--type", "F32", "--m-max", "1", "--n-threads", "1",
                      "--kv-types", "none", "-o", str(out), "-q"]) == 0
    data = tune.load(out)
    assert {s.key[:2] for s in data.shapes} == {s[:2] for s in preset_shapes("1.1B", gg.F32)}
    capsys.readouterr()
    assert tune_main(["analyze", str(out), "--plot", str(tmp_path / "t.png")]) == 0
    text = capsys.readouterr().out
    assert "# N=2048 K=2048 type=F32 n_threads=1" in text and "M,cpu_us" in text
    assert (tmp_path / "t.png").stat().st_size > 1000


def test_by_default_ggml_tune_benches_the_thread_count_ggml_main_runs_at(tmp_path, monkeypatch):
    import ggml_py.core.graph
    from ggml_py.cli import tune as tune_cli
    asked = []

    def fake_bench(shapes, thread_counts, **kwargs):
        asked.append(thread_counts)
        return synthetic_data()
    monkeypatch.setattr(tune_cli, "bench", fake_bench)
    for cores, expected in [(8, [1, 2, 8]), (2, [1, 2]), (1, [1, 2])]:
        monkeypatch.setattr(ggml_py.core.graph, "default_threads", lambda: cores)
        assert tune_main(["--model-shape", "1.1B", "-o", str(tmp_path / "t.json"), "-q",
                          "--kv-types", "none"]) == 0
        assert asked.pop() == expected


def test_without_a_model_ggml_tune_benches_the_bundled_one(tmp_path, monkeypatch):
    from ggml_py.cli import tune as tune_cli
    from ggml_py.files.gguf_reader import GGUFModelFile
    from ggml_py.model.bundled import default_model_path
    from ggml_py.model.weights import matrix_shapes
    asked = []

    def fake_bench(shapes, model, **kwargs):
        asked.append((model, shapes))
        return synthetic_data()
    monkeypatch.setattr(tune_cli, "bench", fake_bench)
    assert tune_main(["-o", str(tmp_path / "t.json"), "-q", "--kv-types", "none"]) == 0
    assert asked == [matrix_shapes(GGUFModelFile(default_model_path()))]
    assert tune.load(tmp_path / "t.json").model == "synthetic"


def test_ggml_tune_benches_the_attention_of_each_kv_type(tmp_path, monkeypatch):
    from ggml_py.cli import tune as tune_cli
    from ggml_py.tune.attention import bench_attention
    asked = []
    monkeypatch.setattr(tune_cli, "bench", lambda *args, **kwargs: synthetic_data())

    def small(shapes, thread_counts):
        asked.append(shapes)
        return bench_attention(shapes, thread_counts, tokens=[1], lengths=[8, 16], repetitions=1)
    monkeypatch.setattr(tune_cli, "bench_attention", small)
    assert tune_main(["-o", str(tmp_path / "t.json"), "-q", "--kv-types", "int8,q4_0,f16",
                      "--n-threads", "1"]) == 0
    # the bundled model: heads of 32, 8 of them, 8 KV heads
    assert asked == [[(32, 8, 8, gg.I8, gg.I8), (32, 8, 8, gg.Q4_0, gg.Q4_0),
                      (32, 8, 8, gg.F16, gg.F16)]]
    data = tune.load(tmp_path / "t.json")
    assert [a.key for a in data.attention] == asked[0]
    assert data.attention_estimates(32, 8, 8, gg.I8, gg.I8, 1, 12, 1)
    with pytest.raises(SystemExit):
        tune_main(["-o", str(tmp_path / "t.json"), "--kv-types", "q5_0"])


def test_cli_errors(tmp_path, capsys):
    assert tune_main(["analyze", str(tmp_path / "none.json")]) == 1
    assert "cannot read" in capsys.readouterr().err
    for args, message in ((["--type", "Q9", "-o", "x"], "argument --type: unknown weight type 'Q9'"),
                          (["--m-max", "40", "-o", str(tmp_path / "x")], "--m-max must be in 1..12")):
        with pytest.raises(SystemExit) as stop:
            tune_main(["--model-shape", "1.1B", *args])
        assert stop.value.code == 2 and message in capsys.readouterr().err


def test_cli_checks_its_output_before_benching(tmp_path, capsys, monkeypatch):
    def no_bench(*args, **kwargs):
        raise AssertionError("benched before finding the output unwritable")
    monkeypatch.setattr("ggml_py.cli.tune.bench", no_bench)
    for out in (tmp_path / "missing" / "t.json", tmp_path):
        assert tune_main(["--model-shape", "1.1B", "-o", str(out), "-q"]) == 1
        assert "ggml-tune: error:" in capsys.readouterr().err
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert tune_main(["-m", str(model), "-o", str(model), "-q"]) == 1
    assert "is the model file" in capsys.readouterr().err
    assert model.read_bytes() == b"GGUF"


@pytest.mark.parametrize("args, match", [
    (["--type", "I8"], "I8 weights have no matrix product kernel"),
    (["--type", "Q8_K"], "Q8_K weights have no matrix product kernel"),
    (["--n-threads", "1,99999999999999999999"], "n-threads"),
])
def test_cli_refuses_types_and_thread_counts_it_cannot_run(tmp_path, capsys, args, match):
    with pytest.raises(SystemExit):
        tune_main(["--model-shape", "1.1B", *args, "-o", str(tmp_path / "t.json")])
    assert match in capsys.readouterr().err


@pytest.mark.parametrize("args, match", [
    (["-m", "model.gguf", "--type", "F16"], "--type goes with --model-shape"),
    (["--type", "F16"], "--type goes with --model-shape"),     # the bundled model's own types
    (["--model-shape", "1.1B", "--m-max", "13"], "--m-max must be in 1..12"),
    (["--model-shape", "1.1B", "--m-max", "0"], "--m-max must be in 1..12 (two Ms or more"),
    (["--model-shape", "1.1B", "--passes", "0"], "--passes must be >= 1"),
    (["--model-shape", "1.1B", "--type", "Q8_K"], "argument --type: Q8_K weights have no matrix"),
    (["--model-shape", "1.1B", "--bogus"], "unrecognized arguments: --bogus"),
    (["-m", ""], "argument -m/--model: expected a file name, got ''"),
    (["-m", "", "--type", "Q4_0"], "argument -m/--model: expected a file name"),
])
def test_cli_bad_flags_end_in_one_line_and_status_2(tmp_path, capsys, args, match):
    with pytest.raises(SystemExit) as stop:
        tune_main([*args, "-o", str(tmp_path / "t.json")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("ggml-tune: error: ") and match in err
    assert err.count("\n") == 1


def test_weight_types_of_a_model_must_have_a_kernel():
    from ggml_py.tune.bench import weight_type
    assert weight_type(int(gg.Q4_0), "w") == gg.Q4_0
    with pytest.raises(ValueError, match="w: tensor type 9999 is not supported"):
        weight_type(9999, "w")
    with pytest.raises(ValueError, match="w: I8 weights have no matrix product kernel"):
        weight_type(int(gg.Type.I8), "w")


def test_analyze_plot_paths(tmp_path, capsys, monkeypatch):
    path = tmp_path / "t.json"
    synthetic_data().save(path)
    assert tune_main(["analyze", str(path), "--plot", str(tmp_path / "pic")]) == 0
    assert f"plot -> {tmp_path / 'pic.png'}" in capsys.readouterr().out
    assert (tmp_path / "pic.png").stat().st_size > 1000
    assert tune_main(["analyze", str(path), "--plot", str(tmp_path / "dot.")]) == 0
    assert f"plot -> {tmp_path / 'dot.png'}" in capsys.readouterr().out     # the file written
    assert (tmp_path / "dot.png").is_file()
    for bad, match in [(tmp_path, "is a directory"), ("", "needs a file name"),
                       (tmp_path / "x.xyz", "matplotlib cannot write '.xyz' files; one of"),
                       (tmp_path / "a.tar.gz", "cannot write '.gz' files"),
                       (tmp_path / "none" / "x.png", "no such folder")]:
        assert tune_main(["analyze", str(path), "--plot", str(bad)]) == 1
        captured = capsys.readouterr()
        assert match in captured.err and captured.out == ""     # refused before any CSV
    # a tune file named like a picture, drawn over itself: refused, the file kept
    shutil.copy(path, tmp_path / "t.png")
    for bad in (tmp_path / "t.png", tmp_path / "." / "t.png"):
        assert tune_main(["analyze", str(tmp_path / "t.png"), "--plot", str(bad)]) == 1
        assert "is the tune file being read" in capsys.readouterr().err
    assert (tmp_path / "t.png").read_bytes() == path.read_bytes()
    # a format matplotlib names but cannot draw here (pgf without LaTeX): refused before any CSV
    from matplotlib.figure import Figure
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (_ for _ in ()).throw(
        RuntimeError("'xelatex' not found; install it")))
    assert tune_main(["analyze", str(path), "--plot", str(tmp_path / "p.pgf")]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip().endswith(
        "matplotlib cannot draw pgf here (RuntimeError: 'xelatex' not found; install it)")
    monkeypatch.undo()
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    assert tune_main(["analyze", str(path), "--plot", str(tmp_path / "x.png")]) == 1
    assert "--plot needs matplotlib: pip install 'ggml_py[plot]'" in capsys.readouterr().err


def test_analyze_reports_crossovers():
    import io
    out = io.StringIO()
    analyze(synthetic_data(), out)
    assert "# crossover: cpu -> blas between M=16 and M=32" in out.getvalue()


def test_cache_sizes_are_read():
    from ggml_py.tune.bench import cache_sizes, parse_cpu_list
    sizes = cache_sizes(2)
    assert sizes == sorted(sizes) and all((1 << 16) <= s <= (1 << 34) for s in sizes)
    assert parse_cpu_list("0-3,8\n") == [0, 1, 2, 3, 8]


def test_main_tune_checks_the_file_first_and_benches_ms_up_to_the_context(tmp_path, capsys,
                                                                          monkeypatch):
    from ggml_py.cli.main import cli
    benched = []

    def recording_bench(shapes, model, m_values, thread_counts):
        benched.append(m_values)
        return TuneData(model=model, m_values=m_values, thread_counts=thread_counts)
    monkeypatch.setattr("ggml_py.tune.bench.bench", recording_bench)
    for bad in ("", str(tmp_path)):
        assert cli(["-c", "64", "--tune", "--tune-file", bad]) == 1
        assert "ggml-main: error:" in capsys.readouterr().err and not benched
    assert cli(["-c", "64", "-b", "65536", "--tune", "--tune-file", str(tmp_path / "t.json")]) == 0
    assert benched == [[1, 2, 4, 8, 16, 32, 64]]     # a batch is never larger than the context
