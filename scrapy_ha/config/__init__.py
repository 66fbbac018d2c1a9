"""Every setting scrapy-ha reads, validated: one frozen ``*Config.from_settings`` per
component (:mod:`.scheduler`, :mod:`.middlewares`, :mod:`.politeness`), each bad value a
:class:`~.validate.ConfigError` naming the setting and the value (:mod:`.validate`)."""
