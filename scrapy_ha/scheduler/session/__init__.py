"""The scheduler's background task: the one place a worker talks to Redis.

It connects (:mod:`.connect`), drains the shell's outbox and leases in rounds
(:mod:`.session`), ends leases otherwise than by an ack (:mod:`.ends`), keeps them renewed
from a thread of its own (:mod:`.renewal`, :mod:`.keeper`). It sees the shell through the
calls it makes, never imports it.
"""
