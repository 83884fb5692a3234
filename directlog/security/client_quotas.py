"""Client quotas as Kafka models them (KIP-13, KIP-55, KIP-124, KIP-546): who a quota applies
to, which quota keys exist, how AlterClientQuotas is validated, how a DescribeClientQuotas
filter selects entities, and which configured quota a connection falls under.

The controller stores the quotas and answers the admin APIs with this module; the broker's
quota manager (``services.broker.quotas``) resolves and enforces them with it, so both read
one set of rules.

An entity names a user, a client id, or both; a name of ``None`` is the default entity of
that type (``<default>`` in kafka-configs.sh). The IP entity of KIP-612
(``connection_creation_rate``) is not supported and is refused with the codes Kafka brokers
gave before they supported it: INVALID_REQUEST from AlterClientQuotas, UNSUPPORTED_VERSION
from DescribeClientQuotas.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

from directlog.protocol.errors import ErrorCode, KafkaError

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"  # Kafka's connection-rate entity; refused here
ENTITY_TYPES = (USER, CLIENT_ID)

ANONYMOUS = "ANONYMOUS"  # the user name of an unauthenticated connection (User:ANONYMOUS)

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
QUOTA_KEYS = frozenset({PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE})

CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
"""KIP-599's quota on the partitions a client creates or deletes per second through
CreateTopics, CreatePartitions and DeleteTopics. Refused rather than accepted and ignored:
nothing here throttles topic mutations, and a stored quota that limits nothing would tell an
operator their cluster is protected when it is not."""

_UNSUPPORTED_KEYS = {
    CONTROLLER_MUTATION_RATE: "Directlog does not throttle topic mutations (KIP-599)",
    "connection_creation_rate": "the ip entity and its connection rate are not supported",
}
_BYTE_RATE_KEYS = frozenset({PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE})  # LONG in Kafka
_LONG_MAX = 2**63 - 1
_FRACTION_TOLERANCE = 1e-6  # how far from a whole number Kafka lets a byte rate be


class InvalidQuotaError(KafkaError):
    """A client quota request Kafka would refuse, with the error code Kafka answers it with
    (INVALID_REQUEST, or UNSUPPORTED_VERSION for an entity type a describe filter cannot
    name)."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INVALID_REQUEST) -> None:
        super().__init__(code, message)


class MatchType(IntEnum):
    """How a DescribeClientQuotas filter component matches names of its entity type."""

    EXACT = 0  # this name
    DEFAULT = 1  # the default entity
    SPECIFIED = 2  # any name, the default included (what Kafka's brokers match)


def _type_key(component: tuple[str, str | None]) -> str:
    return component[0]


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """A set of (entity type, name) pairs, at most one per type, kept sorted by type so equal
    entities compare and hash equal. A name of None is the type's default entity.

    Names are not checked here: a connection with an empty client id still forms a group to
    meter; AlterClientQuotas refuses empty names (``validate_alteration``)."""

    components: tuple[tuple[str, str | None], ...]

    def __post_init__(self) -> None:
        if not self.components:
            raise InvalidQuotaError("Invalid empty client quota entity")
        seen: set[str] = set()
        for entity_type, _ in self.components:
            if entity_type == IP:
                raise InvalidQuotaError(
                    "Quota entity type 'ip' (connection_creation_rate) is not supported"
                )
            if entity_type not in ENTITY_TYPES:
                raise InvalidQuotaError(f"Unhandled client quota entity type: {entity_type!r}")
            if entity_type in seen:
                raise InvalidQuotaError(
                    f"Invalid client quota entity, duplicate entity entry {entity_type}"
                )
            seen.add(entity_type)
        object.__setattr__(self, "components", tuple(sorted(self.components, key=_type_key)))

    def __str__(self) -> str:
        return ", ".join(
            f"{entity_type}={'<default>' if name is None else repr(name)}"
            for entity_type, name in self.components
        )


def validate_alteration(
    entity: QuotaEntity, ops: Sequence[tuple[str, float | None]]
) -> dict[str, float | None]:
    """Check one entry of an AlterClientQuotas request as Kafka's controller does and return
    its changes by key (None: remove the key; removing a key that is not set does nothing,
    so removals are not checked against the known keys, as in Kafka). Byte rates come back
    as whole numbers. Raises InvalidQuotaError (INVALID_REQUEST) for an empty entity name, a
    key given twice, an unknown or unsupported key, a value that is not a finite number
    above 0, or a fractional or out-of-range byte rate."""
    for entity_type, name in entity.components:
        if name == "":
            raise InvalidQuotaError(f"Empty {entity_type} not supported")
    changes: dict[str, float | None] = {}
    for key, value in ops:
        if key in changes:
            raise InvalidQuotaError(
                f"Duplicate quota key {key} not updating quota for this entity {entity}"
            )
        changes[key] = None if value is None else _checked_value(key, value)
    return changes


def _checked_value(key: str, value: float) -> float:
    if key in _UNSUPPORTED_KEYS:
        raise InvalidQuotaError(f"Quota {key} is not supported: {_UNSUPPORTED_KEYS[key]}")
    if key not in QUOTA_KEYS:
        raise InvalidQuotaError(f"Invalid configuration key {key}")
    if not math.isfinite(value):
        raise InvalidQuotaError(f"Quota {key} must be a finite number, not {value}")
    if value <= 0.0:
        raise InvalidQuotaError(f"Quota {key} must be greater than 0")
    if key in _BYTE_RATE_KEYS:
        if value > _LONG_MAX:
            raise InvalidQuotaError(f"Proposed value for {key} is too large for a LONG.")
        if value % 1.0 > _FRACTION_TOLERANCE:
            raise InvalidQuotaError(f"{key} cannot be a fractional value.")
        return float(math.floor(value))
    return value


def describe(
    quotas: Mapping[QuotaEntity, Mapping[str, float]],
    components: Sequence[tuple[str, int, str | None]],
    strict: bool,
) -> dict[QuotaEntity, dict[str, float]]:
    """The entities a DescribeClientQuotas filter selects, with their quotas.

    Each component is (entity type, match type, match): EXACT selects entities naming
    ``match`` for that type, DEFAULT those with the type's default entity, SPECIFIED those
    having the type at all. An entity must satisfy every component; with ``strict`` it may
    also have no other types (so an empty strict filter selects nothing, an empty loose one
    everything). A filter is refused whole, as Kafka refuses it: INVALID_REQUEST for an
    empty or repeated entity type, a match string that contradicts the match type, or an
    unknown match type; UNSUPPORTED_VERSION for an entity type other than user and
    client-id."""
    wanted: dict[str, tuple[MatchType, str | None]] = {}
    for entity_type, match_type, match in components:
        if entity_type == "":
            raise InvalidQuotaError("Invalid empty entity type.")
        if entity_type in wanted:
            raise InvalidQuotaError(
                f"Entity type {entity_type} cannot appear more than once in the filter."
            )
        if entity_type == IP:
            raise InvalidQuotaError(
                "Quota entity type 'ip' (connection_creation_rate) is not supported",
                ErrorCode.UNSUPPORTED_VERSION,
            )
        if entity_type not in ENTITY_TYPES:
            raise InvalidQuotaError(
                f"Unsupported entity type {entity_type}", ErrorCode.UNSUPPORTED_VERSION
            )
        wanted[entity_type] = (_match_type(match_type, match), match)
    selected: dict[QuotaEntity, dict[str, float]] = {}
    for entity, values in quotas.items():
        if strict and len(entity.components) != len(wanted):
            continue
        names = dict(entity.components)
        if all(_matches(names, entity_type, *rule) for entity_type, rule in wanted.items()):
            selected[entity] = dict(values)
    return selected


def _match_type(match_type: int, match: str | None) -> MatchType:
    try:
        kind = MatchType(match_type)
    except ValueError:
        raise InvalidQuotaError(f"Unknown match type {match_type}") from None
    if kind is MatchType.EXACT and match is None:
        raise InvalidQuotaError("Request specified MATCH_TYPE_EXACT, but set match string to null.")
    if kind is not MatchType.EXACT and match is not None:
        raise InvalidQuotaError(
            f"Request specified MATCH_TYPE_{kind.name}, but also specified a match string."
        )
    return kind


def _matches(
    names: Mapping[str, str | None], entity_type: str, kind: MatchType, match: str | None
) -> bool:
    if entity_type not in names:
        return False
    return kind is MatchType.SPECIFIED or names[entity_type] == match


def resolve(
    quotas: Mapping[QuotaEntity, Mapping[str, float]], user: str, client_id: str, key: str
) -> tuple[float, QuotaEntity] | None:
    """The ``key`` quota for a connection of user ``user`` (the principal's name, ANONYMOUS
    when unauthenticated) sending ``client_id``, and the group of connections that share it;
    None when no quota applies.

    The most specific configured entity wins, in Kafka's order: (user, client-id),
    (user, default client-id), user, (default user, client-id), (default user, default
    client-id), default user, client-id, default client-id. The group replaces defaults by
    this connection's names and keeps the matched entity's types: a user quota (or the
    default user quota) is shared by all that user's client ids, while each user gets the
    default user quota for themselves; a client-id quota is shared by that client id across
    users."""
    both = QuotaEntity(((USER, user), (CLIENT_ID, client_id)))
    by_user = QuotaEntity(((USER, user),))
    by_client = QuotaEntity(((CLIENT_ID, client_id),))
    for entity, group in (
        (both, both),
        (QuotaEntity(((USER, user), (CLIENT_ID, None))), both),
        (by_user, by_user),
        (QuotaEntity(((USER, None), (CLIENT_ID, client_id))), both),
        (QuotaEntity(((USER, None), (CLIENT_ID, None))), both),
        (QuotaEntity(((USER, None),)), by_user),
        (by_client, by_client),
        (QuotaEntity(((CLIENT_ID, None),)), by_client),
    ):
        values = quotas.get(entity)
        if values is not None and key in values:
            return values[key], group
    return None
