"""What each RDMA module of the broker (produce, consume, push replication) runs on: one
verbs context, protection domain, completion queue and listener. The event loop owns all
module state and is the only thread that posts. It polls the completion queue itself when
the queue has a doorbell file descriptor (shm, tcp), saving a thread hand-off on every
completion; otherwise a poller thread hands batches over, waiting for the loop to take
one before it polls more (at most ``HANDOFF_BATCHES`` queued). A thread accepts queue
pairs. The modules stay independent (each its own switch, port and queue depths), as the
paper's are.

After a completion the loop keeps polling for ``rdma_poll_spin_us``, once per loop turn
(other work interleaves): a write that follows soon, as the next one of a producer or a
push usually does, is then taken without sleeping on the doorbell and waking up, which on
these machines costs more than the broker's work for a small write. Each such turn yields
the CPU first (sched_yield), so the spin takes only CPU that no other runnable process
wants. An idle broker spends nothing on it; the poller thread (no doorbell) does not spin.
Off by default: it pays only where the broker has cores of its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable

from directlog.rdma import (
    CompletionQueue,
    Context,
    Listener,
    ProtectionDomain,
    QpCaps,
    QueuePair,
    RdmaError,
    WorkCompletion,
    open_context,
)
from services.broker.settings import BrokerSettings

log = logging.getLogger(__name__)

HANDOFF_BATCHES = 4
POLL_BATCH = 64
THREAD_WAKE_SECONDS = 0.2  # how often the threads look at the stop flag


class RdmaEndpoint:
    """A listener on ``port`` whose accepted queue pairs go to ``accepted``, each with
    ``caps.max_recv_wr`` receives posted (wr_id 0 and up: the peer's credits), and whose
    completions go to ``completed``, both called on the event loop."""

    def __init__(
        self,
        name: str,
        settings: BrokerSettings,
        port: int,
        caps: QpCaps,
        cq_depth: int,
        accepted: Callable[[QueuePair], None],
        completed: Callable[[WorkCompletion], None],
    ) -> None:
        self.name = name
        self._loop = asyncio.get_running_loop()
        self._accepted = accepted
        self._completed = completed
        self._receives = caps.max_recv_wr
        self._spin = settings.rdma_poll_spin_us / 1e6
        self._spin_until = 0.0
        self._spinning = False
        self.context: Context = open_context(settings.rdma_provider)
        self.pd: ProtectionDomain = self.context.alloc_pd()
        self.cq: CompletionQueue = self.context.create_cq(cq_depth)
        host = settings.rdma_host or settings.host
        self.listener: Listener = self.pd.listen(
            self.cq,
            caps,
            host=host,
            port=port,
            advertised_host=settings.rdma_advertised_host or settings.advertised_host or host,
        )
        self._stop = threading.Event()
        self._handoff = threading.Semaphore(HANDOFF_BATCHES)
        self._threads = [
            threading.Thread(target=self._accept_loop, name=f"{name}-accept", daemon=True)
        ]
        self._doorbell = self.cq.doorbell()
        if self._doorbell is None:
            self._threads.append(
                threading.Thread(target=self._poll_loop, name=f"{name}-poll", daemon=True)
            )
        else:
            self._loop.add_reader(self._doorbell.fd, self._rung)
        for thread in self._threads:
            thread.start()
        log.info("%s listening: %s", name, self.listener.conn_info.encode())

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                qp = self.listener.accept(timeout=THREAD_WAKE_SECONDS)
            except TimeoutError:
                continue
            except RdmaError as error:
                if not self._stop.is_set():
                    log.warning("%s: accept failed: %s", self.name, error)
                continue
            try:
                self._loop.call_soon_threadsafe(self._take_qp, qp)
            except RuntimeError:  # the loop closed under us: shutting down
                qp.close()
                return

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            try:
                completions = self.cq.poll(POLL_BATCH, timeout=THREAD_WAKE_SECONDS)
            except Exception:  # a provider fault must not stop every queue pair for good
                log.exception("%s: polling the completion queue failed", self.name)
                self._stop.wait(THREAD_WAKE_SECONDS)
                continue
            if not completions:
                continue
            while not self._handoff.acquire(timeout=THREAD_WAKE_SECONDS):
                if self._stop.is_set():
                    return
            try:
                self._loop.call_soon_threadsafe(self._take_completions, completions)
            except RuntimeError:  # the loop closed under us: shutting down
                return

    def _rung(self) -> None:
        assert self._doorbell is not None
        self._doorbell.heard()
        self._drain()

    def _drain(self) -> None:
        """Take what the queue holds, a batch per loop turn so other work interleaves;
        poll again next turn while the queue was full or the spin after the latest
        completion lasts."""
        completions = self.cq.poll(POLL_BATCH, timeout=0)
        for completion in completions:
            self._completed(completion)
        if self._stop.is_set():
            return
        now = time.monotonic()
        if completions:
            self._spin_until = now + self._spin
        if (len(completions) == POLL_BATCH or now < self._spin_until) and not self._spinning:
            self._spinning = True
            self._loop.call_soon(self._spun)

    def _spun(self) -> None:
        self._spinning = False
        os.sched_yield()  # spin on CPU no other process wants
        self._drain()

    def _take_qp(self, qp: QueuePair) -> None:
        if self._stop.is_set():
            qp.close()
            return
        try:
            for credit in range(self._receives):
                qp.post_recv(credit)
        except RdmaError as error:
            log.warning("%s queue pair %d: %s", self.name, qp.qp_num, error)
            qp.close()
            return
        self._accepted(qp)

    def _take_completions(self, completions: list[WorkCompletion]) -> None:
        try:
            for completion in completions:
                self._completed(completion)
        finally:
            self._handoff.release()

    async def close(self) -> None:
        """Stop the threads, then close the listener and the provider (the module has
        dropped its queue pairs and memory regions first)."""
        self._stop.set()
        if self._doorbell is not None:
            self._loop.remove_reader(self._doorbell.fd)
        for thread in self._threads:
            await asyncio.to_thread(thread.join)
        self.listener.close()
        self.context.close()
