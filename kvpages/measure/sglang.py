"""SGLang's own `kv_to_page_indices` as variants `sglang@<label>`, compiled from its source with numpy and torch.

kvpages.core.sglang reads the function with `ast`; the calling convention (docs/guide.md, "SGLang's own code") sets
its `moves`: `Moves.TOKENS` for an `np.ndarray` first parameter, `Moves.PAGES` for a `torch.Tensor` one.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvpages.core.sglang import FUNCTION, SglangFunction, SglangSource, load_all, load_function
from kvpages.measure.variants import Moves, Variant, get_variant, register, variant_names

_LOADED: dict[str, SglangFunction] = {}
"""The SGLang functions registered in this process, by variant name (the cross-check process registers them too)."""

CONVENTION_TEXT = {
    "numpy": "np.ndarray input: the caller copies every token index to the host first, then it strides on the host",
    "tensor": "torch.Tensor input: it gets the device tensor",
}


def compile_function(function: SglangFunction) -> Callable[..., Any]:
    """The function, compiled alone from its source (line numbers of its file kept), with numpy and torch."""
    tree = ast.parse(function.code, filename=str(function.source.file))
    ast.increment_lineno(tree, function.line - 1)
    namespace: dict[str, Any] = {"__name__": __name__, "__builtins__": builtins}
    namespace.update({name: importlib.import_module(module) for name, module in function.names.items()})
    code = compile(tree, str(function.source.file), "exec", flags=__future__.annotations.compiler_flag,
                   dont_inherit=True)
    exec(code, namespace)
    return namespace[FUNCTION]


def _host_first(fn: Callable[[np.ndarray, int], np.ndarray]) -> Callable[[torch.Tensor, int], np.ndarray]:
    def call_with_host_copy(kv_indices: torch.Tensor, page_size: int) -> np.ndarray:
        return fn(kv_indices.cpu().numpy(), page_size)

    return call_with_host_copy


def register_sglang(function: SglangFunction) -> Variant:
    """Register `function` as `sglang@<label>`; the same source registered again is a no-op."""
    source = function.source
    name = source.name
    if name in _LOADED:
        if _LOADED[name].code != function.code:
            raise ValueError(f"variant {name!r} is already registered from {_LOADED[name].source.file}; "
                             f"{source.file} has another {FUNCTION}")
        return get_variant(name)
    if name in variant_names():
        raise ValueError(f"variant {name!r} is already registered; choose another --kv-sglang SPEC")
    compiled = compile_function(function)
    numpy_input = function.convention == "numpy"
    fn = _host_first(compiled) if numpy_input else compiled
    description = (f"SGLang {source.label}'s {FUNCTION} ({source.file}:{function.line}), by its source; "
                   f"{CONVENTION_TEXT[function.convention]}.")
    doc = f"{description}\n\nRegistered by --kv-sglang {source.spec}.\n\n{function.code}"
    _LOADED[name] = function
    return register(Variant(name, fn, description, doc, Moves.TOKENS if numpy_input else Moves.PAGES, ()))


def register_specs(specs: tuple[str, ...]) -> tuple[Variant, ...]:
    """Resolve, read, compile and register every SPEC of --kv-sglang (ValueError naming the spec or the file)."""
    return tuple(register_sglang(f) for f in load_all(specs))


def loaded_sources() -> list[dict[str, str]]:
    """The registered SGLang sources, as JSON for the cross-check and breakdown processes."""
    return [{"spec": f.source.spec, "file": str(f.source.file), "label": f.source.label} for f in _LOADED.values()]


def register_sources(sources: list[dict[str, str]]) -> None:
    """In a child process: register the sources its parent had registered (kvpages.measure.crosscheck)."""
    for s in sources:
        register_sglang(load_function(SglangSource(s["spec"], Path(s["file"]), s["label"])))
