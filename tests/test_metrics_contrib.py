"""What ships in contrib/ for ``scrapy-ha metrics``: the alert rules pass promtool's own check
and unit tests, and the rules and the Grafana dashboard name only metrics the exporter (the
real command, scraped over HTTP) exposes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.request import urlopen

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.test_metrics import exporter_factory  # noqa: F401 (a fixture)

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "contrib" / "prometheus" / "alerts.yml"
RULES_TEST = ROOT / "contrib" / "prometheus" / "alerts_test.yml"
DASHBOARD = ROOT / "contrib" / "grafana" / "scrapy-ha.json"
REFERENCE = ROOT / "docs" / "reference.md"
#: A metric name of ours in a PromQL expression.
METRIC = re.compile(r"\bscrapy_ha_[a-z0-9_]+")
#: The datasource every panel uses: an input the user picks when importing the dashboard.
DATASOURCE = "${DS_PROMETHEUS}"

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is missing: `make deps` installs Debian's prometheus package, which has it",
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], capture_output=True, text=True, timeout=120, cwd=RULES.parent
    )


@needs_promtool
def test_the_alert_rules_pass_promtool_check_rules():
    result = promtool("check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 14 rules found" in result.stdout


@needs_promtool
def test_the_alert_rules_pass_their_promtool_unit_tests():
    result = promtool("test", "rules", RULES_TEST.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_for_a_severity_a_summary_and_a_description():
    text = RULES.read_text()
    alerts = len(re.findall(r"^\s+- alert: ScrapyHA\w+$", text, re.M))
    assert alerts == 14
    for part in ("for", "severity", "summary", "description"):
        assert len(re.findall(rf"^\s+{part}: ", text, re.M)) == alerts, part


def exported_names(text: str) -> set[str]:
    """Every metric name an exposition defines, as a query names it (counters with _total)."""
    return {
        family.name + ("_total" if family.type == "counter" else "")
        for family in text_string_to_metric_families(text)
    }


def unknown_metrics(exprs: Iterable[str], exported: set[str]) -> set[str]:
    return {name for expr in exprs for name in METRIC.findall(expr)} - exported


@pytest.fixture
def exported(redis_url: str, exporter_factory: Any) -> Iterator[set[str]]:  # noqa: F811
    exporter = exporter_factory(redis_url)
    with urlopen(exporter.url, timeout=60) as response:
        yield exported_names(response.read().decode())


def test_the_reference_lists_every_metric_the_exporter_exposes(exported):
    metrics = REFERENCE.read_text().split("## Metrics", 1)[1]
    listed = set(re.findall(r"^\| `(scrapy_ha_[a-z_]+)` \|", metrics, re.M))
    assert listed == exported


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"]]
    return exprs


def test_the_rules_and_the_dashboard_name_only_metrics_the_exporter_exposes(exported):
    assert {"scrapy_ha_redis_up", "scrapy_ha_acked_total", "scrapy_ha_requests"} <= exported
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = dashboard_exprs(dashboard)
    assert len(exprs) > 10
    assert unknown_metrics(exprs, exported) == set()
    assert unknown_metrics([RULES.read_text()], exported) == set()
    # the check itself: a misspelt name is caught
    assert unknown_metrics(["rate(scrapy_ha_acked[5m])"], exported) == {"scrapy_ha_acked"}


def test_the_dashboard_imports_with_a_prometheus_input_and_a_spider_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    (variable,) = dashboard["templating"]["list"]
    assert variable["name"] == "spider" and variable["datasource"]["uid"] == DATASOURCE
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == DATASOURCE, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == DATASOURCE, panel["title"]
            crawl_metrics = [
                name
                for name in METRIC.findall(target["expr"])
                if not name.startswith("scrapy_ha_redis_")
            ]
            if crawl_metrics:  # the crawls chosen in the variable, not every crawl
                assert 'spider=~"$spider"' in target["expr"], panel["title"]
