"""SGLang's own `kv_to_page_indices`, taken by its source: where it comes from, and what its signature says (no torch).

A `--kv-sglang` SPEC is `installed` (the sglang this Python would import), a path to an SGLang checkout, its `python/`
folder or `sglang/srt/mem_cache/common.py`, or a released version such as `0.5.15`, fetched once with
`pip download --no-deps` into `$KVPAGES_CACHE/sglang/<version>/` (default `~/.cache/kvpages/sglang/<version>/`),
keeping only `common.py` and `version.py`. sglang is never imported (its import chain needs GPU kernels and dozens of
packages): `ast` reads the function. Every problem is a ValueError naming the spec or the file, before anything runs.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from kvpages.core.checks import split_csv

FLAG = "--kv-sglang"
FUNCTION = "kv_to_page_indices"
COMMON = Path("sglang", "srt", "mem_cache", "common.py")
VERSION_FILE = Path("sglang", "version.py")
INSTALLED = "installed"
SPEC_FORMS = (f"{INSTALLED!r}, a path to an SGLang checkout or its python/ folder, "
              "or a released version such as 0.5.15")
VERSION = re.compile(r"^\d+(\.\d+)+([.-]?(a|b|rc|post|dev)\d*)*$")
CONVENTIONS = {"np.ndarray": "numpy", "numpy.ndarray": "numpy", "torch.Tensor": "tensor"}
"""The first parameter's annotation -> the calling convention: numpy (host copy of every token index) or tensor."""
MODULES = {"numpy": ("np", "numpy"), "torch": ("torch",)}
"""The modules the function is compiled with, and their default names."""
PIP_TIMEOUT_S = 300.0
PREFIX = "sglang@"


@dataclass(frozen=True)
class SglangSource:
    """Where one SPEC's `common.py` lies, and the label of its variant (`sglang@<label>`)."""

    spec: str
    file: Path
    label: str

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.label}"


@dataclass(frozen=True)
class SglangFunction:
    """`kv_to_page_indices` as read from a source: its definition's text, where it starts, and its convention."""

    source: SglangSource
    code: str
    line: int
    convention: str  # numpy | tensor
    names: dict[str, str]  # {name in the code: module} for the modules it is compiled with


def cache_dir() -> Path:
    return Path(os.environ.get("KVPAGES_CACHE") or Path.home() / ".cache" / "kvpages") / "sglang"


def parse_specs(option: str, text: str) -> tuple[str, ...]:
    """The comma-separated SPECs of `--kv-sglang`, each checked for its form (not yet resolved)."""
    specs = tuple(split_csv(option, text))
    for spec in specs:
        if spec != INSTALLED and not _looks_like_path(spec) and not VERSION.match(spec):
            raise ValueError(f"{option}: {spec!r} is not a SPEC; valid: {SPEC_FORMS}")
    return specs


def _looks_like_path(spec: str) -> bool:
    return "/" in spec or spec.startswith((".", "~")) or Path(spec).exists()


def _version_in(folder: Path) -> str | None:
    try:
        text = (folder / VERSION_FILE).read_text()  # `__version__ = "x"`, or setuptools-scm's `__version__ = version = "x"`
        found = re.search(r"^__version__ *= *(?:version *= *)?[\"']([^\"']+)[\"']", text, re.MULTILINE)
    except (OSError, UnicodeDecodeError):
        return None
    return found.group(1) if found else None


def _from_path(spec: str) -> SglangSource:
    path = Path(spec).expanduser()
    if path.is_file():
        if path.name != COMMON.name:
            raise ValueError(f"{FLAG} {spec}: a file must be {COMMON}, got {path.name}")
        return SglangSource(spec, path.resolve(), _short(path.resolve().parents[3]))
    for root in (path / "python", path):
        if (root / COMMON).is_file():
            return SglangSource(spec, (root / COMMON).resolve(), _short(root.resolve()))
    raise ValueError(f"{FLAG} {spec}: no {COMMON} under {path} or {path / 'python'}; "
                     "give an SGLang checkout or its python/ folder")


def _short(root: Path) -> str:
    """A checkout's folder (the one above python/)."""
    return (root.parent if root.name == "python" else root).name or str(root)


def _installed(spec: str) -> SglangSource:
    found = importlib.util.find_spec("sglang")  # finds the package without importing it
    if found is None or not found.submodule_search_locations:
        raise ValueError(f"{FLAG} {spec}: no sglang package is importable by {sys.executable}; "
                         f"pass a path or a version instead ({SPEC_FORMS})")
    package = Path(next(iter(found.submodule_search_locations)))
    file = package.parent / COMMON
    if not file.is_file():
        raise ValueError(f"{FLAG} {spec}: the installed sglang at {package} has no {COMMON}")
    return SglangSource(spec, file, _version_in(package.parent) or _short(package.parent))


def _fetch(version: str, folder: Path) -> None:
    """pip download --no-deps sglang==version; keep its common.py and version.py under `folder`."""
    with tempfile.TemporaryDirectory(prefix="kvpages-sglang-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
                   "-d", tmp, f"sglang=={version}"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
            failed = None if done.returncode == 0 else (
                [ln for ln in done.stderr.strip().splitlines() if "ERROR" in ln] or done.stderr.strip().splitlines()
                or [f"exit {done.returncode}"])[-1]
        except subprocess.TimeoutExpired:
            failed = f"no answer within {PIP_TIMEOUT_S:g} s"
        archives = sorted(Path(tmp).glob("sglang-*"))
        if failed or not archives:
            raise ValueError(
                f"{FLAG} {version}: could not fetch sglang=={version} with pip download ({failed or 'no archive'}); "
                f"offline, pass a path instead: an SGLang checkout or its python/ folder (e.g. {FLAG} "
                f"/path/to/sglang/python), or put {COMMON} (and {VERSION_FILE}) under {folder}")
        staged = Path(tmp) / "staged"
        _extract(archives[0], staged)
        if not (staged / COMMON).is_file():
            raise ValueError(f"{FLAG} {version}: the release archive {archives[0].name} has no {COMMON}")
        folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(folder, ignore_errors=True)
        shutil.move(str(staged), str(folder))


def _extract(archive: Path, into: Path) -> None:
    """Copy common.py and version.py out of a wheel or an sdist into `into/sglang/...`."""
    wanted = {COMMON.as_posix(), VERSION_FILE.as_posix()}
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as z:
            members = {name: z.read(name) for name in z.namelist() if name in wanted}
    else:
        with tarfile.open(archive) as t:  # the first match of each wins: later ones are overwritten by earlier ones
            found = {w: m for m in reversed(t.getmembers()) for w in wanted if m.isfile() and m.name.endswith("/" + w)}
            members = {w: t.extractfile(m).read() for w, m in found.items()}  # type: ignore[union-attr]
    for name, data in members.items():
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        (into / name).write_bytes(data)


def resolve(spec: str, cache: Path | None = None) -> SglangSource:
    """Find the common.py of one SPEC (fetching a release once into the cache)."""
    if spec == INSTALLED:
        return _installed(spec)
    if _looks_like_path(spec):
        return _from_path(spec)
    if VERSION.match(spec):
        folder = (cache or cache_dir()) / spec
        if not (folder / COMMON).is_file():
            _fetch(spec, folder)
        return SglangSource(spec, folder / COMMON, spec)
    raise ValueError(f"{FLAG}: {spec!r} is not a SPEC; valid: {SPEC_FORMS}")


def _module_names(tree: ast.Module) -> dict[str, str]:
    """{name: module} for numpy and torch as the file imports them (`import numpy as np`), defaults included."""
    defaults = {name: module for module, names in MODULES.items() for name in names}
    return defaults | {alias.asname or alias.name: alias.name for node in tree.body if isinstance(node, ast.Import)
                       for alias in node.names if alias.name in MODULES}


def _annotation(node: ast.expr | None) -> str:
    if node is None:
        return "no annotation"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value  # a string annotation, e.g. "torch.Tensor"
    return ast.unparse(node)


def _free_names(fn: ast.FunctionDef) -> set[str]:
    """Names the body reads that it does not bind (its parameters, assignments, imports, comprehensions)."""
    bound = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    loaded: set[str] = set()
    for node in ast.walk(fn):
        if node is fn.returns or isinstance(node, ast.arguments):
            continue
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.Lambda)) and node is not fn:
            bound |= {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
            if isinstance(node, ast.FunctionDef):
                bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
    annotations = {n.id for a in ast.walk(fn.args) if isinstance(a, ast.arg) and a.annotation
                   for n in ast.walk(a.annotation) if isinstance(n, ast.Name)}
    return loaded - bound - annotations - set(dir(builtins))


def load_function(source: SglangSource) -> SglangFunction:
    """`kv_to_page_indices` of `source.file`, with its calling convention; a ValueError naming the file otherwise."""
    where = f"{FLAG} {source.spec}: {source.file}"
    try:
        text = source.file.read_text()
        tree = ast.parse(text, filename=str(source.file))
    except (OSError, UnicodeDecodeError, SyntaxError) as exc:
        raise ValueError(f"{where}: cannot read it as Python ({exc})") from None
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found = next((n for n in defs if n.name == FUNCTION), None)
    if found is None:
        listed = ", ".join(n.name for n in defs[:12]) or "none"
        raise ValueError(f"{where} has no top-level function {FUNCTION}; its top-level functions: {listed}")
    line = found.decorator_list[0].lineno if found.decorator_list else found.lineno
    code = "\n".join(text.splitlines()[line - 1:found.end_lineno])
    returns = f" -> {ast.unparse(found.returns)}" if found.returns else ""
    signature = f"{FUNCTION}({ast.unparse(found.args)}){returns}"
    if isinstance(found, ast.AsyncFunctionDef):
        raise ValueError(f"{where}: {FUNCTION} is async ({signature}); kvpages places only a plain function")
    args = found.args
    positional = args.posonlyargs + args.args
    required_kw = [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None]
    if len(positional) - len(args.defaults) > 2 or len(positional) < 2 or args.vararg or required_kw:
        raise ValueError(f"{where}: cannot place the signature {signature}; kvpages calls it as "
                         f"{FUNCTION}(kv_indices, page_size)")
    first = _annotation(positional[0].annotation)
    names = _module_names(tree)
    parts = first.split(".")
    canonical = ".".join(["np" if names.get(parts[0]) == "numpy" else names.get(parts[0], parts[0])] + parts[1:])
    if canonical not in CONVENTIONS:
        raise ValueError(f"{where}: cannot place the signature {signature}: the first parameter's annotation is "
                         f"{first}; kvpages places np.ndarray (the caller copies the token indices to the host "
                         "first) or torch.Tensor (the device tensor)")
    unknown = sorted(_free_names(found) - set(names))
    if unknown:
        raise ValueError(f"{where}: {FUNCTION} uses {', '.join(unknown)}, defined elsewhere in the file; kvpages "
                         "compiles the function alone, with numpy and torch only")
    return SglangFunction(source, code, line, CONVENTIONS[canonical], names)


def _told_apart(f: SglangFunction) -> SglangFunction:
    """`f` labelled `<label>-<short commit>` when its file lies in a git checkout, else as it was."""
    try:
        done = subprocess.run(["git", "-C", str(f.source.file.parent), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return f
    commit = done.stdout.strip()
    if done.returncode != 0 or not commit:
        return f
    return dataclasses.replace(f, source=dataclasses.replace(f.source, label=f"{f.source.label}-{commit}"))


def load_all(specs: tuple[str, ...], cache: Path | None = None) -> tuple[SglangFunction, ...]:
    """Resolve and read every SPEC; two of one variant name are told apart by their git commits, else refused."""
    functions = [load_function(resolve(spec, cache)) for spec in dict.fromkeys(specs)]
    names = [f.source.name for f in functions]
    functions = [_told_apart(f) if names.count(f.source.name) > 1 else f for f in functions]
    seen: dict[str, str] = {}
    for f in functions:
        if f.source.name in seen:
            raise ValueError(f"{FLAG}: {seen[f.source.name]!r} and {f.source.spec!r} both make the variant "
                             f"{f.source.name}, and no git commit tells them apart; give only one of them, or rename "
                             "one checkout's folder")
        seen[f.source.name] = f.source.spec
    return tuple(functions)
