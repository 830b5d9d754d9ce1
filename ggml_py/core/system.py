"""What this build can do: compiled instruction sets and the kernels picked."""
import os

from ggml_py import _core

PACKAGE_VERSION = "0.1.0"    # as pyproject.toml's; tune files record it

FEATURES = ("SSE3", "AVX", "AVX2", "FMA", "F16C", "AVX512", "AVX512_VNNI", "AVX512_BF16",
            "AVX_VNNI", "AMX_INT8", "BLAS", "TSAN")

# on for 1 (any value but the usual spellings of off)
FORCE_REF = os.environ.get("GGML_PY_FORCE_REF", "").strip().lower() not in ("", "0", "false", "no",
                                                                              "off")
KERNELS = _core.select_kernels(FORCE_REF)


def build_features():
    """{feature name: bool} for the instruction sets this binary was compiled for."""
    bits = _core.build_features()
    return {name: bool(bits >> i & 1) for i, name in enumerate(FEATURES)}


def system_info():
    """One line like llama.cpp's: 'AVX = 1 | AVX2 = 1 | ... | KERNELS = avx2'."""
    parts = [f"{name} = {int(on)}" for name, on in build_features().items()]
    parts.append(f"KERNELS = {KERNELS}")
    return " | ".join(parts)


def blas():
    """The BLAS the BLAS profiles call ('OpenBLAS 0.3.29 DYNAMIC_ARCH ... SkylakeX ...'), or 'none'."""
    return _core.blas_config()


def kernels():
    """Which kernels the type traits use ('avx2', 'scalar reference', ...)."""
    return KERNELS
