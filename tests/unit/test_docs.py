"""The README and the code's own docs name only files that exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from shared.core.catalog import with_table

ROOT = Path(__file__).resolve().parents[2]
_PATH = re.compile(
    r"(?<![\w./-])((?:shared|services|deploy|tests|bench|chaos)/[\w/-]+"
    r"\.(?:py|sh|cql|yaml|md|html|options|template))\b"
)


def _tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [ROOT / name for name in out.split() if name.endswith((".py", ".md", ".sh"))]


def test_every_file_path_named_in_a_tracked_text_exists() -> None:
    missing = {
        f"{source.relative_to(ROOT)} -> {name}"
        for source in _tracked()
        for name in _PATH.findall(source.read_text(errors="replace"))
        if not (ROOT / name).exists()
    }
    assert missing == set()


def test_the_readmes_provider_table_is_the_catalogs() -> None:
    """``make docs`` rewrites it; a provider or limit changed in the catalog alone fails here."""
    readme = (ROOT / "README.md").read_text()

    assert with_table(readme) == readme


def test_the_readmes_map_names_every_module_of_each_shared_package() -> None:
    """Each floor's row lists its package's modules: a module added elsewhere is found."""
    readme = (ROOT / "README.md").read_text()
    unnamed = set()
    for package in sorted(p for p in (ROOT / "shared").iterdir() if (p / "__init__.py").exists()):
        row = re.search(rf"^\| \d+ \| `shared/{package.name}` \|.*$", readme, re.MULTILINE)
        assert row is not None, f"no row for shared/{package.name}"
        unnamed |= {
            f"shared/{package.name}/{module.stem}"
            for module in package.glob("*.py")
            if module.stem != "__init__" and f"`{module.stem}`" not in row.group(0)
        }
    assert unnamed == set()
