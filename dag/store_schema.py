"""The schema of the node's database file: the DDL of every table, the schema version and
the migrations from each older version.

Every layer owns the code of its own tables (see :mod:`dag.store`), but a schema version is
the whole file's: its tables are created together when a file is new and migrated together
when it is older, so their DDL is kept here, in one place, whoever owns them. An owner
changing its tables bumps :data:`SCHEMA_VERSION` and adds a step to ``_MIGRATIONS``. Kept
apart from opening the file (:mod:`dag.store_file`, which runs these statements) and from
the block methods (:mod:`dag.store`), so a schema change touches only this module.

Tables (schema version :data:`SCHEMA_VERSION`, kept in ``PRAGMA user_version``; the file is
marked as ours with ``PRAGMA application_id`` = :data:`APPLICATION_ID`)::

    blocks        cid → data, stored_at, pinned (1: the node needs it; 0: held for the DHT)
    block_keys    key → cid                      sha1 of each stored block's binary CID,
                                                 the DHT key it is looked up under
                                                 (schema 4): the node answers FIND_VALUE
                                                 for its own blocks (``block_for_key``)
    dht_records   key → value, stored_at, republished_at
    subscriptions topic → created_at, active
    heads         (topic, event)                 the current heads of a topic's event DAG
    delivery_log  (topic, seq) → event, delivered_at, created_ms (schema 10; NULL for
                                                 entries logged before); UNIQUE (topic, event)
    log_state     topic → last_seq, last_at      the per-topic high-water mark of the log
    topic_latest  topic → version                the latest version of a topic the node
                                                 knows (schema 2), so a restart judges and
                                                 updates by it
    outbox        (topic, event) → published_at  this node's own published events not yet
                                                 delivered (logged) here (schema 3): a
                                                 restart announces them again
    log_cut       (topic, event) → delivered_at  delivery-log entries a retention policy cut
                                                 (schema 5), kept for a while so an event
                                                 met again is known as delivered
    consumers     (topic, name) → config, delivered, counters
                                                 durable named consumers of a topic's
                                                 delivery log (schema 6): where each one is
    consumer_pending (topic, name, seq) → count, due
                                                 what a consumer handed out and was not
                                                 acknowledged yet (schema 6)
    checkpoints   (topic, number) → count, last_ms, cid, log_seq, made_at
                                                 the checkpoints this node made of the
                                                 topics it authored (schema 7): what the
                                                 next one links and where it starts
    held_checkpoints (topic, cid) → last_ms       checkpoints of followed topics this node
                                                 holds for the DHT (schema 8): what a
                                                 retention cut drops with their index
    consumer_watched (topic, name, seq) → event, created, owner
                                                 log entries a group consumer left to
                                                 another member, until that member's
                                                 acknowledgement is heard (schema 9)
    log_keys      (topic, key) → created_ms, event  the newest event of each key in a
                                                 compacted topic's log (schema 8)
    log_compaction (topic) → through             the last log position compaction looked
                                                 at (schema 8)
"""

from __future__ import annotations

import hashlib
from typing import Final

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION"]

SCHEMA_VERSION: Final = 10
"""The schema this build writes; a file with a higher ``user_version`` is refused."""

APPLICATION_ID: Final = int.from_bytes(b"PLSR", "big")
"""Written to ``PRAGMA application_id`` so a pulsarcast database can be told from any other
SQLite file (``file(1)`` also shows it)."""

# The publisher's own acknowledged events until it has delivered them itself. A publish is
# acknowledged once the DHT quorum stored the event; if the one copy sent down the tree is
# lost and the node is killed before HEADS or IHAVE told anyone, nothing but this row names
# the event: a restart learns these as heads and announces them.
_OUTBOX: Final = """CREATE TABLE IF NOT EXISTS outbox (
        topic        BLOB NOT NULL,
        event        BLOB NOT NULL,
        published_at REAL NOT NULL,
        PRIMARY KEY (topic, event)
    ) WITHOUT ROWID"""

_LOG_CUT: Final = """CREATE TABLE IF NOT EXISTS log_cut (
        topic        BLOB NOT NULL,
        event        BLOB NOT NULL,
        delivered_at REAL NOT NULL,
        PRIMARY KEY (topic, event)
    ) WITHOUT ROWID"""
_LOG_CUT_INDEX: Final = "CREATE INDEX IF NOT EXISTS log_cut_time ON log_cut (delivered_at)"
"""Schema 5 to 7 only (dropped by the step to 8)."""

# Durable named consumers (pulsar.runtime.consumer_table). A consumer reads its topic's
# delivery log in order: ``delivered`` is the last position it handed out, so what lies
# beyond is its backlog, and ``consumer_pending`` holds the positions handed out and not
# acknowledged, with how often each was delivered and when it is due again. ``config`` is
# the consumer's settings as JSON (``ConsumerConfig.to_json``); the counters stay with the
# row, so what a consumer reports survives a restart.
_CONSUMERS: Final = """CREATE TABLE IF NOT EXISTS consumers (
        topic        BLOB NOT NULL,
        name         TEXT NOT NULL,
        config       TEXT NOT NULL,
        created_at   REAL NOT NULL,
        start        INTEGER NOT NULL,
        delivered    INTEGER NOT NULL,
        paced_at     REAL,
        paced_from   REAL,
        redelivered  INTEGER NOT NULL DEFAULT 0,
        terminated   INTEGER NOT NULL DEFAULT 0,
        set_aside    INTEGER NOT NULL DEFAULT 0,
        skipped      INTEGER NOT NULL DEFAULT 0,
        skipped_from INTEGER,
        skipped_to   INTEGER,
        PRIMARY KEY (topic, name)
    ) WITHOUT ROWID"""
_CONSUMER_PENDING: Final = """CREATE TABLE IF NOT EXISTS consumer_pending (
        topic BLOB NOT NULL,
        name  TEXT NOT NULL,
        seq   INTEGER NOT NULL,
        count INTEGER NOT NULL CHECK (count > 0),
        due   REAL NOT NULL,
        PRIMARY KEY (topic, name, seq)
    ) WITHOUT ROWID"""
# Redeliveries and the sweep that sets exhausted entries aside look for what is due.
_CONSUMER_PENDING_INDEX: Final = ("CREATE INDEX IF NOT EXISTS consumer_pending_due "
                                  "ON consumer_pending (due)")
# A group consumer's log entries another member handles (pulsar.runtime.consumer_table):
# kept until that member's acknowledgement is heard, so that if it goes first this node
# can take the entry over. ``owner`` is the member's key (node, name, incarnation);
# acknowledgements name events, hence the index by event.
_CONSUMER_WATCHED: Final = """CREATE TABLE IF NOT EXISTS consumer_watched (
        topic   BLOB NOT NULL,
        name    TEXT NOT NULL,
        seq     INTEGER NOT NULL,
        event   BLOB NOT NULL,
        created REAL NOT NULL,
        owner   BLOB NOT NULL,
        PRIMARY KEY (topic, name, seq)
    ) WITHOUT ROWID"""
_CONSUMER_WATCHED_INDEX: Final = ("CREATE INDEX IF NOT EXISTS consumer_watched_event "
                                  "ON consumer_watched (topic, event)")

# The checkpoints an author made (dag.checkpoints): a new one links earlier ones by number
# (its skips carry their count and last_ms), and starts after the log position the last
# one ended at (log_seq).
_CHECKPOINTS: Final = """CREATE TABLE IF NOT EXISTS checkpoints (
        topic   BLOB NOT NULL,
        number  INTEGER NOT NULL,
        count   INTEGER NOT NULL,
        last_ms INTEGER NOT NULL,
        cid     BLOB NOT NULL,
        log_seq INTEGER NOT NULL,
        made_at REAL NOT NULL,
        PRIMARY KEY (topic, number)
    ) WITHOUT ROWID"""

# Checkpoints of followed topics this node holds for the DHT (pulsar.runtime.checkpoint_cut):
# when the topic's retention has cut everything a checkpoint covers, the checkpoint and
# its index blocks go too.
_HELD_CHECKPOINTS: Final = """CREATE TABLE IF NOT EXISTS held_checkpoints (
        topic   BLOB NOT NULL,
        cid     BLOB NOT NULL,
        last_ms INTEGER NOT NULL,
        PRIMARY KEY (topic, cid)
    ) WITHOUT ROWID"""

# Compaction by key (pulsar.runtime.compaction): the newest event of each key a compacted
# topic's log holds, and how far the log was looked at.
_LOG_KEYS: Final = """CREATE TABLE IF NOT EXISTS log_keys (
        topic      BLOB NOT NULL,
        key        TEXT NOT NULL,
        created_ms INTEGER NOT NULL,
        event      BLOB NOT NULL,
        PRIMARY KEY (topic, key)
    ) WITHOUT ROWID"""
_LOG_COMPACTION: Final = """CREATE TABLE IF NOT EXISTS log_compaction (
        topic   BLOB PRIMARY KEY,
        through INTEGER NOT NULL
    ) WITHOUT ROWID"""

# The DHT looks blocks up by key, ``sha1(bytes(cid))`` (``dht.keys.dht_key``), and a hash
# cannot be inverted: this index maps each stored block's key back to its CID, so a node
# serves its own blocks (the events it delivered or published, pinned) to FIND_VALUE like
# the records it holds for the network. Written in the same transaction as the block.
_BLOCK_KEYS: Final = """CREATE TABLE IF NOT EXISTS block_keys (
        key BLOB PRIMARY KEY,
        cid BLOB NOT NULL
    ) WITHOUT ROWID"""
_SHA1_SQL: Final = "pulsarcast_sha1"
"""A function the connection defines (``_open``) for the schema 3 -> 4 migration only;
nothing stored in the schema refers to it, so other SQLite clients can still write."""

# The DDL of every table in the file, whoever owns it (the module docstring): the schema
# version, creation and migrations are the file's, so they are kept in one place. An owner
# changing its tables bumps SCHEMA_VERSION and adds a step to _MIGRATIONS here.
_SCHEMA: Final = (
    # -- the data model's (dag.store): blocks, and block_keys below ------------------------
    # A rowid table, not WITHOUT ROWID: measured on 20,000 random 300-byte blocks in 500-block
    # batches, WITHOUT ROWID put 3x slower (≈20k/s vs ≈60k/s) and got no faster (≈70k/s both);
    # with 2 kB and 16 kB blocks it was slower at both. SQLite's own advice is that WITHOUT
    # ROWID pays only for rows under ~1/20 of a page, and blocks are bigger than that.
    """CREATE TABLE blocks (
        cid       BLOB PRIMARY KEY,
        data      BLOB NOT NULL,
        stored_at REAL NOT NULL,
        pinned    INTEGER NOT NULL DEFAULT 1 CHECK (pinned IN (0, 1))
    )""",
    # -- the DHT's (dht.record_table) ------------------------------------------------------
    """CREATE TABLE dht_records (
        key            BLOB PRIMARY KEY,
        value          BLOB NOT NULL,
        stored_at      REAL NOT NULL,
        republished_at REAL NOT NULL
    )""",
    # Expiry and republishing scan by time every few minutes; the indexes make those scans
    # proportional to what they return, not to the table.
    "CREATE INDEX dht_records_stored_at ON dht_records (stored_at)",
    "CREATE INDEX dht_records_republished_at ON dht_records (republished_at)",
    # -- the node runtime's (pulsar.runtime.node_state), up to the outbox -----------------
    """CREATE TABLE subscriptions (
        topic      BLOB PRIMARY KEY,
        created_at REAL NOT NULL,
        active     INTEGER NOT NULL CHECK (active IN (0, 1))
    )""",
    # Small rows keyed by a composite primary key: the case WITHOUT ROWID is made for (no
    # hidden rowid and no second index for the key).
    """CREATE TABLE heads (
        topic BLOB NOT NULL,
        event BLOB NOT NULL,
        PRIMARY KEY (topic, event)
    ) WITHOUT ROWID""",
    """CREATE TABLE delivery_log (
        topic        BLOB NOT NULL,
        seq          INTEGER NOT NULL CHECK (seq > 0),
        event        BLOB NOT NULL,
        delivered_at REAL NOT NULL,
        created_ms   INTEGER,
        PRIMARY KEY (topic, seq)
    ) WITHOUT ROWID""",
    "CREATE UNIQUE INDEX delivery_log_event ON delivery_log (topic, event)",
    "CREATE INDEX delivery_log_time ON delivery_log (topic, delivered_at, seq)",
    # The high-water mark lives apart from the log so that a sequence number is never handed
    # out twice, even after the latest entries have been pruned.
    """CREATE TABLE log_state (
        topic    BLOB PRIMARY KEY,
        last_seq INTEGER NOT NULL,
        last_at  REAL NOT NULL
    )""",
    """CREATE TABLE topic_latest (
        topic   BLOB PRIMARY KEY,
        version BLOB NOT NULL
    )""",
    _OUTBOX,
    _BLOCK_KEYS,
    _LOG_CUT,
    # -- the node runtime's durable consumers (pulsar.runtime.consumer_table) --------------
    _CONSUMERS,
    _CONSUMER_PENDING,
    _CONSUMER_PENDING_INDEX,
    _CONSUMER_WATCHED,
    _CONSUMER_WATCHED_INDEX,
    _CHECKPOINTS,
    _HELD_CHECKPOINTS,
    _LOG_KEYS,
    _LOG_COMPACTION,
    f"PRAGMA application_id = {APPLICATION_ID}",
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)
_MIGRATIONS: Final = {
    # 1 -> 2: durable topic versions.
    1: (
        "CREATE TABLE IF NOT EXISTS topic_latest (topic BLOB PRIMARY KEY, version BLOB NOT NULL)",
        "PRAGMA user_version = 2",
    ),
    # 2 -> 3: the publisher's outbox.
    2: (_OUTBOX, "PRAGMA user_version = 3"),
    # 3 -> 4: blocks by DHT key.
    3: (
        _BLOCK_KEYS,
        f"INSERT OR IGNORE INTO block_keys (key, cid) SELECT {_SHA1_SQL}(cid), cid FROM blocks",
        "PRAGMA user_version = 4",
    ),
    # 4 -> 5: what retention cut from the delivery log.
    4: (_LOG_CUT, _LOG_CUT_INDEX, "PRAGMA user_version = 5"),
    # 5 -> 6: durable named consumers.
    5: (_CONSUMERS, _CONSUMER_PENDING, _CONSUMER_PENDING_INDEX, "PRAGMA user_version = 6"),
    # 6 -> 7: the checkpoints an author made.
    6: (_CHECKPOINTS, "PRAGMA user_version = 7"),
    # 7 -> 8: the checkpoints of followed topics held for the DHT; compaction by key.
    # The memory of cut entries loses its time index: it is expired topic by topic, by
    # the primary key, and the index was as large as the data.
    7: (_HELD_CHECKPOINTS, _LOG_KEYS, _LOG_COMPACTION, "DROP INDEX IF EXISTS log_cut_time",
        "PRAGMA user_version = 8"),
    # 8 -> 9: consumer groups across nodes.
    8: (_CONSUMER_WATCHED, _CONSUMER_WATCHED_INDEX, "PRAGMA user_version = 9"),
    # 9 -> 10: each log entry's event creation time, which range reconciliation sorts by.
    # Entries logged before it have none; a node reads those from the blocks once.
    9: ("ALTER TABLE delivery_log ADD COLUMN created_ms INTEGER", "PRAGMA user_version = 10"),
}
_TABLES: Final = frozenset(
    {"blocks", "dht_records", "subscriptions", "heads", "delivery_log", "log_state",
     "topic_latest", "outbox", "block_keys", "log_cut", "consumers", "consumer_pending",
     "checkpoints", "held_checkpoints", "log_keys", "log_compaction", "consumer_watched"}
)


def _sha1(data: bytes) -> bytes:
    """The DHT key of a binary CID (``dht.keys.dht_key``, which this layer cannot import)."""
    return hashlib.sha1(bytes(data)).digest()
