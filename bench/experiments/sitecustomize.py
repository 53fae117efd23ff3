"""Opt-in what-if experiments, applied to every Python process of a run at start-up.

``python -m bench.run --experiment NAME`` puts this directory first on ``PYTHONPATH`` and
names the experiments in ``BENCH_EXPERIMENTS``; Python imports this module
(``sitecustomize``) before anything else, in the services too. Each experiment patches one
library default to measure what a proposed change to ``shared/`` would gain, without editing
it; the results JSON lists the experiments that were active, and a normal run has none.

Experiments that paid off became real changes and left this file: ``tcp-nodelay``
(``shared/infra/db.py`` sets TCP_NODELAY) and ``fast-email`` (``shared/core/addresses.py`` skips
email-validator for plain ASCII addresses).
"""

from __future__ import annotations

import os
from collections.abc import Callable

EXPERIMENTS = frozenset(filter(None, os.environ.get("BENCH_EXPERIMENTS", "").split(",")))

#: Every experiment by name.
KNOWN: dict[str, Callable[[], None]] = {}

for _name in EXPERIMENTS & KNOWN.keys():
    KNOWN[_name]()
