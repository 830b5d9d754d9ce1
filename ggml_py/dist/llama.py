"""`gg.Llama`: the Llama of model/session.py, which with `comm=` (an mpi4py communicator)
runs a model split over the communicator's processes (tensor parallel).

    from mpi4py import MPI
    import ggml_py as gg
    llm = gg.Llama("model.gguf", comm=MPI.COMM_WORLD)     # every rank, together
    if llm.rank > 0:
        llm.serve()          # run the steps rank 0 orders, until rank 0 closes its Llama
    else:
        print("".join(llm.generate("ROMEO.", max_tokens=32, temperature=0)))
        llm.close()          # (or at exit) ends the other ranks' serve()

Rank 0 tokenizes, schedules and samples: its Llama works as one process's does (generate,
eval, perplexity, batch()), and the other ranks follow its orders. Without comm nothing of
MPI is imported and the Llama is model/session.py's.
"""
import os
import time
import weakref

from ggml_py.core.comm import is_communicator
from ggml_py.core.graph import default_threads
from ggml_py.dist.channel import collective
from ggml_py.dist.model import MirroredPool, ShardModel
from ggml_py.dist.shard import split_matrix_shapes
from ggml_py.model.batch import Batch
from ggml_py.model.kv_paged import PagedKVCache
from ggml_py.model.llama import KV_PAD
from ggml_py.model.session import DEFAULT_SEQ_MAX
from ggml_py.model.session import Llama as _Llama
from ggml_py.model.weights import matrix_shapes


def candidates_needed(sampler):
    """Logits per row of each rank that sampler's choice needs: its top k (greedy's 1),
    plus the tokens it bans (which may be among them); None when it needs the whole
    distribution: penalties that may push any token down (a token outside a rank's top
    k then moves up), or no top-k cut (top-p or min-p over every token)."""
    p = sampler.params
    penalties = p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
    if penalties and sampler.history.maxlen != 0:
        return None
    k = 1 if p.greedy else p.top_k
    return None if k <= 0 else k + len(sampler.banned)


def _release_workers(channel):
    """Rank 0's last word to the other ranks (at close or exit): stop serving."""
    if not channel.closed:
        channel.send("close")


class Llama(_Llama):
    """A llama GGUF model ready to tokenize, evaluate and generate (model/session.py's
    Llama; its arguments, and:)

    comm: None (this process alone), or an mpi4py intracommunicator whose processes
    share the model (tensor parallel, docs/distributed.md): every rank makes its Llama
    with the same arguments at the same time; rank 0 (llm.rank == 0) uses it, the
    others call serve(). Each rank maps the file and reads only its share of the
    weights; its KV cache holds its heads. The ranks' count must divide the model's
    n_head_kv (ValueError on every rank otherwise). n_threads None: the cores of this
    host shared among the ranks on it.
    """

    _init_frames = 1   # its warnings point at the caller's line, past this __init__

    def __init__(self, model_path=None, n_ctx=None, n_threads=None, n_batch=512, kv_type="f16",
                 kv_pad=KV_PAD, make_cache=None, use_mmap=True, n_seq_max=DEFAULT_SEQ_MAX,
                 clock=time.perf_counter, kv_type_v=None, attention="auto", comm=None, repack=True):
        self.comm = comm
        self.rank, self.n_ranks = 0, 1
        if comm is None:
            super().__init__(model_path, n_ctx, n_threads, n_batch, kv_type, kv_pad, make_cache,
                             use_mmap, n_seq_max, clock, kv_type_v, attention, repack)
            return
        if not is_communicator(comm):
            raise TypeError(f"Llama: comm must be an mpi4py intracommunicator (such as "
                            f"MPI.COMM_WORLD), got {type(comm).__name__}")
        self.rank, self.n_ranks = comm.Get_rank(), comm.Get_size()
        # (a collective call: on every rank, whether or not its n_threads is None, so
        # that ranks given other thread counts still meet in _agree)
        on_host = comm.Split_type(_mpi().COMM_TYPE_SHARED)
        if n_threads is None:     # the cores of this host, shared by its ranks
            n_threads = max(1, default_threads() // on_host.Get_size())
        on_host.Free()
        error = None
        try:
            super().__init__(model_path, n_ctx, n_threads, n_batch, kv_type, kv_pad, make_cache,
                             use_mmap, n_seq_max, clock, kv_type_v, attention, repack)
        except Exception as exc:   # noqa: BLE001 - every rank must hear of it (they wait)
            error = exc
        self._agree(error, None if error is not None else
                    (self.n_ctx(), self._kv_type.name, self._kv_type_v.name, n_batch, n_seq_max,
                     self.model.file.n_params))
        model = self.model
        self._serving = False
        if self.rank == 0:
            self._release = weakref.finalize(self, _release_workers, model.channel)
        model.started = True

    def _agree(self, error, facts):
        """Every rank learns whether every rank loaded, and that they agree on what the
        steps depend on; the same exception on every rank otherwise."""
        results = self.comm.allgather((None if error is None else f"{error}", facts))
        failed = [(r, message) for r, (message, _) in enumerate(results) if message]
        if failed:
            text = "; ".join(f"rank {r}: {message}" for r, message in failed)
            if error is not None and len(failed) == self.n_ranks and \
                    len({m for _, m in failed}) == 1:
                raise error         # the same on every rank (a model that cannot be split)
            raise ValueError(f"the split model did not load on every rank: {text}") from error
        other = next((r for r, (_, f) in enumerate(results) if f != results[0][1]), None)
        if other is not None:
            raise ValueError(f"rank {other} loaded another model or context than rank 0 "
                             f"(n_ctx, KV type, n_batch, n_seq_max, parameters: "
                             f"{results[other][1]} against {results[0][1]}): every rank "
                             f"must load the same file with the same arguments")

    def _make_model(self, path, **kwargs):
        if self.comm is None:
            return super()._make_model(path, **kwargs)
        return ShardModel(path, self.comm, **kwargs)

    @property
    def config(self):
        """The model's LlamaConfig (a rank's share: llm.model.config)."""
        return getattr(self.model, "full_config", self.model.config)

    def matrix_shapes(self):
        """(model name, distinct (N, K, type)) of the matrix products this Llama runs: the
        file's, or (split) those of every rank's share; what a tune file for it holds."""
        if self.comm is None:
            return matrix_shapes(self.model.file)
        return split_matrix_shapes(self.model.file, self.n_ranks)

    def set_tune(self, data):
        """Schedule MUL_MAT profiles with tune data (see model/session.py's Llama): a
        split model's tune file must hold its ranks' shapes (ggml-main --tp --tune
        --tune-file F benches them); rank 0's data goes to every rank."""
        if self.comm is not None and isinstance(data, (str, bytes, os.PathLike)):
            from ggml_py.tune import data as tune
            name, shapes = self.matrix_shapes()
            data = tune.load(os.fsdecode(data), model=name, shapes=shapes,
                             n_threads=self.n_threads())
        super().set_tune(data)

    def _turn(self, what):
        if self.rank > 0 and not self._serving and what != "close":
            raise RuntimeError(f"{what}: rank {self.rank} of a split model runs rank 0's steps: "
                               f"call serve() here, and use the Llama on rank 0")
        return super()._turn(what)

    def close(self):
        """Let go of the model (as model/session.py's Llama); on rank 0 of a split model,
        the other ranks' serve() returns."""
        if self.comm is not None and self.rank == 0 and hasattr(self, "_release") \
                and self._release.alive:
            with self._turn("close"):      # after a step another thread may be running
                self._release()
        super().close()

    # ---- the other ranks ---------------------------------------------------------------

    def serve(self):
        """On a rank other than 0: carry out rank 0's steps until rank 0 closes its Llama
        (or exits); then close this one. Ctrl-C is rank 0's to handle (an interrupt
        during a step ends every rank). On rank 0 (or without comm): RuntimeError."""
        if self.comm is None or self.rank == 0:
            raise RuntimeError("serve: only the ranks other than 0 of a split model serve")
        model = self.model
        self._serving = True
        try:
            # rank 0 may be waiting in a collective call for this rank: an error here
            # ends every rank rather than leave it waiting
            with collective(self.comm):
                while model.execute(model.channel.receive(), self.kv_pool):
                    pass
        finally:
            self._serving = False
        self.close()

    # ---- rank 0: what its logits must hold ---------------------------------------------

    def kv_pool(self):
        """The paged KV cache of batches (this rank's heads); on rank 0 one whose row
        moves every rank makes."""
        if self.comm is None:
            return super().kv_pool()
        if self._kv_pool is None:
            c = self.model.config       # this rank's KV heads
            pool = PagedKVCache(c.n_layer, self.n_ctx(), c.n_head_kv, c.head_dim,
                                type=self._kv_type, type_v=self._kv_type_v)
            self._kv_pool = MirroredPool(pool, self.model.channel) if self.rank == 0 else pool
        return self._kv_pool

    def _generate(self, ids, sampler, *args, **kwargs):
        steps = super()._generate(ids, sampler, *args, **kwargs)
        if self.comm is None:
            yield from steps
            return
        # the prompt's logits whole (kept for the same prompt again, whatever its sampler),
        # then each token's as the sampler needs them
        want, model = None, self.model
        try:
            while True:
                model.want = want
                try:
                    token = next(steps)
                except StopIteration:
                    return
                finally:
                    model.want = None
                yield token
                want = candidates_needed(sampler)
        finally:
            steps.close()

    def batch(self, n_ctx_seq=None, keep=0, context_shift=True, invariant=True, share_prefix=True):
        if self.comm is None:
            return super().batch(n_ctx_seq, keep, context_shift, invariant, share_prefix)
        return SplitBatch(self, self._n_seq_max, self.n_batch, n_ctx_seq=n_ctx_seq, keep=keep,
                          context_shift=context_shift, invariant=invariant, share_prefix=share_prefix)


class SplitBatch(Batch):
    """The batch scheduler on rank 0 of a split model: each step gathers the logits its
    sequences' samplers need (the largest top k of them, or whole rows when one needs
    the whole distribution or log-probabilities)."""

    def _run(self, plan):
        sampled = [s for s, n in plan if s.n_cached + n == len(s.ids)]
        wants = [None if s.logprobs_n is not None else candidates_needed(s.sampler)
                 for s in sampled]
        self.model.want = None if None in wants or not wants else max(wants)
        try:
            return super()._run(plan)
        finally:
            self.model.want = None


def _mpi():
    from mpi4py import MPI  # (a communicator was given: loaded already)
    return MPI

