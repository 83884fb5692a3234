"""How the admin CLI logs in to a secured cluster.

The settings are Kafka client properties under the names librdkafka, kcat and the
`make run SECURE=1` banner use, read from a file given with ``--command-config`` (the
option Kafka's own tools take) and from ``DIRECTLOG_CLIENT_<NAME>`` variables, the name in
capitals with underscores for dots (``DIRECTLOG_CLIENT_SASL_PASSWORD``), which win over
the file — so a Kubernetes pod can take the password from a Secret. They become
kafka-python's admin client settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

ENV_PREFIX = "DIRECTLOG_CLIENT_"
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# Kafka client property -> kafka-python's KafkaAdminClient setting
_SETTINGS = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl.endpoint.identification.algorithm": "ssl_check_hostname",
}
BOOTSTRAP = "bootstrap.servers"  # taken from the file when --bootstrap-server is not given


class ClientConfigError(ValueError):
    """A property file or variable the CLI cannot use; the message says which and why."""


def parse_properties(text: str, source: str) -> dict[str, str]:
    """``key=value`` lines (Java properties as Kafka's tools write them: ``#`` and ``!``
    comments, ``:`` as a separator too, blanks around keys and values ignored)."""
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        cut = min((i for i in (stripped.find("="), stripped.find(":")) if i > 0), default=-1)
        if cut < 0:
            raise ClientConfigError(f"{source}:{number}: expected key=value, got {stripped!r}")
        found[stripped[:cut].strip()] = stripped[cut + 1 :].strip()
    return found


def read_client_config(
    path: str | None, environ: Mapping[str, str]
) -> tuple[dict[str, Any], str | None]:
    """kafka-python settings from the file at `path` (if any) and the environment, and the
    file's bootstrap.servers (None without one)."""
    properties: dict[str, str] = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as error:
            raise ClientConfigError(f"cannot read {path}: {error.strerror}") from None
        except UnicodeDecodeError:
            raise ClientConfigError(f"{path} is not UTF-8 text") from None
        properties = parse_properties(text, path)
    for name, value in environ.items():
        if name.startswith(ENV_PREFIX) and value:
            properties[name[len(ENV_PREFIX) :].lower().replace("_", ".")] = value
    bootstrap = properties.pop(BOOTSTRAP, None)
    unknown = sorted(set(properties) - set(_SETTINGS))
    if unknown:
        raise ClientConfigError(
            f"unknown client properties {', '.join(unknown)}; known: "
            + ", ".join([BOOTSTRAP, *_SETTINGS])
        )
    return {_SETTINGS[key]: _value(key, value) for key, value in properties.items()}, bootstrap


def _value(key: str, value: str) -> Any:
    if key == "security.protocol":
        value = value.upper()
        if value not in PROTOCOLS:
            raise ClientConfigError(f"security.protocol {value!r} is not one of {PROTOCOLS}")
    elif key == "sasl.mechanism":
        value = value.upper()
        if value not in MECHANISMS:
            raise ClientConfigError(f"sasl.mechanism {value!r} is not one of {MECHANISMS}")
    elif key == "ssl.endpoint.identification.algorithm":
        if value.lower() not in ("https", "none", ""):
            raise ClientConfigError(f"{key} is https or none, not {value!r}")
        return value.lower() == "https"
    return value
