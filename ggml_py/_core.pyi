# Type stubs of the compiled glue module (private; use the ggml_py package API).
from typing import Any, Sequence

import numpy as np

ARENA_ALIGN: int
TENSOR_STRUCT_SIZE: int
MAX_THREADS: int
INT64_MAX: int
MAX_SPIN_US: float
POLICIES: dict[str, int]
OP_COUNT: int
OP_IDS: dict[str, int]
TYPE_IDS: dict[str, int]

def select_kernels(force_ref: bool) -> str: ...
def build_features() -> int: ...
def time_ns() -> int: ...
def type_traits_raw(type: int) -> tuple | None: ...
def row_size(type: int, ne: int) -> int: ...
def check_thread_count(n_threads: int, where: str) -> int: ...
def op_profiles_for(op: int, type0: int, type1: int, ne0: Sequence[int] = ...,
                    ne1: Sequence[int] = ...) -> list[tuple]: ...
def new_tensor(cls: type, ctx: Context, type: int, ne: Sequence[int], nb: Sequence[int] | None,
               ndim: int, op: int = ..., src: tuple = ..., op_params: Sequence[int] | None = ...,
               view_of: TensorBase | None = ..., view_offset: int = ...,
               external: np.ndarray | None = ...) -> Any: ...

class Context:
    buffer: np.ndarray
    mem_size: int
    used: int
    def __init__(self, mem_size: int = ...) -> None: ...

class TensorBase:
    ctx: Context
    src: tuple
    owner: np.ndarray
    owner_base: int
    ndim: int
    read_only: bool
    name: str
    @property
    def data_ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def is_contiguous(self) -> bool: ...

class ThreadPool:
    n_threads: int
    policy: str
    spin_us: float
    def __init__(self, n_threads: int, policy: str = ..., spin_us: float = ...) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def stats(self) -> dict[str, int]: ...

class CGraph:
    tensors: tuple
    def __init__(self, tensors: Sequence[TensorBase]) -> None: ...
    def work_size(self, n_threads: int) -> int: ...
    def compute(self, pool: ThreadPool | None, work: np.ndarray | None,
                stage_ns: np.ndarray | None, lookahead: int, abort_interval_ms: float) -> None: ...
