"""Kafka's ACL authorization on every API, as Kafka users meet it: ACLs created, described
and deleted with confluent-kafka's and kafka-python's admin clients, then producers,
consumers, admin clients and kcat logging in with SASL PLAIN as principals that are
allowed, denied, allowed by a prefix or a wildcard, denied despite an allow, or super
users, each getting the error code Kafka answers. A change reaches every broker at once;
the brokers' own traffic (replication over the PLAINTEXT inter-broker listener, whose
principal User:ANONYMOUS is a super user) keeps flowing. A broker without an authorizer
answers the ACL APIs with SECURITY_DISABLED and reports every operation in KIP-430's fields.

The harness itself works through the PLAINTEXT listener as User:ANONYMOUS, a super user;
every test logs in as principals of its own, so the ACLs of one test never decide another's.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
)
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from directlog.client.rdma_consume import RdmaConsumeError, RdmaConsumer
from directlog.client.rdma_produce import RdmaProduceError, RdmaProducer
from directlog.protocol import rdma_replica
from directlog.protocol.errors import ErrorCode
from directlog.protocol.rdma_replica import RdmaReplicaRequest
from directlog.records.batch import Record, build_batch
from tests.e2e.broker import BrokerProcess
from tests.e2e.cluster import Cluster, eventually, wait_for
from tests.e2e.conftest import Clients, _stop_checked
from tests.e2e.test_sasl import add_users, framed, plain

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaProducer
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePattern,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourceType as KResourceType
    from kafka.errors import (
        ClusterAuthorizationFailedError,
        InvalidRequestError,
        SecurityDisabledError,
        TopicAuthorizationFailedError,
    )
    from kafka.protocol.admin import (
        CreateAclsRequest,
        CreateAclsResponse,
        DeleteRecordsRequest,
        DeleteRecordsResponse,
        DescribeAclsRequest,
        DescribeAclsResponse,
        DescribeUserScramCredentialsRequest,
        DescribeUserScramCredentialsResponse,
        ElectLeadersRequest,
        ElectLeadersResponse,
        ListPartitionReassignmentsRequest,
        ListPartitionReassignmentsResponse,
    )
    from kafka.protocol.consumer import (
        FetchRequest,
        FetchResponse,
        ListOffsetsRequest,
        ListOffsetsResponse,
        OffsetForLeaderEpochRequest,
        OffsetForLeaderEpochResponse,
    )
    from kafka.protocol.metadata import (
        FindCoordinatorRequest,
        FindCoordinatorResponse,
        MetadataRequest,
        MetadataResponse,
    )
    from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse
    from kafka.protocol.sasl import (
        SaslAuthenticateRequest,
        SaslAuthenticateResponse,
        SaslHandshakeRequest,
        SaslHandshakeResponse,
    )

pytestmark = pytest.mark.timeout(240)

TOPIC, GROUP, BROKER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.BROKER
LITERAL, PREFIXED = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
CLUSTER_NAME = "kafka-cluster"
PASSWORD = "secret-of-"
LISTENERS = [
    {"name": "PLAINTEXT", "port": 0},
    {"name": "SASL_PLAINTEXT", "port": 0, "sasl_enabled_mechanisms": ["PLAIN"]},
]
# The PLAINTEXT listener's principal is User:ANONYMOUS: the inter-broker listener's, so a
# super user, or replication stops. Kafka's "a;b" syntax of super.users.
AUTHORIZED = {
    "listeners": LISTENERS,
    "authorizer_enabled": True,
    "super_users": "User:ANONYMOUS;User:admin",
}


def acl_filter(
    resource_type: ResourceType = ResourceType.ANY,
    name: str | None = None,
    pattern: ResourcePatternType = ResourcePatternType.ANY,
    principal: str | None = None,
) -> AclBindingFilter:
    """A filter of any host, operation and permission."""
    make: Callable[..., AclBindingFilter] = AclBindingFilter  # stubs refuse None ("any")
    return make(
        resource_type, name, pattern, principal, None, AclOperation.ANY, AclPermissionType.ANY
    )


EVERY_ACL = acl_filter()

KP_EVERY_ACL = ACLFilter(  # kafka-python's
    principal=None,
    host=None,
    operation=ACLOperation.ANY,
    permission_type=ACLPermissionType.ANY,
    resource_pattern=ResourcePatternFilter(KResourceType.ANY, None, ACLResourcePatternType.ANY),
)


@dataclass
class Secured:
    """A broker with the authorizer on; `admin` works through PLAINTEXT as a super user."""

    broker: BrokerProcess

    @property
    def sasl(self) -> str:
        return self.broker.listeners["SASL_PLAINTEXT"]

    @cached_property
    def admin(self) -> AdminClient:
        """One client, kept: its futures fail once it is freed."""
        return AdminClient({"bootstrap.servers": self.broker.bootstrap})

    def login(self, user: str | None = None) -> tuple[str, dict[str, str]]:
        """A SASL user (a new one unless named): its principal and confluent-kafka login."""
        user = user or f"u{uuid.uuid4().hex[:10]}"
        add_users(self.broker.bootstrap, {user: PASSWORD + user})
        return f"User:{user}", plain(user, PASSWORD + user)

    def allow(self, *bindings: AclBinding) -> None:
        """Create the ACLs; the answer comes once this broker decides by them."""
        for future in self.admin.create_acls(list(bindings)).values():
            assert future.result(timeout=30) is None

    def create_topics(self, *names: str, partitions: int = 1) -> None:
        topics = [NewTopic(name, num_partitions=partitions) for name in names]
        for future in self.admin.create_topics(topics, operation_timeout=10).values():
            future.result(timeout=30)


def acl(
    principal: str,
    operation: AclOperation,
    name: str,
    resource_type: ResourceType = TOPIC,
    pattern: ResourcePatternType = LITERAL,
    permission: AclPermissionType = ALLOW,
    host: str = "*",
) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation, permission)


def kafka_python(login: dict[str, str]) -> dict[str, str]:
    """kafka-python's options for a confluent-kafka SASL PLAIN login."""
    return {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": login["sasl.username"],
        "sasl_plain_password": login["sasl.password"],
    }


def only(futures: Any) -> Any:
    """The one future of a confluent-kafka admin call made for one item."""
    (future,) = futures.values()
    return future


def code_of(future: Any) -> int:
    """The Kafka error code a confluent-kafka admin future fails with."""
    with pytest.raises(KafkaException) as failed:
        future.result(timeout=30)
    return int(failed.value.args[0].code())


def delivery_codes(
    clients: Clients, address: str, login: dict[str, str], topic: str, count: int = 1, **extra: Any
) -> list[int]:
    """Produce `count` records with a new producer: each one's delivery error code (0: ok)."""
    producer = clients.producer(address, {**login, "message.timeout.ms": 10000, **extra})
    records = [{"value": b"v%d" % i, "partition": 0} for i in range(count)]
    return [
        error.code() if error else 0 for error, _ in clients.produce_all(producer, topic, records)
    ]


def first_error(consumer: Consumer, timeout: float = 30.0) -> int:
    """The code of the first error the consumer reports."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = consumer.poll(0.5)
        error = message.error() if message is not None else None
        if error is not None:
            return int(error.code())
    raise AssertionError(f"no error within {timeout} s")


def ask(
    address: str, requests: list[tuple[Any, Any]], login: tuple[str, str] | None = None
) -> list[Any]:
    """Send each (request, response class) on one connection, after a SASL PLAIN login
    when `login` (user, password) is given; the decoded responses."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=15) as sock:

        def exchange(request: Any, response: Any, correlation: int) -> Any:
            sock.sendall(framed(request, correlation))
            frame = receive(sock, int.from_bytes(receive(sock, 4), "big"))
            return response.decode(frame, version=request.version, header=True)

        if login is not None:
            user, password = login
            handshake = exchange(
                SaslHandshakeRequest[1](mechanism="PLAIN"), SaslHandshakeResponse, 1
            )
            assert handshake.error_code == 0
            token = b"\0" + user.encode() + b"\0" + password.encode()
            answer = exchange(
                SaslAuthenticateRequest[1](auth_bytes=token), SaslAuthenticateResponse, 2
            )
            assert answer.error_code == 0, answer
        return [exchange(r, response, 10 + i) for i, (r, response) in enumerate(requests)]


def receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {size} bytes")
        data += chunk
    return data


def topic_uuid(admin: AdminClient, topic: str) -> uuid.UUID:
    found = admin.describe_topics(TopicCollection([topic]))[topic].result(timeout=30).topic_id
    high, low = found.get_most_significant_bits(), found.get_least_significant_bits()
    return uuid.UUID(int=(high % (1 << 64)) << 64 | low % (1 << 64))


def user_of(login: dict[str, str]) -> tuple[str, str]:
    return login["sasl.username"], login["sasl.password"]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    cluster = Cluster(tmp_path_factory.mktemp("acl-cluster"), broker_settings=AUTHORIZED)
    cluster.start()
    try:
        yield Secured(cluster.brokers[0])
        _stop_checked(cluster.brokers[0])
    finally:
        cluster.stop()


# Topics --------------------------------------------------------------------------------


def test_topics_need_describe_write_and_read(
    secured: Secured, clients: Clients, topic_name: Callable[[str], str]
) -> None:
    topic, other = topic_name("orders"), topic_name("other")
    secured.create_topics(topic, other)
    principal, alice = secured.login()
    admin = clients.admin(secured.sasl, alice)

    # Without an ACL the topics are not listed, and named they are refused whether they
    # exist or not: Kafka does not tell.
    assert topic not in admin.list_topics(timeout=10).topics
    for name in (topic, topic_name("missing")):
        error = clients.admin(secured.sasl, alice).list_topics(name, timeout=10).topics[name].error
        assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert delivery_codes(clients, secured.sasl, alice, topic) == [
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    ]

    # WRITE lets alice produce, and implies DESCRIBE: the topic is listed, the other is not
    secured.allow(acl(principal, AclOperation.WRITE, topic))
    assert delivery_codes(clients, secured.sasl, alice, topic, 3) == [0, 0, 0]
    topics = clients.admin(secured.sasl, alice).list_topics(timeout=10).topics
    assert topic in topics and other not in topics

    # A consumer needs READ on the topic (and on its group)
    group = topic_name("readers")
    secured.allow(acl(principal, AclOperation.READ, group, GROUP))
    reader = {**alice, "group.id": group}
    consumer = clients.consumer(secured.sasl, reader)
    clients.assign_from(consumer, topic, [0])
    assert first_error(consumer) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    consumer.close()
    secured.allow(acl(principal, AclOperation.READ, topic))
    consumer = clients.consumer(secured.sasl, reader)
    clients.assign_from(consumer, topic, [0])
    assert [m.value() for m in clients.consume(consumer, 3)] == [b"v0", b"v1", b"v2"]


def test_deny_beats_allow_prefixes_wildcards_and_super_users(
    secured: Secured, clients: Clients, topic_name: Callable[[str], str]
) -> None:
    prefix = topic_name("team") + "."
    inside, denied, outside = prefix + "a", prefix + "b", topic_name("outside")
    secured.create_topics(inside, denied, outside)
    bob, bob_login = secured.login()
    secured.allow(
        acl(bob, AclOperation.WRITE, prefix, pattern=PREFIXED),
        acl(bob, AclOperation.WRITE, denied, permission=DENY),
    )
    # kafka-python: the prefix allows, the literal DENY wins over it, elsewhere nothing
    producer = KafkaProducer(bootstrap_servers=secured.sasl, **kafka_python(bob_login))
    try:
        producer.send(inside, b"in").get(timeout=30)
        for topic in (denied, outside):
            with pytest.raises(TopicAuthorizationFailedError):
                producer.send(topic, b"no").get(timeout=30)
    finally:
        producer.close()

    # a wildcard topic for one principal, a wildcard principal for one topic
    carol, carol_login = secured.login()
    secured.allow(acl(carol, AclOperation.WRITE, "*"))
    assert delivery_codes(clients, secured.sasl, carol_login, denied) == [0]
    assert outside not in clients.admin(secured.sasl, bob_login).list_topics(timeout=10).topics
    secured.allow(acl("User:*", AclOperation.DESCRIBE, outside))
    assert outside in clients.admin(secured.sasl, bob_login).list_topics(timeout=10).topics
    assert delivery_codes(clients, secured.sasl, bob_login, outside) == [
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    ]

    # a super user needs no ACL: it writes where bob is denied, and creates topics
    _, admin_login = secured.login("admin")
    assert delivery_codes(clients, secured.sasl, admin_login, denied) == [0]
    made = topic_name("by-admin")
    admin = clients.admin(secured.sasl, admin_login)
    admin.create_topics([NewTopic(made, 1)], operation_timeout=10)[made].result(timeout=30)
    assert made in admin.list_topics(timeout=10).topics


def test_an_idempotent_producer_needs_idempotent_write_or_write_on_some_topic(
    secured: Secured, clients: Clients, topic_name: Callable[[str], str]
) -> None:
    topic = topic_name("idem")
    secured.create_topics(topic)
    idempotent: dict[str, Any] = {"enable.idempotence": True, "acks": "all"}

    # nothing granted: InitProducerId is refused, which is fatal to the producer
    _, frank = secured.login()
    errors: list[KafkaError] = []
    producer = Producer(
        {"bootstrap.servers": secured.sasl, **frank, **idempotent, "error_cb": errors.append}
    )
    deadline = time.monotonic() + 30
    while not errors and time.monotonic() < deadline:
        try:
            producer.poll(0.2)
        except KafkaException as error:
            errors.append(error.args[0])
    assert errors and errors[0].fatal(), errors
    assert errors[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED

    # WRITE on some topic is enough (KIP-679) ...
    writer, writer_login = secured.login()
    secured.allow(acl(writer, AclOperation.WRITE, topic))
    assert delivery_codes(clients, secured.sasl, writer_login, topic, 3, **idempotent) == [0] * 3
    # ... and so is IDEMPOTENT_WRITE on the cluster, which writes no topic by itself
    grace, grace_login = secured.login()
    secured.allow(acl(grace, AclOperation.IDEMPOTENT_WRITE, CLUSTER_NAME, BROKER))
    assert delivery_codes(clients, secured.sasl, grace_login, topic, **idempotent) == [
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    ]


# Groups --------------------------------------------------------------------------------


def test_consumer_groups_need_read_on_the_group(
    secured: Secured, clients: Clients, topic_name: Callable[[str], str]
) -> None:
    topic, group = topic_name("events"), topic_name("group")
    secured.create_topics(topic)
    dave, dave_login = secured.login()
    assert delivery_codes(clients, secured.broker.bootstrap, {}, topic, 4) == [0] * 4
    secured.allow(acl(dave, AclOperation.READ, topic))
    subscriber = {**dave_login, "group.id": group, "auto.offset.reset": "earliest"}

    consumer = clients.consumer(secured.sasl, subscriber)
    consumer.subscribe([topic])
    assert first_error(consumer) == KafkaError.GROUP_AUTHORIZATION_FAILED
    consumer.close()

    # READ on the group: it joins, consumes and commits
    secured.allow(acl(dave, AclOperation.READ, group, GROUP))
    consumer = clients.consumer(secured.sasl, subscriber)
    consumer.subscribe([topic])
    assert sorted(bytes(m.value() or b"") for m in clients.consume(consumer, 4)) == [
        b"v0",
        b"v1",
        b"v2",
        b"v3",
    ]
    committed = consumer.commit(offsets=[CTopicPartition(topic, 0, 4)], asynchronous=False)
    assert [(c.offset, c.error) for c in committed] == [(4, None)]

    # listing and describing the group need DESCRIBE on it (READ implies it)
    _, erin_login = secured.login()
    admins = {
        "dave": clients.admin(secured.sasl, dave_login),
        "erin": clients.admin(secured.sasl, erin_login),
        "super user": secured.admin,
    }
    seen = {
        name: {g.group_id for g in admin.list_consumer_groups().result(30).valid}
        for name, admin in admins.items()
    }
    assert {name: group in groups for name, groups in seen.items()} == {
        "dave": True,
        "erin": False,
        "super user": True,
    }
    assert code_of(admins["erin"].describe_consumer_groups([group])[group]) == (
        KafkaError.GROUP_AUTHORIZATION_FAILED
    )
    # KIP-430 for a group: what dave may do with it
    described = admins["dave"].describe_consumer_groups([group], include_authorized_operations=True)
    assert set(described[group].result(timeout=30).authorized_operations) == {
        AclOperation.READ,
        AclOperation.DESCRIBE,
    }

    # deleting it needs DELETE
    consumer.close()
    dave_admin = clients.admin(secured.sasl, dave_login)
    assert code_of(dave_admin.delete_consumer_groups([group])[group]) == (
        KafkaError.GROUP_AUTHORIZATION_FAILED
    )
    secured.allow(acl(dave, AclOperation.DELETE, group, GROUP))
    assert dave_admin.delete_consumer_groups([group])[group].result(timeout=30) is None


# The cluster and the admin APIs ----------------------------------------------------------


def test_admin_operations_need_their_acls(
    secured: Secured, clients: Clients, topic_name: Callable[[str], str]
) -> None:
    henry, henry_login = secured.login()
    admin = clients.admin(secured.sasl, henry_login)
    topic = topic_name("managed")
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)

    def create() -> Any:
        return admin.create_topics([NewTopic(topic, 1)], operation_timeout=10)[topic]

    # CREATE on the topic (the cluster's CREATE would do for every topic)
    assert code_of(create()) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    secured.allow(acl(henry, AclOperation.CREATE, topic))
    create().result(timeout=30)

    # configs: DESCRIBE_CONFIGS and ALTER_CONFIGS on the topic, on the cluster for a broker's
    assert code_of(admin.describe_configs([resource])[resource]) == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    broker = ConfigResource(ConfigResource.Type.BROKER, "0")
    assert code_of(admin.describe_configs([broker])[broker]) == (
        KafkaError.CLUSTER_AUTHORIZATION_FAILED
    )
    retention = ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET)
    altered = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[retention])
    assert code_of(admin.incremental_alter_configs([altered])[altered]) == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    secured.allow(acl(henry, AclOperation.ALTER_CONFIGS, topic))  # implies DESCRIBE_CONFIGS
    admin.incremental_alter_configs([altered])[altered].result(timeout=30)
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    assert configs["retention.ms"].value == "60000"

    # ALTER to add partitions, DELETE to delete records or the topic
    grow = [NewPartitions(topic, 2)]
    assert code_of(admin.create_partitions(grow)[topic]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert code_of(admin.delete_topics([topic])[topic]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    secured.allow(acl(henry, AclOperation.ALTER, topic), acl(henry, AclOperation.DELETE, topic))
    admin.create_partitions(grow)[topic].result(timeout=30)
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 2
    admin.delete_topics([topic])[topic].result(timeout=30)

    # the cluster's resources: SCRAM credentials and ACLs
    upsertion: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(
            "mallory", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"pw"
        )
    ]
    assert code_of(only(admin.alter_user_scram_credentials(upsertion))) == (
        KafkaError.CLUSTER_AUTHORIZATION_FAILED
    )
    (created,) = admin.create_acls([acl(henry, AclOperation.ALL, "*")]).values()
    assert code_of(created) == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    (deleted,) = admin.delete_acls([EVERY_ACL]).values()
    assert code_of(deleted) == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # kafka-python for these two: librdkafka ignores DescribeAcls' error and, with this
    # release, crashes on DescribeUserScramCredentials' (Kafka's answers too)
    kp = KafkaAdminClient(bootstrap_servers=secured.sasl, **kafka_python(henry_login))
    try:
        with pytest.raises(ClusterAuthorizationFailedError):
            kp.describe_acls(KP_EVERY_ACL)
        with pytest.raises(ClusterAuthorizationFailedError):
            kp.describe_user_scram_credentials([henry[5:]])
    finally:
        kp.close()
    # the SCRAM admin APIs are the cluster's: ALTER and DESCRIBE on it
    secured.allow(
        acl(henry, AclOperation.ALTER, CLUSTER_NAME, BROKER),
        acl(henry, AclOperation.DESCRIBE, CLUSTER_NAME, BROKER),
    )
    only(admin.alter_user_scram_credentials(upsertion)).result(timeout=30)
    described = only(admin.describe_user_scram_credentials(["mallory"])).result(timeout=30)
    assert [i.iterations for i in described.scram_credential_infos] == [4096]


# confluent-kafka's describe_user_scram_credentials for the users in argv[2], logged in with
# the settings in argv[1]: each user's error code, written (unbuffered) from the future's
# done callback, which runs on librdkafka's background thread before the result is freed.
DESCRIBE_SCRAM = """
import concurrent.futures, json, os, sys
from confluent_kafka.admin import AdminClient
config, users = json.loads(sys.argv[1]), json.loads(sys.argv[2])
def told(user):
    def report(future):
        error = future.exception()
        code = 0 if error is None else error.args[0].code()
        os.write(1, f"{user}:{code}\\n".encode())
    return report
admin = AdminClient(config)  # kept: a freed client fails its futures with _DESTROY
futures = admin.describe_user_scram_credentials(users)
for user, future in futures.items():
    future.add_done_callback(told(user))
concurrent.futures.wait(list(futures.values()), timeout=60)
"""


def test_a_refused_scram_description_is_answered_as_kafka_answers_it(secured: Secured) -> None:
    """Without DESCRIBE on the cluster, DescribeUserScramCredentials gets Kafka 3.7's answer
    (DescribeUserScramCredentialsRequest.getErrorResponse): CLUSTER_AUTHORIZATION_FAILED at
    the top and in one result per user named, each with an empty user name. librdkafka
    (up to 2.16 at least) frees the top-level error message it read without allocating it
    (rd_kafka_DescribeUserScramCredentialsResponse_parse: a string of the response buffer
    copied to the stack, or a static one), so the client process aborts once the result is
    delivered, with Kafka too: the call runs in a child process, which must report the
    error for every user first, and may only die of that abort."""
    principal, login = secured.login()
    user, nobody = principal[5:], f"nobody-{uuid.uuid4().hex[:8]}"
    request = DescribeUserScramCredentialsRequest[0](
        users=[
            DescribeUserScramCredentialsRequest[0].UserName(name=name) for name in (user, nobody)
        ]
    )
    (answer,) = ask(secured.sasl, [(request, DescribeUserScramCredentialsResponse)], user_of(login))
    refused = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert (answer.error_code, bool(answer.error_message)) == (refused, True)
    assert [
        (r.user, r.error_code, r.error_message, list(r.credential_infos)) for r in answer.results
    ] == [("", refused, answer.error_message, [])] * 2

    child = subprocess.run(
        [
            sys.executable,
            "-c",
            DESCRIBE_SCRAM,
            json.dumps({"bootstrap.servers": secured.sasl, **login}),
            json.dumps([user, nobody]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sorted(child.stdout.split()) == sorted(f"{name}:{refused}" for name in (user, nobody))
    assert child.returncode in (0, -signal.SIGABRT), (child.returncode, child.stderr[-2000:])
    # With the permission the same client describes the user (and lives on).
    secured.allow(acl(principal, AclOperation.DESCRIBE, CLUSTER_NAME, BROKER))
    granted = subprocess.run(
        [
            sys.executable,
            "-c",
            DESCRIBE_SCRAM,
            json.dumps({"bootstrap.servers": secured.sasl, **login}),
            json.dumps([user]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (granted.returncode, granted.stdout.split()) == (0, [f"{user}:0"]), granted.stderr


# Managing ACLs ---------------------------------------------------------------------------


def test_acls_created_described_and_deleted_with_confluent_kafka(secured: Secured) -> None:
    principal = f"User:{uuid.uuid4().hex[:10]}"
    admin = secured.admin
    name = f"acl-{uuid.uuid4().hex[:8]}"
    bindings = [
        acl(principal, AclOperation.READ, name + "-1"),
        acl(principal, AclOperation.WRITE, name, pattern=PREFIXED),
        acl(principal, AclOperation.DESCRIBE, "*", host="10.1.2.3", permission=DENY),
        acl(principal, AclOperation.READ, name + "-group", GROUP),
        acl(principal, AclOperation.CLUSTER_ACTION, CLUSTER_NAME, BROKER),
    ]
    secured.allow(*bindings)
    secured.allow(bindings[0])  # creating one that exists succeeds and changes nothing

    def described(acl_filter: AclBindingFilter) -> set[AclBinding]:
        return set(admin.describe_acls(acl_filter).result(timeout=30))

    mine = acl_filter(principal=principal)
    assert described(mine) == set(bindings)
    # MATCH: the ACLs that apply to one resource (literal, prefixes, the wildcard)
    match = acl_filter(TOPIC, name + "-1", ResourcePatternType.MATCH, principal)
    assert described(match) == set(bindings[:3])

    # refused bindings: INVALID_REQUEST with Kafka's reason; the others are created
    wrong_cluster = acl(principal, AclOperation.ALTER, "not-the-cluster", BROKER)
    no_colon = acl("nobody", AclOperation.READ, name + "-2")
    fine = acl(principal, AclOperation.READ, name + "-3")
    futures = admin.create_acls([wrong_cluster, no_colon, fine])
    for refused, reason in ((wrong_cluster, "kafka-cluster"), (no_colon, "Type:name")):
        with pytest.raises(KafkaException) as failed:
            futures[refused].result(timeout=30)
        assert failed.value.args[0].code() == KafkaError.INVALID_REQUEST
        assert reason in failed.value.args[0].str()
    assert futures[fine].result(timeout=30) is None

    # deleting by filter answers the ACLs deleted
    prefixed = acl_filter(TOPIC, None, PREFIXED, principal)
    assert only(admin.delete_acls([prefixed])).result(timeout=30) == [bindings[1]]
    assert described(mine) == {*bindings[:1], *bindings[2:], fine}
    assert set(only(admin.delete_acls([mine])).result(timeout=30)) == {
        *bindings[:1],
        *bindings[2:],
        fine,
    }
    assert described(mine) == set()


def test_acls_created_described_and_deleted_with_kafka_python(secured: Secured) -> None:
    principal = f"User:{uuid.uuid4().hex[:10]}"
    name = f"kp-{uuid.uuid4().hex[:8]}"
    wanted = [
        ACL(
            principal,
            "*",
            ACLOperation.WRITE,
            ACLPermissionType.ALLOW,
            ResourcePattern(KResourceType.TOPIC, name, ACLResourcePatternType.PREFIXED),
        ),
        ACL(
            principal,
            "*",
            ACLOperation.READ,
            ACLPermissionType.DENY,
            ResourcePattern(KResourceType.GROUP, name, ACLResourcePatternType.LITERAL),
        ),
    ]
    wrong = ACL(
        principal,
        "*",
        ACLOperation.ALTER,
        ACLPermissionType.ALLOW,
        ResourcePattern(KResourceType.CLUSTER, "elsewhere", ACLResourcePatternType.LITERAL),
    )
    mine = ACLFilter(
        principal=principal,
        host=None,
        operation=ACLOperation.ANY,
        permission_type=ACLPermissionType.ANY,
        resource_pattern=ResourcePatternFilter(KResourceType.ANY, None, ACLResourcePatternType.ANY),
    )
    admin = KafkaAdminClient(bootstrap_servers=secured.broker.bootstrap)
    try:
        result = admin.create_acls([*wanted, wrong])
        assert result["succeeded"] == wanted
        assert result["failed"] == [InvalidRequestError]  # kafka-python lists error classes
        acls, error = admin.describe_acls(mine)
        assert error.errno == 0
        assert sorted(map(str, acls)) == sorted(map(str, wanted))
        ((_, deleted, error),) = admin.delete_acls([mine])
        assert error.errno == 0
        assert sorted(map(str, deleted)) == sorted(map(str, wanted))
        assert admin.describe_acls(mine)[0] == []
    finally:
        admin.close()


def test_refused_acl_requests_on_the_wire(secured: Secured) -> None:
    """What clients refuse to send is refused by the broker too: a MATCH pattern in a
    creation, an UNKNOWN operation in a filter."""
    creation = CreateAclsRequest[3].AclCreation
    request = CreateAclsRequest[3](
        creations=[
            creation(
                resource_type=2,
                resource_name="t",
                resource_pattern_type=2,  # MATCH
                principal="User:x",
                host="*",
                operation=3,
                permission_type=3,
            ),
            creation(
                resource_type=2,
                resource_name="",
                resource_pattern_type=3,
                principal="User:x",
                host="*",
                operation=3,
                permission_type=3,
            ),
        ]
    )
    describe = DescribeAclsRequest[3](
        resource_type_filter=1,
        resource_name_filter=None,
        pattern_type_filter=1,
        principal_filter=None,
        host_filter=None,
        operation=0,  # UNKNOWN
        permission_type=1,
    )
    created, described = ask(
        secured.broker.bootstrap,
        [(request, CreateAclsResponse), (describe, DescribeAclsResponse)],
    )
    assert [(r.error_code, r.error_message) for r in created.results] == [
        (42, "invalid pattern type MATCH for an ACL: it must be LITERAL or PREFIXED"),
        (42, "an ACL's resource name must not be empty"),
    ]
    assert (described.error_code, described.error_message) == (
        42,
        "the ACL filter holds UNKNOWN values: operation",
    )


# Requests as the wire carries them -------------------------------------------------------


def test_each_api_answers_its_authorization_error(
    secured: Secured, topic_name: Callable[[str], str]
) -> None:
    topic = topic_name("wire")
    secured.create_topics(topic)
    topic_id = topic_uuid(secured.admin, topic)
    _, ivan_login = secured.login()
    fetch = FetchRequest[12](
        replica_id=0,  # a follower's fetch: CLUSTER_ACTION on the cluster
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[
            FetchRequest[12].FetchTopic(
                topic=topic,
                partitions=[
                    FetchRequest[12].FetchTopic.FetchPartition(
                        partition=0,
                        current_leader_epoch=-1,
                        fetch_offset=0,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=1 << 20,
                    )
                ],
            )
        ],
        forgotten_topics_data=[],
        rack_id="",
    )
    by_id = MetadataRequest[12](
        topics=[MetadataRequest[12].MetadataRequestTopic(topic_id=topic_id, name=None)],
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    list_offsets = ListOffsetsRequest[7](
        replica_id=-1,
        isolation_level=0,
        topics=[
            ListOffsetsRequest[7].ListOffsetsTopic(
                name=topic,
                partitions=[
                    ListOffsetsRequest[7].ListOffsetsTopic.ListOffsetsPartition(
                        partition_index=0, current_leader_epoch=-1, timestamp=-1
                    )
                ],
            )
        ],
    )
    epochs = OffsetForLeaderEpochRequest[4](
        replica_id=-1,
        topics=[
            OffsetForLeaderEpochRequest[4].OffsetForLeaderTopic(
                topic=topic,
                partitions=[
                    OffsetForLeaderEpochRequest[4].OffsetForLeaderTopic.OffsetForLeaderPartition(
                        partition=0, current_leader_epoch=-1, leader_epoch=0
                    )
                ],
            )
        ],
    )
    coordinators = FindCoordinatorRequest[4](key_type=1, coordinator_keys=["tx-1"])
    group_coordinator = FindCoordinatorRequest[4](key_type=0, coordinator_keys=["g-1"])
    transactional = InitProducerIdRequest[4](
        transactional_id="tx-1", transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1
    )
    elect = ElectLeadersRequest[2](election_type=0, topic_partitions=None, timeout_ms=5000)
    reassignments = ListPartitionReassignmentsRequest[0](timeout_ms=5000, topics=None)
    delete_records = DeleteRecordsRequest[2](
        topics=[
            DeleteRecordsRequest[2].DeleteRecordsTopic(
                name=topic,
                partitions=[
                    DeleteRecordsRequest[2].DeleteRecordsTopic.DeleteRecordsPartition(
                        partition_index=0, offset=0
                    )
                ],
            )
        ],
        timeout_ms=5000,
    )
    answers = ask(
        secured.sasl,
        [
            (fetch, FetchResponse),
            (by_id, MetadataResponse),
            (list_offsets, ListOffsetsResponse),
            (epochs, OffsetForLeaderEpochResponse),
            (coordinators, FindCoordinatorResponse),
            (group_coordinator, FindCoordinatorResponse),
            (transactional, InitProducerIdResponse),
            (elect, ElectLeadersResponse),
            (reassignments, ListPartitionReassignmentsResponse),
            (delete_records, DeleteRecordsResponse),
        ],
        user_of(ivan_login),
    )
    fetched, metadata, offsets, ends, transaction, group, producer_id, elected, listed, deleted = (
        answers
    )
    assert fetched.responses[0].partitions[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    # by id: refused, and without the name (the id is no secret)
    (described,) = metadata.topics
    assert (described.error_code, described.name, described.topic_id) == (
        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        None,
        topic_id,
    )
    assert offsets.topics[0].partitions[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert ends.topics[0].partitions[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert transaction.coordinators[0].error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert group.coordinators[0].error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert producer_id.error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert elected.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert listed.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert deleted.topics[0].partitions[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED

    # allowed on the transactional id, the requests get past authorization to the
    # coordinator, which this one-broker cluster cannot have: __transaction_state needs
    # transaction_state_log_replication_factor (3) brokers
    principal = "User:" + ivan_login["sasl.username"]
    secured.allow(acl(principal, AclOperation.WRITE, "tx-1", ResourceType.TRANSACTIONAL_ID))
    transaction, producer_id = ask(
        secured.sasl,
        [(coordinators, FindCoordinatorResponse), (transactional, InitProducerIdResponse)],
        user_of(ivan_login),
    )
    assert transaction.coordinators[0].error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert producer_id.error_code == ErrorCode.NOT_COORDINATOR


def test_auto_creation_needs_create_on_the_cluster_or_the_topic(
    secured: Secured, topic_name: Callable[[str], str]
) -> None:
    wanted, other = topic_name("auto"), topic_name("auto-other")
    principal, login = secured.login()
    secured.allow(
        acl(principal, AclOperation.DESCRIBE, wanted),
        acl(principal, AclOperation.DESCRIBE, other),
        acl(principal, AclOperation.CREATE, wanted),
    )
    metadata = MetadataRequest[12](
        topics=[
            MetadataRequest[12].MetadataRequestTopic(topic_id=None, name=name)
            for name in (wanted, other)
        ],
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=True,
    )
    (answer,) = ask(secured.sasl, [(metadata, MetadataResponse)], user_of(login))
    by_name = {t.name: t for t in answer.topics}
    # created (LEADER_NOT_AVAILABLE while it comes up), with what the requester may do
    assert by_name[wanted].error_code in (ErrorCode.NONE, ErrorCode.LEADER_NOT_AVAILABLE)
    assert by_name[wanted].authorized_operations == {ACLOperation.CREATE, ACLOperation.DESCRIBE}
    # DESCRIBE without CREATE: refused, and not created
    assert by_name[other].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    topics = secured.admin.list_topics(timeout=10).topics
    assert wanted in topics and other not in topics


def test_kcat_lists_only_the_topics_it_may_describe(
    secured: Secured, topic_name: Callable[[str], str]
) -> None:
    visible, hidden = topic_name("visible"), topic_name("hidden")
    secured.create_topics(visible, hidden)
    principal, login = secured.login()
    secured.allow(acl(principal, AclOperation.DESCRIBE, visible))
    kcat = ["kcat", "-b", secured.sasl, *(f"-X{key}={value}" for key, value in login.items())]
    listing = subprocess.run([*kcat, "-L", "-J"], capture_output=True, check=True, timeout=60)
    topics = {t["topic"] for t in json.loads(listing.stdout)["topics"]}
    assert visible in topics and hidden not in topics
    produced = subprocess.run(
        [*kcat, "-P", "-t", visible, "-p", "0"], input=b"x\n", capture_output=True, timeout=60
    )
    assert produced.returncode != 0
    assert b"Topic authorization failed" in produced.stderr


# KIP-430 -------------------------------------------------------------------------------


def test_authorized_operations_say_what_the_requester_may_do(
    secured: Secured, topic_name: Callable[[str], str]
) -> None:
    topic = topic_name("ops")
    secured.create_topics(topic)
    principal, login = secured.login()
    secured.allow(acl(principal, AclOperation.READ, topic))
    admin = AdminClient({"bootstrap.servers": secured.sasl, **login})
    described = admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True)
    assert set(described[topic].result(30).authorized_operations) == {
        AclOperation.READ,
        AclOperation.DESCRIBE,
    }
    # none of the cluster's to one who may not DESCRIBE it
    cluster = admin.describe_cluster(include_authorized_operations=True).result(30)
    assert not cluster.authorized_operations
    secured.allow(acl(principal, AclOperation.ALTER, CLUSTER_NAME, BROKER))
    cluster = admin.describe_cluster(include_authorized_operations=True).result(30)
    assert set(cluster.authorized_operations) == {AclOperation.ALTER, AclOperation.DESCRIBE}


# Without an authorizer -------------------------------------------------------------------


def test_without_an_authorizer_acls_are_refused_and_every_operation_reported(
    module_broker: BrokerProcess, topic_name: Callable[[str], str], clients: Clients
) -> None:
    admin = clients.admin(module_broker.bootstrap)
    binding = acl("User:alice", AclOperation.READ, "t")
    (created,) = admin.create_acls([binding]).values()
    assert code_of(created) == KafkaError.SECURITY_DISABLED
    (deleted,) = admin.delete_acls([EVERY_ACL]).values()
    assert code_of(deleted) == KafkaError.SECURITY_DISABLED
    kp = KafkaAdminClient(bootstrap_servers=module_broker.bootstrap)
    try:
        with pytest.raises(SecurityDisabledError):
            kp.describe_acls(KP_EVERY_ACL)
    finally:
        kp.close()
    topic = topic_name("all-ops")
    clients.create_topic(module_broker.bootstrap, topic)
    described = admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True)
    assert set(described[topic].result(30).authorized_operations) == {
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.CREATE,
        AclOperation.DELETE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    }
    cluster = admin.describe_cluster(include_authorized_operations=True).result(30)
    assert set(cluster.authorized_operations) == {
        AclOperation.CREATE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE,
        AclOperation.CLUSTER_ACTION,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
        AclOperation.IDEMPOTENT_WRITE,
    }


# Several brokers -------------------------------------------------------------------------


def test_two_brokers_replicate_and_follow_acl_changes(
    tmp_path: Path, clients: Clients, topic_name: Callable[[str], str]
) -> None:
    with Cluster(tmp_path, brokers=2, broker_settings=AUTHORIZED) as cluster:
        secured = Secured(cluster.brokers[0])
        topic = topic_name("replicated")
        admin = secured.admin
        futures = admin.create_topics([NewTopic(topic, 1, replication_factor=2)])
        futures[topic].result(timeout=30)
        # the brokers replicate as User:ANONYMOUS, a super user: acks=all goes through
        producer = clients.producer(cluster.bootstrap, {"acks": "all"})
        reports = clients.produce_all(producer, topic, [{"value": b"r%d" % i} for i in range(50)])
        assert [error for error, _ in reports] == [None] * 50

        def both_hold_all() -> None:
            counts = [sum(n for _, n in b.stored_batches(topic)) for b in cluster.brokers.values()]
            assert counts == [50, 50], counts

        eventually(both_hold_all, "every record on both replicas", 30)
        (partition,) = admin.list_topics(topic, timeout=10).topics[topic].partitions.values()
        assert sorted(partition.isrs) == [0, 1]

        # an ACL change decides on every broker as soon as its image has it
        principal, login = secured.login()
        describe = MetadataRequest[12](
            topics=[MetadataRequest[12].MetadataRequestTopic(topic_id=None, name=topic)],
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )

        def codes() -> list[int]:
            return [
                ask(b.listeners["SASL_PLAINTEXT"], [(describe, MetadataResponse)], user_of(login))[
                    0
                ]
                .topics[0]
                .error_code
                for b in cluster.brokers.values()
            ]

        assert codes() == [ErrorCode.TOPIC_AUTHORIZATION_FAILED] * 2
        secured.allow(acl(principal, AclOperation.DESCRIBE, topic))
        wait_for(lambda: codes() == [0, 0], 5, "both brokers allow DESCRIBE")
        everything = acl_filter(TOPIC, topic, LITERAL, principal)
        assert len(only(admin.delete_acls([everything])).result(timeout=30)) == 1
        wait_for(
            lambda: codes() == [ErrorCode.TOPIC_AUTHORIZATION_FAILED] * 2,
            5,
            "both brokers deny DESCRIBE again",
        )


# RDMA access -----------------------------------------------------------------------------


def test_rdma_access_is_authorized(
    tmp_path: Path, clients: Clients, topic_name: Callable[[str], str]
) -> None:
    """RDMA produce needs WRITE on the topic, RDMA consume READ, a leader's push grant
    CLUSTER_ACTION on the cluster. The RDMA clients connect as User:ANONYMOUS here, and
    resources without ACLs allow everyone (allow_everyone_if_no_acl_found)."""
    settings = {
        "authorizer_enabled": True,
        "allow_everyone_if_no_acl_found": True,
        "rdma_produce": True,
        "rdma_consume": True,
        "rdma_replication": True,
        "rdma_provider": "shm",
        "rdma_connect_timeout_ms": 5000,
    }
    with Cluster(tmp_path, brokers=1, broker_settings=settings) as cluster:
        broker = cluster.brokers[0]
        secured = Secured(broker)
        topic = topic_name("rdma")
        clients.create_topic(broker.bootstrap, topic, config={"preallocate": "true"})
        batch = build_batch([Record(0, int(time.time() * 1000), None, b"rdma")])

        async def produce() -> None:
            producer = RdmaProducer(broker.bootstrap, topic, 0, provider="shm", timeout=5.0)
            await producer.start()
            try:
                await producer.send([batch])
            finally:
                await producer.close()

        async def consume() -> list[bytes | None]:
            async with RdmaConsumer(broker.bootstrap, topic, 0, 0, provider="shm") as consumer:
                return [r.value for r in await consumer.poll(5.0)]

        asyncio.run(produce())  # no ACL on the topic: everyone may
        # an ACL for someone else: now the topic's ACLs decide, and they do not allow us
        secured.allow(acl("User:someone", AclOperation.ALL, topic))
        with pytest.raises(RdmaProduceError) as produce_refused:
            asyncio.run(produce())
        assert produce_refused.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        with pytest.raises(RdmaConsumeError) as consume_refused:
            asyncio.run(consume())
        assert consume_refused.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        secured.allow(
            acl("User:ANONYMOUS", AclOperation.WRITE, topic),
            acl("User:ANONYMOUS", AclOperation.READ, topic),
        )
        asyncio.run(produce())
        assert asyncio.run(consume()) == [b"rdma", b"rdma"]

        # a push grant: the cluster's CLUSTER_ACTION, once the cluster has ACLs
        secured.allow(acl("User:ANONYMOUS", AclOperation.ALTER, CLUSTER_NAME, BROKER))
        grant = RdmaReplicaRequest(topic, 0, 1, 0, 0, 0, 1024, 0, 0, 0, ("shm",))
        host, port = broker.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=15) as sock:
            sock.sendall(rdma_replica.request_frame(grant, 7, "acl-test"))
            frame = receive(sock, int.from_bytes(receive(sock, 4), "big"))
        answer = rdma_replica.decode_response_frame(frame, 7)
        assert answer.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
