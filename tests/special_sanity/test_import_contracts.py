"""The import structure of ``verl``: the import-linter contracts of ``pyproject.toml`` hold, and no module of
``verl`` takes part in an import cycle.

The contracts (layers, independent siblings, forbidden imports) are checked by running import-linter's own entry
point, as the ``lint-imports`` pre-commit hook does. The cycle check builds the import graph with grimp (which
import-linter installs) and looks for strongly connected components: every module of a component imports every
other one, directly or not, so a component of more than one module is a cycle. Imports inside functions and under
``TYPE_CHECKING`` count, as they do for the contracts.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp", reason="import-linter (and with it grimp) is in the dev extra")

REPO_ROOT = Path(__file__).resolve().parents[2]

# import-linter's entry point, run in a fresh interpreter so that its report (and nothing else) is the output
_LINT_IMPORTS = (
    "import sys; from importlinter.cli import lint_imports; "
    "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))"
)


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of a directed graph, iteratively (no recursion limit).

    Args:
        graph: every node mapped to the nodes it points to (targets missing from the keys are ignored).

    Returns:
        The components, each a sorted list of nodes; single nodes are included.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next((t for t in targets if t in graph), None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                on_stack.add(target)
                work.append((target, iter(sorted(graph[target]))))
            elif target in on_stack:
                low[node] = min(low[node], index[target])
    return components


def test_components_of_a_small_graph():
    # a -> b -> c -> a is one cycle; d -> a leaves d alone; e -> e is a self-loop, a component of one node
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    components = sorted(strongly_connected_components(graph))
    assert components == [["a", "b", "c"], ["d"], ["e"]]


def test_import_contracts_hold():
    """Every contract of [tool.importlinter] in pyproject.toml is kept (the report names each broken import)."""
    result = subprocess.run(
        [sys.executable, "-c", _LINT_IMPORTS], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"lint-imports found broken contracts:\n{result.stdout}\n{result.stderr}"


def test_verl_has_no_import_cycle():
    """No two modules of verl import each other, directly or through others."""
    graph = grimp.build_graph("verl", cache_dir=None)
    imports = {module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules}
    cycles = [component for component in strongly_connected_components(imports) if len(component) > 1]
    details = []
    for component in cycles:
        # one concrete loop through the component's first two members, to say where to cut
        there = graph.find_shortest_chain(importer=component[0], imported=component[1]) or ()
        back = graph.find_shortest_chain(importer=component[1], imported=component[0]) or ()
        details.append(f"{component}\n    e.g. {' -> '.join(there)} -> {' -> '.join(back[1:])}")
    assert not cycles, "import cycles among verl modules:\n" + "\n".join(details)
