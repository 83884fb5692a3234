"""The client quota model: which configured quota a connection falls under (Kafka's eight
levels), which entities a DescribeClientQuotas filter selects, and what AlterClientQuotas
refuses, with the error codes Kafka answers."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from directlog.protocol.errors import ErrorCode
from directlog.security.client_quotas import (
    ANONYMOUS,
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    USER,
    InvalidQuotaError,
    MatchType,
    QuotaEntity,
    describe,
    resolve,
    validate_alteration,
)


def entity(user: str | bool | None = False, client: str | bool | None = False) -> QuotaEntity:
    """An entity from keyword names; False leaves the type out, None is its default."""
    pairs: list[tuple[str, str | None]] = []
    if user is not False:
        assert not isinstance(user, bool)
        pairs.append((USER, user))
    if client is not False:
        assert not isinstance(client, bool)
        pairs.append((CLIENT_ID, client))
    return QuotaEntity(tuple(pairs))


# Kafka's precedence, most specific first, with the group each level's quota is shared by
# for a connection of user alice with client id app.
LEVELS = [
    (entity("alice", "app"), entity("alice", "app")),
    (entity("alice", None), entity("alice", "app")),
    (entity("alice"), entity("alice")),
    (entity(None, "app"), entity("alice", "app")),
    (entity(None, None), entity("alice", "app")),
    (entity(None), entity("alice")),
    (entity(client="app"), entity(client="app")),
    (entity(client=None), entity(client="app")),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("level", range(len(LEVELS)))
def test_each_level_shadows_every_level_below_it(level: int) -> None:
    quotas = {
        configured: {PRODUCER_BYTE_RATE: 1000.0 * (i + 1)}
        for i, (configured, _) in enumerate(LEVELS)
        if i >= level
    }
    assert resolve(quotas, "alice", "app", PRODUCER_BYTE_RATE) == (
        1000.0 * (level + 1),
        LEVELS[level][1],
    )


@pytest.mark.timeout(10)
def test_levels_are_resolved_per_key() -> None:
    quotas = {
        entity("alice", "app"): {CONSUMER_BYTE_RATE: 5.0},
        entity(client=None): {PRODUCER_BYTE_RATE: 7.0},
    }
    assert resolve(quotas, "alice", "app", PRODUCER_BYTE_RATE) == (7.0, entity(client="app"))
    assert resolve(quotas, "alice", "app", CONSUMER_BYTE_RATE) == (5.0, entity("alice", "app"))
    assert resolve(quotas, "alice", "app", REQUEST_PERCENTAGE) is None


@pytest.mark.timeout(10)
def test_defaults_apply_to_each_user_and_user_quotas_to_all_their_client_ids() -> None:
    quotas = {entity(None): {PRODUCER_BYTE_RATE: 100.0}, entity("carol"): {PRODUCER_BYTE_RATE: 9.0}}
    assert resolve(quotas, "alice", "a", PRODUCER_BYTE_RATE) == (100.0, entity("alice"))
    assert resolve(quotas, "bob", "a", PRODUCER_BYTE_RATE) == (100.0, entity("bob"))
    assert resolve(quotas, "carol", "a", PRODUCER_BYTE_RATE) == (9.0, entity("carol"))
    assert resolve(quotas, "carol", "b", PRODUCER_BYTE_RATE) == (9.0, entity("carol"))
    # an empty client id only ever matches a default (no quota can name it)
    quotas = {entity(client=None): {REQUEST_PERCENTAGE: 20.0}}
    assert resolve(quotas, ANONYMOUS, "", REQUEST_PERCENTAGE) == (20.0, entity(client=""))


@pytest.mark.timeout(10)
def test_entities_are_sorted_values() -> None:
    a = QuotaEntity(((CLIENT_ID, "app"), (USER, "alice")))
    b = QuotaEntity(((USER, "alice"), (CLIENT_ID, "app")))
    assert a == b and hash(a) == hash(b)
    assert a.components == (("client-id", "app"), ("user", "alice"))
    assert str(entity("alice", None)) == "client-id=<default>, user='alice'"


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("components", "message"),
    [
        ((), "Invalid empty client quota entity"),
        (((USER, "a"), (USER, "b")), "duplicate entity entry user"),
        ((("ip", "10.0.0.1"),), r"'ip' \(connection_creation_rate\) is not supported"),
        ((("group", "g"),), "Unhandled client quota entity type: 'group'"),
    ],
)
def test_bad_entities_are_invalid_requests(
    components: tuple[tuple[str, str | None], ...], message: str
) -> None:
    with pytest.raises(InvalidQuotaError, match=message) as raised:
        QuotaEntity(components)
    assert raised.value.code == ErrorCode.INVALID_REQUEST


STORED: dict[QuotaEntity, dict[str, float]] = {
    entity("alice"): {PRODUCER_BYTE_RATE: 1.0},
    entity(None): {PRODUCER_BYTE_RATE: 2.0},
    entity(client="c1"): {CONSUMER_BYTE_RATE: 3.0},
    entity(client=None): {CONSUMER_BYTE_RATE: 4.0},
    entity("alice", "c1"): {REQUEST_PERCENTAGE: 5.0},
    entity("alice", None): {REQUEST_PERCENTAGE: 6.0},
    entity(None, None): {REQUEST_PERCENTAGE: 7.0},
    entity("bob", "c2"): {REQUEST_PERCENTAGE: 8.0},
}
EXACT, DEFAULT, SPECIFIED = MatchType.EXACT, MatchType.DEFAULT, MatchType.SPECIFIED


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("components", "strict", "expected"),
    [
        ([(USER, EXACT, "alice")], True, [entity("alice")]),
        (
            [(USER, EXACT, "alice")],
            False,
            [entity("alice"), entity("alice", "c1"), entity("alice", None)],
        ),
        ([(USER, DEFAULT, None)], True, [entity(None)]),
        ([(USER, DEFAULT, None)], False, [entity(None), entity(None, None)]),
        ([(USER, SPECIFIED, None)], True, [entity("alice"), entity(None)]),
        (
            [(USER, SPECIFIED, None), (CLIENT_ID, SPECIFIED, None)],
            True,
            [entity("alice", "c1"), entity("alice", None), entity(None, None), entity("bob", "c2")],
        ),
        ([(USER, EXACT, "alice"), (CLIENT_ID, DEFAULT, None)], True, [entity("alice", None)]),
        ([(USER, DEFAULT, None), (CLIENT_ID, EXACT, "c1")], False, []),
        ([(CLIENT_ID, EXACT, "c1")], False, [entity(client="c1"), entity("alice", "c1")]),
        ([(CLIENT_ID, EXACT, "nobody")], False, []),
        ([], False, list(STORED)),
        ([], True, []),
    ],
)
def test_describe_filters(
    components: list[tuple[str, int, str | None]], strict: bool, expected: list[QuotaEntity]
) -> None:
    assert describe(STORED, components, strict) == {e: STORED[e] for e in expected}


@pytest.mark.timeout(10)
def test_describe_answers_copies() -> None:
    found = describe(STORED, [(USER, EXACT, "alice")], True)
    found[entity("alice")][PRODUCER_BYTE_RATE] = 99.0
    assert STORED[entity("alice")] == {PRODUCER_BYTE_RATE: 1.0}


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("components", "code", "message"),
    [
        ([("", EXACT, "x")], ErrorCode.INVALID_REQUEST, "Invalid empty entity type"),
        (
            [(USER, EXACT, "a"), (USER, DEFAULT, None)],
            ErrorCode.INVALID_REQUEST,
            "Entity type user cannot appear more than once",
        ),
        ([("ip", DEFAULT, None)], ErrorCode.UNSUPPORTED_VERSION, "'ip' .* not supported"),
        ([("group", EXACT, "g")], ErrorCode.UNSUPPORTED_VERSION, "Unsupported entity type group"),
        ([(USER, EXACT, None)], ErrorCode.INVALID_REQUEST, "MATCH_TYPE_EXACT, but set match"),
        ([(USER, DEFAULT, "a")], ErrorCode.INVALID_REQUEST, "MATCH_TYPE_DEFAULT, but also"),
        ([(CLIENT_ID, SPECIFIED, "a")], ErrorCode.INVALID_REQUEST, "MATCH_TYPE_SPECIFIED, but"),
        ([(USER, 3, None)], ErrorCode.INVALID_REQUEST, "Unknown match type 3"),
    ],
)
def test_describe_refuses_bad_filters(
    components: list[tuple[str, int, str | None]], code: ErrorCode, message: str
) -> None:
    with pytest.raises(InvalidQuotaError, match=message) as raised:
        describe(STORED, components, False)
    assert raised.value.code == code


@pytest.mark.timeout(10)
def test_alterations_come_back_by_key() -> None:
    changes = validate_alteration(
        entity("alice", None),
        [
            (PRODUCER_BYTE_RATE, 1024.0),
            (CONSUMER_BYTE_RATE, 2048.0000001),  # within Kafka's 1e-6 of a whole number
            (REQUEST_PERCENTAGE, 12.5),  # a percentage may be fractional
            (CONTROLLER_MUTATION_RATE, None),  # removals are not checked against the keys
            ("no_such_key", None),
        ],
    )
    assert changes == {
        PRODUCER_BYTE_RATE: 1024.0,
        CONSUMER_BYTE_RATE: 2048.0,
        REQUEST_PERCENTAGE: 12.5,
        CONTROLLER_MUTATION_RATE: None,
        "no_such_key": None,
    }


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("target", "ops", "message"),
    [
        (entity(""), [(PRODUCER_BYTE_RATE, 1.0)], "Empty user not supported"),
        (entity("a", ""), [(PRODUCER_BYTE_RATE, 1.0)], "Empty client-id not supported"),
        (
            entity("a"),
            [(PRODUCER_BYTE_RATE, 1.0), (PRODUCER_BYTE_RATE, None)],
            "Duplicate quota key producer_byte_rate",
        ),
        (entity("a"), [("no_such_key", 1.0)], "Invalid configuration key no_such_key"),
        (entity("a"), [(CONTROLLER_MUTATION_RATE, 10.0)], "controller_mutation_rate is not supp"),
        (entity("a"), [("connection_creation_rate", 10.0)], "connection_creation_rate is not"),
        (entity("a"), [(PRODUCER_BYTE_RATE, 0.0)], "must be greater than 0"),
        (entity("a"), [(REQUEST_PERCENTAGE, -5.0)], "must be greater than 0"),
        (entity("a"), [(REQUEST_PERCENTAGE, math.nan)], "must be a finite number"),
        (entity("a"), [(CONSUMER_BYTE_RATE, math.inf)], "must be a finite number"),
        (entity("a"), [(CONSUMER_BYTE_RATE, 1000.5)], "cannot be a fractional value"),
        (entity("a"), [(PRODUCER_BYTE_RATE, 1e19)], "too large for a LONG"),
    ],
)
def test_bad_alterations_are_invalid_requests(
    target: QuotaEntity, ops: list[tuple[str, float | None]], message: str
) -> None:
    with pytest.raises(InvalidQuotaError, match=message) as raised:
        validate_alteration(target, ops)
    assert raised.value.code == ErrorCode.INVALID_REQUEST


def reference_resolve(
    quotas: Mapping[QuotaEntity, Mapping[str, float]], user: str, client_id: str, key: str
) -> tuple[float, QuotaEntity] | None:
    """Kafka's documented order spelled out as paths, the way kafka-configs.sh stores them."""
    by_path = {}
    for stored, values in quotas.items():
        names = dict(stored.components)
        parts = []
        if USER in names:
            parts.append(f"users/{'<default>' if names[USER] is None else names[USER]}")
        if CLIENT_ID in names:
            parts.append(f"clients/{'<default>' if names[CLIENT_ID] is None else names[CLIENT_ID]}")
        by_path["/".join(parts)] = values
    order: list[tuple[str, tuple[str | bool, str | bool]]] = [
        (f"users/{user}/clients/{client_id}", (user, client_id)),
        (f"users/{user}/clients/<default>", (user, client_id)),
        (f"users/{user}", (user, False)),
        (f"users/<default>/clients/{client_id}", (user, client_id)),
        ("users/<default>/clients/<default>", (user, client_id)),
        ("users/<default>", (user, False)),
        (f"clients/{client_id}", (False, client_id)),
        ("clients/<default>", (False, client_id)),
    ]
    for path, (group_user, group_client) in order:
        values = by_path.get(path, {})
        if key in values:
            return values[key], entity(group_user, group_client)
    return None


NAMES = st.sampled_from(["alice", "bob", "c1", "c2"])
STORED_NAME = st.one_of(st.none(), NAMES)
ENTITIES = st.one_of(
    st.builds(lambda u: entity(u), STORED_NAME),
    st.builds(lambda c: entity(client=c), STORED_NAME),
    st.builds(lambda u, c: entity(u, c), STORED_NAME, STORED_NAME),
)
KEYS = st.sampled_from(sorted([PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE]))
QUOTAS = st.dictionaries(
    ENTITIES, st.dictionaries(KEYS, st.floats(1, 1e9), min_size=1), max_size=12
)


@pytest.mark.timeout(60)
@given(quotas=QUOTAS, user=NAMES, client_id=st.one_of(NAMES, st.just("")), key=KEYS)
def test_resolve_matches_the_documented_order(
    quotas: dict[QuotaEntity, dict[str, float]], user: str, client_id: str, key: str
) -> None:
    assert resolve(quotas, user, client_id, key) == reference_resolve(quotas, user, client_id, key)
