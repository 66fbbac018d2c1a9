"""``python -m scrapy_ha.cli``: the ``scrapy-ha`` command, where its script is not on the
``PATH`` (a virtualenv not activated)."""

import sys

from scrapy_ha.cli.cmdline import main

sys.exit(main())
