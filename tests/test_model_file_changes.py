"""A model file changed while a Llama has it: a clear error before the next evaluation
(mapped), nothing at all with use_mmap=False, a warning for a file others may write,
and a one-line explanation before a SIGBUS that no check could prevent."""
import os
import shutil
import signal
import subprocess
import sys
import warnings

import numpy as np
import pytest

from llama_models import model_path

import ggml_py as gg
from ggml_py.files.gguf_reader import ModelFileWarning, ModelLoadError

ENV = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(gg.__file__))))


@pytest.fixture
def model_copy(tmp_path):
    path = tmp_path / "m.gguf"
    shutil.copy(model_path("f32"), path)
    os.chmod(path, 0o644)
    return path


def first_logits(llm):
    return np.array(llm.model.forward(np.array([1, 2, 3]), np.arange(3)))


@pytest.mark.parametrize("change", ["truncate", "overwrite"])
def test_a_mapped_file_changed_in_place_is_an_error_not_a_crash(model_copy, change):
    llm = gg.Llama(str(model_copy), n_ctx=64)
    first_logits(llm)
    size = os.path.getsize(model_copy)
    with open(model_copy, "r+b") as f:
        if change == "truncate":
            f.truncate(size // 2)
        else:   # the same size, other bytes (the weights' part), a later modification time
            f.seek(size // 2)
            f.write(bytes(range(256)) * 16)
            os.utime(model_copy, ns=(0, os.stat(model_copy).st_mtime_ns + 10**9))
    with pytest.raises(ModelLoadError, match="changed in place since it was loaded"):
        first_logits(llm)


def test_a_file_replaced_by_rename_or_removed_leaves_the_model_whole(model_copy, tmp_path):
    llm = gg.Llama(str(model_copy), n_ctx=64)
    before = first_logits(llm)
    other = tmp_path / "other.gguf"
    shutil.copy(model_path("q8_0"), other)
    os.replace(other, model_copy)        # as ggml-quantize and ggml-convert write
    assert np.array_equal(first_logits(llm), before)
    os.unlink(model_copy)
    assert np.array_equal(first_logits(llm), before)


def test_no_mmap_keeps_the_weights_whatever_happens_to_the_file(model_copy):
    mapped = first_logits(gg.Llama(str(model_copy), n_ctx=64))
    llm = gg.Llama(str(model_copy), n_ctx=64, use_mmap=False)
    with open(model_copy, "r+b") as f:
        f.truncate(100)
    assert np.array_equal(first_logits(llm), mapped)


def test_ggml_main_no_mmap_gives_the_same_text(tmp_path):
    def run(*flags):    # from a neutral folder: a checkout's ggml_py/ must not shadow the one tested
        proc = subprocess.run([sys.executable, "-m", "ggml_py.cli.main", "-p", "ROMEO.", "-n", "12",
                               "-s", "3", *flags], capture_output=True, text=True, env=ENV,
                              timeout=120, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout
    assert run("--no-mmap") == run()


def test_a_file_every_user_may_write_gives_a_warning(model_copy):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelFileWarning)
        gg.Llama(str(model_copy), n_ctx=64).close()        # 0644, ours: quiet
        gg.Llama(str(model_copy), n_ctx=64, use_mmap=False).close()
    os.chmod(model_copy, 0o666)
    with pytest.warns(ModelFileWarning, match="every user may write this file"):
        gg.Llama(str(model_copy), n_ctx=64).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelFileWarning)
        gg.Llama(str(model_copy), n_ctx=64, use_mmap=False).close()   # in memory: no matter


def test_a_bus_error_in_compute_is_explained_before_the_process_dies(model_copy):
    # the check before each evaluation is bypassed, as a truncation during one would be
    script = ("import sys, numpy as np, ggml_py as gg\n"
              "llm = gg.Llama(sys.argv[1], n_ctx=64)\n"
              "llm.model.file.check_unchanged = lambda: None\n"
              "open(sys.argv[1], 'r+b').truncate(4096)\n"
              "llm.model.forward(np.array([1, 2, 3]), np.arange(3))\n"
              "print('computed')\n")
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", script, str(model_copy)],
                          capture_output=True, text=True, env=ENV, timeout=120,
                          cwd=model_copy.parent)
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stderr)
    assert proc.stderr.count("ggml_py: bus error (SIGBUS) while computing a graph") == 1
    assert "--no-mmap" in proc.stderr and "computed" not in proc.stdout
