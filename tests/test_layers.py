"""lessonkit's shape: its layers (core, display, lessons, exercises), what each may import, and the line
budgets each is held to. A change that needs more lines raises its layer's budget here, in the same
commit, and says why in its message: growth is then a decision, not a drift.

The layers, each importing only those before it: core (build, check, load, call, cache, trace, references,
timing, files, language), display, lessons (each lesson's helpers), exercises. ``lessonkit/__init__.py`` and
``__main__.py`` stand above them all (the short names, the build's command line). The tools beside lessonkit
(``workbench/``) may import it; lessonkit never imports them."""
from __future__ import annotations

import ast
import sys
from functools import lru_cache
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "lessonkit"
LAYERS = ("core", "display", "lessons", "exercises")
# lines (wc -l, docstrings, comments and blank lines included) of each layer, and of the whole package
# core: 3800, raised to 3920 for the q8 cache's own page-aligned mappings (cache.mapped_zeros: whole huge pages with
# MADV_HUGEPAGE, or 4 KiB pages as the board has), which the memory bound at 256K tokens needs (lessons 03 and 09),
# and for the kept object files of toolchain (an edit of the kernel rebuilds in 2 s, not 11 s); raised to 4080 for
# core/compare.py (135 lines): the one way every lesson compares two timings, interleaved rounds, a band and a verdict
# lessons: 3900, raised to 4030 for lessons/comparisons.py (115 lines): each comparison a lesson shows, written once,
# and for roofline's steps judged by the saved rounds with compare's band (lesson 09)
# total: 10600, raised to 10880 for the same modules and the exercises below
# exercises: 2100, raised to 2150 for questions and messages that no longer give the answer away or contradict their
# checker (lessons 00, 01, 03, 06, 07), and lesson 07's exercise 3 naming its own data
BUDGETS = {"core": 4080, "display": 650, "lessons": 4030, "exercises": 2150}
TOTAL_BUDGET = 10880
MODULE_MAX_LINES = 600
MAX_FLOORS = 9  # the longest chain of imports, a module its own floor 1


def modules() -> dict[str, Path]:
    """``{"core.native": path, ..., "__init__": path}``: every module of lessonkit, by its dotted name."""
    return {".".join(p.relative_to(PKG).with_suffix("").parts): p for p in sorted(PKG.rglob("*.py"))}


def layer(name: str) -> str | None:
    return name.split(".")[0] if name.split(".")[0] in LAYERS else None


def resolve(parts: list[str]) -> str | None:
    """The module a dotted path names: itself, or the package it is (its __init__); None if neither."""
    known = modules()
    for name in (".".join(parts), ".".join([*parts, "__init__"])):
        if name in known:
            return name
    return None


@lru_cache(maxsize=None)
def imports(name: str) -> frozenset[str]:
    """The lessonkit modules ``name`` imports, at its top or inside a function (a lazy import runs too),
    by dotted name; ``"workbench"`` for any import of the tools' package."""
    package = name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(modules()[name].read_text())):
        if isinstance(node, ast.ImportFrom):
            top = (node.module or "").split(".")[0]
            if node.level:
                stem = [*package[:len(package) - node.level + 1], *(node.module.split(".") if node.module else [])]
            elif top == "workbench":
                found.add("workbench")
                continue
            elif top == "lessonkit":
                stem = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:  # a name may be a submodule (from .core import native) or an object
                found.add(resolve([*stem, alias.name]) or resolve(stem))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                top, *rest = alias.name.split(".")
                if top == "workbench":
                    found.add("workbench")
                elif top == "lessonkit":
                    found.add(resolve(rest))
    return frozenset(f for f in found if f and f != name)


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_each_layer_is_within_its_budget():
    mods = modules()
    got = {lay: sum(lines(p) for n, p in mods.items() if layer(n) == lay) for lay in LAYERS}
    total = sum(lines(p) for p in mods.values())
    over = {lay: (got[lay], BUDGETS[lay]) for lay in LAYERS if got[lay] > BUDGETS[lay]}
    assert not over, f"layers over their line budgets (lines, budget): {over}; all: {got}"
    assert total <= TOTAL_BUDGET, f"lessonkit has {total} lines, above its budget of {TOTAL_BUDGET}"


def test_no_module_is_over_600_lines():
    long = {n: lines(p) for n, p in modules().items() if lines(p) > MODULE_MAX_LINES}
    assert not long, f"modules over {MODULE_MAX_LINES} lines: {long}"


def test_no_layer_imports_a_layer_above_it_and_lessonkit_never_imports_the_tools():
    up = []
    for name in modules():
        mine = layer(name)
        for target in imports(name):
            if target == "workbench":
                up.append(f"{name} imports workbench")
            elif mine and layer(target) and LAYERS.index(layer(target)) > LAYERS.index(mine):
                up.append(f"{name} ({mine}) imports {target} ({layer(target)})")
            elif mine and target in ("__init__", "__main__"):
                up.append(f"{name} imports the package's top ({target})")
    assert not up, "imports that run up the layers:\n" + "\n".join(up)


def floors(graph: dict[str, set]) -> dict[str, int]:
    """Each node's floor: 1 for one that imports nothing of ``graph``, else 1 + its highest import's.
    AssertionError on a circle of imports."""
    done: dict[str, int] = {}

    def floor(node: str, path: tuple) -> int:
        if node in path:
            raise AssertionError("a circle of imports: " + " -> ".join([*path[path.index(node):], node]))
        if node not in done:
            done[node] = 1 + max((floor(t, (*path, node)) for t in graph[node]), default=0)
        return done[node]
    for node in graph:
        floor(node, ())
    return done


def graphs() -> dict[str, dict[str, set]]:
    """The import graph as the package is drawn: ``"lessonkit"``, its layers (and its top modules) as rooms; and
    each layer's own graph of modules."""
    room = lambda name: layer(name) or name  # noqa: E731
    out: dict[str, dict[str, set]] = {"lessonkit": {}, **{lay: {} for lay in LAYERS}}
    for name in modules():
        targets = {t for t in imports(name) if t != "workbench"}
        out["lessonkit"].setdefault(room(name), set()).update(room(t) for t in targets if room(t) != room(name))
        if layer(name):
            out[layer(name)].setdefault(name, set()).update(t for t in targets if layer(t) == layer(name))
    return out


def test_the_import_graph_has_no_circle_and_at_most_nine_floors():
    """The layers as rooms (today 4 floors: core, display, lessons and the package's top, exercises), and
    inside each layer its modules (today core 7, lessons 4): no circle, at most MAX_FLOORS floors each."""
    for what, graph in graphs().items():
        got = floors(graph)
        assert max(got.values()) <= MAX_FLOORS, f"{what}: {max(got.values())} floors (at most {MAX_FLOORS}): {got}"


@pytest.mark.parametrize("bad", ["from ..lessons import bench", "from lessonkit.exercises import core",
                                 "import workbench.bench"])
def test_the_check_sees_an_import_that_runs_up(tmp_path, monkeypatch, bad):
    """The checks above are shown to fail: a core module that imports a lesson helper, an exercise or a tool."""
    fake = tmp_path / "lessonkit"
    for p in PKG.rglob("*.py"):
        (fake / p.relative_to(PKG)).parent.mkdir(parents=True, exist_ok=True)
        (fake / p.relative_to(PKG)).write_text(p.read_text())
    (fake / "core" / "timing.py").write_text((fake / "core" / "timing.py").read_text() + f"\n{bad}\n")
    monkeypatch.setattr(sys.modules[__name__], "PKG", fake)
    imports.cache_clear()
    try:
        with pytest.raises(AssertionError, match="run up"):
            test_no_layer_imports_a_layer_above_it_and_lessonkit_never_imports_the_tools()
    finally:
        imports.cache_clear()
