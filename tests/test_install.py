"""How ggml_py loads where it is installed: OpenBLAS found through scipy_openblas32
wherever pip put either package, and a clear error from an unbuilt source tree."""
import os
import shutil
import subprocess
import sys

import pytest

import ggml_py as gg

PACKAGE = os.path.dirname(os.path.abspath(gg.__file__))
# an editable install's finder would lead `ggml_py._core` back to the checkout
WITHOUT_EDITABLE_FINDERS = ("import sys; sys.meta_path = [f for f in sys.meta_path "
                            "if 'editable' not in repr(f).lower()]\n")


def run_python(code, folder):
    """python -c code in folder, that folder first on the module path."""
    return subprocess.run([sys.executable, "-c", WITHOUT_EDITABLE_FINDERS + code],
                          capture_output=True, text=True, cwd=folder, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(folder)))


def test_blas_is_found_wherever_ggml_py_is_installed(tmp_path):
    # the extension's rpath finds OpenBLAS only beside ggml_py in one site-packages; a
    # copy elsewhere (as an editable install, `pip install --target` or `--user` leaves
    # it) loads it because ggml_py imports scipy_openblas32 first
    if "BLAS = 1" not in gg.system_info():
        pytest.skip("built without BLAS")
    shutil.copytree(PACKAGE, tmp_path / "ggml_py",
                    ignore=shutil.ignore_patterns("models", "data", "__pycache__", "*.c"))
    proc = run_python("""if True:
        import numpy as np, ggml_py as gg
        ctx = gg.Context(mem_size=1 << 20)
        a = ctx.from_numpy(np.ones((32, 32), np.float32))
        y = gg.mul_mat(a, a)
        y.profile = next(p for p in y.profiles() if p.name == "blas")
        gg.build_forward(y).compute(n_threads=1)
        print(gg.__file__, y.numpy()[0, 0])""", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(tmp_path / "ggml_py" / "__init__.py"), "32.0"]


def test_an_unbuilt_source_tree_says_so(tmp_path):
    # `python -m pytest` in a checkout puts its unbuilt ggml_py/ before the installed one
    # (a build for another Python left there does not count)
    (tmp_path / "ggml_py").mkdir()
    shutil.copy(os.path.join(PACKAGE, "__init__.py"), tmp_path / "ggml_py")
    (tmp_path / "ggml_py" / "_core.cpython-39-x86_64-linux-gnu.so").write_bytes(b"")
    proc = run_python("import ggml_py", tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == (
        f"ImportError: ggml_py's compiled extension is not built for this Python in "
        f"{tmp_path / 'ggml_py'} "
        f"(importing the source tree?): build it there with `pip install -e .` or "
        f"`python setup.py build_ext --inplace`, or run from another folder to use the "
        f"installed ggml_py")
