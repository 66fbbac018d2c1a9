"""Real Redis topologies for the tests, on loopback: a server with TLS, an ACL user and a
Unix socket; a 3-master (+3 replica) Redis Cluster; a primary, a replica and three
sentinels. Every process is started with ``harness.spawn`` (its own session), so the
conftest's leftover-process fixture stops whatever a failed test leaves running."""

from __future__ import annotations

import random
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.crc import key_slot

from scrapy_ha.demo import harness
from scrapy_ha.demo.harness import free_port

if TYPE_CHECKING:
    from pathlib import Path

#: Seconds a server, a cluster or a sentinel set gets to come up on a loaded machine.
START_TIMEOUT = 60.0
#: Sentinel's failure detection: short, so a failover takes seconds in the tests.
DOWN_AFTER_MS = 1000
#: A cluster node talks to the others on its port + 10000 (Redis Cluster's bus).
CLUSTER_BUS_OFFSET = 10000
#: The name the sentinels know the primary by.
SERVICE = "crawlmaster"
#: The two ways a worker runs the sync script on Redis 7: as a Redis function (``FCALL``),
#: or with ``EVALSHA`` as on Redis 6.2 (the user the ACL denies ``FCALL``, as
#: docs/reference.md's "The function library" tells an operator)
SCRIPT_PATHS = ("fcall", "evalsha")
NO_FCALL_USER = "no-fcall"


def script_path_url(url: str, path: str) -> str:
    """*url* as a worker whose sync script runs by *path* (of :data:`SCRIPT_PATHS`)."""
    if path == "fcall":
        return url
    with redis.Redis.from_url(url) as client:
        acl = ("on", f">{NO_FCALL_USER}", "~*", "&*", "+@all", "-fcall")
        client.execute_command("ACL", "SETUSER", NO_FCALL_USER, *acl)
    parts = urlsplit(url)
    netloc = f"{NO_FCALL_USER}:{NO_FCALL_USER}@{parts.netloc}"
    return urlunsplit(parts._replace(netloc=netloc))


def _base_args(directory: Path, port: int) -> list[str]:
    return [
        harness.redis_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(directory),
        "--save",
        "",
        "--appendonly",
        "no",
        "--logfile",
        str(directory / "redis.log"),
    ]


def start(directory: Path, *args: str, port: int | None = None, **ping: Any) -> Server:
    """A redis-server with *args*, answering PING (with *ping*'s client arguments)."""
    directory.mkdir(parents=True, exist_ok=True)
    port = port if port is not None else free_port()
    proc = harness.spawn([*_base_args(directory, port), *args])
    server = Server(proc, port, directory)
    server.wait_ready(**ping)
    return server


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    dir: Path

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis(port=self.port, socket_connect_timeout=5, **kwargs)

    def wait_ready(self, **kwargs: Any) -> None:
        def answers() -> bool:
            if self.proc.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server on {self.port} exited: {log}")
            try:
                with redis.Redis(
                    port=self.port if "port" not in kwargs else kwargs["port"],
                    socket_connect_timeout=2,
                    **{k: v for k, v in kwargs.items() if k != "port"},
                ) as c:
                    return bool(c.ping())
            except redis.exceptions.RedisError:
                return False

        harness.wait_for(answers, f"redis-server on port {self.port}", START_TIMEOUT, 0.1)

    def kill(self) -> None:
        harness.signal_group(self.proc, 9)
        harness.stop(self.proc)


# -- TLS ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls_files(
    directory: Path, *, strict_ca: bool = True, server_san: str = "IP:127.0.0.1,DNS:localhost"
) -> TlsFiles:
    """A CA, a server certificate for *server_san* and a client certificate (openssl).
    *strict_ca* False: a CA without the extensions strict verification asks for (Python
    3.13's default, ``VERIFY_X509_STRICT``), as CAs made by hand often are."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.crt", directory / "ca.key"
    strict = [
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]
    _openssl(
        "req",
        "-x509",
        "-new",
        "-nodes",
        "-newkey",
        "rsa:2048",
        "-days",
        "2",
        "-subj",
        "/CN=scrapy-ha test CA",
        *(strict if strict_ca else []),
        "-keyout",
        ca_key,
        "-out",
        ca,
    )
    files = {}
    for name, san in (("server", server_san), ("client", None)):
        key, csr, crt = (directory / f"{name}.{e}" for e in ("key", "csr", "crt"))
        _openssl(
            "req",
            "-new",
            "-nodes",
            "-newkey",
            "rsa:2048",
            "-subj",
            f"/CN={name}",
            "-keyout",
            key,
            "-out",
            csr,
        )
        extra: list[Any] = []
        if san:
            ext = directory / f"{name}.ext"
            ext.write_text(f"subjectAltName={san}\n")
            extra = ["-extfile", ext]
        _openssl(
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            crt,
            *extra,
        )
        files[name] = (crt, key)
    return TlsFiles(ca, *files["server"], *files["client"])


def _openssl(*args: Any) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def start_tls(directory: Path, tls: TlsFiles, *extra: str) -> Server:
    """A redis-server that speaks TLS only (client certificates required), on a free port."""
    port = free_port()
    args = [
        "--tls-port",
        str(port),
        "--tls-cert-file",
        str(tls.server_cert),
        "--tls-key-file",
        str(tls.server_key),
        "--tls-ca-cert-file",
        str(tls.ca),
        "--tls-auth-clients",
        "yes",
        *extra,
    ]
    directory.mkdir(parents=True, exist_ok=True)
    proc = harness.spawn([*_base_args(directory, 0), *args])
    server = Server(proc, port, directory)
    server.wait_ready(
        ssl=True,
        ssl_cert_reqs="none",  # up is up, whatever its certificate (the tests check those)
        ssl_certfile=str(tls.client_cert),
        ssl_keyfile=str(tls.client_key),
    )
    return server


# -- Cluster ------------------------------------------------------------------------------


@dataclass
class Cluster:
    nodes: list[Server] = field(default_factory=list)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:3])

    def masters(self) -> list[int]:
        """Ports of the masters that serve slots, as a live node sees them: a master marked
        failed (its replica took its slots: a failover the machine's load can cause, at
        ``cluster-node-timeout``) is not one."""
        for node in self.alive():
            try:
                with node.client() as c:
                    lines = c.execute_command("CLUSTER", "NODES").decode().splitlines()
                break
            except redis.exceptions.RedisError:
                continue
        else:
            return []
        return sorted(_port(f[1]) for f in map(str.split, lines) if _serving_master(f))

    def alive(self) -> list[Server]:
        return [n for n in self.nodes if n.proc.poll() is None]

    def owner_of(self, key: str, among: list[Server] | None = None) -> Server | None:
        """The live master that serves *key*'s slot, as the live nodes see it (None while
        none does: a failover in progress)."""
        slot = key_slot(key.encode())
        for node in among or self.alive():
            try:
                with node.client() as c:
                    if c.execute_command("ROLE")[0] == b"master" and _serves(c, slot):
                        return node
            except redis.exceptions.RedisError:
                continue
        return None

    def stop(self) -> None:
        for node in self.nodes:
            harness.stop(node.proc)


def _port(address: str) -> int:
    return int(address.split(":")[1].split("@")[0])


def _serving_master(fields: list[str]) -> bool:
    """A CLUSTER NODES line (split) of a master that is not failed and holds slots."""
    flags = fields[2].split(",")
    return "master" in flags and "fail" not in flags and len(fields) > 8


def start_cluster(
    directory: Path, masters: int = 3, replicas: int = 1, args: tuple[str, ...] = ()
) -> Cluster:
    """*masters* masters with *replicas* replica each, created with ``redis-cli --cluster``,
    each server started with *args* too."""
    cluster = Cluster()
    for i in range(masters * (1 + replicas)):
        d = directory / f"node{i}"
        cluster.nodes.append(
            start(
                d,
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(d / "nodes.conf"),
                "--cluster-node-timeout",
                "3000",
                "--repl-diskless-sync-delay",  # a replica's first sync at once, not after 5 s
                "0",
                *args,
                port=_cluster_port(),
            )
        )
    addresses = [f"127.0.0.1:{n.port}" for n in cluster.nodes]
    subprocess.run(
        [
            "redis-cli",
            "--cluster",
            "create",
            *addresses,
            "--cluster-replicas",
            str(replicas),
            "--cluster-yes",
        ],
        check=True,
        capture_output=True,
        timeout=START_TIMEOUT,
    )
    harness.wait_for(lambda: _cluster_ok(cluster), "the cluster to be ok", START_TIMEOUT, 0.2)
    synced = lambda: _replicas_synced(cluster) == masters * replicas  # noqa: E731
    harness.wait_for(synced, "every replica to sync with its master", START_TIMEOUT, 0.2)
    return cluster


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too, below 55536."""
    for _ in range(100):
        port = random.randint(20000, 45000)
        if all(_free(p) for p in (port, port + CLUSTER_BUS_OFFSET)):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _serves(client: redis.Redis, slot: int) -> bool:
    """Whether this node owns *slot* (its own line in CLUSTER NODES lists the slot)."""
    for line in client.execute_command("CLUSTER", "NODES").decode().splitlines():
        fields = line.split()
        if "myself" not in fields[2]:
            continue
        for part in fields[8:]:
            start, _, end = part.partition("-")
            if start.isdigit() and int(start) <= slot <= int(end or start):
                return True
    return False


def _cluster_ok(cluster: Cluster) -> bool:
    for node in cluster.nodes:
        with node.client() as c:
            if b"cluster_state:ok" not in c.execute_command("CLUSTER", "INFO"):
                return False
    return True


def _replicas_synced(cluster: Cluster) -> int:
    """How many replicas have finished their first sync (ROLE says "connected"). One that
    never did refuses to fail over ("Disconnected from master for longer than allowed":
    its data age counts from 0, beyond any cluster-replica-validity-factor)."""
    count = 0
    for node in cluster.nodes:
        with node.client() as c:
            role = c.execute_command("ROLE")
            count += role[0] == b"slave" and role[3] == b"connected"
    return count


# -- Sentinel -----------------------------------------------------------------------------


@dataclass
class SentinelSet:
    primary: Server
    replica: Server
    sentinels: list[Server]

    @property
    def url(self) -> str:
        where = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{where}/{SERVICE}/0"

    def primary_port(self) -> int:
        with redis.Redis(port=self.sentinels[0].port) as c:
            host, port = c.sentinel_get_master_addr_by_name(SERVICE)
        return int(port)

    def stop(self) -> None:
        for server in (*self.sentinels, self.primary, self.replica):
            harness.stop(server.proc)


def start_sentinels(directory: Path, *primary_args: str) -> SentinelSet:
    """A primary, its replica and three sentinels that fail over after a second down."""
    primary_args = ("--repl-diskless-sync-delay", "0", *primary_args)  # a first sync at once
    primary = start(directory / "primary", *primary_args)
    replica = start(
        directory / "replica", "--replicaof", "127.0.0.1", str(primary.port), *primary_args
    )
    sentinels = [_sentinel(directory / f"sentinel{i}", primary.port) for i in range(3)]
    found = SentinelSet(primary, replica, sentinels)
    harness.wait_for(lambda: _sentinels_ready(found), "3 sentinels and a replica", START_TIMEOUT)
    return found


def _sentinel(directory: Path, primary_port: int) -> Server:
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = directory / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {directory}\nlogfile {directory / 'redis.log'}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n"
        f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
        f"sentinel failover-timeout {SERVICE} 10000\n"
        f"sentinel parallel-syncs {SERVICE} 1\n"
    )
    proc = harness.spawn(["redis-sentinel", str(conf)])
    server = Server(proc, port, directory)
    server.wait_ready()
    return server


def _sentinels_ready(found: SentinelSet) -> bool:
    with found.primary.client() as c:
        info = c.info("replication")
        # online: its first sync is over (a replica still waiting for it is counted as
        # connected, and promoted it would hold nothing of the crawl)
        if info.get("connected_slaves", 0) < 1 or info["slave0"].get("state") != "online":
            return False
    for s in found.sentinels:
        with redis.Redis(port=s.port) as c:
            master = c.sentinel_master(SERVICE)
            if (
                int(master.get("num-other-sentinels", 0)) < 2
                or int(master.get("num-slaves", 0)) < 1
            ):
                return False
    return True


def wait_promoted(found: SentinelSet, old_port: int, timeout: float = START_TIMEOUT) -> int:
    """Wait until the sentinels name another primary; return its port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if (port := found.primary_port()) != old_port:
                return port
        except redis.exceptions.RedisError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"no failover within {timeout} s")
