"""The request codec's implementation; users import :mod:`scrapy_ha.codec`.

- :mod:`.document`: the stored document (its fields, their short names and defaults, the tags);
- :mod:`.encode`: a Request to a document, with every meta and cb_kwargs value tagged;
- :mod:`.decode`: a document back to a Request, building only what :mod:`.trust` allows;
- :mod:`.trust`: which classes and callbacks a payload may name;
- :mod:`.credentials`: what never reaches Redis, and what is masked when printed;
- :mod:`.summary`: what an operator reads of a stored request without rebuilding it.
"""
