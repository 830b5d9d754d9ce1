"""Task profiles: how the executor runs each stage of a node.

A profile is data. `id` selects the op's code path (for MUL_MAT: CPU, BLAS,
BLAS-split); each stage (INIT, COMPUTE, FINALIZE) says whether it runs at all,
on every thread or on the main thread only, and whether idle workers should go
to sleep at once while a single-thread stage runs. No op's profile runs FINALIZE
yet; docs/runtime.md says why the stage stays.
"""
from dataclasses import dataclass, replace

from ggml_py import _core
from ggml_py.core.types import Op, Type, type_traits

STAGES = ("init", "compute", "finalize")


@dataclass(frozen=True)
class StageFlags:
    """One stage: run it (valid), on all threads (parallel), workers sleep (wait)."""
    valid: bool = False
    parallel: bool = False
    wait: bool = False

    def __str__(self):
        if not self.valid:
            return "-"
        return ("parallel" if self.parallel else "single") + (" wait" if self.wait else "")


@dataclass(frozen=True)
class TaskProfile:
    """A task profile: `id` (code path), `name`, and the flags of each stage."""
    id: int
    name: str
    init: StageFlags = StageFlags()
    compute: StageFlags = StageFlags()
    finalize: StageFlags = StageFlags()

    @property
    def stages(self):
        """(init, compute, finalize) flags."""
        return (self.init, self.compute, self.finalize)

    def with_stage(self, stage, **flags):
        """A copy with some flags of one stage ('init', 'compute', 'finalize') changed."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages are {STAGES}")
        return replace(self, **{stage: replace(getattr(self, stage), **flags)})

    def same_code_path(self, other):
        """True when both run the same stages of the same code path (flags may differ)."""
        return self.id == other.id and all(
            a.valid == b.valid for a, b in zip(self.stages, other.stages))

    def __str__(self):
        return (f"{self.name}(init: {self.init}, compute: {self.compute}, "
                f"finalize: {self.finalize})")

    @classmethod
    def _from_raw(cls, raw):
        pid, name, stages = raw
        return cls(pid, name, *(StageFlags(*s) for s in stages))

    def _to_raw(self):
        return (self.id, self.name,
                tuple((s.valid, s.parallel, s.wait) for s in self.stages))


def task_profiles(op, src0_type=Type.F32, src1_type=Type.F32):
    """The task profiles `op` supports for these source types, default first.

    Empty where the op rejects the types: MUL_MAT needs a src0 type with a dot
    product kernel and an F32 src1."""
    op = Op(op)
    src0_type, src1_type = Type.of(src0_type, "task_profiles"), Type.of(src1_type, "task_profiles")
    if op == Op.MUL_MAT and (src1_type != Type.F32 or not type_traits(src0_type)["has_vec_dot"]):
        return []
    return [TaskProfile._from_raw(r)
            for r in _core.op_profiles_for(int(op), int(src0_type), int(src1_type))]
