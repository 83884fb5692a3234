"""`python -m directlog.kube.scale_down`: the broker container's preStop hook, which drains a
broker that is leaving the cluster for good.

The kubelet runs it in the broker container before it sends SIGTERM, whatever the reason the
pod stops. The hook tells a scale-down from a restart by asking the API server for the
broker StatefulSet's ``spec.replicas`` (``GET /apis/apps/v1/namespaces/<ns>/statefulsets/
<name>``, the name from ``STATEFULSET_NAME``; the ServiceAccount needs ``get`` on it):

- ordinal < replicas: a restart (rolling restart, eviction, node drain): exit 0 at once; the
  broker's own controlled shutdown on SIGTERM moves its leaderships away.
- ordinal >= replicas: the pod is leaving for good (``kubectl scale`` down). Every replica
  of this broker (node id = ordinal) is moved onto the brokers that stay, through
  `directlog brokers drain ID --wait`'s own code (directlog.admin.brokers.drain), against
  the broker's own listener, within ``--timeout`` seconds. Brokers leaving at the same time
  (ordinals >= replicas) get none of the replicas.

Exit codes: 0 done, a restart, or the API could not be read (treated as a restart: the
controlled shutdown still runs); 1 the drain was refused (a partition would be left with
fewer replicas than it has) or did not finish in time; 2 a bad command line or environment.
The kubelet stops the broker whatever the hook returns; on 1 the partitions the broker
still holds are under-replicated until it comes back or they are reassigned, which the
message says. A hook's output goes nowhere a user sees (a failed hook's FailedPreStopHook
event leaves it out), so everything is logged to stderr and to the broker's own log
(``--log-file``: the container's main process's stderr), which `kubectl logs` and log
collectors show.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys
import time
from pathlib import Path

from directlog.admin.brokers import DrainRefused, drain
from directlog.admin.output import Report
from directlog.admin.reassignment import InProgressError, WaitTimeout
from directlog.admin.session import AdminError, Session
from directlog.kube.api import (
    SERVICE_ACCOUNT_DIR,
    ApiError,
    ApiServer,
    get,
    statefulset_path,
)

log = logging.getLogger("directlog.kube.scale_down")

DEFAULT_TIMEOUT = 300.0  # seconds for the whole hook (the chart passes its own)
API_TIMEOUT = 10.0  # seconds to read the StatefulSet before treating the stop as a restart
REQUEST_TIMEOUT = 15.0  # bound on one Kafka request of the drain
RETRY_SECONDS = 1.0
MAIN_PROCESS_LOG = "/proc/1/fd/2"  # the container's own output, which `kubectl logs` shows

EXIT_OK, EXIT_NOT_DRAINED, EXIT_USAGE = 0, 1, 2


def ordinal_of(pod: str) -> int:
    """A StatefulSet pod's ordinal: the number after its last dash."""
    _, _, tail = pod.rpartition("-")
    if not tail.isdigit():
        raise ValueError(f"pod name {pod!r} does not end in -<ordinal>")
    return int(tail)


def desired_replicas(
    api: ApiServer, namespace: str, name: str, deadline: float
) -> tuple[int | None, str]:
    """The StatefulSet's spec.replicas, or None with the reason when it is not to be
    drained for (deleted or being deleted: the whole release goes). Read errors are
    retried until `deadline`, then raised (ApiError)."""
    path = statefulset_path(namespace, name)
    while True:
        try:
            document = get(
                api, path, timeout=max(0.5, min(API_TIMEOUT, deadline - time.monotonic()))
            )
            break
        except ApiError as error:
            if error.status == 404:
                return None, f"StatefulSet {namespace}/{name} does not exist (uninstalled?)"
            if error.status in (401, 403) or time.monotonic() + RETRY_SECONDS >= deadline:
                raise
            log.warning("%s; retrying", error)
            time.sleep(RETRY_SECONDS)
    metadata = document.get("metadata")
    if isinstance(metadata, dict) and metadata.get("deletionTimestamp"):
        return None, f"StatefulSet {namespace}/{name} is being deleted"
    spec = document.get("spec")
    if document.get("kind", "StatefulSet") != "StatefulSet" or not isinstance(spec, dict):
        raise ApiError(f"GET {path}: not a StatefulSet")
    replicas = spec.get("replicas", 1)  # the API's default
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise ApiError(f"GET {path}: spec.replicas is {replicas!r}")
    return replicas, ""


class _LogLines(io.StringIO):
    """A text stream whose lines go to the log (the drain's progress)."""

    def __init__(self) -> None:
        super().__init__()
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if line.strip():
                log.info("%s", line.strip())
        return len(text)


def _bootstrap(given: str | None) -> str:
    """The broker's own listener: --bootstrap-server, DIRECTLOG_BOOTSTRAP_SERVERS (the chart
    sets it when brokers listen on the pod's IP only), else the pod's advertised INTERNAL
    address (DIRECTLOG_ADVERTISED_HOST:DIRECTLOG_PORT), else 127.0.0.1:9092."""
    if given:
        return given
    if os.environ.get("DIRECTLOG_BOOTSTRAP_SERVERS"):
        return os.environ["DIRECTLOG_BOOTSTRAP_SERVERS"]
    host = os.environ.get("DIRECTLOG_ADVERTISED_HOST", "")
    port = os.environ.get("DIRECTLOG_PORT", "9092")
    return f"{host}:{port}" if host else f"127.0.0.1:{port}"


def drain_broker(
    broker: int,
    replicas: int,
    bootstrap: str,
    deadline: float,
    request_timeout: float = REQUEST_TIMEOUT,
) -> Report:
    """`directlog brokers drain BROKER --wait`, with the brokers that leave too (ids >=
    replicas) kept off, until `deadline`. A drain refused because another reassignment of
    the same partitions runs (a broker leaving beside this one) is planned again once that
    one is done. Returns the drain's report; raises its AdminError."""
    while True:
        timeout = max(1.0, min(request_timeout, deadline - time.monotonic()))
        with Session(bootstrap, timeout) as session:
            leaving = {b for b in session.cluster([]).brokers if b >= replicas and b != broker}
            if leaving:
                log.info(
                    "brokers %s are leaving too: none of the replicas go to them", sorted(leaving)
                )
            try:
                return drain(
                    session,
                    broker,
                    wait=True,
                    throttle=None,
                    progress=_LogLines(),
                    deadline=deadline,
                    keep_off=leaving,
                )
            except InProgressError as error:
                if time.monotonic() + RETRY_SECONDS * 2 >= deadline:
                    raise WaitTimeout(f"{error}, and still so at the deadline") from None
                log.info("%s; planning again in %.0f s", error, RETRY_SECONDS * 2)
        time.sleep(RETRY_SECONDS * 2)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m directlog.kube.scale_down",
        description="preStop hook: drain this broker when the StatefulSet is scaled below it",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="seconds for the whole hook, below the pod's terminationGracePeriodSeconds",
    )
    parser.add_argument("--pod", default=os.environ.get("POD_NAME"), help="this pod's name")
    parser.add_argument(
        "--statefulset",
        default=os.environ.get("STATEFULSET_NAME"),
        help="the broker StatefulSet's name (default: $STATEFULSET_NAME)",
    )
    parser.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE"),
        help="its namespace (default: $POD_NAMESPACE, else the ServiceAccount's)",
    )
    parser.add_argument(
        "--bootstrap-server",
        default=None,
        metavar="HOST:PORT",
        help="the broker's own listener (default: $DIRECTLOG_BOOTSTRAP_SERVERS, else "
        "$DIRECTLOG_ADVERTISED_HOST:$DIRECTLOG_PORT)",
    )
    parser.add_argument(
        "--log-file",
        default=MAIN_PROCESS_LOG,
        help="also log here, when it can be opened ('' for stderr only; default: the "
        "container's main process's stderr)",
    )
    parser.add_argument(
        "--service-account-dir", type=Path, default=SERVICE_ACCOUNT_DIR, help=argparse.SUPPRESS
    )
    return parser


def _setup_logging(log_file: str) -> None:
    formatter = logging.Formatter("%(asctime)s %(levelname)s scale_down: %(message)s")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        try:
            stream = open(log_file, "a", encoding="utf-8")  # noqa: SIM115 (the process's life)
        except OSError:
            stream = None  # not in the container (or not allowed): stderr only
        if stream is not None:
            handlers.append(logging.StreamHandler(stream))
    for handler in handlers:
        handler.setFormatter(formatter)
    logger = logging.getLogger("directlog.kube")
    logger.handlers[:] = handlers
    logger.setLevel(logging.INFO)
    logger.propagate = False
    # kafka-python logs connection trouble as it retries: what failed is logged once.
    logging.getLogger("kafka").setLevel(logging.CRITICAL)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_file)
    started = time.monotonic()
    deadline = started + args.timeout
    if not args.pod or not args.statefulset:
        log.error("POD_NAME and STATEFULSET_NAME (or --pod and --statefulset) are required")
        return EXIT_USAGE
    try:
        broker = ordinal_of(args.pod)
    except ValueError as error:
        log.error("%s", error)
        return EXIT_USAGE

    try:
        api = ApiServer.in_cluster(args.service_account_dir)
        namespace = args.namespace or api.namespace
        if not namespace:
            raise ApiError("no namespace: set POD_NAMESPACE or mount the ServiceAccount's")
        replicas, why = desired_replicas(
            api, namespace, args.statefulset, min(deadline, started + API_TIMEOUT)
        )
    except ApiError as error:
        log.warning(
            "cannot read the StatefulSet %s (%s): treated as a restart, broker %d is not "
            "drained (its controlled shutdown still moves its leaderships away)",
            args.statefulset,
            error,
            broker,
        )
        return EXIT_OK
    if replicas is None:
        log.info("%s: broker %d is not drained", why, broker)
        return EXIT_OK
    if broker < replicas:
        log.info(
            "broker %d stays (StatefulSet %s has %d replicas): a restart, no drain",
            broker,
            args.statefulset,
            replicas,
        )
        return EXIT_OK
    if replicas == 0:
        log.info("StatefulSet %s is scaled to 0: no broker stays to drain onto", args.statefulset)
        return EXIT_OK

    bootstrap = _bootstrap(args.bootstrap_server)
    log.info(
        "broker %d is leaving (StatefulSet %s scaled to %d): draining it through %s, "
        "for at most %.0f s",
        broker,
        args.statefulset,
        replicas,
        bootstrap,
        deadline - time.monotonic(),
    )
    stops_anyway = (
        f"the partitions broker {broker} still holds are under-replicated once it stops "
        f"(their ISR lacks it; `directlog brokers list` shows broker {broker} down with "
        "replicas, `directlog topics describe` their ISRs, and the "
        "DirectlogUnderReplicatedPartitions alert fires) until it comes back (scale up "
        "again: its volume is kept) or they are reassigned (`directlog reassign`)"
    )
    try:
        # Leave the last request's bound: a request started just before the deadline ends
        # before it.
        request_timeout = min(REQUEST_TIMEOUT, max(1.0, args.timeout / 4))
        report = drain_broker(
            broker, replicas, bootstrap, deadline - request_timeout, request_timeout
        )
    except DrainRefused as error:
        log.error(
            "drain of broker %d refused: %s. It stops anyway: %s", broker, error, stops_anyway
        )
        return EXIT_NOT_DRAINED
    except WaitTimeout as error:
        log.error(
            "drain of broker %d not done within %.0f s: %s. It stops anyway; the moves "
            "keep running without it (`directlog reassign list`), and until they are done %s",
            broker,
            args.timeout,
            error,
            stops_anyway,
        )
        return EXIT_NOT_DRAINED
    except AdminError as error:
        log.error("drain of broker %d failed: %s. It stops anyway: %s", broker, error, stops_anyway)
        return EXIT_NOT_DRAINED
    except Exception as error:  # a client or network failure: say what, not a traceback
        if not type(error).__module__.startswith("kafka"):
            raise
        log.error("drain of broker %d failed: %s. It stops anyway: %s", broker, error, stops_anyway)
        return EXIT_NOT_DRAINED
    for note in report.notes:
        log.info("%s", note)
    log.info("broker %d drained in %.0f s", broker, time.monotonic() - started)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
