"""``blizzard dispatch``: delivers HTTP tasks (``blizzard.client.http_delivery``) from
queues with a pool of asyncio senders (``deliver``), settles them in batches (``settle``),
to the hosts an operator allows (``allow_hosts``).

Uses ``blizzard.client`` and what it uses.
"""
