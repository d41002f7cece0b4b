"""``@task`` functions as jobs (``task``) and the worker that runs them
(``loop``, ``runner``): ``blizzard worker``.

Uses ``blizzard.client`` and what it uses.
"""
