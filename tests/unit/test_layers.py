"""The house's floors: ``shared/`` is concept packages stacked in layers, and an import may
only point down.

Read from the source with ``ast`` (no module is imported), so a new upward import fails here
the moment it is written, wherever it sits: at the top, inside a function or under
``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Each package of ``shared/`` and its floor, lowest first. Packages on one floor are
#: siblings and import none of each other.
RANK = {
    "core": 0,
    "infra": 1,
    "providers": 2,
    "accounts": 3,
    "templates": 3,
    "engagement": 3,
    "audience": 3,
    "delivery": 4,
    "outbound": 5,
    "ingest": 6,
    "ops": 7,
}
#: The processes: none imports another (each is deployed, scaled and restarted alone).
SERVICES = ("api", "consumers", "webhooks", "tracking", "hooks")
#: Development and test tools, outside the wheel: the product never imports them.
HARNESSES = ("sandbox", "tests", "bench", "simulation", "chaos")
#: The command line and the development runner start the processes, so they may import them.
LAUNCHERS = ("services.cli", "services.devrun", "services.usercli")


def module_of(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, root: Path = ROOT) -> Iterator[tuple[str, int]]:
    """Every module ``path`` imports (``from a import b`` may name module ``a.b``), with its
    line."""
    me = module_of(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base, node.lineno
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno


def package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "shared" and parts[1] in RANK else None


def service_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "services" and parts[1] in SERVICES else None


def sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_shared_holds_only_its_concept_packages() -> None:
    loose = [p.name for p in (ROOT / "shared").glob("*.py") if p.name != "__init__.py"]
    folders = {p.name for p in (ROOT / "shared").iterdir() if (p / "__init__.py").exists()}

    assert loose == []
    assert folders == set(RANK)


def upward_imports(root: Path) -> list[str]:
    """Imports in ``root/shared`` that point up a floor or across to a sibling."""
    wrong = set()
    for path in (root / "shared").rglob("*.py"):
        mine = package_of(module_of(path, root))
        for target, line in imported(path, root):
            theirs = package_of(target)
            if mine and theirs and theirs != mine and RANK[theirs] >= RANK[mine]:
                wrong.add(f"{path.relative_to(root)}:{line} {mine} -> {theirs}")
    return sorted(wrong)


def test_no_import_in_shared_points_up_or_to_a_sibling() -> None:
    assert upward_imports(ROOT) == []


def test_shared_imports_no_process_nor_harness() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line} {target}"
        for path in sources("shared")
        for target, line in imported(path)
        if target.split(".")[0] in ("services", *HARNESSES)
    ]

    assert wrong == []


def test_no_process_imports_a_harness() -> None:
    """The sandbox starts only from the command line, and only in a checkout."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line} {target}"
        for path in sources("services")
        if module_of(path) not in LAUNCHERS
        for target, line in imported(path)
        if target.split(".")[0] in HARNESSES
    ]

    assert wrong == []


def test_no_process_imports_another() -> None:
    wrong = []
    for path in sources("services"):
        me = module_of(path)
        mine = service_of(me)
        for target, line in imported(path):
            theirs = service_of(target)
            if theirs and theirs != mine and me not in LAUNCHERS:
                wrong.append(f"{path.relative_to(ROOT)}:{line} {mine or me} -> {theirs}")

    assert wrong == []


def test_the_floor_check_sees_upward_sideways_and_relative_imports(tmp_path: Path) -> None:
    core = tmp_path / "shared" / "core"
    accounts = tmp_path / "shared" / "accounts"
    core.mkdir(parents=True)
    accounts.mkdir()
    (core / "models.py").write_text(
        "def f() -> None:\n    from shared.delivery import stats\n"  # up, inside a function
    )
    (accounts / "apikeys.py").write_text("from shared import templates\n")  # to a sibling
    (accounts / "accounts.py").write_text("from shared.core import models\nfrom . import apikeys\n")
    (core / "errors.py").write_text("from ..ops import check\n")  # up, relative

    assert upward_imports(tmp_path) == [
        "shared/accounts/apikeys.py:1 accounts -> templates",
        "shared/core/errors.py:1 core -> ops",
        "shared/core/models.py:2 core -> delivery",
    ]
