"""Run Scrapy's own scheduler and engine tests with ``scrapy_ha.Scheduler`` swapped in.

Everything Scrapy-specific here comes from Scrapy's root ``conftest.py`` (fixtures
``mockserver``, ``reactor_pytest``, ``fast_engine_heartbeat``, its markers and warning
filters). The one scrapy-ha addition is :func:`scrapy_ha_scheduler`: every crawler any
test builds gets ``SCHEDULER = "scrapy_ha.Scheduler"`` and a flushed Redis database, as
Scrapy's defaults, so a test that picks its own scheduler keeps it. See README.md.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
import scrapy
from packaging.version import Version
from scrapy.core.engine import ExecutionEngine
from scrapy.settings import default_settings

from tests.dupefilter import dupefilter_settings
from tests.scrapy_conformance.differences import NOT_APPLICABLE, TIMING_DEPENDENT, XFAIL
from tests.scrapy_conformance.scheduler_under_test import BASELINE_ENV

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.scrapy_conformance.mockserver.http import MockServer

#: The copied tests are Scrapy 2.19's: they use APIs older Scrapy versions lack (tox's
#: scrapy216 environment runs the rest of the suite without them).
if Version(scrapy.__version__) < Version("2.19"):
    collect_ignore_glob = ["test_*.py"]

#: What a user switching to scrapy-ha sets, plus the Redis of the test.
SCRAPY_HA_DEFAULTS = {
    "SCHEDULER": "scrapy_ha.Scheduler",
    # One worker and no peers: Scrapy closes an idle crawl at once; scrapy-ha's default
    # 5 s wait for other workers' leases would only add 5 s to every crawl here.
    "HA_IDLE_TIMEOUT": 0,
    # Scrapy's tests crawl data: URLs; scrapy-ha queues and fetches from Redis only the
    # schemes a crawl allows (http and https by default), as a user crawling them would set.
    "HA_ALLOWED_SCHEMES": ["http", "https", "data"],
}

#: Scrapy's own warning filters (its pyproject.toml) for what its tests leave behind.
SCRAPY_WARNING_FILTERS = (
    "ignore::DeprecationWarning:twisted.web.static",
    "ignore:.*<socket\\.socket fd=:pytest.PytestUnraisableExceptionWarning",
    "ignore:.*<function (_SelectorTransport|_ProactorBasePipeTransport|_ProactorSocketTransport"
    "|BaseEventLoop)\\.__del__:pytest.PytestUnraisableExceptionWarning",
    "ignore:.*<function connect\\.<locals>\\.remove:pytest.PytestUnraisableExceptionWarning",
    # The tests were written before Scrapy 2.19 renamed RANDOMIZE_DOWNLOAD_DELAY and the
    # randomize_delay slot parameter (jitter): same meaning, new names, a deprecation warning.
    "ignore:.*(RANDOMIZE_DOWNLOAD_DELAY|randomize_delay).* deprecated"
    ":scrapy.exceptions.ScrapyDeprecationWarning",
)

SCRAPY_MARKERS = (
    "only_asyncio: marks tests that require the asyncio loop to be used",
    "only_not_asyncio: marks tests that require the asyncio loop to not be used",
    "requires_reactor: marks tests that require a reactor",
    "requires_internet: marks tests that need real Internet access",
)


@pytest.fixture(autouse=True)
def scrapy_ha_scheduler(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Make scrapy-ha the default scheduler of every crawler, on a flushed Redis DB."""
    settings = {**SCRAPY_HA_DEFAULTS, **dupefilter_settings(), "REDIS_URL": redis_url}
    if os.environ.get(BASELINE_ENV) == "1":  # Scrapy's own scheduler, to compare
        settings = {"REDIS_URL": redis_url}
    for name, value in settings.items():
        monkeypatch.setattr(default_settings, name, value, raising=False)
    return redis_url


@pytest.fixture(autouse=True)
def fast_engine_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scrapy's: shorten the interval at which the engine checks for work while idle."""
    monkeypatch.setattr(ExecutionEngine, "_SLOT_HEARTBEAT_INTERVAL", 0.1)


@pytest.fixture(scope="session")
def mockserver() -> Iterator[MockServer]:
    from tests.scrapy_conformance.mockserver.http import MockServer  # needs Scrapy 2.19

    with MockServer() as server:
        yield server


@pytest.fixture(scope="session")
def reactor_pytest(request: pytest.FixtureRequest) -> str:
    return str(request.config.getoption("--reactor"))


def pytest_configure(config: pytest.Config) -> None:
    for marker in SCRAPY_MARKERS:
        config.addinivalue_line("markers", marker)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    baseline = os.environ.get(BASELINE_ENV) == "1"
    for item in items:
        if "scrapy_conformance/" not in item.nodeid:
            continue
        for spec in SCRAPY_WARNING_FILTERS:
            item.add_marker(pytest.mark.filterwarnings(spec))
        if baseline:
            continue
        test_id = item.nodeid.split("scrapy_conformance/", 1)[1]
        if test_id in XFAIL:
            strict = test_id not in TIMING_DEPENDENT
            item.add_marker(pytest.mark.xfail(strict=strict, reason=XFAIL[test_id]))
        elif test_id in NOT_APPLICABLE:
            item.add_marker(pytest.mark.skip(reason=NOT_APPLICABLE[test_id]))


def pytest_collection_finish(session: pytest.Session) -> None:
    """A renamed or removed test must not leave a stale line in differences.py."""
    config = session.config
    if config.option.keyword or config.option.markexpr or any("::" in a for a in config.args):
        return  # a selection: absent tests are not stale
    seen = {
        item.nodeid.split("scrapy_conformance/", 1)[1]
        for item in session.items
        if "scrapy_conformance/" in item.nodeid
    }
    files = {name.split("::")[0] for name in seen}
    stale = [
        name
        for name in (*XFAIL, *NOT_APPLICABLE)
        if name.split("::")[0] in files and name not in seen
    ]
    if stale:
        raise pytest.UsageError(
            f"tests/scrapy_conformance/differences.py names tests that do not exist: {stale}"
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Scrapy's reactor and network markers."""
    reactor = item.config.getoption("--reactor")
    if item.get_closest_marker("only_not_asyncio") and reactor in {"asyncio", "none"}:
        pytest.skip('This test is only run when the --reactor value is not "asyncio"')
    if item.get_closest_marker("only_asyncio") and reactor not in {"asyncio", "none"}:
        pytest.skip('This test is only run when the --reactor value is "asyncio"')
    if item.get_closest_marker("requires_internet"):
        pytest.skip("needs real Internet access, which the conformance suite does not use")
