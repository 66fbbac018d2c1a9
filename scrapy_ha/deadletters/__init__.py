"""What becomes of dead letters: the queue's Python API (:mod:`.dlq`, public as
``scrapy_ha.dlq``), the permanent SQL archive (:mod:`.archive`) and the webhook alert
(:mod:`.alerts`), the last two written by workers as letters die."""
