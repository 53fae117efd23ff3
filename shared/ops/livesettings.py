"""Settings an operator changes while everything runs: the provider chain's order, pausing a
provider, attempts per chunk, rate limits, alerts, and the sending domains' capacity rules.

The environment (``SAFEDELIVR_PROVIDERS_*``) gives each setting its starting value; a change
made through ``PATCH /v1/settings`` or ``safedelivr settings set`` is stored in Cassandra
(``live_settings``, with every change audited in ``settings_audit``: who, when, old -> new),
and then a nudge is published on the ``<exchange>.settings`` fanout exchange. Every process
subscribes to it with a queue of its own, reloads the stored values when nudged (and every
:data:`RELOAD_EVERY` seconds, should a nudge be missed) and applies them (:class:`Watcher`):
within a second of the change in practice.

Settings are flat names with string values (``providers.chain`` = ``mg,sg``,
``providers.sg.paused`` = ``true``, ``providers.max_attempts`` = ``6``); the API speaks them
as nested JSON with provider names or codes. Parsing and validation are pure.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import orjson

from shared.core.addresses import (
    AddressError,
    address_key,
    normalize_email,
    parse_address,
    split_address_list,
)
from shared.core.catalog import CATALOG, CODES, code_of
from shared.core.errors import DependencyUnavailable
from shared.delivery.domain_capacity import CapacityRules
from shared.infra.broker import Broker
from shared.infra.config import ProviderSettings
from shared.infra.db import Database, utc
from shared.infra.leases import Alarm
from shared.providers.provider_health import HealthRules

log = logging.getLogger(__name__)

#: Seconds between reloads that do not wait for a nudge.
RELOAD_EVERY: Final = 30.0
MAX_ATTEMPTS_LIMIT: Final = 50
MAX_RATE_LIMIT: Final = 100_000.0
_WHOLE_NUMBERS: Final = {
    "providers.max_attempts": (1, MAX_ATTEMPTS_LIMIT),
    "alerts.cool_off": (10, 86_400),
    "alerts.queue_depth": (1, 10**9),
    "alerts.error_burst": (1, 10**6),
    "capacity.initial": (10, 10**9),
    "providers.health.cool_down": (5, 3600),
}
_FRACTIONS: Final = {
    "providers.health.open_below": (0.01, 0.99),
    "providers.health.demote_below": (0.01, 1.0),
    "providers.health.probe_share": (0.01, 0.5),
    "capacity.max_bounce_rate": (0.001, 1.0),
    "capacity.max_complaint_rate": (0.0001, 1.0),
}
_HEALTH_FIELDS: Final = {
    "open_below": "providers.health.open_below",
    "demote_below": "providers.health.demote_below",
    "cool_down_s": "providers.health.cool_down",
    "probe_share": "providers.health.probe_share",
}
_CAPACITY_FIELDS: Final = {
    "enabled": "capacity.enabled",
    "initial_per_day": "capacity.initial",
    "max_bounce_rate": "capacity.max_bounce_rate",
    "max_complaint_rate": "capacity.max_complaint_rate",
}
_ALERT_FIELDS: Final = {
    "webhook_url": "alerts.webhook_url",
    "email_to": "alerts.email_to",
    "email_from": "alerts.email_from",
    "cool_off_s": "alerts.cool_off",
    "queue_depth": "alerts.queue_depth",
    "error_burst": "alerts.error_burst",
}
_TRUE, _FALSE = frozenset({"true", "1", "yes", "on"}), frozenset({"false", "0", "no", "off"})


class SettingsError(ValueError):
    """A change that cannot be made; ``fields`` maps each bad name to why."""

    def __init__(self, fields: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in fields.items()))
        self.fields = fields


@dataclass(frozen=True, slots=True)
class LiveSettings:
    """The values in force."""

    chain: tuple[str, ...]
    paused: frozenset[str] = frozenset()
    max_attempts: int = 6
    rate_limits: tuple[tuple[str, float], ...] = ()
    """Requests per second by provider code, for every process together (none: no limit)."""
    alert_url: str = ""
    """Where alerts are posted (Slack/Discord-compatible incoming webhook); empty: logged."""
    alert_cool_off: int = 600
    """Seconds during which the same alert is not sent again (a burst alerts once)."""
    alert_queue_depth: int = 10_000
    """Jobs waiting in one provider queue above which an alert is raised."""
    alert_error_burst: int = 50
    """Provider-side failures of one provider in a minute that make a burst worth an alert."""
    alert_email_to: tuple[str, ...] = ()
    """Operators' addresses alerts are mailed to, through Safedelivr itself."""
    alert_email_from: str = ""
    health: HealthRules = field(default_factory=HealthRules)
    """The thresholds of circuits and chain ordering."""
    capacity: CapacityRules = field(default_factory=CapacityRules)
    """Daily capacity per sending domain (off unless an operator turns it on)."""

    def limits(self) -> dict[str, float]:
        return dict(self.rate_limits)

    def running_chain(self, configured: Sequence[str]) -> tuple[str, ...]:
        """The chain to send through: its providers this process can use, paused ones left
        out, unless every one is paused (then work waits; see :meth:`all_paused`)."""
        usable = [c for c in self.chain if c in configured] or list(configured)
        running = [c for c in usable if c not in self.paused]
        return tuple(running or usable)

    def all_paused(self, configured: Sequence[str]) -> bool:
        usable = [c for c in self.chain if c in configured] or list(configured)
        return all(c in self.paused for c in usable)


def defaults(providers: ProviderSettings) -> dict[str, str]:
    """Every setting's value from the environment."""
    values = {
        "providers.chain": providers.chain,
        "providers.max_attempts": str(providers.max_attempts),
    }
    values.update({f"providers.{code}.paused": "false" for code in CODES})
    values.update(
        {f"providers.{c}.rate_limit": f"{CATALOG[c].requests_per_s or 0:g}" for c in CODES}
    )
    values.update(
        {
            "alerts.webhook_url": "",
            "alerts.cool_off": "600",
            "alerts.queue_depth": "10000",
            "alerts.error_burst": "50",
            "alerts.email_to": "",
            "alerts.email_from": "",
        }
    )
    health = HealthRules()
    values.update(
        {
            "providers.health.open_below": f"{health.open_below:g}",
            "providers.health.demote_below": f"{health.demote_below:g}",
            "providers.health.cool_down": f"{health.cool_down:g}",
            "providers.health.probe_share": f"{health.probe_share:g}",
        }
    )
    rules = CapacityRules()
    values.update(
        {
            "capacity.enabled": "false",
            "capacity.initial": str(rules.initial),
            "capacity.max_bounce_rate": f"{rules.max_bounce_rate:g}",
            "capacity.max_complaint_rate": f"{rules.max_complaint_rate:g}",
        }
    )
    return values


def resolve(stored: Mapping[str, str], providers: ProviderSettings) -> LiveSettings:
    """The values in force: the stored ones over the environment's (an unreadable stored
    value is ignored, with the environment's in its place)."""
    values = defaults(providers)
    for name, value in stored.items():
        try:
            values[name] = check(name, value)
        except SettingsError:
            log.warning("ignoring the stored setting %s=%r: not valid now", name, value)
    return LiveSettings(
        chain=tuple(values["providers.chain"].split(",")),
        paused=frozenset(c for c in CODES if values[f"providers.{c}.paused"] == "true"),
        max_attempts=int(values["providers.max_attempts"]),
        rate_limits=tuple(
            (c, float(values[f"providers.{c}.rate_limit"]))
            for c in CODES
            if float(values[f"providers.{c}.rate_limit"]) > 0
        ),
        alert_url=values["alerts.webhook_url"],
        alert_cool_off=int(values["alerts.cool_off"]),
        alert_queue_depth=int(values["alerts.queue_depth"]),
        alert_error_burst=int(values["alerts.error_burst"]),
        alert_email_to=tuple(e for e in values["alerts.email_to"].split(",") if e),
        alert_email_from=values["alerts.email_from"],
        health=_health(values),
        capacity=CapacityRules(
            enabled=values["capacity.enabled"] == "true",
            initial=int(values["capacity.initial"]),
            max_bounce_rate=float(values["capacity.max_bounce_rate"]),
            max_complaint_rate=float(values["capacity.max_complaint_rate"]),
        ),
    )


def _health(values: Mapping[str, str]) -> HealthRules:
    rules = HealthRules(
        open_below=float(values["providers.health.open_below"]),
        demote_below=float(values["providers.health.demote_below"]),
        cool_down=float(values["providers.health.cool_down"]),
        probe_share=float(values["providers.health.probe_share"]),
    )
    if rules.open_below >= rules.demote_below:
        log.warning(
            "ignoring providers.health: open_below %g is not below demote_below %g",
            rules.open_below,
            rules.demote_below,
        )
        return HealthRules()
    return rules


def check(name: str, value: str) -> str:
    """The canonical form of ``value`` for setting ``name``; SettingsError if it is not one."""
    checker = _checker(name)
    if checker is None:
        raise SettingsError({name: "is not a setting that can be changed live"})
    return checker(name, value.strip())


def _checker(name: str) -> Callable[[str, str], str] | None:
    exact: dict[str, Callable[[str, str], str]] = {
        "providers.chain": _chain,
        "providers.max_attempts": _whole,
        "alerts.webhook_url": _url,
        "alerts.cool_off": _whole,
        "alerts.queue_depth": _whole,
        "alerts.error_burst": _whole,
        "alerts.email_to": _addresses,
        "alerts.email_from": _address,
        "providers.health.open_below": _fraction,
        "providers.health.demote_below": _fraction,
        "providers.health.cool_down": _whole,
        "providers.health.probe_share": _fraction,
        "capacity.enabled": _flag,
        "capacity.initial": _whole,
        "capacity.max_bounce_rate": _fraction,
        "capacity.max_complaint_rate": _fraction,
    }
    if name in exact:
        return exact[name]
    parts = name.split(".")
    if len(parts) == 3 and parts[0] == "providers" and parts[1] in CODES:
        return {"paused": _flag, "rate_limit": _rate}.get(parts[2])
    return None


def _chain(name: str, text: str) -> str:
    codes = [code_of(p) for p in text.split(",") if p.strip()]
    if None in codes:
        raise SettingsError({name: f"unknown provider in {text!r}; known: {_known()}"})
    if not codes or len(set(codes)) != len(codes):
        raise SettingsError({name: "must list one or more providers, each once"})
    return ",".join(c for c in codes if c)


def _whole(name: str, text: str) -> str:
    low, high = _WHOLE_NUMBERS[name]
    if not text.isascii() or not text.isdecimal() or not low <= int(text) <= high:
        raise SettingsError({name: f"must be a whole number from {low} to {high}"})
    return str(int(text))


def _url(name: str, text: str) -> str:
    if text and not re.match(r"^https?://[^\s/?#]+(/\S*)?$", text):
        raise SettingsError({name: "must be an http(s) URL, or empty for none"})
    return text[:2000]


#: Operators an alert may be mailed to.
MAX_ALERT_ADDRESSES: Final = 20


def _addresses(name: str, text: str) -> str:
    """Addresses as ``a@example.com,b@example.com`` (empty: none)."""
    try:
        found = [normalize_email(a) for a in split_address_list(text) if a.strip()]
    except AddressError as exc:
        raise SettingsError({name: f"must be e-mail addresses, comma-separated: {exc}"}) from None
    if len(found) > MAX_ALERT_ADDRESSES:
        raise SettingsError({name: f"must hold at most {MAX_ALERT_ADDRESSES} addresses"})
    first: dict[str, str] = {}
    for address in found:
        first.setdefault(address_key(address), address)
    return ",".join(first.values())


def _address(name: str, text: str) -> str:
    """One sender, ``Name <a@example.com>`` or ``a@example.com`` (empty: none)."""
    if not text:
        return ""
    try:
        address = parse_address(text)
    except AddressError as exc:
        raise SettingsError({name: f"must be an e-mail address: {exc}"}) from None
    if not address.name:
        return address.email
    quoted = address.name.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{quoted}" <{address.email}>'


def _flag(name: str, text: str) -> str:
    if text.lower() in _TRUE:
        return "true"
    if text.lower() in _FALSE:
        return "false"
    raise SettingsError({name: "must be true or false"})


def _fraction(name: str, text: str) -> str:
    low, high = _FRACTIONS[name]
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not low <= value <= high:  # NaN fails this too
        raise SettingsError({name: f"must be a fraction from {low:g} to {high:g} (0.05 = 5 %)"})
    return f"{value:g}"


def _rate(name: str, text: str) -> str:
    try:
        rate = float(text)
    except ValueError:
        rate = -1.0
    if not 0 <= rate <= MAX_RATE_LIMIT:  # NaN fails this too
        raise SettingsError(
            {name: f"must be requests per second, 0 (no limit) to {MAX_RATE_LIMIT:g}"}
        )
    return f"{rate:g}"


def _known() -> str:
    return ", ".join(f"{info.name.lower()} ({code})" for code, info in CATALOG.items())


def flatten_patch(body: object) -> dict[str, str]:
    """The flat changes of a ``PATCH /v1/settings`` body, e.g. ``{"providers": {"chain":
    ["mailgun", "sendgrid"], "sendgrid": {"paused": true}, "max_attempts": 4}}``."""
    if not isinstance(body, dict) or not body:
        raise SettingsError({"body": "must be a JSON object of settings to change"})
    errors: dict[str, str] = {
        f"{k}": "unknown section" for k in body if k not in ("providers", "alerts", "capacity")
    }
    changes: dict[str, str] = {}
    providers = body.get("providers")
    if "providers" in body and not isinstance(providers, dict):
        errors["providers"] = "must be an object"
    for key, value in (providers if isinstance(providers, dict) else {}).items():
        try:
            changes.update(_provider_change(str(key), value))
        except SettingsError as exc:
            errors.update(exc.fields)  # keyed by the paths the body used
    alerts = body.get("alerts")
    if isinstance(alerts, dict) and isinstance(alerts.get("email_to"), list):
        addresses = alerts["email_to"]
        if all(isinstance(a, str) for a in addresses):
            body = {**body, "alerts": {**alerts, "email_to": ",".join(addresses)}}
    _section(
        body, "alerts", _ALERT_FIELDS, (str, int), "a string or a whole number", changes, errors
    )
    _section(
        body,
        "capacity",
        _CAPACITY_FIELDS,
        (bool, int, float),
        "JSON true/false or a number",
        changes,
        errors,
    )
    if errors:
        raise SettingsError(errors)
    if not changes:
        raise SettingsError({"body": "changes nothing"})
    return changes


def _section(
    body: dict[str, Any],
    section: str,
    fields: Mapping[str, str],
    types: tuple[type, ...],
    kinds: str,
    changes: dict[str, str],
    errors: dict[str, str],
) -> None:
    """The changes of one flat section of a PATCH body (``alerts``, ``capacity``)."""
    values = body.get(section)
    if section in body and not isinstance(values, dict):
        errors[section] = "must be an object"
    for key, value in (values if isinstance(values, dict) else {}).items():
        name = fields.get(str(key))
        if name is None:
            errors[f"{section}.{key}"] = f"unknown; known: {', '.join(fields)}"
            continue
        allowed = isinstance(value, types) and (bool in types or not isinstance(value, bool))
        if not allowed:
            errors[f"{section}.{key}"] = f"must be {kinds}"
            continue
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        try:
            changes[name] = check(name, text)
        except SettingsError as exc:
            errors[f"{section}.{key}"] = next(iter(exc.fields.values()))


def _health_change(value: object) -> dict[str, str]:
    """``{"providers": {"health": {"open_below": 0.4, ...}}}``."""
    changes: dict[str, str] = {}
    errors: dict[str, str] = {}
    _section({"health": value}, "health", _HEALTH_FIELDS, (int, float), "a number", changes, errors)
    if errors:
        raise SettingsError({f"providers.{k}": v for k, v in errors.items()})
    return changes


def _provider_change(key: str, value: object) -> dict[str, str]:
    if key == "chain":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise SettingsError({"providers.chain": "must be a list of provider names"})
        return {"providers.chain": check("providers.chain", ",".join(value))}
    if key == "health":
        return _health_change(value)
    if key == "max_attempts":
        if not isinstance(value, int) or isinstance(value, bool):
            raise SettingsError({"providers.max_attempts": "must be a whole number"})
        return {"providers.max_attempts": check("providers.max_attempts", str(value))}
    code = code_of(key)
    if code is None:
        raise SettingsError({f"providers.{key}": f"unknown provider; known: {_known()}"})
    return _one_provider_change(key, code, value)


def _one_provider_change(key: str, code: str, value: object) -> dict[str, str]:
    """``{"sendgrid": {"paused": true, "rate_limit_per_s": 20}}`` (``key`` as the body named
    the provider)."""
    if not isinstance(value, dict) or set(value) - {"paused", "rate_limit_per_s"} or not value:
        raise SettingsError(
            {f"providers.{key}": 'must be {"paused": true|false, "rate_limit_per_s": number}'}
        )
    changes: dict[str, str] = {}
    if "paused" in value:
        paused = value["paused"]
        if not isinstance(paused, bool):
            raise SettingsError({f"providers.{key}.paused": "must be true or false"})
        changes[f"providers.{code}.paused"] = "true" if paused else "false"
    if "rate_limit_per_s" in value:
        rate = value["rate_limit_per_s"]
        if not isinstance(rate, int | float) or isinstance(rate, bool):
            raise SettingsError({f"providers.{key}.rate_limit_per_s": "must be a number"})
        try:
            changes[f"providers.{code}.rate_limit"] = check(
                f"providers.{code}.rate_limit", str(rate)
            )
        except SettingsError as exc:
            raise SettingsError(
                {f"providers.{key}.rate_limit_per_s": next(iter(exc.fields.values()))}
            ) from None
    return changes


def view(live: LiveSettings) -> dict[str, Any]:
    """The settings as ``GET /v1/settings`` shows them (provider names, as PATCH takes them)."""
    providers: dict[str, Any] = {
        "chain": [CATALOG[c].name.lower() for c in live.chain if c in CATALOG],
        "max_attempts": live.max_attempts,
    }
    providers["health"] = {
        "open_below": live.health.open_below,
        "demote_below": live.health.demote_below,
        "cool_down_s": live.health.cool_down,
        "probe_share": live.health.probe_share,
    }
    limits = live.limits()
    for code, info in CATALOG.items():
        providers[info.name.lower()] = {
            "code": code,
            "paused": code in live.paused,
            "rate_limit_per_s": limits.get(code),
        }
    alerts = {
        "webhook_url": live.alert_url or None,
        "email_to": list(live.alert_email_to),
        "email_from": live.alert_email_from or None,
        "cool_off_s": live.alert_cool_off,
        "queue_depth": live.alert_queue_depth,
        "error_burst": live.alert_error_burst,
    }
    rules = live.capacity
    capacity = {
        "enabled": rules.enabled,
        "initial_per_day": rules.initial,
        "max_bounce_rate": rules.max_bounce_rate,
        "max_complaint_rate": rules.max_complaint_rate,
    }
    return {"providers": providers, "alerts": alerts, "capacity": capacity}


@dataclass(frozen=True, slots=True)
class Change:
    """One audited change."""

    name: str
    old: str | None
    new: str
    by: str
    at: datetime

    def view(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "old": self.old,
            "new": self.new,
            "by": self.by,
            "at": self.at.isoformat(),
        }


# --------------------------------------------------------------------------- the tables


class StoredSettings(Protocol):
    """What callers use of :class:`SettingsStore` (its twin: ``tests/fakes/ops.py``)."""

    async def stored(self) -> dict[str, str]: ...

    async def change(self, changes: Mapping[str, str], by: str) -> list[Change]: ...

    async def audit(self, limit: int = 50) -> list[Change]: ...


class SettingsStore:
    """The ``live_settings`` and ``settings_audit`` tables (their only writer), for the
    deployment whose exchange is ``scope``."""

    def __init__(self, db: Database, scope: str) -> None:
        self._db = db
        self.scope = scope

    async def stored(self) -> dict[str, str]:
        rows = await self._db.rows(
            "SELECT name, value FROM live_settings WHERE scope = ?", (self.scope,)
        )
        return {str(r["name"]): str(r["value"]) for r in rows if r["value"] is not None}

    async def change(self, changes: Mapping[str, str], by: str) -> list[Change]:
        """Store each change (checked again here) and audit the ones that change a value."""
        done: list[Change] = []
        for name, raw in changes.items():
            value = check(name, raw)
            row = await self._db.one(
                "SELECT value FROM live_settings WHERE scope = ? AND name = ?",
                (self.scope, name),
                serial=True,
            )
            old = None if row is None else row["value"]
            if old == value:
                continue
            now = datetime.now(UTC)
            await self._db.execute(
                "INSERT INTO live_settings (scope, name, value, changed_at, changed_by) "
                "VALUES (?, ?, ?, ?, ?)",
                (self.scope, name, value, now, by),
                idempotent=True,
            )
            await self._db.execute(
                "INSERT INTO settings_audit (scope, changed_at, at, name, old_value, "
                "new_value, changed_by) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (self.scope, uuid.uuid1(), now, name, old, value, by),
                idempotent=True,
            )
            done.append(Change(name, old, value, by, now))
        return done

    async def audit(self, limit: int = 50) -> list[Change]:
        rows = await self._db.rows(
            "SELECT at, name, old_value, new_value, changed_by FROM settings_audit "
            "WHERE scope = ? LIMIT ?",
            (self.scope, limit),
        )
        return [
            Change(
                name=str(r["name"]),
                old=r["old_value"],
                new=str(r["new_value"]),
                by=str(r["changed_by"]),
                at=utc(r["at"]),
            )
            for r in rows
        ]


async def announce(broker: Broker, done: Sequence[Change]) -> bool:
    """Tell every process that ``done`` was stored (nothing to tell: True); False when the
    announcement could not be sent: each process still applies it at its next reload."""
    if not done:
        return True
    try:
        await broker.announce(orjson.dumps({"changed": [c.name for c in done]}))
    except DependencyUnavailable as exc:
        log.warning("settings changed but not announced: %s", exc)
        return False
    return True


# --------------------------------------------------------------------------- the watcher


Apply = Callable[[LiveSettings], Awaitable[None]]


@dataclass
class Watcher:
    """Keeps this process's settings current: loads them, reloads on every nudge and every
    :data:`RELOAD_EVERY` seconds, and calls ``apply`` when they changed."""

    store: SettingsStore
    providers: ProviderSettings
    apply: Apply
    current: LiveSettings | None = None
    _wake: Alarm = field(default_factory=Alarm)

    async def load(self) -> LiveSettings:
        """Read and apply the settings now (at start-up: before any work is taken)."""
        live = resolve(await self.store.stored(), self.providers)
        if live != self.current:
            await self.apply(live)
            self.current = live
        return live

    def nudge(self) -> None:
        """A change was announced: reload soon."""
        self._wake.nudge()

    async def run(self) -> None:
        """Reload whenever nudged, and every RELOAD_EVERY seconds regardless."""
        while True:
            await self._wake.wait(RELOAD_EVERY)
            try:
                await self.load()
            except DependencyUnavailable as exc:
                log.warning("could not reload the live settings: %s", exc)
