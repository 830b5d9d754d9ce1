"""The public names stay where the README and docs say they are: every `gg.NAME` and every
`from ggml_py… import …` in their code, and every console script pyproject.toml declares."""
import importlib
import pathlib
import re
import tomllib

import pytest

import ggml_py as gg

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def code_of(path):
    """The text of a Markdown file's fenced code blocks and `inline code`."""
    text = path.read_text(encoding="utf-8")
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    return "\n".join(blocks + re.findall(r"`([^`\n]+)`", text))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_gg_name_in_the_docs_exists(doc):
    names = set(re.findall(r"\bgg\.([A-Za-z_][A-Za-z0-9_]*)", code_of(doc)))
    missing = sorted(n for n in names if not hasattr(gg, n))
    assert missing == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_import_in_the_docs_imports(doc):
    for module, names in re.findall(r"from (ggml_py[\w.]*) import ([\w, ]+)", code_of(doc)):
        imported = importlib.import_module(module)
        for name in (n.strip().split(" as ")[0] for n in names.split(",") if n.strip()):
            assert hasattr(imported, name) or importlib.util.find_spec(f"{module}.{name}"), \
                f"{doc.name}: from {module} import {name}"


def test_every_console_script_has_its_main():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {"ggml-main", "ggml-perplexity", "ggml-batched", "ggml-bench", "ggml-tune",
                            "ggml-quantize", "ggml-convert", "ggml-server"}
    for name, target in scripts.items():
        module, function = target.split(":")
        assert module.startswith("ggml_py.cli."), f"{name}: {target} is not in cli/"
        assert callable(getattr(importlib.import_module(module), function)), name
