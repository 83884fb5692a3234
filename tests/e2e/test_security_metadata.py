"""The security metadata through real controllers and a real consensus ensemble, with this
test playing the brokers over gRPC: AlterUserScramCredentials, CreateAcls, DeleteAcls and
AlterClientQuotas answered as Kafka answers them, streamed to a watching broker only when
they change, written one znode per user, resource pattern and quota entity (read here with
kazoo), and loaded back by the next controller: 10,000 ACLs across a SIGKILLed active
controller's failover, and everything across a restart.

Every wait is bounded; nothing asserts on durations.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from directlog.protocol.errors import ErrorCode
from directlog.rpc import controller_pb2 as pb
from directlog.security.scram import ScramCredential, ScramMechanism
from tests.e2e.controller import ControllerProcess
from tests.e2e.ensemble import Ensemble
from tests.e2e.test_controller import WAIT, Brokers, Heartbeats, Watch, full_image, wait_active

pytestmark = pytest.mark.timeout(180)

StartController = Callable[[int], ControllerProcess]


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ensemble]:
    with Ensemble(tmp_path_factory.mktemp("ensemble"), size=1) as ens:
        ens.start()
        ens.wait_serving()
        yield ens


@pytest.fixture
def root(request: pytest.FixtureRequest) -> str:
    return "/" + re.sub(r"[^a-zA-Z0-9_-]+", "-", request.node.name).strip("-")


@pytest.fixture
def start_controller(ensemble: Ensemble, tmp_path: Path, root: str) -> Iterator[StartController]:
    """Starts controllers on this test's root; at teardown each must stop cleanly on
    SIGTERM unless the test SIGKILLed it."""
    started: list[ControllerProcess] = []

    def start(controller_id: int) -> ControllerProcess:
        process = ControllerProcess(
            tmp_path,
            ensemble.hosts,
            controller_id=controller_id,
            settings={"root": root, "broker_session_timeout_ms": 3000},
        )
        started.append(process.start())
        return process

    yield start
    for process in started:
        process.stop()
    for process in started:
        unclean = [c for c in process.exit_codes if c not in (0, -signal.SIGKILL)]
        assert not unclean and not process.killed, (
            f"controller {process.controller_id} did not stop cleanly: {process.exit_codes}\n"
            f"{process.stderr_tail()}"
        )


@pytest.fixture
def zk(ensemble: Ensemble) -> Iterator[KazooClient]:
    client = KazooClient(hosts=ensemble.hosts)
    client.start(timeout=WAIT)
    yield client
    client.stop()
    client.close()


def scram(user: str, mechanism: int, password: str = "secret", **fields: int) -> pb.ScramCredential:
    made = ScramCredential.from_password(
        ScramMechanism(mechanism) if mechanism in (1, 2) else ScramMechanism.SCRAM_SHA_256,
        password,
        salt=b"salt-of-" + user.encode(),
    )
    message = pb.ScramCredential(
        user=user,
        mechanism=mechanism,
        salt=made.salt,
        stored_key=made.stored_key,
        server_key=made.server_key,
        iterations=made.iterations,
    )
    for name, value in fields.items():
        setattr(message, name, value)
    return message


def binding(
    name: str,
    principal: str = "User:alice",
    operation: int = 3,  # READ
    *,
    kind: int = 2,  # TOPIC
    pattern: int = 3,  # LITERAL
    permission: int = 3,  # ALLOW
) -> pb.AclBinding:
    return pb.AclBinding(
        resource_type=kind,
        resource_name=name,
        pattern_type=pattern,
        principal=principal,
        host="*",
        operation=operation,
        permission=permission,
    )


def acl_filter(**fields: int | str) -> pb.AclBindingFilter:
    """Matches everything but what ``fields`` narrow down."""
    message = pb.AclBindingFilter(resource_type=1, pattern_type=1, operation=1, permission=1)
    for name, value in fields.items():
        setattr(message, name, value)
    return message


def alteration(entity: list[tuple[str, str | None]], **ops: float | None) -> pb.QuotaAlteration:
    return pb.QuotaAlteration(
        entity=[pb.QuotaEntityComponent(entity_type=t, name=n) for t, n in entity],
        ops=[pb.QuotaOp(key=k, value=v) for k, v in ops.items()],
    )


def scram_of(image: pb.MetadataUpdate) -> dict[tuple[str, int], tuple[bytes, bytes, int]]:
    return {
        (c.user, c.mechanism): (c.stored_key, c.server_key, c.iterations)
        for c in image.scram_credentials
    }


def acls_of(image: pb.MetadataUpdate) -> set[tuple[int, str, int, str, str, int, int]]:
    return {
        (
            b.resource_type, b.resource_name, b.pattern_type, b.principal, b.host, b.operation,
            b.permission,
        )
        for b in image.acls
    }  # fmt: skip


def quotas_of(
    image: pb.MetadataUpdate,
) -> dict[tuple[tuple[str, str | None], ...], dict[str, float]]:
    return {
        tuple((c.entity_type, c.name if c.HasField("name") else None) for c in q.entity): dict(
            q.values
        )
        for q in image.client_quotas
    }


def codes(results: list[pb.UserResult]) -> dict[str, int]:
    return {r.user: r.error_code for r in results}


def test_each_security_rpc_answers_as_kafka_does_and_streams_what_changed(
    start_controller: StartController, zk: KazooClient, root: str
) -> None:
    brokers = Brokers(start_controller(1))
    epoch = brokers.register(1).broker_epoch
    heartbeats = Heartbeats(brokers, {1: epoch})
    watch = Watch(brokers.stub(brokers.active), 1, epoch)
    try:
        image = watch.next()
        assert image.full and image.has_scram_credentials and image.has_acls
        assert image.has_client_quotas
        assert (list(image.scram_credentials), list(image.acls), list(image.client_quotas)) == (
            [],
            [],
            [],
        )

        # SCRAM: every refusal code, and the users that pass are changed.
        reply = brokers.call(
            "AlterUserScramCredentials",
            pb.AlterUserScramCredentialsRequest(
                upsertions=[
                    scram("alice", 1),
                    scram("alice", 1),  # one user and mechanism twice
                    scram("bob", 2),
                    scram("", 1),
                    scram("carol", 7),
                    scram("dave", 1, iterations=100),
                    scram("erin", 1, iterations=20000),
                ],
                deletions=[pb.ScramDeletion(user="frank", mechanism=1)],
            ),
        )
        assert codes(list(reply.results)) == {
            "frank": ErrorCode.RESOURCE_NOT_FOUND,
            "alice": ErrorCode.DUPLICATE_RESOURCE,
            "bob": 0,
            "": ErrorCode.UNACCEPTABLE_CREDENTIAL,
            "carol": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
            "dave": ErrorCode.UNACCEPTABLE_CREDENTIAL,
            "erin": ErrorCode.UNACCEPTABLE_CREDENTIAL,
        }
        assert {r.user: r.error_message for r in reply.results}["dave"] == "Too few iterations"
        delta = watch.until(lambda u: u.has_scram_credentials)
        assert not delta.full and not delta.has_acls and not delta.has_client_quotas
        bob = scram("bob", 2)
        assert scram_of(delta) == {("bob", 2): (bob.stored_key, bob.server_key, 4096)}
        assert zk.get_children(f"{root}/scram") == ["bob"]
        assert b"secret" not in zk.get(f"{root}/scram/bob")[0]

        # ACLs: a refused binding among good ones, then the same bindings again.
        good = [
            binding("orders"),
            binding("orders-", "User:bob", 4, pattern=4),  # WRITE on the prefix
            binding("app", kind=3),  # a GROUP
            binding("kafka-cluster", "User:ops", 8, kind=4),  # DESCRIBE the CLUSTER
        ]
        refused = binding("orders", principal="alice")  # not Type:name
        reply = brokers.call("CreateAcls", pb.CreateAclsRequest(creations=[*good, refused]))
        assert [r.error_code for r in reply.results] == [0, 0, 0, 0, ErrorCode.INVALID_REQUEST]
        assert "alice" in reply.results[4].error_message
        delta = watch.until(lambda u: u.has_acls)
        assert acls_of(delta) == acls_of(pb.MetadataUpdate(acls=good))
        assert sorted(zk.get_children(f"{root}/acls/TOPIC")) == ["LITERAL", "PREFIXED"]
        assert zk.get_children(f"{root}/acls/TOPIC/PREFIXED") == ["orders-"]
        again = brokers.call("CreateAcls", pb.CreateAclsRequest(creations=good))
        assert [r.error_code for r in again.results] == [0, 0, 0, 0]  # idempotent

        # An unrelated change (a topic) sends none of the security metadata.
        assert brokers.create_topic("unrelated", 1, 1).error_code == 0
        delta = watch.until(lambda u: bool(u.topics))
        assert not (delta.has_scram_credentials or delta.has_acls or delta.has_client_quotas)
        assert not (delta.scram_credentials or delta.acls or delta.client_quotas)

        # DeleteAcls: MATCH, PREFIXED, LITERAL and ANY filters, each listing what it deleted;
        # a filter with an UNKNOWN operation is refused.
        reply = brokers.call(
            "DeleteAcls",
            pb.DeleteAclsRequest(
                filters=[
                    acl_filter(resource_type=2, pattern_type=2, resource_name="orders-eu"),
                    acl_filter(pattern_type=4, resource_name="nothing-"),
                    acl_filter(pattern_type=3, principal="User:ops"),
                    acl_filter(operation=0),
                ]
            ),
        )
        assert [r.error_code for r in reply.results] == [0, 0, 0, ErrorCode.INVALID_REQUEST]
        assert [acls_of(pb.MetadataUpdate(acls=r.deleted)) for r in reply.results] == [
            acls_of(pb.MetadataUpdate(acls=[good[1]])),
            set(),
            acls_of(pb.MetadataUpdate(acls=[good[3]])),
            set(),
        ]
        delta = watch.until(lambda u: u.has_acls)
        assert acls_of(delta) == acls_of(pb.MetadataUpdate(acls=good[:1] + good[2:3]))
        assert zk.get_children(f"{root}/acls/TOPIC/PREFIXED") == []
        reply = brokers.call("DeleteAcls", pb.DeleteAclsRequest(filters=[acl_filter()]))
        assert len(reply.results[0].deleted) == 2
        emptied = watch.until(lambda u: u.has_acls)
        assert list(emptied.acls) == []  # emptied, not unchanged

        # Client quotas: validate_only checks and changes nothing; refusals per alteration.
        alterations = [
            alteration([("user", "alice")], producer_byte_rate=1048576.0),
            alteration([("user", None), ("client-id", "app")], request_percentage=25.0),
            alteration([("user", "bob")], producer_byte_rate=1.5),
            alteration([("ip", "10.0.0.1")], connection_creation_rate=10.0),
        ]
        for validate_only in (True, False):
            reply = brokers.call(
                "AlterClientQuotas",
                pb.AlterClientQuotasRequest(alterations=alterations, validate_only=validate_only),
            )
            assert [r.error_code for r in reply.results] == [
                0,
                0,
                ErrorCode.INVALID_REQUEST,
                ErrorCode.INVALID_REQUEST,
            ]
            assert "fractional" in reply.results[2].error_message
            if validate_only:
                assert not zk.exists(f"{root}/client_quotas")
                assert not full_image(brokers, 1, epoch).client_quotas
        delta = watch.until(lambda u: u.has_client_quotas)
        expected = {
            (("user", "alice"),): {"producer_byte_rate": 1048576.0},
            (("client-id", "app"), ("user", None)): {"request_percentage": 25.0},
        }
        assert quotas_of(delta) == expected
        assert sorted(zk.get_children(f"{root}/client_quotas")) == [
            "client-id=app,user=<default>",
            "user=alice",
        ]
        reply = brokers.call(
            "AlterClientQuotas",
            pb.AlterClientQuotasRequest(
                alterations=[alteration([("user", "alice")], producer_byte_rate=None)]
            ),
        )
        assert [r.error_code for r in reply.results] == [0]
        del expected[(("user", "alice"),)]
        assert quotas_of(watch.until(lambda u: u.has_client_quotas)) == expected

        image = full_image(brokers, 1, epoch)
        assert set(scram_of(image)) == {("bob", 2)} and not image.acls
        assert quotas_of(image) == expected
    finally:
        watch.close()
        heartbeats.stop()
        brokers.close()


def test_ten_thousand_acls_and_the_rest_survive_a_failover_and_a_restart(
    start_controller: StartController, zk: KazooClient, root: str
) -> None:
    first, second = start_controller(1), start_controller(2)
    active = wait_active(first, second)
    standby = second if active is first else first
    brokers = Brokers(active, standby)
    epoch = brokers.register(1).broker_epoch
    heartbeats = Heartbeats(brokers, {1: epoch})
    try:
        # 10,000 ACLs in four requests: 1,875 topics with four each, a prefix shared by
        # 1,000 principals, 1,000 principals on the cluster resource, 500 groups.
        requests = [
            [
                binding(f"topic-{t:04d}", f"User:app-{t % 13}", op)
                for t in range(n, n + 625)
                for op in (3, 4, 8, 10)
            ]
            for n in range(0, 1875, 625)
        ]
        requests.append(
            [binding("shared-", f"User:team-{i}", 3, pattern=4) for i in range(1000)]
            + [binding("kafka-cluster", f"User:svc-{i}", 12, kind=4) for i in range(1000)]
            + [binding(f"group-{g}", "User:app-1", 3, kind=3) for g in range(500)]
        )
        for creations in requests:
            reply = brokers.call("CreateAcls", pb.CreateAclsRequest(creations=creations))
            assert [r.error_code for r in reply.results] == [0] * len(creations)
        created = acls_of(pb.MetadataUpdate(acls=[b for r in requests for b in r]))
        assert len(created) == 10_000
        assert len(zk.get_children(f"{root}/acls/TOPIC/LITERAL")) == 1875
        assert zk.get_children(f"{root}/acls/TOPIC/PREFIXED") == ["shared-"]
        assert zk.get_children(f"{root}/acls/CLUSTER/LITERAL") == ["kafka-cluster"]

        scram_reply = brokers.call(
            "AlterUserScramCredentials",
            pb.AlterUserScramCredentialsRequest(
                upsertions=[scram("alice", 1), scram("bob/ops", 2), scram("..", 1)]
            ),
        )
        assert codes(list(scram_reply.results)) == {"alice": 0, "bob/ops": 0, "..": 0}
        quota_reply = brokers.call(
            "AlterClientQuotas",
            pb.AlterClientQuotasRequest(
                alterations=[
                    alteration([("user", "alice")], consumer_byte_rate=2048.0),
                    alteration([("client-id", None)], request_percentage=10.0),
                ]
            ),
        )
        assert [r.error_code for r in quota_reply.results] == [0, 0]
        before = full_image(brokers, 1, epoch)
        assert acls_of(before) == created
        assert set(scram_of(before)) == {("alice", 1), ("bob/ops", 2), ("..", 1)}

        # The active controller dies; the standby loads everything from the store.
        active.kill()
        assert wait_active(standby) is standby
        assert brokers.heartbeat(1, epoch) == 0  # and the test's client follows it
        after = full_image(brokers, 1, epoch)
        assert after.controller_id == standby.controller_id
        assert acls_of(after) == created
        assert scram_of(after) == scram_of(before)
        assert (
            quotas_of(after)
            == quotas_of(before)
            == {
                (("user", "alice"),): {"consumer_byte_rate": 2048.0},
                (("client-id", None),): {"request_percentage": 10.0},
            }
        )

        # The new controller knows the containers the old one made: its first writes under
        # them (a refused transaction would end its term) go through.
        reply = brokers.call(
            "CreateAcls", pb.CreateAclsRequest(creations=[binding("after-failover")])
        )
        assert [r.error_code for r in reply.results] == [0]
        scram_reply = brokers.call(
            "AlterUserScramCredentials",
            pb.AlterUserScramCredentialsRequest(upsertions=[scram("zed", 2)]),
        )
        assert codes(list(scram_reply.results)) == {"zed": 0}
        quota_reply = brokers.call(
            "AlterClientQuotas",
            pb.AlterClientQuotasRequest(
                alterations=[alteration([("user", "zed")], producer_byte_rate=1.0)]
            ),
        )
        assert [r.error_code for r in quota_reply.results] == [0]
        assert standby.sample("directlog_controller_active") == 1

        # The new controller deletes by filter what the old one created.
        reply = brokers.call(
            "DeleteAcls",
            pb.DeleteAclsRequest(filters=[acl_filter(resource_type=4), acl_filter(pattern_type=4)]),
        )
        assert [len(r.deleted) for r in reply.results] == [1000, 1000]
        remaining = full_image(brokers, 1, epoch)
        assert len(remaining.acls) == 8001

        # Both stop; one starts again alone and has it all.
        standby.stop()
        active.start()
        assert wait_active(active) is active
        restarted = full_image(brokers, 1, brokers.register(1).broker_epoch)
        assert acls_of(restarted) == acls_of(remaining)
        assert scram_of(restarted) == scram_of(remaining)
        assert set(scram_of(restarted)) == {("alice", 1), ("bob/ops", 2), ("..", 1), ("zed", 2)}
        assert quotas_of(restarted) == quotas_of(remaining)
        assert len(quotas_of(restarted)) == 3
    finally:
        heartbeats.stop()
        brokers.close()
