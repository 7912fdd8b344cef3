"""The GROUP beat: how the members of a consumer group find each other, stay alive in
each other's views, and tell each other what they acknowledged.

One DAG-CBOR map with ``t = "gbeat"`` (the codec's rules: exactly the listed keys, every
field validated on decode):

==========  ============================================================================
key         value
==========  ============================================================================
``topic``   link: the topic's first version (the group's topic)
``group``   string, 1..64 of ``A-Z a-z 0-9 _ -``: the group's name
``member``  bytes: the sending member's node (a peer id)
``name``    string (as ``group``): the member's consumer name on that node
``inc``     uint: the member's incarnation (its start, in ms since the epoch); a higher
            one replaces a lower one of the same ``(member, name)``
``seq``     uint: the beat's number within the incarnation
``since``   uint, ms since the epoch: events created before this are not this
            incarnation's to handle (see :mod:`pulsar.proto.groups.view`)
``leaving`` bool: the member is going (its consumer was deleted or its node stops)
``acked``   [link] (<= 512): events the member settled since its previous beat
``hops``    uint 0..8: how many more times the beat may be relayed over the topic's
            tree and lazy links (0: sent to a member directly; not signed)
``sig``     bytes (64): the member node's Ed25519 signature (below)
==========  ============================================================================

The signature covers the DAG-CBOR encoding of the map without ``hops`` and ``sig``,
preceded by :data:`SIGNING_CONTEXT`: a relay may lower ``hops`` but not change anything
else, and a beat cannot be passed off as another kind of signed object.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from dag import CID, Identity, PeerId, encode
from pulsar.proto.fields import MessageError, link_field, uint_field

__all__ = ["GROUP_NAME", "MAX_ACKED", "MAX_RELAY_HOPS", "SIGNING_CONTEXT", "GroupBeat",
           "check_group_name"]

MAX_ACKED: Final = 512
"""Most acknowledged events one beat names (a member with more sends more beats)."""
MAX_RELAY_HOPS: Final = 8
"""Most relays a flooded beat may ask for: enough to cross a topic's tree from any node
to any other in a few hundred nodes' worth of fan-out."""
MAX_INC: Final = 2**53
SIGNING_CONTEXT: Final = b"pulsarcast/group-beat/v1\0"
GROUP_NAME: Final = "[A-Za-z0-9_-]{1,64}"
_NAME = re.compile(GROUP_NAME)


def check_group_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise MessageError(f"{what} must be 1..64 characters of A-Z, a-z, 0-9, '_' and '-'")
    return value


@dataclass(frozen=True, slots=True)
class GroupBeat:
    """One member's beat (see the module docstring). Build with :meth:`signed`; a beat
    off the wire is checked with :meth:`verify` before anything it says is believed."""

    topic: CID
    group: str
    member: PeerId
    name: str
    inc: int
    seq: int
    since: int
    leaving: bool
    acked: tuple[CID, ...]
    hops: int
    sig: bytes
    T: ClassVar[str] = "gbeat"
    FIELDS: ClassVar[frozenset[str]] = frozenset({
        "topic", "group", "member", "name", "inc", "seq", "since", "leaving", "acked",
        "hops", "sig"})

    @classmethod
    def signed(cls, identity: Identity, *, topic: CID, group: str, name: str, inc: int,
               seq: int, since: int, leaving: bool, acked: tuple[CID, ...], hops: int
               ) -> GroupBeat:
        unsigned = cls(topic, group, identity.peer_id, name, inc, seq, since, leaving,
                       acked, hops, b"")
        return unsigned.with_sig(identity.sign(unsigned.signing_bytes()))

    def with_sig(self, sig: bytes) -> GroupBeat:
        return GroupBeat(self.topic, self.group, self.member, self.name, self.inc, self.seq,
                         self.since, self.leaving, self.acked, self.hops, sig)

    def relayed(self) -> GroupBeat:
        """The copy a relay sends on: one hop fewer, the signature untouched."""
        return GroupBeat(self.topic, self.group, self.member, self.name, self.inc, self.seq,
                         self.since, self.leaving, self.acked, self.hops - 1, self.sig)

    def signing_bytes(self) -> bytes:
        body = {"topic": self.topic, "group": self.group, "member": self.member.raw,
                "name": self.name, "inc": self.inc, "seq": self.seq, "since": self.since,
                "leaving": self.leaving, "acked": list(self.acked)}
        return SIGNING_CONTEXT + encode(body)

    def verify(self) -> bool:
        """Whether ``member`` signed this beat."""
        return self.member.verify(self.sig, self.signing_bytes())

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "topic": self.topic, "group": self.group,
                "member": self.member.raw, "name": self.name, "inc": self.inc,
                "seq": self.seq, "since": self.since, "leaving": self.leaving,
                "acked": list(self.acked), "hops": self.hops, "sig": self.sig}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> GroupBeat:
        acked = m["acked"]
        if not isinstance(acked, list) or len(acked) > MAX_ACKED:
            raise MessageError(f"gbeat.acked must be a list of at most {MAX_ACKED} links")
        leaving = m["leaving"]
        if not isinstance(leaving, bool):
            raise MessageError("gbeat.leaving must be a boolean")
        sig = m["sig"]
        if not isinstance(sig, bytes) or len(sig) != 64:
            raise MessageError("gbeat.sig must be 64 bytes")
        try:
            member = PeerId(m["member"])
        except (ValueError, TypeError) as exc:
            raise MessageError(f"gbeat.member: {exc}") from None
        return cls(
            link_field(m["topic"], "gbeat.topic"),
            check_group_name(m["group"], "gbeat.group"),
            member,
            check_group_name(m["name"], "gbeat.name"),
            uint_field(m["inc"], "gbeat.inc", MAX_INC),
            uint_field(m["seq"], "gbeat.seq", MAX_INC),
            uint_field(m["since"], "gbeat.since", MAX_INC),
            leaving,
            tuple(link_field(a, "gbeat.acked") for a in acked),
            uint_field(m["hops"], "gbeat.hops", MAX_RELAY_HOPS),
            sig,
        )
