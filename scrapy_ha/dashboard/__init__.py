"""The dashboard: a web page that shows every crawl under a prefix and acts on it
(``scrapy-ha dashboard``, registered by :mod:`scrapy_ha.cli.dashboard`).

The application is :mod:`.app` (pages and the ``/api/`` JSON), what it reads from Redis
:mod:`._data`, what its buttons do :mod:`._actions` (the same functions the CLI calls),
who may read and act :mod:`._guard`. It needs the ``dashboard`` extra
(``pip install 'scrapy-ha[dashboard]'``).
"""
