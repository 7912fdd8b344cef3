"""Skip a test that needs the host's test network slot while another run holds it.

One test network at a time per host and slot (pulsar.tools.netlab.netns): a `pulsarcast
verify` (slot 0) or a testbed run in namespaces (slot 1) on the same machine holds its
slot for minutes, and a test that then built a network would wait for it and time out.
"""

from __future__ import annotations

import pytest

from pulsar.tools.netlab import netns

_busy: dict[int, str] = {}
"""Slots found taken, with why: every later test skips at once instead of waiting again."""


def skip_unless_slot_free(slot: int = 0, wait: float = 30.0) -> None:
    """Skip the calling test (with the reason) unless ``slot`` can be taken within ``wait``
    seconds; it is released again at once, for the test to take."""
    if slot in _busy:
        pytest.skip(_busy[slot])
    try:
        netns._acquire_host(timeout=wait, slot=slot)
    except TimeoutError as error:
        _busy[slot] = f"another test network is up on this host: {error}"
        pytest.skip(_busy[slot])
    netns._release_host()
