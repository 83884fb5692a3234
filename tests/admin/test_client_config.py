"""The admin CLI's login settings: Kafka client properties from a file and the
environment, as kafka-python's admin client takes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from directlog.admin.cli import main
from directlog.admin.client_config import (
    ClientConfigError,
    parse_properties,
    read_client_config,
)

BANNER = """\
# what `make run SECURE=1` prints
bootstrap.servers=127.0.0.1:9092
security.protocol=sasl_ssl
sasl.mechanism = SCRAM-SHA-512
sasl.username: admin
sasl.password=p=w:rd
! a comment in Java's other style
ssl.ca.location=/data/ca.pem
"""


def test_a_properties_file_becomes_kafka_python_settings(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_text(BANNER)
    settings, bootstrap = read_client_config(str(path), {})
    assert bootstrap == "127.0.0.1:9092"
    assert settings == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "admin",
        "sasl_plain_password": "p=w:rd",  # split at the first separator only
        "ssl_cafile": "/data/ca.pem",
    }


def test_variables_win_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_text("security.protocol=SSL\nssl.endpoint.identification.algorithm=https\n")
    environ = {
        "DIRECTLOG_CLIENT_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "DIRECTLOG_CLIENT_SASL_PASSWORD": "from-a-secret",
        "DIRECTLOG_CLIENT_SSL_KEY_LOCATION": "",  # set but empty: not a setting
        "DIRECTLOG_BOOTSTRAP_SERVERS": "b:1",  # another variable of the CLI
    }
    settings, bootstrap = read_client_config(str(path), environ)
    assert bootstrap is None
    assert settings == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_plain_password": "from-a-secret",
        "ssl_check_hostname": True,
    }
    assert read_client_config(None, {}) == ({}, None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("security.protocol=TLS\n", "security.protocol 'TLS' is not one of"),
        ("sasl.mechanism=GSSAPI\n", "sasl.mechanism 'GSSAPI' is not one of"),
        ("sasl.jaas.config=x\n", "unknown client properties sasl.jaas.config"),
        ("ssl.endpoint.identification.algorithm=maybe\n", "https or none"),
        ("security.protocol\n", "client.properties:1: expected key=value"),
    ],
)
def test_bad_properties_are_refused_by_name(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "client.properties"
    path.write_text(text)
    with pytest.raises(ClientConfigError, match=message):
        read_client_config(str(path), {})


def test_the_cli_says_what_is_wrong_with_its_login(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "absent.properties"
    assert main(["--command-config", str(missing), "topics", "list"]) == 1
    assert f"cannot read {missing}" in capsys.readouterr().err
    bad = tmp_path / "bad.properties"
    bad.write_text("security.protocol=TLS\n")
    assert main(["topics", "list", "--command-config", str(bad)]) == 1
    assert "security.protocol 'TLS'" in capsys.readouterr().err


def test_comments_and_blank_lines_are_skipped() -> None:
    assert parse_properties("\n  # c\n!c\n a = b \n", "f") == {"a": "b"}
