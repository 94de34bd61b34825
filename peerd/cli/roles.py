"""``peerd roles`` (every role known here, confirmed or seen only reading, and which nodes have sent in
each role's name), ``peerd roles forget ROLE`` (forget a role seen only reading: a typo), and
``peerd role pin ROLE NODE...`` / ``peerd role unpin ROLE`` (bind a role to nodes, lift it).

Invariants:
* These commands work on the replica file itself, with or without a daemon: a pin is one signed
  ``pin`` op, a forget one signed ``set`` op, which a running daemon notices (its file watch) and
  pushes to the fleet; with none, it waits in the replica like any offline write.
* A node is named by id (a prefix of at least 4 hex digits) or by the name the membership gives it;
  a word that names no node, or several, is refused and nothing is written.
* The text forms are pure functions of what ``--json`` prints (``RoleSenders``, ``RolePin``).
"""

from __future__ import annotations

import argparse
from typing import Any

from peerd import home as homes
from peerd.cli.replicafile import emit, open_replica


def node_text(ref: dict[str, Any] | None) -> str:
    """A node for people: ``name (id16)``, or the id alone when no name is known."""
    if not ref:
        return "-"
    short = str(ref["id"])[:16]
    return f"{ref['name']} ({short})" if ref.get("name") else short


def roles_text(rows: list[dict[str, Any]], flag: str = "") -> str:
    """The table of ``peerd roles``: a line per (role, sending node), with the role's standing
    (confirmed, or unconfirmed: seen only reading), pinned roles marked; how to forget a typo."""
    from peerd.cli.format import table  # noqa: PLC0415 - format imports this module

    if not rows:
        return "no role is known here yet (none has sent a message, set a profile or read its inbox)"
    out = []
    for r in rows:
        pinned = r.get("pinned_to")
        pin = "-" if pinned is None else "to " + ", ".join(node_text(n) for n in pinned)
        for s in r["senders"] or [None]:
            out.append((r["role"], r.get("status") or "-", node_text(s["node"]) if s else "-",
                        s["messages"] if s else 0, s["last_sent"] if s else "-", pin))
    text = table(out, ["ROLE", "STATUS", "SENT FROM NODE", "MESSAGES", "LAST SENT", "PINNED"])
    if any(r.get("status") == "unconfirmed" for r in rows):
        text += ("\n\nunconfirmed: seen only reading an inbox, never sent a message nor set a profile (a typo?); "
                 f"forget one with: peerd roles forget ROLE{flag}")
    return text


def pin_status_lines(totals: dict[str, Any]) -> list[str]:
    """What ``peerd status`` adds: ops refused here for a role pin, if any."""
    n = int(totals.get("pin_refused") or 0)
    if not n:
        return []
    return [f"pins    {n:,} op{'' if n == 1 else 's'} from peers refused: sent in the name of a role pinned to other "
            "nodes (peerd roles; peerd doctor names the last)"]


def cmd_roles(args: argparse.Namespace) -> int:
    from peerd.cli.setup import home_flag  # noqa: PLC0415 - keep this module light for format.py

    with open_replica(args) as rep:
        rows = [r.to_dict() for r in rep.role_senders()]
    emit(args, rows, roles_text(rows, home_flag(args.home)))
    return 0


def cmd_forget(args: argparse.Namespace) -> int:
    with open_replica(args) as rep:
        gone = rep.forget_role(args.role).to_dict()
    text = (f"forgot role {gone['role']!r} (seen only reading an inbox, first at {gone['first_seen']}): sends to it "
            "warn again, and it is no longer among the recipients of broadcasts")
    if not _live(args):
        text += "\n(no daemon runs for this home: the fleet learns of it once one runs)"
    emit(args, gone, text)
    return 0


def _live(args: argparse.Namespace) -> bool:
    from peerd.cli.backends import running_daemon  # noqa: PLC0415 - keep this module light for format.py

    return running_daemon(homes.resolve_home(args.home)) is not None


def cmd_pin(args: argparse.Namespace) -> int:
    with open_replica(args) as rep:
        pin = rep.pin_role(args.role, args.nodes).to_dict()
    text = (f"pinned role {pin['role']!r} to {', '.join(node_text(n) for n in pin['nodes'])}: every replica "
            "refuses new messages in its name from other nodes")
    if not _live(args):
        text += "\n(no daemon runs for this home: the fleet learns of the pin once one runs)"
    emit(args, pin, text)
    return 0


def cmd_unpin(args: argparse.Namespace) -> int:
    with open_replica(args) as rep:
        pin = rep.unpin_role(args.role).to_dict()
    text = f"lifted the pin of role {pin['role']!r}: any member may send in its name again"
    if not _live(args):
        text += "\n(no daemon runs for this home: the fleet learns of it once one runs)"
    emit(args, pin, text)
    return 0


def _common() -> argparse.ArgumentParser:
    """The global options, for a verb's own parser (they are accepted after it too)."""
    from peerd.cli.parser import Parser, global_options  # noqa: PLC0415 - the parser loads this module

    common = Parser(add_help=False)
    global_options(common, argparse.SUPPRESS)
    return common


def roles_arguments(s: argparse.ArgumentParser) -> None:
    s.description = ("With no VERB: every role known here, confirmed (it sent a message or has a profile) or "
                     "unconfirmed (seen only reading its inbox), and the nodes that sent in its name.")
    s.set_defaults(fn=cmd_roles)  # with no verb: the list
    verbs = s.add_subparsers(dest="verb", metavar="VERB")
    v = verbs.add_parser("forget", parents=[_common()], help="forget a role seen only reading its inbox (a typo), "
                                                             "on every replica")
    v.add_argument("role", metavar="ROLE", help="the role's name, as peerd roles shows it")
    v.set_defaults(fn=cmd_forget)


def role_arguments(s: argparse.ArgumentParser) -> None:
    common = _common()  # the global options after a verb, too
    s.set_defaults(fn=cmd_roles)  # each verb sets its own; a verb is required
    verbs = s.add_subparsers(dest="verb", required=True, metavar="VERB")
    v = verbs.add_parser("pin", parents=[common], help="let only NODE... send in ROLE's name, on every replica")
    v.add_argument("role", metavar="ROLE", help="the role to pin")
    v.add_argument("nodes", metavar="NODE", nargs="+", help="a node id (4 or more hex digits) or a member's name")
    v.set_defaults(fn=cmd_pin)
    v = verbs.add_parser("unpin", parents=[common], help="lift ROLE's pin: any member may send in its name again")
    v.add_argument("role", metavar="ROLE", help="the pinned role")
    v.set_defaults(fn=cmd_unpin)
