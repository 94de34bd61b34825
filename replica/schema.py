"""SQLite schema and its migrations.

``ops`` is the source of truth (every signed op, keyed by (origin, seq), its
rowid is the local arrival sequence ``lseq``); a message op also carries its
message columns in the same row (one insert per message; ``messages`` is a
view over them). ``routes`` files messages to several roles under each role;
a message to one role or to ``broadcast`` is found through its channel column.
Every other table is a projection of the ops and can be rebuilt from them;
``first_seen`` and ``seen_reads`` hold what the ops show of each role (``replica.firstseen``).
``origins.hlc`` on this node's own row is the persisted HLC high-water mark.

Invariants:
* ``MIGRATIONS`` only grows at its end: a file at version ``v`` (``meta.schema_version``) has
  run exactly the first ``v`` scripts, and opening it runs the rest, in order, in the same
  write transaction that records ``LATEST``; migrations only ever move forward.
* A file of a version above ``LATEST`` (a newer peerd wrote it) is refused with nothing
  changed (``replica.store``), never migrated down.
* ``ops`` alone holds the truth: every other table can be rebuilt from it, and from ``KEYED``
  on every row carries its name keys (older files are rebuilt on upgrade).
"""

from __future__ import annotations

SCHEMA_V1 = """
CREATE TABLE meta(k TEXT PRIMARY KEY, v) WITHOUT ROWID;
CREATE TABLE origins(
    oid INTEGER PRIMARY KEY,
    node BLOB NOT NULL UNIQUE,
    contig INTEGER NOT NULL DEFAULT 0,
    top INTEGER NOT NULL DEFAULT 0,
    hlc INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE ops(
    lseq INTEGER PRIMARY KEY,
    oid INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    blob BLOB NOT NULL,
    id TEXT,
    sender TEXT,
    sender_inst TEXT,
    channel TEXT,
    to_inst TEXT,
    thread TEXT,
    content TEXT,
    hlc INTEGER
);
CREATE UNIQUE INDEX ops_by_origin ON ops(oid, seq);
CREATE INDEX messages_by_channel ON ops(channel, lseq) WHERE channel IS NOT NULL;
CREATE INDEX messages_by_thread ON ops(thread, lseq) WHERE thread IS NOT NULL;
CREATE VIEW messages AS
    SELECT lseq, id, sender, sender_inst, channel, to_inst, thread, content, hlc FROM ops WHERE id IS NOT NULL;
CREATE TABLE routes(role TEXT NOT NULL, lseq INTEGER NOT NULL, PRIMARY KEY(role, lseq)) WITHOUT ROWID;
CREATE TABLE lww(
    tbl TEXT NOT NULL, k TEXT NOT NULL, f TEXT NOT NULL, v,
    hlc INTEGER NOT NULL, origin BLOB NOT NULL,
    PRIMARY KEY(tbl, k, f)
) WITHOUT ROWID;
CREATE TABLE receipts(
    msg_id TEXT NOT NULL, role TEXT NOT NULL, inst TEXT NOT NULL,
    rid TEXT NOT NULL UNIQUE, delivered INTEGER, read INTEGER,
    PRIMARY KEY(msg_id, role, inst)
) WITHOUT ROWID;
CREATE TABLE profiles(id TEXT PRIMARY KEY, name TEXT, static TEXT, dynamic TEXT, updated INTEGER) WITHOUT ROWID;
CREATE TABLE agents(id TEXT PRIMARY KEY, name TEXT, alive INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
CREATE INDEX agents_by_name ON agents(name);
CREATE TABLE threads(id TEXT PRIMARY KEY, created INTEGER) WITHOUT ROWID;
CREATE TABLE members(thread TEXT NOT NULL, agent TEXT NOT NULL, present INTEGER NOT NULL,
    PRIMARY KEY(thread, agent)) WITHOUT ROWID;
CREATE INDEX members_by_agent ON members(agent, thread) WHERE present = 1;
"""

# v2: full-text search over message content, sender and channel, and who sent
# last when. Both are projections kept off the write path: a reader first
# catches them up with every message that landed since ``meta.fts_upto`` (an
# lseq), then queries.
SCHEMA_V2 = """
CREATE VIRTUAL TABLE message_fts USING fts5(content, sender, channel, content='', tokenize='unicode61');
CREATE TABLE senders(
    role TEXT NOT NULL, inst TEXT NOT NULL, hlc INTEGER NOT NULL, PRIMARY KEY(role, inst)
) WITHOUT ROWID;
INSERT INTO meta(k, v) VALUES ('fts_upto', 0);
"""

# Per-thread numbers: ``thread_seqs`` gives each thread message its number
# within its thread, 1, 2, 3, ... in the order it landed in this replica (the
# ``seq`` of the thread API and tools); a projection of the ops like the others.
# Existing thread messages are numbered per thread by lseq, the order they landed in.
SCHEMA_THREAD_SEQS = """
CREATE TABLE thread_seqs(lseq INTEGER PRIMARY KEY, thread TEXT NOT NULL, tseq INTEGER NOT NULL);
CREATE UNIQUE INDEX thread_seqs_by_thread ON thread_seqs(thread, tseq);
INSERT INTO thread_seqs(lseq, thread, tseq)
    SELECT lseq, thread, row_number() OVER (PARTITION BY thread ORDER BY lseq) FROM ops
    WHERE thread IS NOT NULL AND id IS NOT NULL
"""

# When each role was first seen (``replica.firstseen``): the min over the messages it sent
# and the ``seen`` register writes; the messages already held give the start.
SCHEMA_FIRST_SEEN = """
CREATE TABLE first_seen(role TEXT PRIMARY KEY, at INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO first_seen(role, at)
    SELECT sender, min(hlc) >> 16 FROM ops WHERE id IS NOT NULL AND thread IS NULL GROUP BY sender;
"""



# v5: names match by key (``names.name_key``) and VantagePeers' message fields. Each message
# row gains its matching keys (sender, sender instance, channel, target instance), its session
# day and tenant, and its retraction mark; every op gains its local arrival time in Unix ms,
# never decreasing along lseq, so a timestamp maps to an arrival position by a binary search
# over lseq (no index needed). list_messages' filters scan newest first without an index of
# their own: an audit tool should not slow every write down. ``retractions``
# holds every retraction op's (message, role, stamp), whether or not its message is here yet.
# Profiles become one row per (role) or (role, instance), their fields read from ``lww``.
# ``first_seen`` is keyed by role key. The store then recomputes the keys of existing rows and
# rebuilds every register and the first-seen times from the ops (``migrate.rebuild_keys``): signed
# op bodies never change.
SCHEMA_KEYS = """
ALTER TABLE ops ADD COLUMN skey TEXT;
ALTER TABLE ops ADD COLUMN sikey TEXT;
ALTER TABLE ops ADD COLUMN ckey TEXT;
ALTER TABLE ops ADD COLUMN tkey TEXT;
ALTER TABLE ops ADD COLUMN sday INTEGER;
ALTER TABLE ops ADD COLUMN tenant TEXT;
ALTER TABLE ops ADD COLUMN retracted INTEGER;
ALTER TABLE ops ADD COLUMN arrived INTEGER NOT NULL DEFAULT 0;
DROP INDEX messages_by_channel;
DROP VIEW messages;
CREATE VIEW messages AS
    SELECT lseq, id, sender, sender_inst, channel, to_inst, thread, content, hlc,
           skey, sikey, ckey, tkey, sday, tenant, retracted, arrived
    FROM ops WHERE id IS NOT NULL;
CREATE INDEX messages_by_ckey ON ops(ckey, lseq) WHERE ckey IS NOT NULL;
CREATE TABLE retractions(
    msg_id TEXT NOT NULL, by_key TEXT NOT NULL, hlc INTEGER NOT NULL, PRIMARY KEY(msg_id, by_key, hlc)
) WITHOUT ROWID;
DROP TABLE profiles;
CREATE TABLE profiles(
    id TEXT PRIMARY KEY, rkey TEXT NOT NULL, ikey TEXT NOT NULL, role TEXT NOT NULL, inst TEXT,
    first_hlc INTEGER NOT NULL, first_origin BLOB NOT NULL, updated INTEGER NOT NULL
) WITHOUT ROWID;
DROP TABLE senders;
CREATE TABLE senders(
    rkey TEXT NOT NULL, ikey TEXT NOT NULL, role TEXT NOT NULL, inst TEXT, hlc INTEGER NOT NULL,
    PRIMARY KEY(rkey, ikey)
) WITHOUT ROWID;
"""

# v6: fleet membership (``replica.fleet``): who was let in, the rekey ops, and who is removed
# with the cutoff past which its ops are refused. Projections of ``admit`` and ``rekey`` ops.
SCHEMA_FLEET = """
CREATE TABLE fleet_admits(node BLOB PRIMARY KEY, name TEXT NOT NULL, fleet TEXT NOT NULL,
    hlc INTEGER NOT NULL, origin BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE fleet_rekeys(origin BLOB NOT NULL, seq INTEGER NOT NULL, lseq INTEGER NOT NULL,
    PRIMARY KEY(origin, seq)) WITHOUT ROWID;
CREATE TABLE fleet_removed(node BLOB PRIMARY KEY, upto INTEGER NOT NULL) WITHOUT ROWID;
"""

# v7 (0.2.0): ops of a newer release. ``v1`` is 0 on an op a peer of the first release would refuse
# (a kind, field or table it does not know), so that peer is never sent it; ``newer`` is set on an op
# this release stored without understanding all of it (the op level of the release that stored it):
# a later release applies what it has learnt to read (``migrate.upgrade_held``). Every op held before
# v7 came from the first release: understood, and taken by it.
SCHEMA_NEWER_OPS = """
ALTER TABLE ops ADD COLUMN v1 INTEGER NOT NULL DEFAULT 1;
ALTER TABLE ops ADD COLUMN newer INTEGER;
CREATE INDEX ops_not_v1 ON ops(oid, seq) WHERE v1 = 0;
CREATE INDEX ops_newer ON ops(lseq) WHERE newer IS NOT NULL;
"""


# v8 (0.2.0): retention (``replica.purge``): ops by creation time, so a purge finds what is past the horizon
# (and when the next thing will be) without reading every op.
SCHEMA_RETENTION = """
CREATE INDEX ops_by_hlc ON ops(hlc);
"""

# v9: role pins (``replica.pinstore``): every pin op held, per role key (the rule needs the pins
# in force at any stamp, ``pins.binding_at``, not only the winner). A projection of ``pin`` ops; pin
# ops a release before v9 held unapplied are applied by ``migrate.upgrade_held``.
SCHEMA_PINS = """
CREATE TABLE role_pins(rkey TEXT NOT NULL, hlc INTEGER NOT NULL, origin BLOB NOT NULL, role TEXT NOT NULL,
    nodes BLOB NOT NULL, PRIMARY KEY(rkey, hlc, origin)) WITHOUT ROWID;
"""

# v10: leases (``replica.leases``, ``replica.leasestore``): each take op's lease with its span and
# who it is lost to (``lost_to``, recomputed on every lease op), the renew/release/force ops by lease
# (kept whether or not their lease is here yet), and when this replica first saw each lease lost
# (``lseq`` of the op that made it so: the order sessions are told in). ``prefix`` is a pattern's
# text before its first glob character: two patterns overlap only if one starts with the other's.
# Lease ops a 0.2.0 replica held without understanding them are applied on upgrade
# (``migrate.upgrade_held``).
SCHEMA_LEASES = """
CREATE TABLE leases(
    id TEXT PRIMARY KEY, pkey TEXT NOT NULL, project TEXT NOT NULL, pattern TEXT NOT NULL,
    rkey TEXT NOT NULL, role TEXT NOT NULL, inst TEXT, exclusive INTEGER NOT NULL, reason TEXT NOT NULL,
    hlc INTEGER NOT NULL, origin BLOB NOT NULL, seq INTEGER NOT NULL, ttl INTEGER NOT NULL,
    start INTEGER NOT NULL, until INTEGER NOT NULL, ended_kind TEXT, ended_by TEXT, ended_why TEXT,
    lost_to TEXT, prefix TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX leases_by_project ON leases(pkey, until);
CREATE INDEX leases_by_stamp ON leases(pkey, hlc);
CREATE INDEX leases_by_prefix ON leases(pkey, prefix);
CREATE INDEX leases_by_pattern ON leases(pkey, pattern);
CREATE TABLE lease_changes(
    lease TEXT NOT NULL, kind TEXT NOT NULL, rkey TEXT NOT NULL, role TEXT NOT NULL,
    hlc INTEGER NOT NULL, origin BLOB NOT NULL, seq INTEGER NOT NULL, ttl INTEGER NOT NULL, why TEXT,
    PRIMARY KEY(lease, hlc, origin, seq)
) WITHOUT ROWID;
CREATE TABLE lease_losses(lease TEXT PRIMARY KEY, winner TEXT NOT NULL, lseq INTEGER NOT NULL) WITHOUT ROWID;
CREATE INDEX lease_losses_by_lseq ON lease_losses(lseq);
"""

# v11: acknowledgements (``replica.acks``): a receipt's acked-at time, the projection of its ``a`` field.
SCHEMA_ACKS = """
ALTER TABLE receipts ADD COLUMN acked INTEGER;
"""

# v12: a pin's cuts (``replica.pins``; NULL for a pin op written without them, judged by its stamp) and
# the ops a pin holds back (``pin_held``: a message or retraction in a pinned role's name, stored, counted
# and relayed, not applied while the pins held here refuse it; ``project.rejudge_role``). Pin ops a release
# before cuts held are projected again by ``migrate.upgrade_held`` (op level 4).
SCHEMA_PIN_CUTS = """
ALTER TABLE role_pins ADD COLUMN cuts BLOB;
CREATE TABLE pin_held(lseq INTEGER PRIMARY KEY, rkey TEXT NOT NULL);
CREATE INDEX pin_held_by_role ON pin_held(rkey);
"""

# v13: membership as a set (``replica.fleetstore``): every admit and rekey op held, whatever its fate
# (``fleet_rekeys`` is folded in, and the admits found among the ops: ``fleetstore.backfill``), and
# the nodes let in on a closed replica.
SCHEMA_MEMBERS = """
CREATE TABLE fleet_ops(origin BLOB NOT NULL, seq INTEGER NOT NULL, lseq INTEGER NOT NULL, kind TEXT NOT NULL,
    PRIMARY KEY(origin, seq)) WITHOUT ROWID;
CREATE TABLE fleet_members(node BLOB PRIMARY KEY) WITHOUT ROWID;
"""

# v14: a role seen only reading its inbox is unconfirmed, and can be forgotten (``replica.firstseen``):
# ``first_seen`` gains ``confirmed`` (it sent a message or has a profile: here, a message row, a sender
# row, a message held back for a pin, or a profile) and ``forgot`` (the latest forget), and its ``at``
# becomes NULL while a forgotten role is not seen again; ``seen_reads`` holds every read sighting (the
# ``seen`` writes of the ops held, ``migrate.backfill_reads``; and, for an unconfirmed role, its time,
# whose op may be purged).
SCHEMA_ROLES_SEEN = """
CREATE TABLE first_seen_v14(role TEXT PRIMARY KEY, at INTEGER, confirmed INTEGER NOT NULL DEFAULT 0, forgot INTEGER)
    WITHOUT ROWID;
INSERT INTO first_seen_v14(role, at, confirmed)
    SELECT f.role, f.at, EXISTS (SELECT 1 FROM profiles p WHERE p.rkey = f.role)
        OR EXISTS (SELECT 1 FROM senders s WHERE s.rkey = f.role)
        OR EXISTS (SELECT 1 FROM pin_held h WHERE h.rkey = f.role)
        OR EXISTS (SELECT 1 FROM ops m WHERE m.skey = f.role AND m.thread IS NULL AND m.id IS NOT NULL)
    FROM first_seen f;
DROP TABLE first_seen;
ALTER TABLE first_seen_v14 RENAME TO first_seen;
CREATE TABLE seen_reads(role TEXT NOT NULL, at INTEGER NOT NULL, PRIMARY KEY(role, at)) WITHOUT ROWID;
INSERT INTO seen_reads(role, at) SELECT role, at FROM first_seen WHERE NOT confirmed
"""

MIGRATIONS: tuple[str, ...] = (
    SCHEMA_V1, SCHEMA_V2, SCHEMA_THREAD_SEQS, SCHEMA_FIRST_SEEN, SCHEMA_KEYS, SCHEMA_FLEET, SCHEMA_NEWER_OPS,
    SCHEMA_RETENTION, SCHEMA_PINS, SCHEMA_LEASES, SCHEMA_ACKS, SCHEMA_PIN_CUTS, SCHEMA_MEMBERS, SCHEMA_ROLES_SEEN,
)
LATEST = len(MIGRATIONS)
MEMBERS = 13  # the version from which every membership op is listed (older files are backfilled)
ROLES_SEEN = 14  # the version from which read sightings are kept (older files are backfilled)
KEYED = 5  # the version from which rows carry name keys (older files are rebuilt on upgrade)
