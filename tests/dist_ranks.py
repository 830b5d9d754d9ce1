"""What each rank runs for tests/test_dist.py, under `mpiexec -n 2 python dist_ranks.py
WHAT ...`: rank 0 prints one JSON line of results for the test to check (the others
print nothing); an assertion that fails on any rank ends the job with its traceback.

    allreduce            gg.all_reduce against numpy's sum of every rank's data, and
                         the gathering of the logits (whole, or each rank's top k)
    model PATH|bundled   a split model against one process: greedy text (generate, a
                         batch, a context shift in both), logits (of a prompt, and of
                         the same tokens fed through a context shift), perplexity, tune data
"""
import json
import sys

import numpy as np
from mpi4py import MPI

import ggml_py as gg

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


def data(shape, rank, seed):
    return np.random.default_rng([seed, rank]).standard_normal(shape).astype(np.float32)


def check_all_reduce():
    cases = 0
    for seed, shape in enumerate([(1, 7), (33, 64), (2, 3, 40), (5,)]):
        for threads in (1, 2):
            ctx = gg.Context(mem_size=1 << 20)
            a = ctx.new_tensor(gg.F32, shape)
            b = ctx.new_tensor(gg.F32, shape)
            s = gg.add(a, b)                       # the op before writes into MPI's buffer
            y = gg.all_reduce(s, COMM)
            out = gg.scale(y, 0.5)                 # and the one after reads it in place
            graph = gg.build_forward(out)
            assert y.data_ptr == s.data_ptr and y.profile.name == "comm"
            flags = y.profile.compute
            assert flags.valid and not flags.parallel and flags.wait and not y.profile.init.valid
            a.numpy()[...] = data(shape, RANK, 2 * seed)
            b.numpy()[...] = data(shape, RANK, 2 * seed + 1)
            graph.compute(n_threads=threads)
            want = sum(data(shape, r, 2 * seed) + data(shape, r, 2 * seed + 1)
                       for r in range(SIZE))
            assert np.allclose(out.numpy(), 0.5 * want, rtol=1e-6, atol=1e-6), shape
            cases += 1
    # a profile set to run on every thread still reduces once (not once per thread)
    ctx = gg.Context(mem_size=1 << 20)
    a = ctx.new_tensor(gg.F32, (4, 8))
    y = gg.all_reduce(gg.scale(a, 1.0), COMM)
    y.profile = y.profile.with_stage("compute", parallel=True, wait=False)
    a.numpy()[...] = RANK + 1
    gg.build_forward(y).compute(n_threads=2)
    assert (y.numpy() == sum(range(1, SIZE + 1))).all()
    return cases + 1


def check_gather_logits():
    """gather_logits: rank 0 gets every rank's columns, whole or as each rank's top k
    (-inf elsewhere); a NaN logit is never a candidate."""
    from ggml_py.dist.channel import gather_logits
    bounds = [0, 5, 11] if SIZE == 2 else list(range(0, 4 * SIZE + 1, 4))   # unequal shares
    full = np.random.default_rng(7).standard_normal((3, bounds[-1])).astype(np.float32)
    full[1, 2] = np.nan
    full[2, bounds[:-1]] = np.nan                       # a NaN first in each rank's share
    full[1, 3] = 100.0                                  # row 1's best, beside a NaN
    local = full[:, bounds[RANK]:bounds[RANK + 1]]
    whole = gather_logits(COMM, local, bounds, None)
    top = {k: gather_logits(COMM, local, bounds, k) for k in (1, 2)}
    if RANK != 0:
        assert whole is None and top[1] is None
        return 0
    assert np.array_equal(whole, full, equal_nan=True)
    for k, got in top.items():
        for i in range(3):
            for r in range(SIZE):
                share = np.nan_to_num(full[i, bounds[r]:bounds[r + 1]], nan=-np.inf)
                best = bounds[r] + np.argsort(-share, kind="stable")[:k]
                assert np.array_equal(got[i, best], full[i, best]), (k, i, r)
            assert np.isfinite(got[i]).sum() == k * SIZE and not np.isnan(got[i]).any()
    assert np.argmax(top[1][1]) == 3
    return 1


def check_all_reduce_and_gather():
    cases = check_all_reduce() + check_gather_logits()
    if RANK == 0:
        print(json.dumps({"cases": cases}))


def run_model(path):
    """Rank 0's results of every check with this Llama (the other ranks serve)."""
    llm = gg.Llama(path, n_ctx=256, n_threads=1, n_seq_max=3, comm=COMM)
    model = llm.model
    if llm.rank > 0:
        llm.serve()
        COMM.gather(model.tune is not None)
        return None
    results = model_checks(llm, path)
    llm.close()
    results["tuned_ranks"] = COMM.gather(model.tune is not None)
    return results


def model_checks(llm, path):
    prompts = ["ROMEO.", "JULIET. O Romeo, Romeo, wherefore art thou", "KING"]
    out = {"greedy": "".join(llm.generate(prompts[0], max_tokens=24, temperature=0))}
    out["sampled"] = "".join(llm.generate(prompts[1], max_tokens=16, temperature=0.8, seed=3,
                                          top_k=20))
    out["shifted"] = "".join(llm.generate(prompts[2], max_tokens=300, temperature=0,
                                          context_shift=True, keep=2, ignore_eos=True))
    b = llm.batch(n_ctx_seq=64, keep=1)
    sids = [b.add(p, max_tokens=80, temperature=0, ignore_eos=True) for p in prompts]
    b.step()     # one more starts on the second's first page, which the shifts copy on every rank
    sids.append(b.add(prompts[1] + " ROMEO.", max_tokens=80, temperature=0, ignore_eos=True))
    while b.running:
        b.step()
    out["batch"] = [b.sequence(s).text for s in sids]
    ids = llm.tokenize(prompts[1])
    llm.reset()      # the prompt's own (not after the texts above, which may differ)
    out["logits"] = llm.eval(ids).tolist()
    out["shift_logits"] = shift_logits(llm, prompts)
    text = "\n".join(prompts * 12)
    out["ppl"] = llm.perplexity(text, n_ctx=32, n_chunks=3).ppl
    # tune data of the ranks' shapes (checked by set_tune) goes to every rank; the text
    # may differ from one process's (the profiles go by times measured now)
    from ggml_py.tune.bench import bench
    name, shapes = llm.matrix_shapes()
    llm.set_tune(bench(shapes, model=name, m_values=[1, 2], thread_counts=[1]))
    llm.reset()
    out["tuned"] = len(list(llm.generate_tokens(prompts[0], max_tokens=8, ignore_eos=True)))
    return out


def shift_logits(llm, prompts, n_before=4, n_after=12):
    """Logits of the same tokens (not the model's own choices, so that one process and
    the ranks are compared on equal inputs however their texts go) fed one at a time up
    to a full context and past it: the last n_before rows before the context shift
    (keep 2), then n_after after it. Where the ranks did not make the shift as rank 0
    does (each rotating its own heads' K rows), the rows after it differ by far more
    than rounding."""
    ids = llm.tokenize("\n".join(prompts * 100))[:llm.n_ctx() + n_after]
    n_fill = llm.n_ctx() - 1 - n_before
    assert len(ids) >= n_fill + n_before + n_after
    llm.reset()
    llm.eval(ids[:n_fill])
    shifts, rows = len(llm.shift_log), []
    for token in ids[n_fill:n_fill + n_before + n_after]:
        if llm.n_tokens + 1 >= llm.n_ctx():      # generate's rule
            llm.shift_context(2)
        rows.append(llm.eval([token])[0].tolist())
    assert len(llm.shift_log) == shifts + 1 and llm.shift_log[-1][0] == 2
    llm.reset()
    return rows


def check_model(path):
    path = None if path == "bundled" else path
    split = run_model(path)
    if split is None:
        return
    alone = model_checks(gg.Llama(path, n_ctx=256, n_threads=1, n_seq_max=3), path)
    out = {"split": split, "alone": alone}
    for key in ("logits", "shift_logits"):
        a, b = np.asarray(split.pop(key)), np.asarray(alone.pop(key))
        out[key + "_diff"] = np.abs(a - b).max(axis=-1).tolist()    # per row
        out[key + "_max"] = float(np.abs(b).max())
    print(json.dumps(out))


def batch_texts(llm):
    """Greedy texts of a batch of two prompts, and the V type of the pool they used."""
    b = llm.batch()
    sids = [b.add(p, max_tokens=24, temperature=0, ignore_eos=True) for p in ("ROMEO.", "KING")]
    while b.running:
        b.step()
    return [b.sequence(s).text for s in sids], llm.kv_pool().type_v.name


def check_kv_types():
    """A batch on a pool whose V type is not K's: every rank's pool stores V as asked,
    and the texts are one process's."""
    import ggml_py.dist.llama as dist_llama
    made = []                                 # the V type of each pool this rank makes

    class Recorded(dist_llama.PagedKVCache):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self.type_v.name)

    dist_llama.PagedKVCache = Recorded
    kw = dict(n_ctx=128, n_threads=1, n_seq_max=2, kv_type="f16", kv_type_v="q8_0")
    llm = gg.Llama(None, comm=COMM, **kw)
    if llm.rank > 0:
        llm.serve()
        COMM.gather(made)
        return
    split, _ = batch_texts(llm)
    llm.close()
    made_by_rank = COMM.gather(made)
    alone, alone_type = batch_texts(gg.Llama(None, **kw))
    print(json.dumps({"split": split, "alone": alone, "made": made_by_rank,
                      "alone_type": alone_type}))


if __name__ == "__main__":
    {"allreduce": check_all_reduce_and_gather, "model": lambda: check_model(sys.argv[2]),
     "kv_types": check_kv_types}[sys.argv[1]]()
