"""The checkpoint middleware: ``CheckpointMiddleware`` resumes a paginated task from its
last page.

The documented import path; the implementation is in :mod:`scrapy_ha.middlewares.checkpoint`.
"""

from scrapy_ha.middlewares.checkpoint import CheckpointMiddleware
from scrapy_ha.middlewares.tasks import task_id

__all__ = [
    "CheckpointMiddleware",
    "task_id",
]
