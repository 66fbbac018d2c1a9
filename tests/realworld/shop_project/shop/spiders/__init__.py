"""One spider per everyday idiom; each takes the shop's address as ``-a base=http://...``."""
