"""`directlog`: the admin command line (`kubectl exec broker-0 -- directlog topics list`).

Every command talks the Kafka protocol to the bootstrap servers (kafka-python's admin
client); nothing reads a broker's files. Exit codes: 0 done, 1 refused or failed (the
message says why; nothing was half-applied), 2 a bad command line, 3 `reassign verify`
while the reassignment is still in progress.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from directlog.admin import brokers, groups, leaders, reassignment, topics
from directlog.admin.client_config import ENV_PREFIX, ClientConfigError, read_client_config
from directlog.admin.output import EXIT_ERROR, Report, render
from directlog.admin.plans import Assignment, PlanError, parse_plan
from directlog.admin.session import AdminError, Session

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "DIRECTLOG_BOOTSTRAP_SERVERS"
DEFAULT_TIMEOUT = 30.0

Command = Callable[[Session, argparse.Namespace], Report]


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {value}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, not {text}")
    return value


def _broker_list(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected broker ids such as 0,1,2, not {text!r}"
        ) from None
    if not ids or any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"expected broker ids >= 0 such as 0,1,2, not {text!r}")
    return ids


def _name_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _global_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """The connection options, accepted before the command and after it. Subcommands
    leave them unset (SUPPRESS) unless given, so a value before the command stays."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--bootstrap-server",
        metavar="HOST:PORT[,HOST:PORT]",
        default=default(None),
        help="brokers to bootstrap from (default: the --command-config file's "
        f"bootstrap.servers, else ${BOOTSTRAP_ENV}, else {DEFAULT_BOOTSTRAP})",
    )
    parser.add_argument(
        "--command-config",
        metavar="FILE",
        default=default(None),
        help="Kafka client properties to log in with (security.protocol, sasl.mechanism, "
        "sasl.username, sasl.password, ssl.ca.location, ssl.certificate.location, "
        f"ssl.key.location, ...); ${ENV_PREFIX}<NAME> variables override them",
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_seconds,
        default=default(DEFAULT_TIMEOUT),
        help=f"bound on each request (default {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument(
        "--output",
        choices=("table", "json"),
        default=default("table"),
        help="tables for people or one JSON document for scripts (default table)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="directlog",
        description="Administer a Directlog (or any Kafka) cluster over the Kafka protocol.",
    )
    _global_options(parser, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, defaults=False)
    areas = parser.add_subparsers(dest="area", required=True, metavar="COMMAND")

    def command(
        group: argparse._SubParsersAction[argparse.ArgumentParser],
        name: str,
        run: Command,
        help_text: str,
    ) -> argparse.ArgumentParser:
        sub = group.add_parser(name, parents=[common], help=help_text, description=help_text)
        sub.set_defaults(run=run)
        return sub

    # topics
    area = areas.add_parser("topics", help="list, describe, create, alter and delete topics")
    cmds = area.add_subparsers(dest="command", required=True, metavar="ACTION")
    command(cmds, "list", lambda s, a: topics.list_topics(s), "every topic")
    sub = command(
        cmds,
        "describe",
        lambda s, a: topics.describe_topics(s, a.names),
        "partitions, leaders, replicas, in-sync replicas and overridden configs",
    )
    sub.add_argument("names", nargs="*", metavar="NAME")
    sub = command(
        cmds,
        "create",
        lambda s, a: topics.create_topic(
            s, a.name, a.partitions, a.replication_factor, a.config, a.if_not_exists
        ),
        "create a topic",
    )
    sub.add_argument("name", metavar="NAME")
    sub.add_argument("--partitions", type=int, required=True, metavar="N")
    sub.add_argument("--replication-factor", type=int, required=True, metavar="R")
    sub.add_argument("--config", action="append", default=[], metavar="K=V")
    sub.add_argument("--if-not-exists", action="store_true", help="an existing topic is fine")
    sub = command(
        cmds,
        "alter",
        lambda s, a: topics.alter_topic(s, a.name, a.config, a.delete_config, a.partitions),
        "change a topic's configs or add partitions",
    )
    sub.add_argument("name", metavar="NAME")
    sub.add_argument("--config", action="append", default=[], metavar="K=V")
    sub.add_argument("--delete-config", action="append", default=[], metavar="K")
    sub.add_argument("--partitions", type=int, metavar="N", help="the new, higher, count")
    sub = command(
        cmds,
        "delete",
        lambda s, a: topics.delete_topics(s, a.names, a.if_exists),
        "delete topics",
    )
    sub.add_argument("names", nargs="+", metavar="NAME")
    sub.add_argument("--if-exists", action="store_true", help="skip topics that do not exist")

    # groups
    area = areas.add_parser("groups", help="consumer groups: list, describe, reset offsets, delete")
    cmds = area.add_subparsers(dest="command", required=True, metavar="ACTION")
    command(cmds, "list", lambda s, a: groups.list_groups(s), "every consumer group")
    sub = command(
        cmds,
        "describe",
        lambda s, a: groups.describe_groups(s, a.groups),
        "state, members, committed offsets, log end offsets and lag",
    )
    sub.add_argument("groups", nargs="+", metavar="GROUP")
    sub = command(
        cmds,
        "reset-offsets",
        _reset_offsets,
        "move a group's committed offsets (prints the plan unless --execute)",
    )
    sub.add_argument("group", metavar="GROUP")
    sub.add_argument("--topic", action="append", required=True, metavar="T[:P,P]")
    how = sub.add_mutually_exclusive_group(required=True)
    how.add_argument("--to-earliest", action="store_true")
    how.add_argument("--to-latest", action="store_true")
    how.add_argument("--to-offset", type=int, metavar="N")
    how.add_argument("--to-datetime", metavar="ISO8601")
    how.add_argument("--shift-by", type=int, metavar="N")
    sub.add_argument("--execute", action="store_true", help="commit the new offsets")
    sub = command(
        cmds, "delete", lambda s, a: groups.delete_groups(s, a.groups), "delete inactive groups"
    )
    sub.add_argument("groups", nargs="+", metavar="GROUP")

    # brokers
    area = areas.add_parser("brokers", help="list brokers, drain one")
    cmds = area.add_subparsers(dest="command", required=True, metavar="ACTION")
    command(
        cmds,
        "list",
        lambda s, a: brokers.list_brokers(s),
        "id, address, rack, partitions led and replicas held",
    )
    sub = command(
        cmds,
        "drain",
        lambda s, a: brokers.drain(s, a.id, a.wait, a.throttle),
        "move every replica off a broker onto the others",
    )
    sub.add_argument("id", type=_non_negative, metavar="ID")
    sub.add_argument("--wait", action="store_true", help="until the broker holds no replica")
    sub.add_argument("--throttle", type=_positive, metavar="BYTES_PER_S")

    # reassign
    area = areas.add_parser(
        "reassign", help="partition reassignment plans (kafka-reassign-partitions' JSON)"
    )
    cmds = area.add_subparsers(dest="command", required=True, metavar="ACTION")
    sub = command(
        cmds,
        "generate",
        lambda s, a: reassignment.generate(s, a.brokers, a.topics),
        "print a plan that spreads partitions evenly over the given brokers",
    )
    sub.add_argument("--brokers", type=_broker_list, required=True, metavar="0,1,2")
    sub.add_argument("--topics", type=_name_list, default=[], metavar="a,b")
    sub = command(
        cmds,
        "execute",
        lambda s, a: reassignment.execute(s, _read_plan(a.plan_file), a.throttle),
        "start the moves of a plan file",
    )
    sub.add_argument("plan_file", metavar="PLAN_FILE")
    sub.add_argument("--throttle", type=_positive, metavar="BYTES_PER_S")
    sub = command(
        cmds,
        "verify",
        lambda s, a: reassignment.verify(s, _read_plan(a.plan_file)),
        "done or in progress, per partition (exit 3 while in progress)",
    )
    sub.add_argument("plan_file", metavar="PLAN_FILE")
    command(
        cmds,
        "list",
        lambda s, a: reassignment.list_reassignments(s),
        "reassignments in progress, with the replicas being added and removed",
    )
    sub = command(
        cmds,
        "cancel",
        lambda s, a: reassignment.cancel(s, _read_plan(a.plan_file)),
        "cancel a plan's running moves",
    )
    sub.add_argument("plan_file", metavar="PLAN_FILE")

    # rebalance
    sub = command(
        areas,
        "rebalance",
        lambda s, a: brokers.rebalance(s, a.execute, a.wait, a.throttle),
        "spread replicas and preferred leaders evenly over every live broker",
    )
    sub.add_argument("--execute", action="store_true", help="start the moves")
    sub.add_argument("--wait", action="store_true", help="until done, then elect leaders")
    sub.add_argument("--throttle", type=_positive, metavar="BYTES_PER_S")

    # elect-leaders
    sub = command(
        areas,
        "elect-leaders",
        lambda s, a: leaders.elect(s, leaders.select(s, a.topic, a.partition), a.type),
        "elect preferred (or, unclean, any live) leaders",
    )
    sub.add_argument("--topic", action="append", default=[], metavar="T")
    sub.add_argument("--partition", action="append", default=[], type=_non_negative, metavar="P")
    sub.add_argument("--type", choices=sorted(leaders.ELECTION_TYPES), default="preferred")
    return parser


def _reset_offsets(session: Session, args: argparse.Namespace) -> Report:
    if args.to_earliest:
        target = groups.ResetTarget("earliest")
    elif args.to_latest:
        target = groups.ResetTarget("latest")
    elif args.to_offset is not None:
        if args.to_offset < 0:
            raise AdminError(f"--to-offset must be >= 0, not {args.to_offset}")
        target = groups.ResetTarget("offset", args.to_offset)
    elif args.to_datetime is not None:
        target = groups.ResetTarget("datetime", groups.parse_datetime(args.to_datetime))
    else:
        target = groups.ResetTarget("shift", args.shift_by)
    return groups.reset_offsets(session, args.group, args.topic, target, args.execute)


def _read_plan(path: str) -> Assignment:
    """A plan file (`-` for stdin), every problem in it reported at once."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise AdminError(f"cannot read the plan {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise AdminError(f"the plan {path} is not UTF-8 text") from None
    try:
        return parse_plan(text, source=path)
    except PlanError as error:
        raise AdminError(f"the plan is refused, nothing was submitted:\n{error}") from None


def bootstrap_servers(given: str | None, from_file: str | None) -> str:
    """--bootstrap-server, else the --command-config file's bootstrap.servers, else
    $DIRECTLOG_BOOTSTRAP_SERVERS (a broker pod's own address), else 127.0.0.1:9092."""
    return given or from_file or os.environ.get(BOOTSTRAP_ENV) or DEFAULT_BOOTSTRAP


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # kafka-python logs connection trouble as it retries; what failed is reported once,
    # as the command's error.
    logging.basicConfig(level=logging.CRITICAL, stream=sys.stderr)
    try:
        try:
            client, file_bootstrap = read_client_config(args.command_config, os.environ)
        except ClientConfigError as error:
            raise AdminError(str(error)) from None
        bootstrap = bootstrap_servers(args.bootstrap_server, file_bootstrap)
        with Session(bootstrap, args.timeout, client) as session:
            run: Command = args.run
            report = run(session, args)
    except AdminError as error:
        print(f"directlog: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("directlog: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # a client or network failure: say what, not a traceback
        if type(error).__module__.startswith("kafka"):
            print(f"directlog: error: {error}", file=sys.stderr)
            return EXIT_ERROR
        raise
    render(report, args.output, sys.stdout, sys.stderr)
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
