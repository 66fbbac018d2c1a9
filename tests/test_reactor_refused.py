"""A worker run under another Twisted reactor than asyncio's says so in one ERROR line.

scrapy-ha talks to Redis with ``redis.asyncio``, which needs the asyncio reactor (Scrapy's
default). With ``TWISTED_REACTOR`` set to the epoll reactor a worker printed two CRITICAL
tracebacks (``RuntimeError: no running event loop``) and no finish reason, whether the
add-on or ``SCHEDULER`` alone enabled scrapy-ha; on Scrapy 2.16, once refused in one line,
it never closed (the refusal's close was scheduled on an asyncio loop there was none of).
"""

from __future__ import annotations

from tests.test_scheduler_process import crawl, ha

EPOLL = "twisted.internet.epollreactor.EPollReactor"
#: Seconds a refused worker may take to exit (a loaded machine): it exits in about 3.
REFUSED_WITHIN = 60


def test_another_reactor_is_refused_at_start_in_one_line(tmp_path, redis_url, site):
    alone = {"SCHEDULER": "scrapy_ha.Scheduler", "REDIS_URL": redis_url}
    for name, settings in (("addon", ha(redis_url)), ("alone", alone)):
        (tmp_path / name).mkdir()
        proc = crawl(tmp_path / name, site.url + "/item/1", TWISTED_REACTOR=EPOLL, **settings)
        try:
            code = proc.wait(REFUSED_WITHIN)
        finally:
            if proc.poll() is None:  # (it hung: not left running)
                proc.kill()
                proc.wait()
        assert code != 0
        log = (tmp_path / name / "log.txt").read_text()
        errors = [line for line in log.splitlines() if " ERROR: " in line]
        assert len(errors) == 1, log
        assert f"TWISTED_REACTOR='{EPOLL}'" in errors[0], errors[0]
        assert "AsyncioSelectorReactor" in errors[0], errors[0]
        assert "Traceback" not in log and " CRITICAL: " not in log, log[-3000:]
        assert "'finish_reason': 'ha_start_failed'" in log, log[-3000:]
