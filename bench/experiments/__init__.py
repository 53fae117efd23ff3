"""What-if experiments (see :mod:`bench.experiments.sitecustomize`), named for ``--experiment``."""

from __future__ import annotations

#: The experiments ``sitecustomize`` knows, importable without applying any of them.
NAMES: tuple[str, ...] = ()
