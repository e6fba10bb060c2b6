"""monitoring/: the Grafana dashboard and the alert rules name only metrics the library
exports, read from a real /metrics exposition (tests/metrics_scrape.py, in a process of its
own), and the dashboard shows every one of them. promtool runs the rules' own unit tests in
.ci/run (stage alerts)."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "monitoring"
SCRAPE = Path(__file__).resolve().parent / "metrics_scrape.py"

# What PromQL writes that is not a metric name.
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "and"})
_KEYWORDS |= {"or", "unless", "bool", "offset", "inf", "nan"}
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPINGS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_VARIABLES = re.compile(r"\$\w+")
_NAME = re.compile(r"[A-Za-z_:][\w:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (Grafana's label_values(METRIC, label) too)."""
    text = _VARIABLES.sub("", _STRINGS.sub('""', expr))
    label_values = re.fullmatch(r"\s*label_values\(\s*([A-Za-z_:][\w:]*)\s*,.*\)\s*", text)
    if label_values:
        return {label_values.group(1)}
    text = _GROUPINGS.sub(" ", _RANGES.sub(" ", _MATCHERS.sub(" ", text)))
    names = set()
    for found in _NAME.finditer(text):
        following = text[found.end() :].lstrip()
        if following.startswith("(") or found.group().lower() in _KEYWORDS:
            continue  # a function or an operator
        names.add(found.group())
    return names


@functools.cache
def exported() -> frozenset[str]:
    """Every series name /metrics serves after a little of everything, plus Prometheus' own
    ``up``."""
    folder = Path(subprocess.check_output(["mktemp", "-d"], text=True).strip())
    done = subprocess.run(
        [sys.executable, str(SCRAPE), str(folder)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    names = {"up"}
    for line in done.stdout.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return frozenset(names)


def dashboard_queries() -> list[str]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    queries = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]
    queries += [v["query"] for v in dashboard["templating"]["list"] if v.get("type") == "query"]
    return queries


def test_the_scrape_has_every_instrument_the_library_defines() -> None:
    names = exported()
    for family in (
        "inbox_processed_total",
        "inbox_duplicates_total",
        "inbox_failures_total",
        "inbox_retries_total",
        "inbox_dead_letters_total",
        "inbox_effects_total",
        "inbox_outbox_sent_total",
        "inbox_outbox_refused_total",
        "messaging_client_consumed_messages_total",
        "inbox_claim_duration_seconds_bucket",
        "inbox_handler_duration_seconds_bucket",
        "inbox_message_age_seconds_bucket",
        "messaging_process_duration_seconds_bucket",
        "inbox_worker_ready",
        "inbox_outbox_pending",
        "inbox_outbox_oldest_age_seconds",
    ):
        assert family in names


def test_every_dashboard_query_names_only_exported_metrics() -> None:
    names = exported()
    queries = dashboard_queries()
    assert queries
    for query in queries:
        read = metric_names(query)
        assert read, f"no metric in {query!r}"
        assert read <= names, f"{query!r} reads {sorted(read - names)}, which /metrics lacks"


def test_the_dashboard_shows_every_inbox_metric() -> None:
    shown = set().union(*(metric_names(q) for q in dashboard_queries()))
    inbox_series = {
        re.sub(r"_(bucket|sum|count)$", "_bucket", name)
        for name in exported()
        if name.startswith(("inbox_", "messaging_"))
    }
    assert inbox_series <= shown, f"not on the dashboard: {sorted(inbox_series - shown)}"


def test_the_alert_rules_and_their_tests_name_only_exported_metrics() -> None:
    names = exported()
    rules = (MONITORING / "alerts.yml").read_text()
    exprs = re.findall(r"^\s+expr: (.+)$", rules, re.MULTILINE)
    assert len(exprs) >= 6
    for expr in exprs:
        read = metric_names(expr)
        assert read, expr
        assert read <= names, f"{expr!r} reads {sorted(read - names)}, which /metrics lacks"
    tests = (MONITORING / "alerts_test.yml").read_text()
    series = re.findall(r"^\s+- series: ([A-Za-z_:][\w:]*)\{", tests, re.MULTILINE)
    assert series
    assert set(series) <= names


def test_the_query_reader_finds_metrics_not_labels_or_functions() -> None:
    assert metric_names(
        'histogram_quantile(0.99, sum by (le, inbox_handler) (rate(x_bucket{job=~"$job"}[5m])))'
    ) == {"x_bucket"}
    assert metric_names("a_total / ignoring(reason) b_total > 0") == {"a_total", "b_total"}
    assert metric_names("label_values(inbox_worker_ready, job)") == {"inbox_worker_ready"}
