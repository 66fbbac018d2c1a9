"""A module that raises at import, as one that needs its package set up first does
(``HA_CODEC_CLASSES`` naming a class of it: tests/test_config.py)."""

raise RuntimeError("needs setup() first")
