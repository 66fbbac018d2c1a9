"""Where scrapy-ha differs from Scrapy's own scheduler in Scrapy's tests, one line per test.

``XFAIL``: a real difference scrapy-ha must fix (issue 17, item N). The mark is strict, so
the test turns red once fixed: delete its line here then (``TIMING_DEPENDENT`` ones are
not strict: check them with ``-rX``). ``NOT_APPLICABLE``: the test
inspects what scrapy-ha replaces by design (JOBDIR, Scrapy's queue classes); listed with
the same reasons in docs/compatibility.md. Keys are test ids below tests/scrapy_conformance/.
With ``SCRAPY_HA_CONFORMANCE_BASELINE=1`` (Scrapy's own scheduler) none of this applies.
"""

from __future__ import annotations

XFAIL: dict[str, str] = {}

#: Entries of XFAIL whose outcome under scrapy-ha depends on timing: marked non-strict, so
#: that the suite is not flaky; once the item is fixed they pass every time and their line
#: must go.
TIMING_DEPENDENT: frozenset[str] = frozenset()

_JOBDIR = (
    "not applicable: reopens the scheduler on a JOBDIR to read Scrapy's disk queues back; "
    "scrapy-ha keeps its queue in Redis and refuses JOBDIR at start (persistence across "
    "runs is SCHEDULER_PERSIST)"
)

NOT_APPLICABLE: dict[str, str] = {
    **{
        f"test_scheduler.py::{cls}::{test}": _JOBDIR
        for cls in ("TestSchedulerOnDisk", "TestSchedulerWithDownloaderAwareOnDisk")
        for test in ("test_length", "test_dequeue", "test_dequeue_priorities", "test_logic")
        if not (cls == "TestSchedulerOnDisk" and test == "test_logic")
    },
    "test_scheduler.py::TestMigration::test_migration": (
        "not applicable: checks that DownloaderAwarePriorityQueue refuses the JOBDIR state "
        "ScrapyPriorityQueue left on disk; scrapy-ha uses neither class nor JOBDIR"
    ),
    "test_scheduler.py::TestIncompatibility::test_incompatibility": (
        "not applicable: DownloaderAwarePriorityQueue's own refusal of "
        "CONCURRENT_REQUESTS_PER_IP; scrapy-ha does not build SCHEDULER_PRIORITY_QUEUE"
    ),
    "test_crawl.py::TestCrawl::test_unknown_url_scheme": (
        "not applicable: checks the download handler's NotSupported error for a foo:// "
        "request; scrapy-ha queues no request of a scheme outside HA_ALLOWED_SCHEMES (a "
        "WARNING names the setting instead), so it never reaches a download handler"
    ),
    "test_engine.py::TestEngine::test_short_timeout": (
        "not applicable: runs `scrapy fetch http://toscrape.com` in a subprocess, which never "
        "uses the scheduler under test (and needs Internet access)"
    ),
}
