"""Datagram loss in front of a real DHT node (tests only)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dht import DhtNode

__all__ = ["Deaf"]


class Deaf:
    """Drops datagrams before ``node``'s protocol sees them: ``drop_next`` of them, or all
    while ``down`` (a partition; its socket stays open, so it is back at the same address),
    or those for which ``drop_if(datagram)`` holds."""

    def __init__(self, node: DhtNode, monkeypatch: pytest.MonkeyPatch) -> None:
        protocol = node.server.protocol
        self._receive: Callable[[bytes, tuple[str, int]], None] = protocol.datagram_received
        self.down = False
        self.drop_next = 0
        self.dropped = 0
        self.drop_if: Callable[[bytes], bool] | None = None
        monkeypatch.setattr(protocol, "datagram_received", self._datagram)

    def _datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.down or self.drop_next > 0 or (self.drop_if is not None and self.drop_if(data)):
            self.drop_next = max(0, self.drop_next - 1)
            self.dropped += 1
            return
        self._receive(data, addr)
