"""The dupefilter the crawl tests run with: the exact set, or with ``HA_TEST_DUPEFILTER=bloom``
in the environment a Bloom filter small enough to grow layers during the test's crawl
(``make test-bloom`` runs the kill, shard, failover and conformance suites so)."""

from __future__ import annotations

import os

#: The environment variable that switches the suites' crawls to a Bloom filter.
ENV = "HA_TEST_DUPEFILTER"
#: The smallest capacity the setting allows: the test crawls grow a few layers from it.
BLOOM = {"HA_DUPEFILTER": "bloom", "HA_DUPEFILTER_CAPACITY": "1000"}


def dupefilter_settings() -> dict[str, str]:
    """The settings of the dupefilter the environment asks for (none: the exact set)."""
    return dict(BLOOM) if os.environ.get(ENV) == "bloom" else {}
