"""Build the ggml_py extension: the C core (ggml_py/csrc) plus the Cython glue.

Build switches (environment variables, read only here):
  GGML_PY_NATIVE=0          portable binary (no -march=native)
  GGML_PY_SANITIZE=thread   ThreadSanitizer build (-fsanitize=thread, -O1 -g)
  GGML_PY_CYTHON_DEBUG=1    Cython bounds/wraparound checks back on
  GGML_PY_BLAS=0            build without OpenBLAS (no BLAS mul_mat profiles)

BLAS is OpenBLAS from the scipy-openblas32 wheel (headers + library, symbols
prefixed scipy_). At run time ggml_py imports scipy_openblas32 before the
extension, which loads the library wherever that package is installed; an rpath
relative to the extension (site-packages/ggml_py -> site-packages/scipy_openblas32/lib)
is the fallback. No absolute path is added here: pip builds in a temporary
environment that is gone after the build.
"""
import glob
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup


def compile_args():
    args = ["-std=gnu11", "-fno-strict-aliasing", "-ffp-contract=off", "-Wall", "-Wno-unused-function",
            "-Wno-unused-variable", "-Wno-unused-but-set-variable"]
    if os.environ.get("GGML_PY_SANITIZE") == "thread":
        args += ["-O1", "-g", "-fsanitize=thread"]
    else:
        args += ["-O3", "-g0"]   # no debug info (Python's own CFLAGS may ask for -g): 5x smaller
    if os.environ.get("GGML_PY_NATIVE", "1") != "0":
        args += ["-march=native"]
    return args


def link_args():
    args = ["-pthread", "-lm"]
    if os.environ.get("GGML_PY_SANITIZE") == "thread":
        args += ["-fsanitize=thread"]
    return args


def blas_config():
    """(define_macros, include_dirs, library_dirs, libraries, link_args) for OpenBLAS."""
    if os.environ.get("GGML_PY_BLAS", "1") == "0":
        return [], [], [], [], []
    import scipy_openblas32
    return ([("GGML_PY_USE_BLAS", "1")], [scipy_openblas32.get_include_dir()],
            [scipy_openblas32.get_lib_dir()], [scipy_openblas32.get_library()],
            ["-Wl,-rpath,$ORIGIN/../scipy_openblas32/lib"])


def cython_directives():
    debug = os.environ.get("GGML_PY_CYTHON_DEBUG") == "1"
    return {
        "language_level": 3,
        "boundscheck": debug,
        "wraparound": debug,
        "cdivision": not debug,
        "initializedcheck": debug,
        "embedsignature": True,
    }


c_sources = sorted(glob.glob(os.path.join("ggml_py", "csrc", "**", "*.c"), recursive=True))

blas_macros, blas_includes, blas_lib_dirs, blas_libs, blas_link_args = blas_config()

core = Extension(
    "ggml_py._core",
    sources=["ggml_py/_core.pyx"] + c_sources,
    include_dirs=["include", "ggml_py/csrc", "ggml_py/csrc/quants", numpy.get_include()] + blas_includes,
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")] + blas_macros,
    library_dirs=blas_lib_dirs,
    libraries=blas_libs,
    extra_compile_args=compile_args(),
    extra_link_args=link_args() + blas_link_args,
    depends=glob.glob("include/*.h") + glob.glob("ggml_py/csrc/**/*.h", recursive=True)
    + glob.glob("ggml_py/*.pxi"),
)

setup(ext_modules=cythonize([core], compiler_directives=cython_directives()))
