"""The pool and executor under ThreadSanitizer: tests/c/pool_stress.c is built
with -fsanitize=thread from the C sources and must run without a data-race
report (TSan exits non-zero on one)."""
import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CC = os.environ.get("CC", "cc")


def tsan_works(tmp_path):
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    result = subprocess.run([CC, "-fsanitize=thread", str(probe), "-o", str(tmp_path / "probe")],
                            capture_output=True)
    return result.returncode == 0 and subprocess.run([str(tmp_path / "probe")]).returncode == 0


@pytest.mark.skipif(shutil.which(CC) is None, reason="no C compiler")
def test_pool_stress_under_thread_sanitizer(tmp_path):
    if not tsan_works(tmp_path):
        pytest.skip("this compiler cannot build ThreadSanitizer programs")
    sources = sorted(glob.glob(str(ROOT / "ggml_py" / "csrc" / "**" / "*.c"), recursive=True))
    exe = tmp_path / "pool_stress"
    subprocess.run([CC, "-std=gnu11", "-O1", "-g", "-fsanitize=thread", "-march=native",
                    f"-I{ROOT / 'include'}", f"-I{ROOT / 'ggml_py' / 'csrc'}",
                    f"-I{ROOT / 'ggml_py' / 'csrc' / 'quants'}",
                    str(ROOT / "tests" / "c" / "pool_stress.c"), *sources,
                    "-lm", "-lpthread", "-o", str(exe)], check=True)
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1 exitcode=66")
    result = subprocess.run([str(exe), "3000"], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "3000 computes OK" in result.stdout
