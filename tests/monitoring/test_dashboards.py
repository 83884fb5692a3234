"""The Grafana dashboards the Helm chart ships (deploy/helm/directlog/dashboards/) and the
third-party dashboards Kafka users already run (third_party_queries.py), against a real
Prometheus scraping a real cluster under produce and consume load (conftest.py's
`monitored`: RDMA produce, consume and push replication on shm, a tiered topic read back from
offset 0, consumer groups).

Every panel query of every dashboard, with its template variables filled the way Grafana
fills them (each variable's own query run first: `label_values(...)` through the label
values API, `query_result(...)` as an instant query whose lines the variable's regex picks
from; "All" becomes the variable's all-value or Grafana's `(a|b|c)` of every value; a window
for `$__rate_interval`), must return at least one series with a value that is a number (not
NaN), within a deadline while the load runs. Then the key numbers: the bytes in per topic
are the record batch bytes the partitions hold, and the lag per partition is what the group
has not committed.

Dashboards' structure (Grafana's JSON model, the datasource variable, unique ids, every
variable a query uses defined) is checked without a cluster.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import eventually
from tests.e2e.service_process import REPO_ROOT
from tests.monitoring.conftest import LAGGED, LAGGED_GROUP, NAMESPACE, RATE_WINDOW, Monitored
from tests.monitoring.prometheus import Prometheus
from tests.monitoring.third_party_queries import DASHBOARDS as THIRD_PARTY
from tests.monitoring.third_party_queries import EXCLUDED, Dashboard, Variable

pytestmark = pytest.mark.timeout(600)

DASHBOARD_DIR = REPO_ROOT / "deploy" / "helm" / "directlog" / "dashboards"
DASHBOARD_FILES = sorted(DASHBOARD_DIR.glob("*.json"))
DEADLINE = 150.0  # seconds for every query of one dashboard to return data
RETRY_PAUSE = 2.0
LOOKBACK = 600  # seconds of series a label_values() variable query looks at
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Grafana's built-in variables a query may use, and what the tests put there.
BUILTINS = {"__rate_interval": RATE_WINDOW, "__interval": RATE_WINDOW, "__range": "5m"}
# Characters Grafana escapes in a value it puts into a regex (prometheusSpecialRegexEscape).
REGEX_SPECIAL = re.compile(r"[$^*{}\[\]'+?.()|\\]")
LABEL_VALUES = re.compile(r"^label_values\((?:(.+),\s*)?([a-zA-Z_][a-zA-Z0-9_]*)\)\s*$", re.S)
QUERY_RESULT = re.compile(r"^query_result\((.+)\)\s*$", re.S)
VARIABLE_REF = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


# The dashboards' JSON -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Query:
    panel: str  # its title, under its row's
    ref: str
    expr: str


def load(path: Path) -> dict[str, Any]:
    board = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(board, dict)
    return board


def walk(panels: list[dict[str, Any]], row: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(row title, panel) of every panel: the top level, rows' nested (collapsed) panels,
    and the `rows` of the old model."""
    for panel in panels:
        if panel.get("type") == "row":
            row = str(panel.get("title", ""))
        yield row, panel
        yield from walk(panel.get("panels", []), row)


def all_panels(board: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = list(walk(board.get("panels", [])))
    for row in board.get("rows", []):  # schemaVersion < 16
        found += list(walk(row.get("panels", []), str(row.get("title", ""))))
    return found


def panel_queries(board: dict[str, Any]) -> list[Query]:
    return [
        Query(
            f"{row} / {panel.get('title', '')}" if row else str(panel.get("title", "")),
            str(target.get("refId", "")),
            str(target["expr"]),
        )
        for row, panel in all_panels(board)
        for target in panel.get("targets", [])
        if target.get("expr")
    ]


def query_variables(board: dict[str, Any]) -> list[Variable]:
    """The dashboard's query variables, in order (a variable may use those before it)."""
    found = []
    for var in board.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        found.append(
            Variable(
                name=var["name"],
                query=str(query or var.get("definition", "")),
                regex=str(var.get("regex") or ""),
                include_all=bool(var.get("includeAll")),
                all_value=var.get("allValue") or None,
                multi=bool(var.get("multi")),
            )
        )
    return found


def panel_expr(board: dict[str, Any], title: str, ref: str = "A") -> str:
    """The expression of the target `ref` of the panel called `title`."""
    for _, panel in all_panels(board):
        if panel.get("title") == title:
            for target in panel.get("targets", []):
                if target.get("refId") == ref:
                    return str(target["expr"])
    raise AssertionError(f"{board.get('uid')}: no panel {title!r} with a target {ref}")


# Grafana's templating ------------------------------------------------------------------------


def interpolate(text: str, values: Mapping[str, str]) -> str:
    """`text` with $name, ${name}, ${name:format} and [[name]] replaced, as Grafana does;
    an unknown name stays (the query then fails, naming it)."""

    def replace(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        if name in BUILTINS:
            return BUILTINS[name]
        return values.get(name, match.group(0))

    return VARIABLE_REF.sub(replace, text)


def grafana_line(series: Mapping[str, Any]) -> str:
    """A query_result() line as Grafana's Prometheus data source writes it:
    name{label="value",...} value timestamp_ms."""
    labels = dict(series["metric"])
    name = labels.pop("__name__", "")
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    at, value = series["value"]
    return f"{name}{{{inner}}} {value} {int(float(at) * 1000)}"


def variable_options(prometheus: Prometheus, var: Variable, values: Mapping[str, str]) -> list[str]:
    """What the variable's dropdown would list now."""
    query = interpolate(var.query, values)
    if match := LABEL_VALUES.match(query):
        selector, label = match.groups()
        params = {"start": str(time.time() - LOOKBACK)}
        if selector:
            params["match[]"] = selector.strip()
        found = [str(v) for v in prometheus.api(f"label/{label}/values", **params)]
    elif match := QUERY_RESULT.match(query):
        found = [grafana_line(series) for series in prometheus.query(match.group(1))]
    else:
        raise AssertionError(f"variable {var.name}: a query the tests cannot run: {query}")
    if var.regex:
        body = interpolate(var.regex, values)
        if body.startswith("/"):
            body = body[1 : body.rindex("/")]
        pattern = re.compile(body)
        picked = []
        for text in found:
            if match := pattern.search(text):
                picked.append(match.group(1) if pattern.groups else match.group(0))
        found = picked
    return sorted(set(found))


def selected(var: Variable, options: list[str]) -> str:
    """What Grafana puts in the queries for `var` with "All" selected (the first option
    where there is no "All")."""
    if var.include_all:
        if var.all_value is not None:
            return var.all_value
        return "(" + "|".join(REGEX_SPECIAL.sub(r"\\\\\g<0>", o) for o in options) + ")"
    return options[0]


def resolve(prometheus: Prometheus, variables: list[Variable]) -> tuple[dict[str, str], list[str]]:
    """Each variable's value, and the variables whose query found nothing."""
    values: dict[str, str] = {}
    empty = []
    for var in variables:
        options = variable_options(prometheus, var, values)
        if not options:
            empty.append(f"variable {var.name}: {interpolate(var.query, values)} found nothing")
            continue
        values[var.name] = selected(var, options)
    return values, empty


# Checking queries ----------------------------------------------------------------------------


class BadQuery(Exception):
    """Prometheus refused the query: no amount of waiting helps."""


def no_data(prometheus: Prometheus, expr: str) -> str | None:
    """Why `expr` returns no data now, or None when it returns a series with a number."""
    try:
        result = prometheus.query(expr)
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:400]
        if error.code == 400:
            raise BadQuery(f"refused: {detail}") from error
        return f"HTTP {error.code}: {detail}"
    if not result:
        return "no series"
    if all(math.isnan(float(series["value"][1])) for series in result):
        return f"only NaN ({len(result)} series)"
    return None


def check_queries(
    prometheus: Prometheus, name: str, variables: list[Variable], queries: list[Query]
) -> None:
    """Until every query returns data, or DEADLINE: then fail naming each that does not."""
    assert queries, f"{name}: no queries"
    deadline = time.monotonic() + DEADLINE
    pending = list(queries)
    while True:
        values, failures = resolve(prometheus, variables)
        still = []
        for query in pending:
            expr = interpolate(query.expr, values)
            try:
                reason = no_data(prometheus, expr)
            except BadQuery as error:
                pytest.fail(f"{name}: panel {query.panel!r} {query.ref}: {error}\n  {expr}")
            if reason is not None:
                still.append(query)
                failures.append(f"panel {query.panel!r} {query.ref}: {reason}\n    {expr}")
        pending = still
        if not failures:
            return
        if time.monotonic() > deadline:
            pytest.fail(
                f"{name}: no data after {DEADLINE} s ({len(pending)} of {len(queries)} "
                "queries failing):\n  " + "\n  ".join(failures),
                pytrace=False,
            )
        time.sleep(RETRY_PAUSE)


# The dashboards as Grafana reads them (no cluster) -------------------------------------------


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_dashboard_is_a_grafana_dashboard(path: Path) -> None:
    board = load(path)
    assert board["uid"] == path.stem and len(board["uid"]) <= 40
    assert board["title"].startswith("Directlog / ")
    assert "directlog" in board["tags"]
    assert board["schemaVersion"] == 39
    assert board.get("id") is None  # Grafana gives the id when it stores the dashboard
    variables = board["templating"]["list"]
    names = [v["name"] for v in variables]
    assert len(set(names)) == len(names), names
    (datasource,) = [v for v in variables if v["type"] == "datasource"]
    assert datasource["name"] == "datasource" and datasource["query"] == "prometheus"
    for var in variables:
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE, var["name"]

    panels = all_panels(board)
    ids = [panel["id"] for _, panel in panels]
    assert len(set(ids)) == len(ids), f"panel ids repeat: {ids}"
    for _, panel in panels:
        position = panel["gridPos"]
        assert position["x"] >= 0 and position["w"] >= 1 and position["x"] + position["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel.get("description"), panel["title"]
        assert panel["datasource"] == DATASOURCE, panel["title"]
        targets = panel["targets"]
        assert targets and all(t.get("expr") for t in targets), panel["title"]
        refs = [t["refId"] for t in targets]
        assert len(set(refs)) == len(refs), panel["title"]
        assert all(t["datasource"] == DATASOURCE for t in targets), panel["title"]
    # No two panels share a cell.
    cells = [
        (x, y)
        for _, panel in panels
        for x in range(panel["gridPos"]["x"], panel["gridPos"]["x"] + panel["gridPos"]["w"])
        for y in range(panel["gridPos"]["y"], panel["gridPos"]["y"] + panel["gridPos"]["h"])
    ]
    assert len(set(cells)) == len(cells), "panels overlap"

    # Every variable a query or another variable uses is defined (before its user).
    defined: set[str] = {"datasource", *BUILTINS}
    for var in query_variables(board):
        used = {next(g for g in m.groups() if g) for m in VARIABLE_REF.finditer(var.query)}
        assert used <= defined, f"variable {var.name} uses {used - defined}"
        defined.add(var.name)
    for query in panel_queries(board):
        used = {next(g for g in m.groups() if g) for m in VARIABLE_REF.finditer(query.expr)}
        assert used <= defined, f"{query.panel} {query.ref} uses {used - defined}"


def test_every_dashboard_the_issue_asks_for_is_shipped() -> None:
    assert {p.name for p in DASHBOARD_FILES} >= {
        "directlog-cluster.json",
        "directlog-consumer-groups.json",
        "directlog-consensus.json",
        "directlog-rdma.json",
        "directlog-tiering.json",
    }
    uids = [load(p)["uid"] for p in DASHBOARD_FILES]
    assert len(set(uids)) == len(uids)


def test_interpolation_is_grafanas() -> None:
    multi = Variable("pod", "label_values(up, pod)", include_all=True, multi=True)
    assert selected(multi, ["a-0", "a.1"]) == r"(a-0|a\\.1)"
    assert selected(Variable("t", "q", include_all=True, all_value=".+"), ["x"]) == ".+"
    assert selected(Variable("job", "q"), ["b", "c"]) == "b"
    text = 'rate(x{pod=~"$pod", t="${t}", u="[[u]]"}[$__rate_interval])'
    assert interpolate(text, {"pod": "(a|b)", "t": "x", "u": "y"}) == (
        f'rate(x{{pod=~"(a|b)", t="x", u="y"}}[{RATE_WINDOW}])'
    )
    line = grafana_line({"metric": {"__name__": "m", "b": "2", "a": "1"}, "value": [1.5, "3"]})
    assert line == 'm{a="1",b="2"} 3 1500'


# Against the cluster ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_every_panel_query_returns_data(monitored: Monitored, path: Path) -> None:
    board = load(path)
    check_queries(monitored.prometheus, board["uid"], query_variables(board), panel_queries(board))
    assert not monitored.load.errors, monitored.load.errors[:10]


def third_party_queries(dashboard: Dashboard) -> list[Query]:
    return [
        Query(panel.title, chr(ord("A") + i), expr)
        for panel in dashboard.panels
        for i, expr in enumerate(panel.exprs)
    ]


@pytest.mark.parametrize("dashboard", THIRD_PARTY, ids=lambda d: d.name)
def test_third_party_dashboard_queries_return_data(
    monitored: Monitored, dashboard: Dashboard
) -> None:
    """Strimzi's Kafka dashboard and the Kafka Exporter Overview, with the labels a
    Kubernetes scrape gives (the fixture's targets carry them) and the Kafka Exporter's one
    instance; their JVM, container and volume panels are left out (EXCLUDED)."""
    assert not {p.title for p in dashboard.panels} & set(EXCLUDED[dashboard.name])
    check_queries(
        monitored.prometheus,
        dashboard.name,
        list(dashboard.variables),
        third_party_queries(dashboard),
    )


def test_third_party_variables_pick_the_cluster(monitored: Monitored) -> None:
    """The dropdowns of the Strimzi dashboard list what a Strimzi cluster's would: the
    namespace, the cluster, the brokers by their pod names' suffix; the Kafka Exporter's one
    instance."""
    prometheus = monitored.prometheus
    strimzi, exporter = THIRD_PARTY
    options: dict[str, list[str]] = {}
    values: dict[str, str] = {}
    for var in strimzi.variables:
        options[var.name] = variable_options(prometheus, var, values)
        values[var.name] = selected(var, options[var.name])
    assert options["kubernetes_namespace"] == [NAMESPACE]
    assert options["strimzi_cluster_name"] == ["directlog"]
    assert options["kafka_broker"] == [f"broker-{i}" for i in range(3)]
    assert LAGGED in options["kafka_topic"]
    values = {}
    for var in exporter.variables:
        options[var.name] = variable_options(prometheus, var, values)
        values[var.name] = selected(var, options[var.name])
    assert options["instance"] == ["directlog"]
    assert LAGGED in options["topic"] and "__consumer_offsets" not in options["topic"]


# What the load must move (a value above 0), by dashboard, panel title and target.
MOVED_BY_LOAD = (
    ("directlog-cluster", "Bytes in per topic", "A"),
    ("directlog-cluster", "Bytes out per topic", "A"),
    ("directlog-cluster", "Messages in per topic", "A"),
    ("directlog-cluster", "Replication traffic per broker", "A"),
    ("directlog-cluster", "Requests by API", "A"),
    ("directlog-consumer-groups", "Consumption rate", "A"),
    ("directlog-consumer-groups", "Members", "A"),
    ("directlog-consensus", "Transactions applied", "A"),
    ("directlog-rdma", "RDMA produce writes per topic", "A"),
    ("directlog-rdma", "RDMA consumers", "A"),
    ("directlog-rdma", "Registered segments", "A"),
    ("directlog-rdma", "Metadata slot writes per topic", "A"),
    ("directlog-rdma", "Push channels per topic", "A"),
    ("directlog-rdma", "Bytes pushed per topic", "A"),
    ("directlog-tiering", "Copy rate", "A"),
    ("directlog-tiering", "Copy latency", "B"),
    ("directlog-tiering", "Remote log size", "A"),
    ("directlog-tiering", "Remote fetch rate", "A"),
    ("directlog-tiering", "Remote fetch bytes", "A"),
    ("directlog-tiering", "Remote read latency", "B"),
)


def test_the_load_shows_on_the_datapath_panels(monitored: Monitored) -> None:
    """The panels of what the load does (TCP and RDMA produce and consume, push
    replication, remote copies and reads, group commits) show it: some series above 0."""
    prometheus = monitored.prometheus
    boards = {uid: load(DASHBOARD_DIR / f"{uid}.json") for uid, _, _ in MOVED_BY_LOAD}
    deadline = time.monotonic() + DEADLINE
    pending = list(MOVED_BY_LOAD)
    while True:
        still = []
        for uid, title, ref in pending:
            values, _ = resolve(prometheus, query_variables(boards[uid]))
            expr = interpolate(panel_expr(boards[uid], title, ref), values)
            found = [v for v in prometheus.values(expr).values() if not math.isnan(v)]
            if not found or max(found) <= 0:
                still.append((uid, title, ref))
        pending = still
        if not pending:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"panels showing nothing of the load after {DEADLINE} s: {pending}")
        time.sleep(RETRY_PAUSE)


# The numbers -------------------------------------------------------------------------------


def chosen(prometheus: Prometheus, board: dict[str, Any], **picked: str) -> dict[str, str]:
    """The dashboard's variables with "All" selected, but those in `picked`."""
    values, empty = resolve(prometheus, query_variables(board))
    assert not empty, empty
    assert values["namespace"] == NAMESPACE
    return values | picked


def by_label(result: dict[tuple[tuple[str, str], ...], float], label: str) -> dict[str, float]:
    return {dict(key)[label]: value for key, value in result.items()}


def test_bytes_in_per_topic_are_the_bytes_the_partitions_hold(monitored: Monitored) -> None:
    """LAGGED's producers' bytes, summed over the brokers as the cluster dashboard sums
    them, are the record batch bytes in its segment files; its records, the records sent."""
    prometheus = monitored.prometheus
    selector = f'namespace="{NAMESPACE}", topic=~"{LAGGED}"'
    stored = sum(monitored.stored_bytes.values())
    produced = sum(monitored.produced.values())

    def counted() -> None:
        found = prometheus.values(
            f"sum by (topic) (kafka_server_brokertopicmetrics_bytesin_total{{{selector}}})"
        )
        assert by_label(found, "topic") == {LAGGED: stored}
        found = prometheus.values(
            f"sum by (topic) (kafka_server_brokertopicmetrics_messagesin_total{{{selector}}})"
        )
        assert by_label(found, "topic") == {LAGGED: produced}

    eventually(counted, "bytes and messages in", 60.0, interval=1.0)
    # The dashboard's rate of it: the topic gets nothing more, so 0, and a series.
    board = load(DASHBOARD_DIR / "directlog-cluster.json")
    values = chosen(prometheus, board, topic=LAGGED)
    expr = interpolate(panel_expr(board, "Bytes in per topic"), values)
    assert by_label(prometheus.values(expr), "topic") == {LAGGED: 0.0}


def test_consumer_lag_is_what_the_group_has_not_committed(monitored: Monitored) -> None:
    """The consumer groups dashboard's panels for LAGGED_GROUP on LAGGED: per partition, the
    records produced less the offset committed; summed per topic and in total; committed
    and end offsets beside each other."""
    prometheus = monitored.prometheus
    board = load(DASHBOARD_DIR / "directlog-consumer-groups.json")
    values = chosen(prometheus, board, consumergroup=LAGGED_GROUP, topic=LAGGED)
    produced, committed = monitored.produced, monitored.committed
    lag = {str(p): float(produced[p] - committed[p]) for p in produced}

    def run(title: str, ref: str = "A") -> dict[tuple[tuple[str, str], ...], float]:
        return prometheus.values(interpolate(panel_expr(board, title, ref), values))

    def shown() -> None:
        assert by_label(run("Lag per partition"), "partition") == lag
        assert by_label(run("Lag per group and topic"), "topic") == {LAGGED: sum(lag.values())}
        assert list(run("Total lag").values()) == [sum(lag.values())]
        assert by_label(run("Committed offsets and end offsets"), "partition") == {
            str(p): float(o) for p, o in committed.items()
        }
        assert by_label(run("Committed offsets and end offsets", "B"), "partition") == {
            str(p): float(n) for p, n in produced.items()
        }
        assert list(run("Partitions without a commit").values()) == [0.0]

    eventually(shown, f"{LAGGED_GROUP}'s lag", 60.0, interval=1.0)
    # The Kafka Exporter dashboard's lag panel agrees.
    exporter = THIRD_PARTY[1]
    (lag_panel,) = [p for p in exporter.panels if p.title.startswith("Lag by")]
    expr = interpolate(lag_panel.exprs[0], {"instance": "directlog", "topic": LAGGED})
    found = prometheus.values(expr)
    assert by_label(found, "consumergroup")[LAGGED_GROUP] == sum(lag.values())
