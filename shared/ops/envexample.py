"""``.env.example``, rendered from the settings model so the two cannot drift apart.

``make env-example`` writes the file; a unit test fails when the file and the model disagree.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from shared.infra.config import ENV_PREFIX, SECTIONS, Settings

_HEADER = """\
# Safedelivr configuration, rendered from shared/infra/config.py by `make env-example`.
# Copy to .env (read from the working directory) or export these variables.
# Every variable is optional; the values shown are the defaults (for a local machine
# with the sandbox providers: set real credentials and URLs in production).
"""


def render() -> str:
    """The whole file: the top-level variables, then one block per section."""
    blocks = [_HEADER, _block("General", ENV_PREFIX, _top_level())]
    for section, cls in SECTIONS.items():
        title = f"{section}: {(cls.__doc__ or '').strip().splitlines()[0]}"
        blocks.append(_block(title, f"{ENV_PREFIX}{section}_", cls.model_fields))
    blocks.append(_deploy_block(Path(__file__).resolve().parents[2] / "deploy" / "local"))
    return "\n".join(blocks)


#: ``#   SAFEDELIVR_NAME   what it does (default X)`` in a deploy script's header.
_SCRIPT_VARIABLE = re.compile(r"^#\s+(SAFEDELIVR_[A-Z_]+)\s+(.*?)\s*$")
_SCRIPT_DEFAULT = re.compile(r"\s*\(default ([^)]*)\)")


def _deploy_block(scripts: Path) -> str:
    """The variables the local service scripts read, from their own headers (``make
    services-up``; not settings of the services themselves)."""
    model = set(_model_variables())
    lines = ["# --- deploy/local: the local RabbitMQ, Cassandra and browser scripts"]
    seen: set[str] = set()
    for script in sorted(scripts.glob("*.sh")):
        for text in script.read_text().splitlines():
            match = _SCRIPT_VARIABLE.match(text)
            if match is None or match.group(1) in model | seen:
                continue
            name, what = match.groups()
            seen.add(name)
            default = _SCRIPT_DEFAULT.search(what)
            lines.append(f"#   {_SCRIPT_DEFAULT.sub('', what)} ({script.name})")
            lines.append(f"# {name}={default.group(1) if default else ''}")
    return "\n".join(lines) + "\n"


def _model_variables() -> list[str]:
    names = [f"{ENV_PREFIX}{name.upper()}" for name in _top_level()]
    for section, cls in SECTIONS.items():
        names.extend(f"{ENV_PREFIX}{section}_{name.upper()}" for name in cls.model_fields)
    return names


def _top_level() -> dict[str, FieldInfo]:
    """Settings' own scalar fields (its sections have blocks of their own)."""
    sections = {name.lower() for name in SECTIONS}
    return {k: v for k, v in Settings.model_fields.items() if k not in sections}


def _block(title: str, prefix: str, fields: dict[str, FieldInfo]) -> str:
    lines = [f"# --- {title}"]
    for name, field in fields.items():
        for line in (field.description or "").splitlines():
            lines.append(f"#   {line.strip()}".rstrip())
        lines.append(
            f"# {prefix}{name.upper()}={_value(field.get_default(call_default_factory=True))}"
        )
    return "\n".join(lines) + "\n"


def _value(default: Any) -> str:
    if default is None:
        return ""
    if isinstance(default, SecretStr):
        return default.get_secret_value()
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, BaseSettings):  # pragma: no cover - sections have their own block
        raise TypeError("a section is not a value")
    return str(default)
