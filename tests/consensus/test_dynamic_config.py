"""ZooKeeper's configuration text and our one-peer-port mapping (dynamic_config.py), the
dynamic file a member keeps, and the member-list arithmetic of a reconfig."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.consensus.dynamic_config import (
    ConfigFormatError,
    DynamicConfig,
    load,
    next_members,
    parse_config,
    parse_server,
    save,
)
from services.consensus.settings import MemberAddresses

ONE = MemberAddresses(peer="10.0.0.1:2888", client="10.0.0.1:2181")
TWO = MemberAddresses(peer="10.0.0.2:2888", client="10.0.0.2:2181", role="observer")
THREE = MemberAddresses(peer="10.0.0.3:2888", client="10.0.0.3:2181")
ACTIVE = DynamicConfig(0x1_0000_0004, {1: ONE, 2: TWO, 3: THREE})


def test_text_is_zookeepers_layout_with_the_peer_port_twice() -> None:
    assert ACTIVE.text() == (
        "server.1=10.0.0.1:2888:2888:participant;10.0.0.1:2181\n"
        "server.2=10.0.0.2:2888:2888:observer;10.0.0.2:2181\n"
        "server.3=10.0.0.3:2888:2888:participant;10.0.0.3:2181\n"
        "version=100000004"
    )
    assert (ACTIVE.voters, ACTIVE.observers) == ((1, 3), (2,))
    assert parse_config(ACTIVE.text()) == ACTIVE


def test_server_strings_as_zookeeper_writes_them() -> None:
    assert parse_server("server.7", "h:5:5;2181") == (
        7,
        MemberAddresses(peer="h:5", client="0.0.0.0:2181"),  # client host defaults
    )
    assert parse_server(" server.8 ", "h:5:5:observer;c:2182") == (
        8,
        MemberAddresses(peer="h:5", client="c:2182", role="observer"),
    )
    # Commas or newlines between entries, as reconfig's newMembers takes them.
    assert parse_config("server.1=a:1:1;2181,server.2=b:2:2;2182").voters == (1, 2)


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("server.4", "h:1:2:participant;2181", "differ"),  # two peer ports: we have one
        ("server.4", "h:1:1:participant", "no client port"),
        ("server.4", "h:1:1:leader;2181", "host:port:port"),
        ("server.4", "h:1;2181", "host:port:port"),
        ("server.x", "h:1:1;2181", "server.<id>"),
        ("srv.4", "h:1:1;2181", "server.<id>"),
        ("server.0", "h:1:1;2181", "1..255"),
        ("server.4", "h:99999:99999;2181", "server.4"),
        ("server.4", "h:1:1;c:port", "server.4"),
    ],
)
def test_malformed_server_strings(key: str, value: str, why: str) -> None:
    with pytest.raises(ConfigFormatError, match=why):
        parse_server(key, value)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("server.1=a:1:1;2181\nserver.1=b:2:2;2182", "named twice"),
        ("server.1=a:1:1;2181\nserver.2=a:1:1;2182", "share a:1"),
        ("server.1=a:1:1;c:2181\nserver.2=b:2:2;c:2181", "share c:2181"),
        ("server.1", "key=value"),
        ("version=zz", "bad version"),
    ],
)
def test_malformed_configurations(text: str, why: str) -> None:
    with pytest.raises(ConfigFormatError, match=why):
        parse_config(text)


def test_the_newest_dynamic_file_wins_and_older_ones_go(tmp_path: Path) -> None:
    assert load(tmp_path) is None
    older = DynamicConfig(0x1_0000_0002, {1: ONE, 3: THREE})
    save(tmp_path, older)
    path = save(tmp_path, ACTIVE)
    assert path.name == "zoo.cfg.dynamic.100000004"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert load(tmp_path) == ACTIVE


def _reconfig(joining: str = "", leaving: str = "", new: str = "") -> tuple[str, str, str]:
    return joining, leaving, new


def test_incremental_and_whole_member_lists() -> None:
    four = "server.4=10.0.0.4:2888:2888:participant;10.0.0.4:2181"
    members = next_members(ACTIVE, *_reconfig(joining=four, leaving="2"))
    assert sorted(members) == [1, 3, 4] and members[4].peer == "10.0.0.4:2888"
    # Joining an id already there replaces its entry (ZooKeeper's put), e.g. a new role.
    moved = next_members(ACTIVE, *_reconfig(joining="server.3=10.0.0.3:2888:2888:observer;2181"))
    assert moved[3].role == "observer"
    whole = next_members(ACTIVE, *_reconfig(new="server.1=a:1:1;2181,server.5=b:5:5;2185"))
    assert sorted(whole) == [1, 5]


@pytest.mark.parametrize(
    ("request_", "why"),
    [
        (_reconfig(), "no joining"),
        (_reconfig(leaving="9"), "not in the configuration"),
        (_reconfig(leaving="3,3"), "leaves twice"),
        (_reconfig(leaving="x"), "invalid literal"),
        (_reconfig(joining="server.4=a:4:4;2184,server.4=b:5:5;2185"), "joins twice"),
        (_reconfig(joining="server.4=10.0.0.1:2888:2888;2184"), "share 10.0.0.1:2888"),
        (_reconfig(joining="server.4"), "not server"),
        (_reconfig(joining="server.4=a:4:4;2184", new="server.1=a:1:1;2181"), "newMembers"),
    ],
)
def test_bad_member_lists(request_: tuple[str, str, str], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        next_members(ACTIVE, *request_)
