"""The public surface of ``dag`` changes only on purpose."""

import dag


def test_dag_all_is_pinned() -> None:
    assert sorted(dag.__all__) == sorted(
        [
            "BlockStore",
            "CID",
            "CIDMismatch",
            "ChunkError",
            "CodecError",
            "DagError",
            "EventDescriptor",
            "EventLinking",
            "Identity",
            "InvalidCID",
            "InvalidDescriptor",
            "InvalidKeyFile",
            "PeerId",
            "MAX_RETENTION",
            "PublishRule",
            "Retention",
            "SchemaError",
            "SignatureError",
            "StoreError",
            "TopicDescriptor",
            "check_content_type",
            "check_event_key",
            "check_rights",
            "cid_of",
            "cid_of_raw",
            "decode",
            "encode",
        ]
    )
    for name in dag.__all__:
        assert hasattr(dag, name), name


def test_errors_are_value_errors() -> None:
    for name in ("CIDMismatch", "CodecError", "InvalidCID", "SchemaError", "SignatureError"):
        assert issubclass(getattr(dag, name), ValueError)
        assert issubclass(getattr(dag, name), dag.DagError)
