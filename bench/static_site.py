"""The demo catalogue as static files, served by nginx: a site that is never the limit.

The demo site (`scrapy_ha.demo.site`) renders every page in Python on the machine that also
runs the crawler: on two cores it takes one of them and sets the pace, so a scheduler's own
CPU cost hides behind it. Here the same pages (byte for byte) are written to a directory once
and served by nginx, which needs a small fraction of a core at 1,000 pages/s.

``StaticSite(directory, pages=500).start()`` writes the files and starts nginx on a free
port of 127.0.0.1 with its own configuration in *directory*: no path outside it, no daemon,
no master process (one process, whose CPU time `cpu_seconds` reads from /proc), no access
log. ``python bench/static_site.py --pages 5`` serves a site until interrupted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from scrapy_ha.demo import harness  # noqa: E402
from scrapy_ha.demo.site import Catalogue  # noqa: E402

if TYPE_CHECKING:
    from types import TracebackType

#: Items per list page, as in the issue's benchmark (500 list pages of 20 items).
PER_PAGE = 20
#: Seconds nginx gets to accept connections after it starts (a loaded machine is slow).
START_TIMEOUT = 30.0
#: Attempts at a free port: another process may bind it between the pick and nginx's bind.
START_TRIES = 5
#: Requests one keep-alive connection may carry: the crawl reuses its connections for the
#: whole run instead of reconnecting every 1,000 pages (nginx's default).
KEEPALIVE_REQUESTS = 1_000_000
#: Clock ticks per second of /proc/<pid>/stat's utime and stime.
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

NGINX_CONF = """\
daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    default_type text/html;
    charset utf-8;
    keepalive_requests {keepalive};
    keepalive_timeout 60s;
    client_body_temp_path {dir}/tmp;
    server {{
        listen 127.0.0.1:{port};
        root {dir}/site;
        index index.html;
    }}
}}
"""


def nginx_binary() -> str:
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists():
        raise FileNotFoundError(
            "nginx is not installed: `apt-get install -y nginx-light` (the static-site "
            "benchmark serves its catalogue with it)"
        )
    return binary


def write_catalogue(site: Path, pages: int, per_page: int = PER_PAGE, chains: int = 1) -> int:
    """Write the demo catalogue's pages under *site* (``/`` as ``index.html``, ``/list/N``,
    ``/item/N``); return how many pages a crawl of it fetches."""
    catalogue = Catalogue(pages, per_page, 0.0, chains)
    (site / "list").mkdir(parents=True, exist_ok=True)
    (site / "item").mkdir(exist_ok=True)
    (site / "index.html").write_bytes(catalogue.page("/")[1])
    for n in range(1, pages + 1):
        (site / "list" / str(n)).write_bytes(catalogue.list_page(n))
    for n in range(1, pages * per_page + 1):
        (site / "item" / str(n)).write_bytes(catalogue.item_page(n))
    return 1 + pages * (per_page + 1)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a running process has used so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / CLOCK_TICKS


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class StaticSite:
    """nginx serving the catalogue from *directory* (a context manager that stops it)."""

    def __init__(self, directory: Path, pages: int, per_page: int = PER_PAGE) -> None:
        self.dir = directory
        self.pages = pages
        self.per_page = per_page
        self.total = 0
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> StaticSite:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "tmp").mkdir(exist_ok=True)
        self.total = write_catalogue(self.dir / "site", self.pages, self.per_page)
        for _ in range(START_TRIES):
            if self._try_start(harness.free_port()):
                return self
        raise RuntimeError(f"nginx did not start: see {self.dir / 'error.log'}")

    def _try_start(self, port: int) -> bool:
        conf = self.dir / "nginx.conf"
        conf.write_text(NGINX_CONF.format(dir=self.dir, port=port, keepalive=KEEPALIVE_REQUESTS))
        proc = harness.spawn(
            [
                nginx_binary(),
                "-p",
                str(self.dir),
                "-c",
                str(conf),
                "-e",
                str(self.dir / "error.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        harness.wait_for(
            lambda: proc.poll() is not None or _accepts(port),
            f"nginx on port {port}",
            START_TIMEOUT,
        )
        if proc.poll() is not None:  # the port was taken in between, or a bad config
            proc.wait()
            return False
        self.proc, self.port = proc, port
        return True

    def cpu_seconds(self) -> float:
        """CPU seconds nginx has used since it started."""
        assert self.proc is not None, "nginx is not running: call start() first"
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        harness.stop(self.proc)
        self.proc = None

    def __enter__(self) -> StaticSite:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=500, help="list pages (x20 items)")
    parser.add_argument("--dir", type=Path, required=True, help="where the files and config go")
    args = parser.parse_args(argv)
    with StaticSite(args.dir, args.pages) as site:
        print(f"LISTENING {site.port}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
