"""The TUI and the shared vocabulary stay below the controller: no module of ``tui/`` imports
``controller`` (or the testbed, or the composition root), and ``mesh/`` imports only
``contract`` of qpmesh, counting imports inside functions too (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
OURS = ("contract", "sync", "mesh", "mqttlink", "controller", "recovery", "prober", "tui",
        "testbed", "qpmesh")  # fmt: skip


def _imported(path: Path) -> set[str]:
    """Return the qpmesh packages ``path`` imports (anywhere in the module)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        out |= {n.split(".")[0] for n in names} & set(OURS)
    return out


@pytest.mark.parametrize(
    ("package", "allowed"),
    [("tui", {"contract", "mesh", "mqttlink", "tui"}), ("mesh", {"contract", "mesh"})],
)
def test_a_package_imports_only_the_floors_below_it(package: str, allowed: set[str]) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    bad = {str(f.relative_to(ROOT)): _imported(f) - allowed for f in files}
    assert {f: sorted(p) for f, p in bad.items() if p} == {}
