"""Transaction verification (KIP-890 part 1, Kafka's
`transaction.partition.verification.enable`): before a partition takes the first
transactional batch of a producer's transaction, its leader asks the transaction's
coordinator whether the partition is in that transaction.

Without the check a produce that arrives after its transaction ended (a retry, or a request
held up in the network past the client's abort) opens a transaction on the partition that no
marker will ever close: the partition's last stable offset, and with it every read_committed
consumer, stops there for good. With it the produce gets INVALID_TXN_STATE and nothing is
written. Later batches of the same transaction need no check: the partition's producer state
has it open. A coordinator that aborts a transaction on its own (a timeout) bumps the
producer's epoch, so a batch verified just before that abort's marker is fenced by the epoch
check when it is appended.

A coordinator on this broker is asked directly; another broker gets AddPartitionsToTxn v4
with verify_only, over one held connection per broker, the verifications waiting meanwhile
batched into the next request (one transactional id per transaction in it), as Kafka's
AddPartitionsToTxnManager does.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

from directlog.protocol.client import ClientSecurity, KafkaConnection
from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.topics import TopicPartition
from services.broker.cluster_metadata import ClusterImage
from services.broker.transactions.coordinator import TransactionCoordinator
from services.broker.transactions.state_topic import TRANSACTION_STATE_TOPIC

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.producer import AddPartitionsToTxnRequest, AddPartitionsToTxnResponse

log = logging.getLogger(__name__)

VERIFY_VERSION = 4  # Kafka 3.7's brokers send v4
CONNECT_TIMEOUT = 5.0
Partitions = set[tuple[str, int]]
Verdicts = dict[tuple[str, int], ErrorCode]

# What a verification that could not be made answers a producer: Kafka's
# NOT_ENOUGH_REPLICAS, which every client retries without asking for metadata again.
_UNVERIFIED = frozenset(
    {
        ErrorCode.CONCURRENT_TRANSACTIONS,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.NETWORK_EXCEPTION,
    }
)


def produce_refusal(code: ErrorCode) -> KafkaError | None:
    """The error a produce gets for a partition whose verification answered `code` (None
    when it passed), as Kafka's ReplicaManager translates the coordinator's codes."""
    if code is ErrorCode.NONE:
        return None
    if code is ErrorCode.INVALID_TXN_STATE:
        return KafkaError(code, "Partition was not added to the transaction")
    if code in _UNVERIFIED:
        return KafkaError(
            ErrorCode.NOT_ENOUGH_REPLICAS,
            "Unable to verify the partition has been added to the transaction. "
            f"Underlying error: {code.name}",
        )
    return KafkaError(code, f"transaction verification: {code.name}")


@dataclass(slots=True)
class _Ask:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: Partitions
    answer: asyncio.Future[Verdicts] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class _Link:
    """The held connection to one coordinator broker and the verifications waiting for it."""

    def __init__(self, address: tuple[str, int], security: ClientSecurity | None) -> None:
        self.address = address
        self.security = security
        self.waiting: list[_Ask] = []
        self._connection: KafkaConnection | None = None
        self._sender: asyncio.Task[None] | None = None

    async def ask(self, ask: _Ask) -> Verdicts:
        self.waiting.append(ask)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_all())
        return await ask.answer

    async def _send_all(self) -> None:
        while self.waiting:
            batch: dict[str, _Ask] = {}
            later: list[_Ask] = []
            for ask in self.waiting:
                if ask.transactional_id in batch:
                    later.append(ask)  # one entry per transactional id in a request
                else:
                    batch[ask.transactional_id] = ask
            self.waiting = later
            try:
                answers = await self._request(list(batch.values()))
            except Exception:  # an answer we cannot read: the asks fail, the link goes on
                log.exception("transaction verification by %s:%d", *self.address)
                await self.close()
                answers = {}
            for ask in batch.values():
                if not ask.answer.done():
                    ask.answer.set_result(answers.get(ask.transactional_id) or {})

    async def _request(self, asks: list[_Ask]) -> dict[str, Verdicts]:
        """One AddPartitionsToTxn v4 for `asks`; each partition of each gets
        NETWORK_EXCEPTION when the broker cannot be asked."""
        transaction_type: Any = AddPartitionsToTxnRequest.AddPartitionsToTxnTransaction
        topic_type: Any = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
        transactions = []
        for ask in asks:
            topics: dict[str, list[int]] = {}
            for topic, index in sorted(ask.partitions):
                topics.setdefault(topic, []).append(index)
            transactions.append(
                transaction_type(
                    transactional_id=ask.transactional_id,
                    producer_id=ask.producer_id,
                    producer_epoch=ask.producer_epoch,
                    verify_only=True,
                    topics=[topic_type(name=t, partitions=p) for t, p in topics.items()],
                )
            )
        request = AddPartitionsToTxnRequest(version=VERIFY_VERSION, transactions=transactions)
        failed = {
            ask.transactional_id: dict.fromkeys(ask.partitions, ErrorCode.NETWORK_EXCEPTION)
            for ask in asks
        }
        try:
            if self._connection is None:
                self._connection = await KafkaConnection.connect(
                    *self.address, CONNECT_TIMEOUT, self.security
                )
            response = await asyncio.wait_for(
                self._connection.request(request, AddPartitionsToTxnResponse, "txn-verification"),
                CONNECT_TIMEOUT,
            )
        except (OSError, TimeoutError, ConnectionError) as error:
            log.info("transaction verification by %s:%d failed: %s", *self.address, error)
            await self.close()
            return failed
        if response.error_code != ErrorCode.NONE:
            code = ErrorCode(response.error_code)
            return {t: dict.fromkeys(v, code) for t, v in failed.items()}
        answers: dict[str, Verdicts] = {}
        for result in response.results_by_transaction:
            answers[result.transactional_id] = {
                (topic.name, p.partition_index): ErrorCode(p.partition_error_code)
                for topic in result.topic_results
                for p in topic.results_by_partition
            }
        return {t: answers.get(t, v) for t, v in failed.items()}

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()


class TransactionVerifier:
    def __init__(
        self,
        node_id: int,
        image: ClusterImage,
        coordinator: TransactionCoordinator,
        security: ClientSecurity | None,
    ) -> None:
        self.node_id = node_id
        self.image = image
        self.coordinator = coordinator
        self.security = security
        self._links: dict[int, _Link] = {}

    async def verify(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: Partitions
    ) -> Verdicts:
        """Each partition's code from the id's coordinator (NONE: in the open transaction)."""
        index = self.coordinator.partition_of(transactional_id)
        info = self.image.partition(TopicPartition(TRANSACTION_STATE_TOPIC, index))
        leader = -1 if info is None else info.leader
        if leader == self.node_id:
            return self.coordinator.verify_partitions(
                transactional_id, producer_id, producer_epoch, partitions
            )
        broker = self.image.brokers.get(leader)
        if broker is None or broker.port <= 0:
            return dict.fromkeys(partitions, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        address = (broker.host, broker.port)
        link = self._links.get(leader)
        if link is None or link.address != address:
            if link is not None:
                await link.close()
            link = self._links[leader] = _Link(address, self.security)
        verdicts = await link.ask(_Ask(transactional_id, producer_id, producer_epoch, partitions))
        return {tp: verdicts.get(tp, ErrorCode.NETWORK_EXCEPTION) for tp in partitions}

    async def close(self) -> None:
        for link in self._links.values():
            await link.close()
        self._links.clear()
