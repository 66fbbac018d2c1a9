"""`scrapy-ha items SPIDER --to SINK --aside` lists what the group set aside, and
`--retry-aside` writes it to the sink, each record deleted only once the sink committed its
item; a record the sink cannot read (not UTF-8) or whose group is gone is kept."""

from __future__ import annotations

import json

import redis
import sqlalchemy

from scrapy_ha.keys import Keys
from scrapy_ha.store.items import reason_text
from scrapy_ha.store.scripts import ITEMS_ASIDE_LUA
from tests.cli_seed import scrapy_ha
from tests.test_items_sink_kills import fill

KEYS = Keys("ha", "s")
ASIDE = "ha:{s}:items_aside"
NOT_UTF8 = b'\xff\xfe{"id": 9}\x80'


def set_aside(client: redis.Redis, group: str, reason: str) -> list[str]:
    """Deliver every entry to consumer c of *group*, set aside the 2nd and the last (the
    consumers' own script); their ids."""
    client.xgroup_create(KEYS.items, group, id="0")
    ids = [i.decode() for i, _ in client.xreadgroup(group, "c", {KEYS.items: ">"})[0][1]]
    script = client.register_script(ITEMS_ASIDE_LUA)
    keys = [KEYS.items, KEYS.items_aside, KEYS.items_tries, *KEYS.stats_keys()]
    for entry in (ids[1], ids[-1]):
        done = script(keys=keys, args=[group, "c", entry, reason_text(reason), f"{entry} {group}"])
        assert done[0] == 1
    return [ids[1], ids[-1]]


def test_aside_lists_and_retry_aside_writes_and_keeps_what_it_cannot(redis_url, tmp_path):
    fill(redis_url, 3)
    client = redis.Redis.from_url(redis_url)
    client.xadd(KEYS.items, {"i": NOT_UTF8})
    good, bad = set_aside(client, "g", "IntegrityError: prix refusé")
    db = f"sqlite:///{tmp_path / 'items.db'}"
    args = ["items", "s", "--to", db, "--group", "g", "--redis-url", redis_url]
    shown = scrapy_ha(*args, "--aside")
    assert shown.returncode == 0, shown.stderr
    assert f"{good}  " in shown.stdout and f"{bad}  " in shown.stdout
    assert "IntegrityError: prix refusé" in shown.stdout
    assert "2 entries set aside by group g" in shown.stdout
    assert client.xrange(ASIDE)[1][1][b"i"] == NOT_UTF8  # byte for byte
    status = scrapy_ha("status", "s", "--redis-url", redis_url)
    assert "sink  g: backlog 2, consumed 0, set aside 2, 1 consumer(s)" in status.stdout
    retried = scrapy_ha(*args, "--retry-aside")
    assert retried.returncode == 1, retried.stderr
    assert "1 set-aside entry written, 1 kept" in retried.stdout
    assert f"{bad}: the sink cannot read it" in retried.stdout
    engine = sqlalchemy.create_engine(db)
    with engine.connect() as conn:
        rows = conn.execute(sqlalchemy.text("SELECT entry_id, item FROM scrapy_ha_items")).all()
    engine.dispose()
    assert [(r[0], json.loads(r[1])) for r in rows] == [(good, {"id": 2})]
    ((_, kept),) = client.xrange(ASIDE)
    assert kept[b"e"].decode() == bad and kept[b"i"] == NOT_UTF8
    again = scrapy_ha(*args, "--retry-aside")  # written again under its id: still one row
    assert "0 set-aside entries written, 1 kept" in again.stdout
    client.close()


def test_retry_aside_keeps_the_records_of_a_group_that_no_longer_exists(redis_url, tmp_path):
    fill(redis_url, 3)
    client = redis.Redis.from_url(redis_url)
    set_aside(client, "gone", "ValueError: no")
    client.xgroup_destroy(KEYS.items, "gone")
    db = f"sqlite:///{tmp_path / 'items.db'}"
    args = ["items", "s", "--to", db, "--group", "gone", "--redis-url", redis_url]
    retried = scrapy_ha(*args, "--retry-aside")
    assert retried.returncode == 1
    assert "group gone no longer reads ha:{s}:items: 2 kept" in retried.stdout
    assert client.xlen(ASIDE) == 2
    client.close()
