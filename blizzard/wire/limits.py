"""The limits both sides check: the client, the CLI and the gateways before they send, the
master when a request arrives.

Each is defined here once, so the two cannot drift apart: a client that refuses less than the
master sends requests that fail at the master, one that refuses more withholds what the master
would take. Limits only one side knows of (how many requests the master parks, how much it
holds) stay with that side.
"""

from __future__ import annotations

# An item's delay (an enqueue's, a nack's), in seconds: a year, far beyond any retry back-off
# or schedule, and well inside the unix times an item's metadata may carry.
MAX_DELAY_S = 365 * 86400.0
# The shortest lease (a queue's lease_s, an item's own, a consumer's): a lease of 0 would run
# out before it is granted; the SQS gateway takes a visibility timeout of 0 as this.
MIN_LEASE_S = 0.001
# The longest lease, and the master's --max-lease-s by default: 12 hours, as SQS's longest
# visibility timeout, long enough for a batch job, short enough that a lost worker's items
# come back the same day.
MAX_LEASE_S = 12 * 3600.0
# How long a lease request may wait at the master for items (a long poll), in seconds: a
# consumer that waits longer asks again, and a request parked is a slot the master holds.
MAX_LEASE_WAIT_S = 300.0
# The window a unique key is taken for, in seconds: 30 days, the master remembers each key
# taken this long at most.
MAX_UNIQUE_S = 30 * 86400.0
# Characters of an item's key or unique key: kept with every item, on the master and on the
# data nodes, so short.
MAX_KEY = 256
# An item's priority, inclusive: a signed 32-bit integer (beanstalkd's unsigned one maps onto it).
PRIORITY_RANGE = (-(2**31), 2**31 - 1)
# Jobs one enqueue may depend on: each is an edge the master holds until the dependency ends
# (a group's callback on more jobs chains groups).
MAX_DEPENDENCIES = 100
# Bytes of one job's progress state: the master keeps it in memory and in checkpoints for a
# retry to resume from, so it holds a resume point, not the work's data.
MAX_STATE_BYTES = 16 * 1024
# Characters of one job's progress note: a line for a status display.
MAX_NOTE_CHARS = 200
# How long one Jobs request waits at the master for jobs to end, in seconds: a client that
# waits longer asks again.
MAX_JOBS_WAIT_S = 60.0
# Jobs one waiting Jobs request names: each costs the master a waiter per job, so a client
# waits for more in parts.
MAX_WAIT_IDS = 100
# How long a task's result may be kept, in seconds (a queue's result_ttl_s, a stored
# result's ttl_s): 30 days; the master keeps result links in memory until they run out.
MAX_RESULT_TTL_S = 30 * 86400.0
# A schedule's every_s, inclusive: at least a second, as each run is a record in the WAL; at
# most 366 days, so a yearly schedule fits a leap year.
MIN_EVERY_S = 1.0
MAX_EVERY_S = 366 * 86400.0
