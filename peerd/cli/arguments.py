"""The flags of the commands in ``peerd.cli.commands``: one function per command, which the parser's
table (``peerd.cli.parser.COMMANDS``) names.

Invariants: each function adds its command's flags to the parser it is given and sets ``fn`` to
its ``commands.cmd_*`` function; it is called only when a call names that command (or asks for
the whole help), so a command's flags cost nothing to the others; a malformed value is a usage
error told by the parser, before the command runs.
"""

from __future__ import annotations

import argparse

from peerd.cli import commands


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _new_fleet(s: argparse.ArgumentParser) -> None:
    s.add_argument("--new-fleet", action="store_true",
                   help="make a new fleet even though this home holds a node whose config.toml is gone")


# -- setting up, serving and stopping a node ---------------------------------------------------------


def init_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--name", help="a name for this node (default: the host name)")
    s.add_argument("--fleet-key", help="join an existing fleet with this key instead of making a new one")
    _new_fleet(s)
    s.set_defaults(fn=commands.cmd_init)


def run_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--port", type=int, help="peer port (0 picks a free one)")
    s.add_argument("--local-port", type=int, help="local port for MCP, the API and the dashboard (0 picks a free one)")
    s.add_argument("--seed", action="append", metavar="HOST:PORT", help="a peer to contact (repeatable)")
    s.add_argument("--no-mdns", action="store_true", help="do not use mDNS discovery")
    s.add_argument("--bind", default="::", help="address the peer server listens on (default: all, IPv4 and "
                   "IPv6; 0.0.0.0: all, IPv4 only)")
    s.add_argument("--advertise", help="this node's address as written in daemon.json (default: the bind "
                                       "address, or this machine's LAN address when bound to all interfaces)")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="the least severe log lines kept (default: info)")
    s.add_argument("-v", "--verbose", action="store_true",
                   help="log on standard error instead of peerd.log in the home")
    _new_fleet(s)
    s.set_defaults(fn=commands.cmd_run)


def stop_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--timeout", type=positive, default=30.0, help="seconds to wait for it to exit (default 30)")
    s.set_defaults(fn=commands.cmd_stop)


# -- messages ---------------------------------------------------------------------------------------


def send_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--from", dest="sender", required=True, metavar="ROLE", help="sender role")
    s.add_argument("--to", required=True, metavar="CHANNEL", help="a role, 'role1,role2' or 'broadcast'")
    s.add_argument("--instance", metavar="ID", help="only this instance of the target role")
    s.add_argument("--from-instance", metavar="ID", help="the sender's instance id")
    s.add_argument("text", nargs="+", metavar="TEXT", help="the message: its words are joined with spaces; '-' reads "
                   "it from standard input")
    s.set_defaults(fn=commands.cmd_send)


def inbox_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("role", metavar="ROLE", help="the role whose inbox to read (a role never seen gets a warning)")
    s.add_argument("--instance", metavar="ID", help="this instance of the role")
    s.add_argument("--all", action="store_true", help="include messages already read")
    s.add_argument("--follow", action="store_true", help="keep printing new messages as they arrive")
    s.add_argument("--limit", type=int, default=50, help="most messages to show (default 50)")
    s.add_argument("--wait", type=float, default=0, help="block up to this many seconds for a message")
    s.set_defaults(fn=commands.cmd_inbox)


def read_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("receipts", nargs="+", metavar="RECEIPT",
                   help="a receipt id, as peerd inbox shows it (one per message and recipient; not a message id)")
    s.set_defaults(fn=commands.cmd_read)


def retract_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("message_id", metavar="MESSAGE_ID", help="the id send printed")
    s.add_argument("--from", dest="sender", required=True, metavar="ROLE", help="the role that sent it")
    s.set_defaults(fn=commands.cmd_retract)


# -- looking at the node -----------------------------------------------------------------------------


def status_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("message_id", nargs="?", metavar="MESSAGE_ID",
                   help="a message's id: per recipient, delivered and read (works with no daemon too)")
    s.add_argument("--watch", action="store_true", help="refresh until Ctrl-C (a progress bar during a catch-up)")
    s.add_argument("--interval", type=positive, default=1.0, help="seconds between refreshes (default 1)")
    s.add_argument("--count", type=int, default=0, help="with --watch: stop after this many refreshes")
    s.set_defaults(fn=commands.cmd_status)


def dashboard_arguments(s: argparse.ArgumentParser) -> None:
    s.set_defaults(fn=commands.cmd_dashboard)


def peers_arguments(s: argparse.ArgumentParser) -> None:
    s.set_defaults(fn=commands.cmd_peers)


def log_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--limit", type=int, default=20, help="how many of the latest messages (default 20)")
    s.add_argument("--follow", action="store_true", help="keep printing messages as they arrive")
    s.set_defaults(fn=commands.cmd_log)


def search_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("query", nargs="+", metavar="QUERY", help="words that must all match")
    s.add_argument("--from", dest="sender", metavar="ROLE", help="only messages from this role")
    s.add_argument("--channel", metavar="ROLE", help="only messages addressed to this role")
    s.add_argument("--since", type=int, metavar="N", help="only messages after arrival position N")
    s.add_argument("--limit", type=int, default=20, help="most hits (default 20)")
    s.set_defaults(fn=commands.cmd_search)


def threads_arguments(s: argparse.ArgumentParser) -> None:
    s.set_defaults(fn=commands.cmd_threads)


def profile_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("id", nargs="?", metavar="ID", help="the role (orchestrator id) whose profile to show or set")
    s.add_argument("--set", nargs="+", action="extend", metavar="FIELD=VALUE",
                   help="set name=..., static=... and/or dynamic=...")
    s.set_defaults(fn=commands.cmd_profile)


def doctor_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--timeout", type=positive, default=3.0, help="seconds to wait for each peer (default 3)")
    s.set_defaults(fn=commands.cmd_doctor)
