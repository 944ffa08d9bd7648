"""The layout is the architecture: only the measuring side imports torch, it never imports analysis or
rendering, the run-folder schema is what both sides share, and the package has no import cycle."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest
from conftest import REPO

from kvpages.schema.profiles import tomllib  # tomllib, or tomli before Python 3.11

PACKAGE = REPO / "kvpages"
PATHS = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p for p in PACKAGE.rglob("*.py")}
MODULES = sorted(PATHS)
MEASURING = "kvpages.measure"
FACES = ("kvpages.plugin", "kvpages.cli", "kvpages.preflight", "kvpages.__main__")
"""The faces wire both sides together (and import torch only when a benchmark needs it)."""


def imports_of(module: str) -> set[str]:
    """Every kvpages module `module` imports, at any depth of its code (lazy imports included)."""
    tree = ast.parse(PATHS[module].read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvpages"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("kvpages")}
    return {m for m in found if m in MODULES and m != module}


def test_the_layout_has_its_five_parts():
    parts = {m.split(".")[1] for m in MODULES if m.count(".") >= 2}
    assert parts == {"core", "schema", "measure", "analysis", "render"}


WITHOUT_TORCH = [m for m in MODULES if not m.startswith(MEASURING) and m not in FACES]
IMPORT_EACH = """import importlib, json, sys, traceback
sys.modules['torch'] = None  # import torch now raises ImportError, in every module imported after this
failed = {}
for module in sys.argv[1:]:
    try:
        importlib.import_module(module)
        assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]
    except BaseException:
        failed[module] = traceback.format_exc()[-2000:]
print(json.dumps(failed))
"""


@pytest.fixture(scope="module")
def failed_without_torch() -> dict[str, str]:
    """Each module outside the measuring side imported in turn in one fresh interpreter where `import torch` raises
    (a failed import leaves nothing in sys.modules, so a module whose imports need torch fails at its own turn):
    the traceback of each that failed. One interpreter instead of one per module: about 20 s of CPU less."""
    done = subprocess.run([sys.executable, "-c", IMPORT_EACH, *WITHOUT_TORCH], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("module", WITHOUT_TORCH)
def test_every_module_outside_the_measuring_side_imports_without_torch(module, failed_without_torch):
    assert module not in failed_without_torch, failed_without_torch.get(module)


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith(MEASURING)])
def test_the_measuring_side_imports_nothing_from_analysis_or_rendering(module):
    assert not {m for m in imports_of(module) if m.startswith(("kvpages.analysis", "kvpages.render"))}


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith(("kvpages.core", "kvpages.schema"))])
def test_core_and_schema_import_neither_side(module):
    assert not {m for m in imports_of(module) if m.startswith((MEASURING, "kvpages.analysis", "kvpages.render"))}


def test_there_is_no_import_cycle():
    graph = {m: imports_of(m) for m in MODULES}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(n):] + [n]) if n in path
                                     else f"import cycle through {n}")
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in MODULES:
        if m not in state:
            visit(m, [m])


def mypy_unread() -> tuple[str, ...]:
    """The modules pyproject.toml has mypy not read at all (follow_imports = "skip"), as dotted prefixes."""
    overrides = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    return tuple(m.removesuffix(".*") for o in overrides if o.get("follow_imports") == "skip" for m in o["module"])


def names_of(module: str) -> set[str]:
    """Every module `module` imports and every dotted name it writes (torch.cuda.Event), at any depth of its code, a
    name bound by an import spelled out (`dist.rpc` after `import torch.distributed as dist`: torch.distributed.rpc)."""
    tree = ast.parse(PATHS[module].read_text())
    found, bound = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
            bound |= {a.asname: a.name for a in node.names if a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            bound |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts, root = [node.attr], node.value
            while isinstance(root, ast.Attribute):
                parts.append(root.attr)
                root = root.value
            if isinstance(root, ast.Name):
                found.add(".".join([bound.get(root.id, root.id), *reversed(parts)]))
    return found


def test_kvpages_names_nothing_mypy_is_told_not_to_read():
    """mypy reads none of pyproject.toml's unread modules, so a kvpages module that named one would be typed Any
    there, unchecked: none does."""
    unread = mypy_unread()
    assert "torch._dynamo" in unread  # the list is read
    named = {m: sorted(n for n in names_of(m) if any(n == u or n.startswith(f"{u}.") for u in unread)) for m in MODULES}
    assert {m: n for m, n in named.items() if n} == {}
    assert names_of("kvpages.measure.meter") >= {"torch.utils._pytree", "torch.overrides.TorchFunctionMode"}
    assert "torch.distributed.init_process_group" in names_of("kvpages.measure.group")  # through `dist`


def test_no_module_over_400_lines_and_no_class_over_150():
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        assert text.count("\n") <= 400, path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno - node.lineno + 1 <= 150, f"{path}: class {node.name}"


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith(MEASURING) and m != f"{MEASURING}.session"])
def test_no_class_in_measure_calls_back_into_the_session(module):
    """The session hands the runner, recorder and workers what they need as data, and takes their outcomes back:
    none of them imports the session or is handed it (a `session` or `host` parameter)."""
    assert f"{MEASURING}.session" not in imports_of(module)
    for node in ast.walk(ast.parse(PATHS[module].read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = {a.arg for a in node.args.args + node.args.kwonlyargs}
            assert not names & {"session", "host"}, f"{module}.{node.name} is handed the session"


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith("kvpages.schema")])
def test_schema_imports_nothing_from_analysis(module):
    """schema/ only reads and writes run folders: what a row's interval is, analysis/ computes."""
    assert not {m for m in imports_of(module) if m.startswith("kvpages.analysis")}
