"""The public surface of ``pulsar.net`` changes only on purpose."""

import pulsar.net


def test_net_all_is_pinned() -> None:
    assert sorted(pulsar.net.__all__) == sorted(
        [
            "BadRecord",
            "ConnectionInfo",
            "FaultInjector",
            "FaultStats",
            "FrameTooLarge",
            "HandshakeError",
            "PeerUnreachable",
            "RemoteProtocolError",
            "Transport",
            "TransportClosed",
            "TransportConfig",
            "TransportStats",
        ]
    )
    for name in pulsar.net.__all__:
        assert hasattr(pulsar.net, name), name


def test_error_tree() -> None:
    assert issubclass(pulsar.net.PeerUnreachable, ConnectionError)
    assert issubclass(pulsar.net.TransportClosed, ConnectionError)
    assert issubclass(pulsar.net.FrameTooLarge, pulsar.net.RemoteProtocolError)
    assert issubclass(pulsar.net.HandshakeError, pulsar.net.RemoteProtocolError)
    assert issubclass(pulsar.net.BadRecord, pulsar.net.RemoteProtocolError)
    assert issubclass(pulsar.net.RemoteProtocolError, ValueError)
