"""directlog.record: a frozen, slotted dataclass with a faster __init__ must behave exactly
like dataclass(frozen=True, slots=True) in everything but speed."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest

from directlog.record import record


@record
class Vote:
    sender: int
    epoch: int
    tags: tuple[int, ...] = ()
    seen: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True)
class PlainVote:
    sender: int
    epoch: int
    tags: tuple[int, ...] = ()
    seen: list[int] = dataclasses.field(default_factory=list)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1, 2), {}),
        ((1,), {"epoch": 2, "tags": (3,)}),
        ((), {"sender": 1, "epoch": 2, "seen": [4]}),
    ],
)
def test_builds_what_a_frozen_dataclass_builds(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    ours, theirs = Vote(*args, **kwargs), PlainVote(*args, **kwargs)
    assert dataclasses.astuple(ours) == dataclasses.astuple(theirs)
    assert repr(ours) == repr(theirs).replace("PlainVote", "Vote")


def test_equality_hash_copies() -> None:
    assert Vote(1, 2) == Vote(1, 2) != Vote(1, 3)
    assert Vote(1, 2) != PlainVote(1, 2)  # equality is by type, as for any dataclass
    assert Vote(1, 2).seen is not Vote(1, 2).seen  # a fresh default each time
    assert not hasattr(Vote(1, 2), "__dict__")
    assert dataclasses.replace(Vote(1, 2), epoch=5) == Vote(1, 5)
    assert pickle.loads(pickle.dumps(Vote(1, 2, (3,)))) == Vote(1, 2, (3,))

    @record
    class Pair:
        a: int
        b: str

    assert hash(Pair(1, "x")) == hash(Pair(1, "x"))
    assert {Pair(1, "x"), Pair(1, "x"), Pair(2, "x")} == {Pair(1, "x"), Pair(2, "x")}


def test_stays_frozen_and_checks_arguments() -> None:
    vote = Vote(1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        vote.epoch = 3  # type: ignore[misc]
    with pytest.raises(TypeError, match="epoch"):
        Vote(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Vote(1, 2, (), [], 5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword"):
        Vote(1, 2, zxid=3)  # type: ignore[call-arg]


def test_runs_post_init() -> None:
    @record
    class Positive:
        n: int

        def __post_init__(self) -> None:
            if self.n <= 0:
                raise ValueError("not positive")

    assert Positive(1).n == 1
    with pytest.raises(ValueError, match="not positive"):
        Positive(0)


@pytest.mark.parametrize(
    "field",
    [
        dataclasses.field(default=0, init=False),
        dataclasses.field(default=0, kw_only=True),
    ],
    ids=["init=False", "kw_only"],
)
def test_refuses_fields_it_cannot_build(field: object) -> None:
    with pytest.raises(TypeError, match="record takes"):

        @record
        class Odd:
            a: int
            b: int = field  # type: ignore[assignment]


def test_refuses_init_var() -> None:
    with pytest.raises(TypeError, match="record takes"):

        @record
        class WithInitVar:
            a: int
            b: dataclasses.InitVar[int] = 0
