"""ShardModel: one rank's share of a llama model split over the processes of an MPI
communicator (tensor parallel; the split: shard.py).

Every rank builds the same graphs over its share of the weights, each attention and
feed-forward block ending in an all-reduce node (gg.all_reduce). Rank 0 runs the Llama
(tokenizer, sequence, sampling, the batch scheduler); whatever it asks of its model it
first orders the other ranks to do too (channel.py): a forward pass, a batch step (its
inputs: tokens, positions, KV slots and slot lists), a change of the KV cache. The
logits come back to rank 0 whole or as each rank's top candidates (`want`).
"""
import numpy as np

from ggml_py.core import ops
from ggml_py.core.graph import thread_count
from ggml_py.dist.channel import Channel, collective, gather_logits
from ggml_py.dist.shard import Shard
from ggml_py.model.config import LlamaConfig
from ggml_py.model.context_shift import rope_rotation
from ggml_py.model.llama import LlamaModel
from ggml_py.model.weights import LlamaWeights


class ShardModel(LlamaModel):
    """This rank's LlamaModel of a model split over `comm`'s ranks: its heads, its
    feed-forward columns and its rows of the output matrix; its KV cache holds its
    KV heads only. `config` is this rank's (its n_head, n_head_kv, n_ff);
    `full_config` the model's."""

    def __init__(self, path, comm, **kwargs):
        self.comm = comm
        self.channel = Channel(comm)
        self.rank, self.size = self.channel.rank, self.channel.size
        self.want = None         # rank 0: candidates per row its next logits need (None: all)
        self.started = False     # rank 0's changes go to the others once they serve
        super().__init__(path, **kwargs)
        self.reduce = self._all_reduce
        if self.rank == 0:
            self._mirror = MirroredKVCache(self._cache, self.channel)

    def _load(self, f):
        config = LlamaConfig.from_gguf(f)
        whole = LlamaWeights.from_gguf(f, config)
        self.full_config = config
        self.shard = Shard.of(config, self.rank, self.size, whole.layers[0].w_down.type)
        weights, self.copies = self.shard.weights(whole, config)
        return self.shard.config(config), weights

    def _all_reduce(self, x):
        return ops.all_reduce(x, self.comm)

    @property
    def cache(self):
        """The KV cache (this rank's heads); on rank 0 one whose changes every rank makes."""
        return self._mirror if self.rank == 0 else self._cache

    @property
    def n_threads(self):
        """Threads of this rank's computes; set on rank 0, every rank takes it."""
        return self._threads

    @n_threads.setter
    def n_threads(self, n):
        n = thread_count(n, "n_threads")     # checked here: a bad count sent would end every rank
        if self.rank == 0 and self.started:
            self.channel.send("threads", n)
        LlamaModel.n_threads.fset(self, n)

    def set_tune(self, data):
        """Plan every MUL_MAT with TuneData `data` (its shapes: this rank's); on rank 0,
        every rank takes it."""
        if self.rank == 0 and self.started:
            self.channel.send("tune", data)
        super().set_tune(data)

    # ---- the steps -----------------------------------------------------------------

    def _forward(self, tokens, positions, n_out, want=None):
        """LlamaModel._forward on every rank: rank 0 orders it (forward has checked the
        arguments), and gets the logits (n_out, V) gathered; the others get None."""
        if self.rank == 0:
            want = self.want
            self.channel.send("forward", tokens, positions, n_out, want)
        with collective(self.comm):
            local = super()._forward(tokens, positions, n_out)     # (n_out, V_r)
            return gather_logits(self.comm, local, self.shard.vocab_bounds, want)

    def run_step(self, g, want=None):
        """A batch step's graph on every rank: rank 0 orders it with its inputs (written
        by the Batch) and gets the logits (n_out, V) gathered."""
        if self.rank == 0:
            want = self.want
            self.channel.send("step", g.key, g.tokens, g.positions, g.slots, g.kv_index,
                              g.out_rows, want)
        with collective(self.comm):
            local = super().run_step(g)                          # (n_out, V_r)
            return gather_logits(self.comm, local, self.shard.vocab_bounds, want)

    def step_graph(self, cache, R, N, n_out, invariant=True):
        g = super().step_graph(cache, R, N, n_out, invariant)
        g.key = (R, N, n_out, invariant)     # what another rank builds the same graph from
        return g

    def execute(self, order, pool):
        """Another rank: carry out one of rank 0's orders (pool(): the paged KV cache).
        Returns False for the order to stop serving."""
        kind, args = order[0], order[1:]
        if kind == "forward":
            tokens, positions, n_out, want = args
            self._forward(tokens, positions, n_out, want)
        elif kind == "step":
            (R, N, n_out, invariant), tokens, positions, slots, kv_index, out_rows, want = args
            g = self.step_graph(pool(), R, N, n_out, invariant)
            g.tokens[:], g.positions[:], g.slots[:] = tokens, positions, slots
            g.kv_index[:], g.out_rows[:] = kv_index, out_rows
            self.run_step(g, want)
        elif kind == "kv":
            name, *values = args
            if name == "shift":
                self._cache.shift(*values, self._rerope())
            else:
                getattr(self._cache, name)(*values)
        elif kind == "pool_shift":
            pool().move_rows(*args, self._rerope())
        elif kind == "pool_copy":
            pool().copy_rows(*args)
        elif kind == "threads":
            self.n_threads = args[0]
        elif kind == "tune":
            self.set_tune(args[0])
        elif kind == "close":
            return False
        else:
            raise ValueError(f"unknown order {kind!r} from rank 0")
        return True

    def _rerope(self):
        freqs = self.weights.rope_freqs
        return rope_rotation(self.config, None if freqs is None else
                             np.asarray(freqs.data, np.float32))


class MirroredKVCache:
    """Rank 0's KV cache: every change of the sequence it holds (clear, truncate, the
    context shift) is ordered to the other ranks first, which make it in their caches
    (their heads). Everything else is the cache's own."""

    def __init__(self, cache, channel):
        self._cache, self._channel = cache, channel

    def __getattr__(self, name):
        return getattr(self._cache, name)

    def clear(self):
        """KVCache.clear on every rank."""
        self._channel.send("kv", "clear")
        self._cache.clear()

    def truncate(self, n):
        """KVCache.truncate on every rank."""
        self._channel.send("kv", "truncate", n)
        self._cache.truncate(n)

    def shift(self, keep, n_discard, rerope):
        """KVCache.shift on every rank (each rotates its own heads' K rows)."""
        self._channel.send("kv", "shift", keep, n_discard)
        self._cache.shift(keep, n_discard, rerope)


class MirroredPool:
    """Rank 0's paged KV cache: which pages a sequence holds is rank 0's business (the
    slots travel with each step), but the rows a context shift moves and a shared page's
    copy are made on every rank, in its pool (the pool's mirror orders them)."""

    def __init__(self, pool, channel):
        self._pool, self._channel = pool, channel
        pool.mirror = channel.send

    def __getattr__(self, name):
        return getattr(self._pool, name)
