"""The sync script's EVAL form (Redis 6.2, an ACL without FCALL) is one Lua main function,
which holds at most 200 locals, the libraries' top-level ones included: at 200 exactly, the
next top-level local any of its libraries adds breaks that path while the function path
(``FUNCTION LOAD``) still works. Kept with a margin, so the test fails a change before the
script does."""

from __future__ import annotations

import pytest
import redis

from scrapy_ha.store import scripts

#: Top-level locals the sync script must still have room for in its EVAL form.
MARGIN = 1


def test_the_sync_script_has_room_for_more_locals(redis_client):
    spare = "".join(f"local __spare_{i} = {i}\n" for i in range(MARGIN))
    redis_client.script_load(spare + scripts.SYNC_LUA)  # raises if over 200
    with pytest.raises(redis.ResponseError, match="more than 200 local variables"):
        redis_client.script_load("".join(f"local v{i} = {i}\n" for i in range(201)))
