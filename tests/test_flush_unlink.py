"""``scrapy-ha flush`` of a large crawl must not stop Redis while it frees the crawl's
collections. It deleted them with one ``DEL``: on a crawl of 1 M pending requests with
100,000 delayed ones (a payload hash, a delayed set and a retry hash of 100,000 each),
that ``DEL`` held Redis for 166 ms (SLOWLOG), and every worker of every crawl on that
Redis with it; a continuous crawl's million revisits, ten times that. ``UNLINK`` frees
them in Redis's background thread."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.cli_seed import delayed, scrapy_ha

if TYPE_CHECKING:
    import redis

#: More than the entries a listpack holds (128): a hash table, freed in the background
#: once unlinked (Redis's LAZYFREE_THRESHOLD is 64 elements).
ENTRIES = 600


def _lazyfreed(client: redis.Redis) -> int:
    return int(client.info("memory")["lazyfreed_objects"])


def _size(client: redis.Redis, key: bytes) -> int:
    """Elements of a hash or sorted set stored as a table (Redis's free effort), else 0."""
    if client.object("encoding", key) not in (b"hashtable", b"skiplist"):
        return 0
    return int(client.hlen(key) if client.type(key) == b"hash" else client.zcard(key))


def test_flush_frees_the_large_collections_in_the_background(redis_url, redis_client):
    rows = [(f"http://a.example/{i}", 3600_000 + i, "server") for i in range(ENTRIES)]
    delayed(redis_url, "books", rows)
    big = [key for key in redis_client.scan_iter("ha:{books}:*") if _size(redis_client, key) > 64]
    assert len(big) >= 3, big  # the payload hash, the delayed set, the retries' hash
    before = _lazyfreed(redis_client)
    flushed = scrapy_ha("flush", "books", "--yes", "--redis-url", redis_url)
    assert flushed.returncode == 0, flushed.stderr
    assert redis_client.keys("ha:{books}:*") == []
    assert _lazyfreed(redis_client) - before >= len(big)
