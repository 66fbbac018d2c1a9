"""A startup node of a Redis Cluster that hangs (its process stopped: the kernel accepts
the connection, nothing answers) beside nodes that answer. redis-py asks its startup
nodes for the cluster's layout one after the other, each within the whole socket timeout,
in a random order: a command, a worker's start or the exporter whose turn fell on the
hung node first failed within the connect timeout, or waited 15 s, though the cluster
answered (a QA run: ``scrapy-ha status`` failed 2 times in 6 with one master of three
frozen after its replica had taken over)."""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING

import pytest
from redis.cluster import ClusterNode
from scrapy.settings import Settings

from scrapy_ha.store.answering import answering_startup_nodes
from scrapy_ha.store.connection import (
    check_reachable,
    redis_from_settings,
    sync_redis_from_settings,
)
from tests import redis_servers
from tests.cli_seed import _run, scrapy_ha

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

#: Lookups made: each asks the hung node first half the time (redis-py's order).
LOOKUPS = 12


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis_servers.Cluster]:
    found = redis_servers.start_cluster(tmp_path_factory.mktemp("cluster"), replicas=0)
    yield found
    found.stop()


@pytest.fixture
def hung(tmp_path: Path) -> Iterator[redis_servers.Server]:
    """A redis-server stopped (SIGSTOP): it accepts connections and answers nothing."""
    server = redis_servers.start(tmp_path / "hung")
    os.kill(server.proc.pid, signal.SIGSTOP)
    yield server
    os.kill(server.proc.pid, signal.SIGCONT)
    server.kill()


def _url(hung: redis_servers.Server, cluster: redis_servers.Cluster) -> str:
    return f"redis+cluster://127.0.0.1:{hung.port},127.0.0.1:{cluster.nodes[0].port}"


async def _lookups(url: str) -> list[str]:
    """What each of LOOKUPS new clients' first check (a worker's at its start) raised."""
    failed = []
    for _ in range(LOOKUPS):
        client = redis_from_settings(Settings({"REDIS_URL": url}), connect_timeout=3)
        try:
            await check_reachable(client, url, 3)
        except Exception as exc:  # noqa: BLE001 - counted and shown
            failed.append(f"{type(exc).__name__}: {exc}")
        finally:
            await client.aclose()
    return failed


def test_a_hung_startup_node_is_passed_over(cluster, hung):
    assert _run(_lookups(_url(hung, cluster))) == []


def test_the_blocking_client_is_given_a_node_that_answers(cluster, hung):
    live = cluster.nodes[0].port
    kwargs = {"socket_connect_timeout": 3.0, "socket_timeout": 15.0}
    nodes = [ClusterNode("127.0.0.1", hung.port), ClusterNode("127.0.0.1", live)]
    for _ in range(2):
        assert [n.port for n in answering_startup_nodes(nodes, kwargs)] == [live]
        nodes.reverse()


def test_a_command_passes_over_a_hung_node(cluster, hung):
    """The operator's command, from the shell, three times (before: half of them failed
    "cannot reach Redis ... within 5 s")."""
    url = _url(hung, cluster)
    done = scrapy_ha("push", "hung", "--create", "http://a.example/1", "--redis-url", url)
    assert done.returncode == 0, done.stderr
    for _ in range(3):
        done = scrapy_ha("status", "hung", "--json", "--redis-url", url)
        assert done.returncode == 0, done.stderr
        assert '"pending": 1' in done.stdout, done.stdout


@pytest.fixture
def not_of_the_cluster(tmp_path: Path) -> Iterator[redis_servers.Server]:
    """A redis-server that answers PING and not the layout (cluster mode off: as a node
    just restarted without its cluster config would)."""
    server = redis_servers.start(tmp_path / "other")
    yield server
    server.kill()


def test_a_node_that_answers_ping_and_not_the_lookup_is_passed_over(cluster, not_of_the_cluster):
    """The first to answer PING is asked the layout; when its lookup fails, every node is
    asked in turn, as before (a review: one that answered PING first failed the lookup)."""
    url = _url(not_of_the_cluster, cluster)
    assert _run(_lookups(url)) == []
    for _ in range(LOOKUPS // 2):  # the blocking client, made as the exporter makes it
        client = sync_redis_from_settings(Settings({"REDIS_URL": url}), connect_timeout=3)
        try:
            assert client.ping()
        finally:
            client.close()
