"""Draw docs/img/architecture.png from the code: scrapy-ha's subpackages, one box each, in the
layers tests/test_imports.py holds them to, with an arrow wherever one imports another.

    python docs/draw_architecture.py        # needs Graphviz's dot (Debian: graphviz)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_imports import LAYERS, TYPED_GRAPH  # noqa: E402

OUT = ROOT / "docs" / "img" / "architecture.png"

#: The boxes: a subpackage (the scheduler's session apart from its shell), or the modules
#: directly in scrapy_ha grouped by what they are.
BOXES = {
    "scrapy_ha.scheduler.session": "scheduler/session/\nthe one task that talks to Redis",
    "scrapy_ha.scheduler": "scheduler/\nthe shell the engine calls\nand its helpers",
    "shared": "scheduler/engine/, outbox.py, remote.py\nengine facts, the hand-offs",
    "scrapy_ha.middlewares": (
        "middlewares/\nretry, proxy, checkpoint, revisit,\ncookies, user agent, parent"
    ),
    "scrapy_ha.deadletters": "deadletters/\nAPI, SQL archive, alerts",
    "scrapy_ha.sinks": "sinks/\nthe item stream's consumers:\nJSON Lines, SQL, pipelines",
    "scrapy_ha.store": "store/\nqueue, host queues, shards,\nLua, connections",
    "scrapy_ha.config": "config/\nevery setting, validated",
    "scrapy_ha.codec": "codec/\nrequests to JSON and back",
    "scrapy_ha.ops": "ops/\nwhat the tools share",
    "scrapy_ha.dashboard": "dashboard/\nthe web page",
    "scrapy_ha.cli": "cli/\nthe scrapy-ha command",
    "scrapy_ha.demo": "demo/\ndemo site, proxy, harness",
    "names": "keys, metakeys,\nverdict, spiders",
    "faces": "scrapy_ha, .addon, .retry, .revisit, .proxy, .checkpoint,\n"
    ".cookies, .useragent, .parent, .dlq, .stats, .items\n(the public paths)",
}
NAMES = set(LAYERS[0])
FACES = set(LAYERS[-1])
SHARED = {"scrapy_ha.scheduler.engine", "scrapy_ha.scheduler.outbox", "scrapy_ha.scheduler.remote"}
#: Drawn apart: the shell and its session are the scheduler.
CLUSTER = ("scrapy_ha.scheduler", "scrapy_ha.scheduler.session", "shared")


def box(module: str) -> str:
    if module in NAMES:
        return "names"
    if module in FACES:
        return "faces"
    if module in SHARED or module.startswith("scrapy_ha.scheduler.engine."):
        return "shared"
    return max((b for b in BOXES if module == b or module.startswith(b + ".")), key=len)


def edges() -> set[tuple[str, str]]:
    found = set()
    for module, targets in TYPED_GRAPH.items():
        for target in targets:
            a, b = box(module), box(target)
            if a != b:
                found.add((a, b))
    return found


def dot() -> str:
    lines = [
        "digraph architecture {",
        "  rankdir=BT; nodesep=0.3; ranksep=0.45;",
        '  node [shape=box, style="rounded,filled", fillcolor="#f4f6fb", fontname="Helvetica",'
        " fontsize=11];",
        '  edge [color="#8090a8", arrowsize=0.6];',
    ]
    for name, label in BOXES.items():
        if name not in CLUSTER:
            lines.append(f'  "{name}" [label="{label}"];')
    lines.append('  subgraph cluster_scheduler { label="the scheduler"; fontname="Helvetica";')
    lines.append('    fontsize=11; style="rounded,dashed"; color="#8090a8";')
    for name in CLUSTER:
        lines.append(f'    "{name}" [label="{BOXES[name]}"];')
    lines.append("  }")
    for a, b in sorted(edges()):
        lines.append(f'  "{a}" -> "{b}";')
    lines.append("}")
    return "\n".join(lines)


def main() -> None:
    """The arrows that another path already implies are left out (Graphviz's tred)."""
    reduced = subprocess.run(["tred"], input=dot().encode(), capture_output=True, check=True)
    subprocess.run(["dot", "-Tpng", "-Gdpi=110", "-o", str(OUT)], input=reduced.stdout, check=True)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
