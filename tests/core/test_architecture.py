"""The import graph of attnlab keeps the layers of ARCHITECTURE.md.

Read from the source with ``ast`` (nothing is imported), every import counts,
module-level or inside a function:
- no import cycles between modules;
- no upward imports: a module imports only from its own layer or the layers
  below it (the order in LAYERS);
- no private names across modules: ``from .x import _y`` is refused; what is
  shared is public in a module made for it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import attnlab

PACKAGE = Path(attnlab.__file__).parent

#: Lowest first. A module belongs to the first entry that is a prefix of its name.
LAYERS: list[tuple[str, list[str]]] = [
    ("checks", ["attnlab.messages", "attnlab.errors", "attnlab.checks", "attnlab.shapes"]),
    ("math", ["attnlab.special", "attnlab.init", "attnlab.masks", "attnlab.positional",
              "attnlab.positional_relative", "attnlab.trace", "attnlab.hooks", "attnlab.gqa",
              "attnlab.masked_softmax", "attnlab.kernel_options", "attnlab.kernel",
              "attnlab.attention", "attnlab.backward"]),
    ("fast paths", ["attnlab.fast"]),
    ("modules", ["attnlab.nn"]),
    ("models", ["attnlab.models", "attnlab.torch", "attnlab.triton"]),
    ("distributed", ["attnlab.distributed"]),
    ("lenses", ["attnlab.lens"]),
    ("hugging face", ["attnlab.hf"]),
    ("training", ["attnlab.train"]),
    ("report", ["attnlab.report"]),
    ("studies", ["attnlab.studies"]),
    ("exercises", ["attnlab.exercises"]),
    ("cli", ["attnlab.cli", "attnlab.__main__"]),
    ("package", ["attnlab"]),
]


def _layer_of(module: str) -> int:
    best = -1
    best_len = -1
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = rank, len(prefix)
    assert best >= 0, f"{module} is in no layer of LAYERS: add it"
    return best


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(module: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, imported names, line) for every import of an attnlab module."""
    is_package = path.name == "__init__.py"
    base = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names
                      if a.name == "attnlab" or a.name.startswith("attnlab.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)]
                target = ".".join(anchor + ([node.module] if node.module else []))
            elif node.module and (node.module == "attnlab" or node.module.startswith("attnlab.")):
                target = node.module
            else:
                continue
            names = [a.name for a in node.names]
            # `from . import x` names a submodule: count it as an import of that module.
            subs = [n for n in names if f"{target}.{n}" in MODULES]
            if subs:
                found += [(f"{target}.{n}", [], node.lineno) for n in subs]
                names = [n for n in names if n not in subs]
            if names:
                found.append((target, names, node.lineno))
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer_of(module)


def test_no_upward_imports():
    upward = []
    for module, imports in GRAPH.items():
        if module == "attnlab":  # the package root re-exports everything
            continue
        for target, _, line in imports:
            if target == "attnlab":
                upward.append(f"{module}:{line} imports the package root")
            elif _layer_of(target) > _layer_of(module):
                upward.append(
                    f"{module}:{line} ({LAYERS[_layer_of(module)][0]}) imports {target} "
                    f"({LAYERS[_layer_of(target)][0]})"
                )
    assert not upward, "\n".join(upward)


def test_no_private_names_across_modules():
    private = [
        f"{module}:{line} imports {name} from {target}"
        for module, imports in GRAPH.items()
        for target, names, line in imports
        for name in names
        if name.startswith("_") and not name.startswith("__") and target != module
    ]
    assert not private, "\n".join(private)


def test_no_import_cycles():
    edges = {m: {t for t, _, _ in imports if t in MODULES and t != m}
             for m, imports in GRAPH.items() if m != "attnlab"}
    edges = {m: {t for t in ts if t != "attnlab"} for m, ts in edges.items()}
    # A package's __init__ importing its own submodules is the package, not a cycle.
    for m in edges:
        edges[m] = {t for t in edges[m] if not t.startswith(m + ".")}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles: list[str] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [node, nxt]))
            elif nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_the_core_layers_import_only_numpy(module):
    """The checks and math layers (and the fast paths, nn, models) never import torch."""
    if _layer_of(module) > _layer_of("attnlab.models") or module.startswith(
            ("attnlab.torch", "attnlab.triton")):
        return
    heavy = {"torch", "matplotlib", "transformers", "sentence_transformers"}
    for node in ast.walk(ast.parse(MODULES[module].read_text(encoding="utf-8"))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                 else [])
        assert not {n.split(".")[0] for n in names} & heavy, (module, names)
