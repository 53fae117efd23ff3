"""The sandbox's state, held on ``app.state.sandbox``: keys, faults, ledger, webhooks, OAuth."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import cast

from cryptography.hazmat.primitives.asymmetric import ec
from starlette.requests import Request

from sandbox import signing
from sandbox.activity import MessageIndex
from sandbox.faults import FaultBook
from sandbox.inbox import Inbox
from sandbox.ledger import SendLedger
from sandbox.oauth import OAuthStore
from sandbox.tuning import Tuning
from sandbox.webhooks import WebhookDispatcher
from sandbox.zone import TxtRecords
from shared.infra.config import SandboxSettings


@dataclass(slots=True)
class SandboxState:
    """Everything one sandbox app remembers; bounded by :class:`Tuning`."""

    settings: SandboxSettings
    tuning: Tuning
    sendgrid_key: ec.EllipticCurvePrivateKey
    dispatcher: WebhookDispatcher
    faults: FaultBook = field(default_factory=FaultBook)
    ledger: SendLedger = field(init=False)
    inbox: Inbox = field(init=False)
    index: MessageIndex = field(init=False)
    oauth: OAuthStore = field(default_factory=OAuthStore)
    dns: TxtRecords = field(default_factory=TxtRecords)
    mailgun_serial: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.ledger = SendLedger(self.tuning)
        self.inbox = Inbox(self.tuning.max_tracked_recipients)
        self.index = MessageIndex(
            delay=self.settings.query_delay, capacity=self.tuning.max_indexed_recipients
        )

    @property
    def sendgrid_public_key(self) -> str:
        """The base64 DER key that verifies this sandbox's SendGrid events."""
        return signing.public_key_base64(self.sendgrid_key)


def state_of(request: Request) -> SandboxState:
    """The sandbox state of the app serving ``request``."""
    return cast(SandboxState, request.app.state.sandbox)
