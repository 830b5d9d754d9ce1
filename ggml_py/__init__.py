"""ggml_py: a ggml-style tensor graph runtime for CPUs.

    import numpy as np, ggml_py as gg
    ctx = gg.Context(mem_size=64 << 20)
    a = ctx.new_tensor(gg.F32, (4, 3))
    b = ctx.from_numpy(np.ones((2, 3), np.float32))
    y = gg.soft_max(gg.scale(gg.mul_mat(a, b), 0.5))
    graph = gg.build_forward(y)
    a.numpy()[:] = np.random.rand(4, 3)
    graph.compute(n_threads=2)
"""
import importlib as _importlib
import os as _os

# OpenBLAS's threads (lent to it by the blas-mt profile) busy-wait for new work
# for 2^28 cycles (~0.1 s) after each call; on a machine whose cores the pool
# already uses, that steals a core from every node that follows (measured: a
# 2-thread cpu mul_mat 2x slower after a blas-mt one). 2^20 cycles (~0.3 ms, like
# the pool's own spin) keeps back-to-back calls fast (no wake-up) and frees the
# core soon after (2^4: small products 1.8x slower; 2^22: the next node slower).
# Read when the library loads, so set before _core is imported; a user's own
# setting wins.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

# The extension links scipy-openblas32's library. Importing that package loads the
# library (its documented pre-loading), so the extension finds it wherever pip put the
# package: the extension's rpath alone finds it only beside ggml_py in one site-packages,
# not from an editable install or an in-place build (the extension stays in the
# checkout) nor from `pip install --target` / `--user`.
try:
    _importlib.import_module("scipy_openblas32")
except ImportError:          # needed only by a build with BLAS, whose import says so
    pass


def _import_core():
    """The compiled extension, or an ImportError that says where it is missing (a
    checkout's unbuilt ggml_py/ shadows an installed one under `python -m pytest`)."""
    try:
        from ggml_py import _core
    except ImportError as exc:
        from importlib.machinery import EXTENSION_SUFFIXES
        here = _os.path.dirname(_os.path.abspath(__file__))
        if any(_os.path.exists(_os.path.join(here, "_core" + suffix))
               for suffix in EXTENSION_SUFFIXES):
            raise      # built for this Python, and failing for another reason: say that
        raise ImportError(f"ggml_py's compiled extension is not built for this Python in "
                          f"{here} (importing the source tree?): build it there with `pip "
                          f"install -e .` or `python setup.py build_ext --inplace`, or run "
                          f"from another folder to use the installed ggml_py") from exc
    return _core


_core = _import_core()
from ggml_py.core.types import Op, Type  # noqa: E402

from ggml_py.core.system import PACKAGE_VERSION, build_features, kernels, system_info  # noqa: E402
from ggml_py.core.profiles import StageFlags, TaskProfile, task_profiles  # noqa: E402
from ggml_py.core.tensor import Context, Tensor  # noqa: E402
from ggml_py.core.types import data_alignment, row_bytes, type_traits  # noqa: E402
from ggml_py.core.quants import dequantize, interleave_rows8, quantize  # noqa: E402
from ggml_py.core.graph import (MAX_THREADS, Graph, Plan, ThreadPool, build_forward,  # noqa: E402
                           default_threads, shared_pool)
from ggml_py.core.ops import (  # noqa: E402
    ROPE_NEOX, ROPE_NORMAL, add, all_reduce, argmax, attention, concat, cont, cpy, div, dup, gelu, get_rows, mean,
    mul, mul_mat, neg, norm, permute, relu, reshape, rms_norm, rope, scale, set_rows, silu,
    soft_max, sqr, sqrt, sub, sum_rows, swiglu, transpose, view,
)

from ggml_py.files.gguf_reader import ModelFileWarning, ModelLoadError  # noqa: E402
from ggml_py.model.kv_paged import KVPoolFull  # noqa: E402
from ggml_py.model.sampling import Sampler, SamplingParams  # noqa: E402
from ggml_py.model.session import TrainingContextWarning  # noqa: E402
from ggml_py.dist.llama import Llama  # noqa: E402

F32, F16, BF16 = Type.F32, Type.F16, Type.BF16
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 = Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0, Type.Q8_1
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = Type.Q2_K, Type.Q3_K, Type.Q4_K, Type.Q5_K, Type.Q6_K, Type.Q8_K
I8, I16, I32, I64, F64 = Type.I8, Type.I16, Type.I32, Type.I64, Type.F64

__version__ = PACKAGE_VERSION
