"""The run's headline (``bench/results/latest.json``): its figures, each beside its raw baseline
from the same run, and the verdict that refuses a pipeline figure its baseline makes
impossible (pure).

A raw baseline does strictly less than the pipeline it bounds: L_accept stores and publishes
what the API stores and publishes, without HTTP, validation or an outbox; L_e2e and the raw
webhook loop likewise. Within one run, then, the pipeline can neither outrun its baseline nor
do its work with less CPU. A throughput above its baseline (a ratio above 1.0), or acceptance
CPU per recipient below L_accept's, is not a fast pipeline but a miscount: requests answered
without doing the work, a window miscounted, the wrong process sampled (issue 34: an API
"maximum" of 1.11 x L_accept that a re-run put at 0.31). Such a figure is refused: the summary
prints it as INVALID with the reason, :mod:`bench.run` exits with its own status, and
``latest.json`` keeps the last valid run's headline.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bench import targets
from bench.targets import PYTHON_SERVICES


class Bound(enum.Enum):
    """Which side of its raw baseline a pipeline figure cannot be on."""

    #: A rate: the pipeline cannot go faster than the loop that does strictly less.
    CEILING = "ceiling"
    #: Work per unit: nor can it do its work with less CPU than that loop.
    FLOOR = "floor"


@dataclass(frozen=True, slots=True)
class Headline:
    """One headline figure, and the raw baseline of the same run it is read beside."""

    key: str
    """Its name in ``latest.json`` and in the summary."""
    figure: str
    """Its key among the report's figures."""
    unit: str
    baseline: str | None = None
    """Its raw baseline's key among the figures; None when no raw loop measures it."""
    raw: str = ""
    """The baseline's name as the summary prints it."""
    bound: Bound | None = None
    """The side of the baseline it cannot be on; None: the pair is shown, never refused."""
    ratio: str | None = None
    """The report's figure of their ratio (a goal reads it), refused along with the figure."""
    spec: str = ",.1f"
    """How the summary prints it."""


#: Every headline figure, in the summary's order. Figures without a raw counterpart (latency,
#: memory, a read) carry ``baseline: None``: no loop of the run measures them alone.
HEADLINES: tuple[Headline, ...] = (
    Headline(
        "api_max_rcpt_per_s",
        "api_max_rcpt_per_s",
        "recipients/s",
        "l_accept_rcpt_per_s",
        "L_accept",
        Bound.CEILING,
        "acceptance_ratio",
    ),
    # API + Cassandra + RabbitMQ against the raw loop + Cassandra + RabbitMQ.
    Headline(
        "accept_cpu_us_per_rcpt",
        "accept_cpu_us_per_rcpt",
        "CPU-µs/recipient",
        "l_accept_cpu_us_per_rcpt",
        "L_accept",
        Bound.FLOOR,
        "accept_cpu_ratio",
    ),
    Headline("p99_ms_at_50", "p99_ms_at_50pct", "ms"),
    Headline("p99_ms_at_80", "p99_ms_at_80pct", "ms"),
    Headline(
        "e2e_rcpt_per_s",
        "e2e_recipients_per_s",
        "recipients/s",
        "l_e2e_recipients_per_s",
        "L_e2e",
        Bound.CEILING,
        "e2e_ratio",
    ),
    Headline(
        "e2e_1000_rcpt_per_s",
        "e2e_1000_recipients_per_s",
        "recipients/s",
        "l_e2e_1000_recipients_per_s",
        "L_e2e N=1000",
        Bound.CEILING,
        "e2e_1000_ratio",
    ),
    # Shown beside its baseline but not refused: the issue bounds acceptance's CPU only.
    Headline(
        "e2e_cpu_us_per_rcpt",
        "e2e_cpu_us_per_rcpt",
        "CPU-µs/recipient",
        "l_e2e_cpu_us_per_rcpt",
        "L_e2e",
        ratio="e2e_cpu_ratio",
    ),
    Headline(
        "webhook_events_per_s",
        "webhooks_batched_events_per_s",
        "events/s",
        "l_webhook_events_per_s",
        "L_webhook",
        Bound.CEILING,
        "webhooks_batched_ratio",
    ),
    Headline(
        "webhook_single_events_per_s",
        "webhooks_single_events_per_s",
        "events/s",
        "l_webhook_events_per_s",
        "L_webhook",
        Bound.CEILING,
        "webhooks_single_ratio",
    ),
    Headline(
        "webhook_cpu_us_per_event",
        "webhook_cpu_us_per_event",
        "CPU-µs/event",
        "l_webhook_cpu_us_per_event",
        "L_webhook",
        ratio="webhook_cpu_ratio",
    ),
    # Acceptance, dispatch and two webhook events: a recipient's whole cost to the machine.
    Headline(
        "pipeline_cpu_us_per_rcpt",
        "pipeline_cpu_us_per_rcpt",
        "CPU-µs/recipient",
        "l_pipeline_cpu_us_per_rcpt",
        "raw loops",
        ratio="pipeline_cpu_ratio",
    ),
    Headline("stats_read_ms_10m", "stats_read_ms_10m", "ms"),
    # The first read after the writes (issue 34: 94-118 s when it recounted in the request).
    Headline("stats_read_cold_ms_10m", "stats_read_cold_ms_10m", "ms"),
    # The stack with no mail: nothing to compare it with but zero.
    Headline("idle_cores", "idle_cores", "cores", spec=",.3f"),
)


def entry(figures: Mapping[str, float | None], headline: Headline) -> dict[str, float | None]:
    """``{"value", "baseline", "ratio"}`` of ``headline`` in ``figures`` (None where missing)."""
    value = figures.get(headline.figure)
    baseline = figures.get(headline.baseline) if headline.baseline else None
    return {"value": value, "baseline": baseline, "ratio": targets.ratio(value, baseline)}


def refusal(figures: Mapping[str, float | None], headline: Headline) -> str | None:
    """Why ``headline``'s figure cannot be true beside its baseline, or None when it can be
    (or cannot be judged: a figure or its baseline was not measured)."""
    pair = entry(figures, headline)
    ratio = pair["ratio"]
    if headline.bound is None or ratio is None:
        return None
    if headline.bound is Bound.CEILING and ratio > 1.0:
        side = "above"
        why = "a pipeline cannot outrun the loop that does strictly less"
    elif headline.bound is Bound.FLOOR and ratio < 1.0:
        side = "below"
        why = "a pipeline cannot do its work with less CPU than the loop that does strictly less"
    else:
        return None
    return (
        f"{pair['value']:,.1f} {headline.unit} is {side} its raw baseline {headline.raw} "
        f"{pair['baseline']:,.1f} from the same run (ratio {ratio:.2f}): {why}; look for "
        "answers counted without the work, a miscounted window, the wrong process sampled"
    )


def refusals(figures: Mapping[str, float | None]) -> dict[str, str]:
    """Every refused figure of a run with its reason: each pipeline figure its baseline makes
    impossible, and the ratio figure read from it (empty: the run's figures can be true)."""
    out: dict[str, str] = {}
    for headline in HEADLINES:
        reason = refusal(figures, headline)
        if reason is None:
            continue
        out[headline.figure] = reason
        if headline.ratio is not None:
            out[headline.ratio] = reason
    return out


#: The keys of ``latest.json``'s headline, each ``{"value", "baseline", "ratio"}`` (issue 34;
#: the figures of data model v2 and the rates they bound); ``rss_mb`` holds one per service.
LATEST_KEYS = (*(h.key for h in HEADLINES), "rss_mb")
#: Headline keys no phase measures yet.
NOT_YET_MEASURED: frozenset[str] = frozenset()


def latest(report: Mapping[str, Any]) -> dict[str, Any]:
    """``latest.json`` of ``report``: the headline figures at the top level (memory, which no
    raw loop measures, with no baseline), then the run's id, stability and targets."""
    figs = report["figures"]
    return {
        **{h.key: entry(figs, h) for h in HEADLINES},
        "rss_mb": {
            name: {"value": figs.get(f"rss_mb_{name}"), "baseline": None, "ratio": None}
            for name in PYTHON_SERVICES
        },
        "run_id": report["run_id"],
        "stable": report.get("stable"),
        "targets": report.get("targets"),
    }


def kept(report: Mapping[str, Any]) -> str | None:
    """Why ``report``'s headline must not replace ``latest.json`` (None: it may): a figure was
    refused, or a headline figure or its raw baseline was not measured (a subset of the
    phases; a figure without its baseline cannot be believed or refused)."""
    figs: Mapping[str, float | None] = report["figures"]
    refused = refusals(figs)
    if refused:
        return f"figures refused as impossible: {', '.join(sorted(refused))}"
    missing = []
    for headline in HEADLINES:
        if headline.key in NOT_YET_MEASURED:
            continue
        pair = entry(figs, headline)
        if pair["value"] is None:
            missing.append(headline.key)
        if headline.baseline is not None and pair["baseline"] is None:
            missing.append(f"{headline.baseline} (the raw baseline of {headline.key})")
    missing += [f"rss_mb_{n}" for n in PYTHON_SERVICES if figs.get(f"rss_mb_{n}") is None]
    if missing:
        return f"not measured in this run: {', '.join(missing)}"
    return None


def lines(figures: Mapping[str, float | None]) -> list[str]:
    """The summary's headline: each figure, its raw baseline and their ratio, and INVALID
    with the reason for a refused one."""
    out = ["Headline (each beside its raw baseline from this run):"]
    for headline in HEADLINES:
        pair = entry(figures, headline)
        value = _number(pair["value"], headline.spec)
        if headline.baseline is None:
            beside = "no raw baseline measures it"
        else:
            beside = (
                f"{headline.raw} {_number(pair['baseline'])}, ratio {_number(pair['ratio'], '.2f')}"
            )
        out.append(f"  {headline.key:<28} {value:>10} {headline.unit:<17} {beside}")
        reason = refusal(figures, headline)
        if reason is not None:
            out.append(f"    INVALID: {reason}")
    return out


def _number(value: float | None, spec: str = ",.1f") -> str:
    return "-" if value is None else format(value, spec)
