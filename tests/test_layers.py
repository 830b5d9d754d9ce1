"""The package's rooms are its layers: a module imports only from its own layer or the
ones below (docs/architecture.md), and no modules import each other in a circle. Every
import counts, those inside functions too (an import moved into a function to hold a
circle apart is still a circle)."""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "ggml_py"    # the sources, as laid out

# lowest first; a module may import its own layer and those before it ("ggml_py": the
# public API of ggml_py/__init__.py, which the command-line programs use)
LAYERS = ["core", "files", "tokenizer", "tune", "model", "tools", "dist", "ggml_py", "serve", "cli"]
ROOM_LAYER = {"files": "files", "_core": "core", "core": "core", "tokenizer": "tokenizer",
              "tune": "tune", "model": "model", "tools": "tools", "dist": "dist", "serve": "serve",
              "cli": "cli"}


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module):
    """The layer of a ggml_py module name ('ggml_py' itself: the public API)."""
    parts = module.split(".")
    return ROOM_LAYER[parts[1]] if len(parts) > 1 else "ggml_py"


def imports(path):
    """The ggml_py modules the file at `path` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "ggml_py"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ggml_py":
            for alias in node.names:    # `from ggml_py.core import ops` imports ggml_py.core.ops
                sub = f"{node.module}.{alias.name}"
                found.add(sub if _is_module(sub) else node.module)
    return found


def _is_module(name):
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists() or \
        path.with_suffix(".pyx").exists()


def import_graph():
    return {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def test_every_room_has_a_layer():
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(ROOM_LAYER) - {"_core"}
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert loose == [], f"modules outside the rooms: {loose}"


def test_imports_run_downward_only():
    upward = [f"{m} ({layer(m)}) imports {d} ({layer(d)})"
              for m, deps in import_graph().items() for d in sorted(deps)
              if LAYERS.index(layer(d)) > LAYERS.index(layer(m))]
    assert upward == []


def test_no_import_circles():
    graph = import_graph()
    circles = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    circles.append(" -> ".join(path + [start]))
                elif nxt not in seen and nxt in graph:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    assert circles == []


def test_the_checks_see_an_import_inside_a_function_and_each_name_of_a_from_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from ggml_py.core import ops, types\n"
                      "def f():\n    from ggml_py.model.llama import LlamaModel\n")
    assert imports(source) == {"ggml_py.core.ops", "ggml_py.core.types", "ggml_py.model.llama"}
    assert LAYERS.index(layer("ggml_py.model.llama")) > LAYERS.index(layer("ggml_py.core.ops"))
