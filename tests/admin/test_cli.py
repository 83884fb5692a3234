"""The command line's parsing and messages, without a cluster."""

from __future__ import annotations

import pytest

from directlog.admin.cli import BOOTSTRAP_ENV, bootstrap_servers, build_parser, main
from directlog.admin.session import describe_error, error_name


def test_connection_options_go_before_or_after_the_command(monkeypatch):
    monkeypatch.delenv(BOOTSTRAP_ENV, raising=False)
    parser = build_parser()
    before = parser.parse_args(["--bootstrap-server", "b:1", "--output", "json", "topics", "list"])
    after = parser.parse_args(["topics", "list", "--bootstrap-server", "b:1", "--output", "json"])
    for args in (before, after):
        assert (args.bootstrap_server, args.output, args.timeout) == ("b:1", "json", 30.0)
    assert parser.parse_args(["brokers", "list"]).bootstrap_server is None
    assert bootstrap_servers(None, None) == "127.0.0.1:9092"


def test_the_bootstrap_servers_default_to_the_file_then_the_environment(monkeypatch):
    monkeypatch.setenv(BOOTSTRAP_ENV, "broker-0.broker:9092")
    given = build_parser().parse_args(["topics", "list"]).bootstrap_server
    assert bootstrap_servers(given, None) == "broker-0.broker:9092"
    assert bootstrap_servers(given, "secure:9093") == "secure:9093"
    assert bootstrap_servers("b:1", "secure:9093") == "b:1"


@pytest.mark.parametrize(
    "argv",
    [
        ["topics", "create", "t"],  # --partitions and --replication-factor are required
        ["groups", "reset-offsets", "g", "--topic", "t"],  # no target
        ["groups", "reset-offsets", "g", "--topic", "t", "--to-earliest", "--to-latest"],
        ["brokers", "drain", "-1"],
        ["brokers", "drain", "0", "--throttle", "0"],
        ["reassign", "generate", "--brokers", "a,b"],
        ["elect-leaders", "--type", "dirty"],
        ["--timeout", "0", "topics", "list"],
        ["nothing"],
    ],
)
def test_bad_command_lines_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "usage: directlog" in capsys.readouterr().err


def test_error_names_are_kafkas():
    assert error_name(3) == "UNKNOWN_TOPIC_OR_PARTITION"
    assert error_name(39) == "INVALID_REPLICA_ASSIGNMENT"
    assert error_name(85) == "NO_REASSIGNMENT_IN_PROGRESS"
    assert error_name(9999) == "ERROR_9999"
    assert describe_error(38, "3 brokers") == "INVALID_REPLICATION_FACTOR (38): 3 brokers"
