"""The tracking endpoint, on its own port: the open pixel, tracked links and the one-click
unsubscribe of the mail we send (the URLs ``shared.engagement.engagement`` puts into each copy).

* ``GET /o/<token>`` -- a 1x1 GIF; records an open.
* ``GET /c/<token>`` -- a 302 to the link the message was sent with (the token names the
  recipient and the link's place in the stored message, never a URL: no open redirect; a
  personal link's token carries the recipient's URL, followed only to a host the operator
  allows); records a click. A forged, altered or expired token is a 404 page, never a redirect.
* ``GET /u/<token>`` -- a small page naming the address, with a button that posts to
* ``POST /u/<token>`` -- RFC 8058 one-click unsubscribe (a mail client posts
  ``List-Unsubscribe=One-Click``; no login, no confirmation): the address is suppressed for
  the sender (only for the list the mail named, if it named one) before the 200.

Opens, clicks and unsubscribes are events of the recipient like a provider's, applied by the
same ingest (``shared.ingest.ingest``), with ``tracking`` as their provider: engagement
never changes an outcome; opens and clicks count once per recipient and in total, machines
(``shared.engagement.prefetch``) marked; an unsubscribe ends in the same suppression as a
provider's. Opens and clicks are recorded before the answer but never fail it: a reader clicking
while the database is away still gets to the link.
"""

from __future__ import annotations

import asyncio
import html
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from shared.core.errors import DependencyUnavailable
from shared.core.keyring import KeyRing, ring_from
from shared.core.models import Message
from shared.core.webhook_events import Kind
from shared.engagement.engagement import links_of
from shared.engagement.engagement_tokens import Claim, read, redirect_target
from shared.engagement.prefetch import machine
from shared.engagement.unsubscribe_event import tracker_event, unsubscribe_event
from shared.infra.config import Settings
from shared.infra.gil import CpuLane
from shared.infra.health import health_routes
from shared.infra.http import AdmissionLimit, ApiError, error_handlers, read_capped
from shared.infra.metrics import new_registry
from shared.infra.resources import open_resources, readiness_checks
from shared.infra.stall_monitor import StallMetrics, watching
from shared.ingest.ingest import Ingest, IngestMetrics
from shared.templates import template_use

log = logging.getLogger(__name__)

#: The smallest transparent GIF.
PIXEL: Final = bytes.fromhex(
    "47494638396101000100800000000000ffffff21f90401000000002c00000000010001000002024401003b"
)
#: Seconds an open or click may take to record before the reader is answered anyway.
RECORD_BUDGET: Final = 2.0
#: Batches whose links a process keeps, and chunks whose addresses it keeps.
LINKS_CACHE: Final = 2_000
EMAILS_CACHE: Final = 200
#: Opens and clicks remembered, to tell a repeat within the minute.
RECENT_HITS: Final = 100_000
#: Bytes of an unsubscribe POST read (a mail client sends ``List-Unsubscribe=One-Click``).
MAX_BODY: Final = 4096
NO_STORE: Final = {"Cache-Control": "no-store, private", "Referrer-Policy": "no-referrer"}


class Tracking:
    """What the routes need, built by the lifespan."""

    def __init__(
        self,
        ingest: Ingest,
        ring: KeyRing,
        allowed_hosts: frozenset[str] = frozenset(),
        cpu: CpuLane | None = None,
    ) -> None:
        self.ingest = ingest
        self.ring = ring
        self.allowed_hosts = allowed_hosts
        self.cpu = cpu or CpuLane()
        self._links: OrderedDict[uuid.UUID, tuple[list[str], list[str], int]] = OrderedDict()
        self._emails: OrderedDict[tuple[uuid.UUID, int], dict[uuid.UUID, str]] = OrderedDict()
        self._recent: OrderedDict[tuple[uuid.UUID, str, int | None, int], None] = OrderedDict()

    def claim(self, request: Request, purpose: str) -> Claim | None:
        claim = read(str(request.path_params["token"]), self.ring)
        return claim if claim is not None and claim.purpose == purpose else None

    async def links(self, batch_id: uuid.UUID, chunk: int) -> list[str]:
        """The tracked links of the stored message the chunk carried (its own: never from a
        URL; a template's canary chunks carry the canary's)."""
        known = self._links.get(batch_id)
        if known is None:
            header = await self.ingest.batches.header(batch_id)
            if header is None:
                return []
            message, use = header.message, header.message.template
            canary = use.canary_chunks if use and use.canary else 0
            # Finding a message's links reads all of its html (up to megabytes): off the loop.
            known = await self.cpu.run(_links_of, message, canary)
            self._links[batch_id] = known
            if len(self._links) > LINKS_CACHE:
                self._links.popitem(last=False)
        live, canary_links, canary_chunks = known
        return canary_links if chunk < canary_chunks else live

    async def email(self, claim: Claim) -> str | None:
        """The recipient's address (the chunk's addresses are read once, then remembered:
        a message's opens and clicks come in bursts)."""
        key = (claim.batch_id, claim.chunk)
        known = self._emails.get(key)
        if known is None:
            rows = await self.ingest.recipients.chunk_rows(claim.batch_id, claim.chunk)
            known = {r["log_id"]: str(r["email"]) for r in rows if r.get("email")}
            if known:
                self._emails[key] = known
                if len(self._emails) > EMAILS_CACHE:
                    self._emails.popitem(last=False)
        return known.get(claim.log_id)

    async def record(self, claim: Claim, request: Request, kind: Kind, url: str | None) -> None:
        """An open or click, recorded within RECORD_BUDGET (logged, never raised, if not)."""
        client = request.client.host if request.client else None
        by = machine(request.headers.get("user-agent"), client)

        # The same open or click again within the minute counts in the totals only: a
        # reader (or a scanner) hammering a URL must not grow the timeline or flood the
        # sender's webhooks.
        key = (claim.log_id, kind, claim.link, int(time.time() // 60))
        repeat = key in self._recent
        self._recent[key] = None
        if len(self._recent) > RECENT_HITS:
            self._recent.popitem(last=False)

        async def apply() -> None:
            if repeat:
                await self.ingest.count_hit(claim.batch_id, kind, machine=by is not None)
                return
            email = await self.email(claim) or ""
            ev = tracker_event(
                claim, kind, f"{kind}:{uuid.uuid1()}", email=email, url=url, machine=by
            )
            await self.ingest.apply(ev)

        try:
            async with asyncio.timeout(RECORD_BUDGET):
                await apply()
        except (DependencyUnavailable, TimeoutError) as exc:
            log.warning("%s of %s/%s not recorded: %s", kind, claim.batch_id, claim.log_id, exc)


def _links_of(message: Message, canary: int) -> tuple[list[str], list[str], int]:
    """The message's tracked links, its canary's (when ``canary`` chunks carry one), and
    ``canary``."""
    return (
        links_of(message),
        links_of(template_use.message_for(message, 0)) if canary else [],
        canary,
    )


def _tracking(request: Request) -> Tracking:
    tracking: Tracking = request.app.state.tracking
    return tracking


async def open_pixel(request: Request) -> Response:
    t = _tracking(request)
    claim = t.claim(request, "open")
    if claim is None:
        return _page(404, "Not found", "This link is not valid.")
    await t.record(claim, request, "opened", None)
    return Response(PIXEL, media_type="image/gif", headers=NO_STORE)


async def click(request: Request) -> Response:
    t = _tracking(request)
    claim = t.claim(request, "click")
    target = (
        redirect_target(claim, await t.links(claim.batch_id, claim.chunk), t.allowed_hosts)
        if claim
        else None
    )
    if claim is None or target is None:
        return _page(404, "Not found", "This link is not valid or has expired.")
    await t.record(claim, request, "clicked", target)
    return RedirectResponse(target, status_code=302, headers=NO_STORE)


async def unsubscribe_page(request: Request) -> Response:
    t = _tracking(request)
    claim = t.claim(request, "unsubscribe")
    email = await t.email(claim) if claim else None
    if claim is None or email is None:
        return _page(404, "Not found", "This unsubscribe link is not valid or has expired.")
    scope = f" from the list “{html.escape(claim.scope)}”" if claim.scope else ""
    return _page(
        200,
        "Unsubscribe",
        f"Stop sending mail to <strong>{html.escape(email)}</strong>{scope}?",
        form=True,
    )


async def unsubscribe(request: Request) -> Response:
    """RFC 8058: the POST itself unsubscribes (its body is ``List-Unsubscribe=One-Click``
    from a mail client, or our page's button); suppressed before the 200."""
    t = _tracking(request)
    claim = t.claim(request, "unsubscribe")
    email = await t.email(claim) if claim else None
    if claim is None or email is None:
        return _page(404, "Not found", "This unsubscribe link is not valid or has expired.")
    try:
        body = await read_capped(request, MAX_BODY)
    except ApiError:
        body = b""  # too much, or too slow: the POST still unsubscribes (RFC 8058)
    one_click = b"List-Unsubscribe=One-Click" in body
    ev = unsubscribe_event(
        claim, email, "one-click unsubscribe" if one_click else "unsubscribe page"
    )
    if await t.ingest.apply(ev) != "applied":
        return _page(404, "Not found", "This unsubscribe link is not valid or has expired.")
    return _page(200, "Unsubscribed", f"{html.escape(email)} will get no more of this mail.")


def _page(status: int, title: str, body: str, *, form: bool = False) -> HTMLResponse:
    button = '<form method="post"><button type="submit">Unsubscribe</button></form>' if form else ""
    return HTMLResponse(
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{title}</title></head><body style="font-family:sans-serif;max-width:32rem;'
        f'margin:4rem auto;padding:0 1rem"><h1>{title}</h1><p>{body}</p>{button}</body></html>',
        status_code=status,
        headers=NO_STORE,
    )


def create_app(settings: Settings) -> Starlette:
    registry = new_registry()
    metrics = IngestMetrics.create(registry)
    stalls = StallMetrics.create(registry)
    ring = ring_from(settings.tracking.keys.get_secret_value())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with open_resources(settings, name="safedelivr-tracking") as res:
            app.state.resources = res
            ingest = Ingest.over(res.db, res.broker, settings, metrics)
            app.state.tracking = Tracking(
                ingest, ring, settings.tracking.allowed_hosts, cpu=res.cpu
            )
            with watching(stalls):
                yield

    routes = [
        Route("/o/{token}", open_pixel, methods=["GET"]),
        Route("/c/{token}", click, methods=["GET"]),
        Route("/u/{token}", unsubscribe_page, methods=["GET"]),
        Route("/u/{token}", unsubscribe, methods=["POST"]),
        *health_routes(
            "tracking",
            registry,
            lambda request: readiness_checks(request.app.state.resources),
            settings.metrics_token,
        ),
    ]
    app = Starlette(
        middleware=[Middleware(AdmissionLimit, limit=settings.tracking.max_concurrency)],
        routes=routes,
        lifespan=lifespan,
        exception_handlers=error_handlers(),
    )
    app.state.settings = settings
    return app
