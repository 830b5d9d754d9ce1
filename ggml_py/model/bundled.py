"""The model and text that ship inside the package: a small llama trained on
Shakespeare's plays by this project (training/), converted and quantized with
its own tools. Programs and `gg.Llama()` use them when no file is given."""
import os

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # ggml_py/
MODEL_FILE = os.path.join(_HERE, "models", "shakespeare-5m-q8_0.gguf")
TEST_TEXT_FILE = os.path.join(_HERE, "data", "shakespeare_test.txt")


def _existing(path, what):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"the bundled {what} is missing from this installation ({path}); "
                                f"reinstall ggml_py or pass a file")
    return path


def default_model_path():
    """Path of the bundled Shakespeare model (Q8_0 GGUF)."""
    return _existing(MODEL_FILE, "model")


def default_text_path():
    """Path of the bundled held-out text (Julius Caesar and Twelfth Night)."""
    return _existing(TEST_TEXT_FILE, "test text")
