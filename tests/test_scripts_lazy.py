"""The Lua scripts are assembled on first use, each once (scrapy_ha/store/scripts.py): a
worker's process assembles the few it runs, not the 30 (a start-up cost of every crawl)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from scrapy_ha.store import scripts

#: What a worker imports: the scheduler, its session and the queue.
WORKER_MODULES = (
    "scrapy_ha",
    "scrapy_ha.scheduler.shell",
    "scrapy_ha.scheduler.session.session",
    "scrapy_ha.store.queue",
    "scrapy_ha.store.functions",
)


def _assembled_after(code: str) -> set[str]:
    """The scripts a fresh interpreter holds assembled after running *code*."""
    probe = (
        f"{code}\nfrom scrapy_ha.store import scripts\n"
        "print(' '.join(n for n in vars(scripts) if n.endswith('_LUA')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


def test_importing_a_worker_assembles_only_the_renewal_script():
    # the lease keeper's renewal runs in every crawl (a thread's own client, made at start)
    imports = "\n".join(f"import {module}" for module in WORKER_MODULES)
    assert _assembled_after(imports) <= {"RENEW_LUA"}


def test_a_queue_assembles_a_script_at_its_first_call_only():
    made = (
        "import redis.asyncio\nfrom scrapy_ha.keys import Keys\n"
        "from scrapy_ha.store.queue import RedisQueue\n"
        "RedisQueue(redis.asyncio.Redis(), Keys('ha', 'lazy'))"
    )
    assert "COUNTS_LUA" not in _assembled_after(made)


@pytest.mark.parametrize("script", scripts.SCRIPTS)
def test_every_script_is_assembled_once_and_kept(script):
    text = getattr(scripts, f"{script.upper()}_LUA")
    assert text == scripts.assemble(script)
    assert getattr(scripts, f"{script.upper()}_LUA") is text
    assert scripts.script_text(script) is text


def test_an_unknown_script_is_an_error_that_names_the_known_ones():
    with pytest.raises(AttributeError):
        scripts.NOPE_LUA  # noqa: B018 (the attribute's lookup is the test)
    with pytest.raises(ValueError, match="sync"):
        scripts.script_text("nope")
    with pytest.raises(ValueError, match="sync"):
        scripts.Registered(object(), "nope")


def test_a_registered_script_is_registered_at_its_first_call():
    registered: list[str] = []

    class Client:
        def register_script(self, text: str):
            registered.append(text)
            return lambda *args, **kwargs: (args, kwargs)

    script = scripts.Registered(Client(), "counts")
    assert registered == []
    assert script(keys=["k"]) == ((), {"keys": ["k"]})
    script(keys=["k"])
    assert registered == [scripts.COUNTS_LUA]
