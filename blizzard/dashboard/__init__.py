"""``blizzard dashboard``: the status page. ``sampler`` keeps the master's figures
over time; ``server`` serves the page (``assets/``) and its JSON.

Uses ``blizzard.client`` and ``blizzard.net.http_guard``.
"""
