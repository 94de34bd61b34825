"""``peerd retention``: the fleet's retention horizon (``set DURATION``, ``show``, ``clear``).

Invariants:
* The command writes on the replica file itself (one signed ``ret`` op), with or without a
  daemon: a running daemon notices the write (its file watch), pushes it to the fleet and starts
  purging; with none, the op waits in the replica like any offline write.
* A horizon under a day purges a lot: ``set`` refuses it without ``--force`` and says what it
  would remove; a removed node is told it cannot change the fleet, and nothing is written.
* The text forms (``summary_lines``) are pure functions of ``RetentionState.to_dict()``, which is
  what ``--json`` prints, ``/api/status`` carries as ``retention`` and ``peerd doctor`` shows.
"""

from __future__ import annotations

import argparse
from typing import Any

from peerd import home as homes
from peerd.cli.errors import EXIT_USAGE, CliError
from peerd.cli.replicafile import emit, open_replica
from replica import retention as ret
from replica.hlc import pack, to_iso


def _iso(ms: int | None) -> str:
    return "-" if ms is None else to_iso(pack(ms))


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n:,} bytes"


def _counts(r: dict[str, Any]) -> str:
    return ", ".join(f"{r.get(k, 0):,} {k}" for k in ("messages", "receipts", "ops"))


def horizon_sentence(h: int) -> str:
    if h <= 0:
        return "forever: nothing is purged (the default)"
    return (f"{ret.format_horizon(h)}: messages older than {ret.spoken(h)} leave every replica "
            f"(unread ones after {ret.spoken(2 * h)})")


def summary_lines(d: dict[str, Any], names: dict[str, str] | None = None) -> list[str]:
    """The horizon, who set it, the last purge and the total, for people."""
    lines = [f"retention  {horizon_sentence(int(d['horizon_ms']))}"]
    if d.get("set_by"):
        who = (names or {}).get(d["set_by"])
        by = f"{who} ({d['set_by'][:16]})" if who else d["set_by"][:16]
        lines.append(f"set        {_iso(d.get('set_at_ms'))} by {by}")
    last = d.get("last_purge")
    if last:
        lines.append(f"last purge {_iso(last.get('at_ms'))}: removed {_counts(last)} in {last.get('took_ms', 0)} ms; "
                     f"{_size(last.get('bytes_before', 0))} -> {_size(last.get('bytes_after', 0))} on disk")
    elif d.get("checked_at_ms") is not None:
        lines.append(f"last purge {_iso(d['checked_at_ms'])}: nothing was past the horizon")
    if d.get("removed_total"):
        lines.append(f"in all     removed here {_counts(d['removed_total'])}")
    return lines


def status_lines(d: dict[str, Any]) -> list[str]:
    """What ``peerd status`` adds: nothing while the fleet keeps everything and nothing was purged here."""
    state = d.get("retention")
    if not isinstance(state, dict) or (not state.get("horizon_ms") and not state.get("removed_total")):
        return []
    lines = [f"retain  {horizon_sentence(int(state['horizon_ms']))}"]
    last = state.get("last_purge")
    if last:
        lines.append(f"purged  {_counts(state['removed_total'])} in all here, the last at {_iso(last.get('at_ms'))}")
    return lines


# -- the command ------------------------------------------------------------------------------






def _names(rep: Any) -> dict[str, str]:
    view = rep.fleet_view()
    return {rep.node_id: "this node", **{k.hex(): a.name for k, a in view.admitted.items()}}


def cmd_show(args: argparse.Namespace) -> int:
    with open_replica(args) as rep:
        state = rep.retention().to_dict()
        names = _names(rep)
    hint = "" if state["horizon_ms"] else "\n\nset one for the whole fleet with: peerd retention set 30d"
    emit(args, state, "\n".join(summary_lines(state, names)) + hint)
    return 0


def cmd_set(args: argparse.Namespace) -> int:
    try:
        h = ret.parse_horizon(args.horizon)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    return _write(args, h)


def cmd_clear(args: argparse.Namespace) -> int:
    return _write(args, 0)


def _write(args: argparse.Namespace, h: int) -> int:
    home = homes.resolve_home(args.home)
    with open_replica(args) as rep:
        if rep.node_key in rep.removed():
            raise CliError("this node was removed from the fleet: members refuse its ops, so it cannot set the "
                           "fleet's retention horizon (run the command on a member)")
        past, way_past = (rep.messages_older_than(h), rep.messages_older_than(2 * h)) if h else (0, 0)
        if 0 < h < ret.UNFORCED_MS and not args.force:
            raise CliError(f"a horizon of {ret.spoken(h)} purges every read message older than {ret.spoken(h)}, and "
                           f"every message older than {ret.spoken(2 * h)}, from every replica of the fleet; here "
                           f"that is {past:,} message(s) held now, {way_past:,} of them whatever their receipts "
                           "say. Add --force if that is what you want.")
        state = rep.set_retention(h).to_dict()
    from peerd.cli.backends import running_daemon  # noqa: PLC0415 - format.py imports this module: keep it light

    live = running_daemon(home) is not None
    if h:
        text = (f"retention horizon set to {ret.format_horizon(h)} for the whole fleet: messages older than "
                f"{ret.spoken(h)} leave every replica once read, all of them after {ret.spoken(2 * h)}. "
                f"Held here and past it now: {past:,} message(s) ({way_past:,} past twice the horizon).")
    else:
        text = "retention cleared: the fleet keeps everything from now on (what was purged stays gone)."
    if not live:
        text += "\n(no daemon runs for this home: the fleet learns of it, and purging starts, once one runs)"
    emit(args, {**state, "past_horizon": past, "past_twice": way_past}, text)
    return 0


def retention_arguments(s: argparse.ArgumentParser) -> None:
    from peerd.cli.parser import Parser, global_options  # noqa: PLC0415 - the parser loads this module

    common = Parser(add_help=False)  # the global options after a verb, too
    global_options(common, argparse.SUPPRESS)
    s.set_defaults(fn=cmd_show)  # each verb sets its own; a verb is required
    verbs = s.add_subparsers(dest="verb", required=True, metavar="VERB")
    v = verbs.add_parser("set", parents=[common], help="purge messages older than DURATION from every replica")
    v.add_argument("horizon", metavar="DURATION", help="30d, 12h, 90m, 45s, or forever (keep everything)")
    v.add_argument("--force", action="store_true", help="allow a horizon shorter than one day")
    v.set_defaults(fn=cmd_set)
    v = verbs.add_parser("show", parents=[common], help="the horizon in force, who set it, what was purged here")
    v.set_defaults(fn=cmd_show)
    v = verbs.add_parser("clear", parents=[common], help="keep everything again (the default)")
    v.set_defaults(fn=cmd_clear)
