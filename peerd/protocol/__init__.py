"""The peer protocol, sans-io: bytes and values in, bytes and values out.

The protocol owns everything that crosses the wire; a node only seals, sends
and schedules (``peerd.node``), through a transport (``peerd.transport``).

* ``wire``      message kinds, the envelope (``n``, ``p``, ``nm``, ``c``), the codec (a head, then msgpack)
* ``grouping``  a page's ops grouped by origin (each origin key said once)
* ``rounds``    a sync round: the client as a generator, the answers to sync, pull and push
* ``exchange``  peer exchange: records, names
* ``dispatch``  one request in, the reply and what the node must do out (the forwarding rule)
* ``catchup``   catch-up accounting on vectors
* ``versions``  which wire versions a peer speaks, and what two peers use
* ``link``      the return path: links to members nobody can call, the ``back`` probe
* ``snapshot``  snapshots: a member far behind takes pages of a fixed point, signed by the answerer

Invariants: nothing here does I/O, sleeps or touches asyncio; replica work goes
through the ``SyncReplica`` calls only; every check of what a peer sent raises
``ProtocolError`` (a ``RemoteError``), never a library exception.
"""

from peerd.protocol import link, snapshot, versions
from peerd.protocol.catchup import CATCHUP_REPORT, Progress, advance_known, behind, reply_vector, start_catchup
from peerd.protocol.dispatch import KINDS, Here, Outcome, Request, decode_request, dispatch, forwarded
from peerd.protocol.exchange import Learnt, PeerRecord, learn, peers_message, probe
from peerd.protocol.grouping import group, ungroup
from peerd.protocol.rounds import (
    FULL_VECTOR_MAX,
    RoundResult,
    SyncReplica,
    client_round,
    drive,
    encode_page,
    expand,
    first_release_takes,
    handle_pull,
    handle_push,
    handle_sync,
    is_membership_op,
    serve,
    step,
    sync_request,
    wanted,
)
from peerd.protocol.wire import (
    BACK,
    CODES,
    DIFF,
    ERROR,
    HEAD_FIELDS,
    LINK,
    OK,
    PAGE,
    PEERS,
    PROTOCOL_VERSION,
    PULL,
    PUSH,
    REKEY,
    SAME,
    SHORT,
    SHOT,
    SNAP,
    SYNC,
    Envelope,
    Msg,
    ProtocolError,
    decode,
    decode_map,
    encode,
    encode_map,
    envelope,
    error_reply,
    refusal,
    short,
    shorten,
    sign_reply,
    stamp,
)

__all__ = [
    "BACK",
    "CATCHUP_REPORT",
    "CODES",
    "DIFF",
    "ERROR",
    "FULL_VECTOR_MAX",
    "HEAD_FIELDS",
    "KINDS",
    "LINK",
    "OK",
    "PAGE",
    "PEERS",
    "PROTOCOL_VERSION",
    "PULL",
    "PUSH",
    "REKEY",
    "SAME",
    "SHORT",
    "SHOT",
    "SNAP",
    "SYNC",
    "Envelope",
    "Here",
    "Learnt",
    "Msg",
    "Outcome",
    "PeerRecord",
    "Progress",
    "ProtocolError",
    "Request",
    "RoundResult",
    "SyncReplica",
    "advance_known",
    "behind",
    "client_round",
    "decode",
    "decode_map",
    "decode_request",
    "dispatch",
    "drive",
    "encode",
    "encode_map",
    "encode_page",
    "envelope",
    "error_reply",
    "expand",
    "first_release_takes",
    "forwarded",
    "group",
    "handle_pull",
    "handle_push",
    "handle_sync",
    "is_membership_op",
    "learn",
    "link",
    "peers_message",
    "probe",
    "refusal",
    "reply_vector",
    "serve",
    "short",
    "shorten",
    "sign_reply",
    "snapshot",
    "stamp",
    "start_catchup",
    "step",
    "sync_request",
    "ungroup",
    "versions",
    "wanted",
]
