"""What each address was sent, as its mailbox would show it (``rendered``), newest first:
``GET /_control/messages?to=ADDRESS``. Bounded: the last :data:`PER_ADDRESS` messages of at
most ``Tuning.max_tracked_recipients`` addresses (the oldest address is forgotten first)."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any, Final

from sandbox.rendered import Delivered

PER_ADDRESS: Final = 20


class Inbox:
    def __init__(self, max_addresses: int) -> None:
        self._max = max_addresses
        self._by_address: OrderedDict[str, deque[Delivered]] = OrderedDict()

    def add(self, delivered: Iterable[Delivered]) -> None:
        for message in delivered:
            box = self._by_address.get(message.to)
            if box is None:
                box = self._by_address[message.to] = deque(maxlen=PER_ADDRESS)
                if len(self._by_address) > self._max:
                    self._by_address.popitem(last=False)
            box.appendleft(message)

    def of(self, address: str) -> list[dict[str, Any]]:
        return [m.view() for m in self._by_address.get(address.lower(), ())]

    def clear(self) -> None:
        self._by_address.clear()
