"""Imports point down. The import graph of hf_tpu/ and harness/, read with `ast` (imports inside functions
included: a lazy import keeps start-up cheap, it must still point downwards), against the layer order
declared below. Fails on any import circle, on a module no layer names, on an import of a higher layer, and
on harness code assigning to an attribute of an hf_tpu module (the harness instruments the device through
hf_tpu.hooks). `python -m tests.test_layers` prints the layers and the size of every module.

Placing a new module: put it in the lowest layer that is above everything it imports.
"""

from __future__ import annotations

import ast
import fnmatch
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# hf_tpu, bottom to top: a module may import its own layer and the layers below it. Patterns are fnmatch
# patterns over dotted module names; a package's __init__ is the package's own name.
HF_TPU_LAYERS: list[tuple[str, list[str]]] = [
    ("foundations: errors, dtypes, settings, counters; nothing of JAX",
     ["hf_tpu.errors", "hf_tpu.devices", "hf_tpu.dtypes", "hf_tpu.precision", "hf_tpu.compile_options", "hf_tpu.module_moves",
      "hf_tpu.counters", "hf_tpu.memory", "hf_tpu.debug_checks",
      "hf_tpu.no_dynamo", "hf_tpu.autocast", "hf_tpu.process_group",
      "hf_tpu.bounded_sizes", "hf_tpu.bounded_positions", "hf_tpu.bounded_plan", "hf_tpu.bounded", "hf_tpu.bounded_frames", "hf_tpu.op_registry", "hf_tpu.host_malloc",
      "hf_tpu.cache_entries"]),
    ("JAX, started on first use", ["hf_tpu.runtime", "hf_tpu.program_bound", "hf_tpu.lapack_batches"]),
    ("per-program XLA compile options; executables shared across processes",
     ["hf_tpu.xla_options", "hf_tpu.executable_keys", "hf_tpu.executable_cache"]),
    ("helpers of the lowerings", ["hf_tpu.torchax_compat", "hf_tpu.rng", "hf_tpu.views", "hf_tpu.lowering_ops",
                                  "hf_tpu.lowering_parity", "hf_tpu.float8", "hf_tpu.random_ops",
                                  "hf_tpu.special_polynomials", "hf_tpu.special_functions", "hf_tpu.margin_loss", "hf_tpu.linalg_lowerings",
                                  "hf_tpu.unpool", "hf_tpu.scatter_ops",
                                  "hf_tpu.segment_reduce",
                                  "hf_tpu.fractional_pool", "hf_tpu.histogram", "hf_tpu.half_kernels", "hf_tpu.half_steps", "hf_tpu.batch_norm",
                                  "hf_tpu.topk_ties", "hf_tpu.pool_ties",
                                  "hf_tpu.graph_parity", "hf_tpu.graph_bool_index", "hf_tpu.meta_kernels", "hf_tpu.ctc_loss", "hf_tpu.cumulative", "hf_tpu.torch_dot_ffi"]),
    ("fused eager mode's recorder", ["hf_tpu.fused"]),
    ("tpu tensors and host copies", ["hf_tpu.tensor", "hf_tpu.host_copy"]),
    ("programs of one op, decompositions run as programs, plans, torch.save, optimizer kernels, the fused loss, packed weights",
     ["hf_tpu.op_jit", "hf_tpu.decomposed", "hf_tpu.plans", "hf_tpu.serialization", "hf_tpu.foreach_add", "hf_tpu.optim_lowerings",
      "hf_tpu.packed_weights",
      "hf_tpu.cross_entropy"]),
    ("the eager lowering table", ["hf_tpu.lowering"]),
    ("grid samplers (their fallback runs a decomposition)", ["hf_tpu.grid_sampler"]),
    ("backward kernels", ["hf_tpu.backward_lowerings"]),
    ("eager functional ops: their dtypes, their programs; foreach ops as one program",
     ["hf_tpu.op_dtypes", "hf_tpu.eager_functional", "hf_tpu.foreach_ops"]),
    ("eager in-place, view and storage ops",
     ["hf_tpu.functionalize", "hf_tpu.donated_add", "hf_tpu.mm_grad_layout", "hf_tpu.packed_eager", "hf_tpu.view_ops", "hf_tpu.storage_ops"]),
    ("eager dispatch (routing); the graph compiler", ["hf_tpu.dispatch", "hf_tpu.graph_ident", "hf_tpu.graph_outputs",
                                                      "hf_tpu.graph_compiler", "hf_tpu.backward_pieces",
                                                      "hf_tpu.unsafe_view_fix"]),
    ("the graph cache; direct kernels", ["hf_tpu.compile_cache", "hf_tpu.compile_cache.*", "hf_tpu.sdpa"]),
    ("the torch.compile backend", ["hf_tpu.compile"]),
    ("torch.tpu and its C++ hooks", ["hf_tpu.tpu_api", "hf_tpu.tpu_api.*", "hf_tpu.native"]),
    ("registration", ["hf_tpu.device"]),
    ("instrumentation for the harness and tests; the table of ops", ["hf_tpu.hooks", "hf_tpu.op_table"]),
    ("patches of upstream libraries", ["hf_tpu.patches", "hf_tpu.patches.*"]),
    ("the package's face", ["hf_tpu", "hf_tpu._autoload"]),
]

# harness, bottom to top. A module named exactly belongs to that layer even where a wildcard of another layer
# matches it too: the sweep's run (runner, workers) sits above diagnose, which uses the sweep's parts.
HARNESS_LAYERS: list[tuple[str, list[str]]] = [
    ("shared records and helpers", ["harness.schema", "harness.core", "harness.core.*"]),
    ("the model zoo", ["harness.zoo", "harness.zoo.*"]),
    ("calling an entry", ["harness.entry_calls"]),
    ("the figures and tables of a run", ["harness.ci.coverage", "harness.ci.verdicts", "harness.ci.performance",
                                         "harness.ci.causes", "harness.upstream.table"]),
    ("the sweep's parts: numerics, tolerances, results, devices, phases",
     ["harness.sweep", "harness.sweep.tolerances", "harness.sweep.*"]),
    ("diagnosis of failures", ["harness.diagnose", "harness.diagnose.*"]),
    ("running a sweep", ["harness.sweep.runner", "harness.sweep.worker", "harness.sweep.executors",
                         "harness.sweep.sweep", "harness.sweep.cli", "harness.sweep.merge_cli"]),
    ("CI reports", ["harness.ci", "harness.ci.*"]),
    ("upstream test suites", ["harness.upstream", "harness.upstream.*"]),
    ("commands", ["harness", "harness.cli", "harness.__main__", "harness.demo"]),
]

# Upward imports still to cut (none today). The list can only shrink: an entry that no longer exists fails the
# test too, so that it is deleted.
KNOWN_UPWARD: set[tuple[str, str]] = set()

# Harness code that still reassigns an hf_tpu attribute (file, what it assigns), until it uses hf_tpu.hooks
# (none today). The list can only shrink, as KNOWN_UPWARD.
KNOWN_ASSIGNMENTS: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the module imported (the longest dotted prefix that is a module of the tree)
    line: int


def modules(root: Path = ROOT, packages: tuple[str, ...] = ("hf_tpu", "harness")) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except under `if TYPE_CHECKING:` (never run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if _type_checking_only(node):
            stack.extend(node.orelse)  # type: ignore[attr-defined]
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imports(mods: dict[str, Path]) -> list[Import]:
    """Edges between the tree's own modules. `from pkg import name` points at pkg.name when that is a module,
    else at pkg (whose __init__ defines the name)."""
    def owner(name: str) -> str | None:
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in mods:
                return ".".join(parts[:i])
        return None

    out = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in _import_nodes(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for name in names:
                target = owner(name)
                if target is not None and target != mod:
                    out.append(Import(mod, target, node.lineno))
    return out


def circles(edges: list[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def layer_of(mod: str, layers: list[tuple[str, list[str]]]) -> int | None:
    """The one layer naming `mod` exactly, else the one whose wildcard matches it; None if none or several."""
    exact = [i for i, (_, patterns) in enumerate(layers) if mod in patterns]
    if exact:
        return exact[0] if len(exact) == 1 else None
    hits = [i for i, (_, patterns) in enumerate(layers) if any(fnmatch.fnmatchcase(mod, p) for p in patterns)]
    return hits[0] if len(hits) == 1 else None


def _layers_for(mod: str) -> list[tuple[str, list[str]]] | None:
    if mod == "hf_tpu" or mod.startswith("hf_tpu."):
        return HF_TPU_LAYERS
    if mod == "harness" or mod.startswith("harness."):
        return HARNESS_LAYERS
    return None


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, Path], list[Import]]:
    mods = modules()
    return mods, imports(mods)


def test_no_import_circle(graph) -> None:
    _, edges = graph
    found = circles(edges)
    detail = []
    for comp in found:
        inside = [e for e in edges if e.source in comp and e.target in comp]
        detail.append("\n".join(f"  {e.source} -> {e.target} (line {e.line})" for e in inside))
    assert not found, "import circles (cut one arrow of each: move what it needs to a lower module):\n" + \
        "\n\n".join(detail)


def test_every_module_has_a_layer(graph) -> None:
    mods, _ = graph
    unplaced = [m for m in mods if layer_of(m, _layers_for(m) or []) is None]
    assert not unplaced, (f"modules in no layer (or in several) of tests/test_layers.py: {unplaced}; put each "
                          "in the lowest layer above everything it imports")


def test_imports_point_down(graph) -> None:
    _, edges = graph
    upward, seen_known = [], set()
    for e in edges:
        layers = _layers_for(e.source)
        if layers is None or _layers_for(e.target) is not layers:
            continue  # harness -> hf_tpu is allowed; hf_tpu never imports harness (checked below)
        src, dst = layer_of(e.source, layers), layer_of(e.target, layers)
        if src is None or dst is None or dst <= src:
            continue
        if (e.source, e.target) in KNOWN_UPWARD:
            seen_known.add((e.source, e.target))
            continue
        upward.append(f"  {e.source} ({layers[src][0]}) -> {e.target} ({layers[dst][0]}), line {e.line}")
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)
    stale = KNOWN_UPWARD - seen_known
    assert not stale, f"KNOWN_UPWARD lists imports that are gone (delete them): {sorted(stale)}"


def test_hf_tpu_never_imports_harness(graph) -> None:
    _, edges = graph
    bad = [e for e in edges if e.source.split(".")[0] == "hf_tpu" and e.target.split(".")[0] == "harness"]
    assert not bad, bad


def _hf_tpu_aliases(tree: ast.AST) -> set[str]:
    """Names a module binds to hf_tpu modules (`from hf_tpu import dispatch as d`, `import hf_tpu.x as y`)."""
    names = set()
    for node in _import_nodes(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hf_tpu":
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "hf_tpu":
                    names.add(a.asname or a.name.split(".")[0])
    return names


def _base_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def harness_assignments(mods: dict[str, Path], root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(file, line, target) where harness code assigns to (or setattr()s, or deletes) an attribute of something
    it imported from hf_tpu."""
    found = []
    for mod, path in mods.items():
        if not mod.startswith("harness"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        aliases = _hf_tpu_aliases(tree)
        if not aliases:
            continue
        for node in ast.walk(tree):
            targets: list[ast.AST] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            elif isinstance(node, ast.Delete):
                targets = node.targets
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                    "setattr", "delattr") and node.args:
                if _base_name(node.args[0]) in aliases:
                    found.append((path.relative_to(root).as_posix(), node.lineno, ast.unparse(node.args[0])))
                continue
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute) and _base_name(sub) in aliases:
                        found.append((path.relative_to(root).as_posix(), node.lineno, ast.unparse(sub)))
                        break
    return found


def test_harness_does_not_assign_to_hf_tpu(graph) -> None:
    mods, _ = graph
    found = harness_assignments(mods)
    new = [f"{f}:{line} {target}" for f, line, target in found if (f, target) not in KNOWN_ASSIGNMENTS]
    assert not new, ("the harness reassigns hf_tpu attributes (use hf_tpu.hooks to observe ops, override "
                     f"lowerings or switch launch blocking): {new}")
    stale = KNOWN_ASSIGNMENTS - {(f, target) for f, _, target in found}
    assert not stale, f"KNOWN_ASSIGNMENTS lists assignments that are gone (delete them): {sorted(stale)}"


def test_the_checks_catch_what_they_are_for(tmp_path) -> None:
    """The graph reader on a small tree: a circle through a function-level import, an upward import, and a
    harness assignment to an hf_tpu attribute are all seen."""
    (tmp_path / "hf_tpu").mkdir()
    (tmp_path / "harness").mkdir()
    (tmp_path / "hf_tpu" / "__init__.py").write_text("")
    (tmp_path / "hf_tpu" / "low.py").write_text("def f():\n    from hf_tpu import high\n")
    (tmp_path / "hf_tpu" / "high.py").write_text("from hf_tpu import low\n")
    (tmp_path / "harness" / "__init__.py").write_text("")
    (tmp_path / "harness" / "x.py").write_text(
        "from hf_tpu import low as L\n\ndef g():\n    L.f = None\n    setattr(L, 'f', None)\n"
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hf_tpu import high\n")
    mods = modules(tmp_path)
    edges = imports(mods)
    assert circles(edges) == [["hf_tpu.high", "hf_tpu.low"]]
    assert ("harness.x", "hf_tpu.high") not in {(e.source, e.target) for e in edges}  # TYPE_CHECKING only
    layers = [("low", ["hf_tpu.*"]), ("high", ["hf_tpu.high"])]
    assert layer_of("hf_tpu.low", layers) == 0 and layer_of("hf_tpu.high", layers) == 1  # the exact name wins
    up = [e for e in edges if e.source == "hf_tpu.low"]
    assert [(e.target, e.line) for e in up] == [("hf_tpu.high", 2)]
    found = harness_assignments(mods, tmp_path)
    assert found == [("harness/x.py", 4, "L.f"), ("harness/x.py", 5, "L")]


def main() -> None:
    mods = modules()
    sizes = {m: len(p.read_text().splitlines()) for m, p in mods.items()}
    for title, layers in (("hf_tpu", HF_TPU_LAYERS), ("harness", HARNESS_LAYERS)):
        print(f"{title}, top layer first:")
        for i in reversed(range(len(layers))):
            name, _ = layers[i]
            members = sorted(m for m in mods if layer_of(m, layers) == i)
            print(f"  {i:2d} {name}: " + ", ".join(f"{m} {sizes[m]}" for m in members))
    big = sorted(((n, m) for m, n in sizes.items() if n > 500), reverse=True)
    print("modules over 500 lines:", ", ".join(f"{m} {n}" for n, m in big) or "none")


if __name__ == "__main__":
    sys.exit(main())
