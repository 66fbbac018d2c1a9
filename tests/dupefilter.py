"""The dupefilter the crawl tests run with: the exact set, or with ``HA_TEST_DUPEFILTER=bloom``
in the environment a Bloom filter small enough to grow layers during the test's crawl
(``make test-bloom`` runs the kill, shard, failover and conformance suites so)."""

from __future__ import annotations

import os

#: The environment variable that switches the suites' crawls to a Bloom filter.
ENV = "HA_TEST_DUPEFILTER"
#: The smallest capacity the setting allows: the test crawls grow a few layers from it. At
#: the default error rate a false positive (a new URL taken as seen, never crawled: the filter
#: doing what it is asked) has a chance of about 6e-4 in a kill test's crawl of 2,100 URLs (its
#: own figure, ``ha/dupefilter/false_positives``), so one run in some 1,800 would lose an item
#: by design. At 1e-12 that chance is about 1e-9: an item lost in a test is a defect.
BLOOM = {
    "HA_DUPEFILTER": "bloom",
    "HA_DUPEFILTER_CAPACITY": "1000",
    "HA_DUPEFILTER_ERROR_RATE": "1e-12",
}


def dupefilter_settings() -> dict[str, str]:
    """The settings of the dupefilter the environment asks for (none: the exact set)."""
    return dict(BLOOM) if os.environ.get(ENV) == "bloom" else {}
