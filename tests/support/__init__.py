"""What test files share, so that no test file imports another.

- ``tiers``: the pytest plugin that puts each test in its tier (unit, cluster, spark, browser,
  root), keeps unit tests free of processes and fails any skip; ``conftest.py`` loads it.
- ``wait``: ``wait_for``, polling a condition with a deadline.
- ``processes``: stopping, finding and inspecting the processes a test started.
- ``in_process_master``: a real ``MasterServer`` over an in-memory WAL, driven request by request.
- ``fake_master``: a stand-in master for the client's loops (worker, dispatcher).
- ``http_target``: a loopback HTTP endpoint that answers as each test asks.
- ``http_get``: one HTTP request, its status, headers and body.
- ``cli``: the ``blizzard`` command as a process.
- ``spark_output``: reading what a Spark job wrote, and checking it holds each item once.
- ``zmq_wedge``: scenarios run as a script of their own (a stopped ZeroMQ context hangs).

The fixtures (``cluster``, ``cluster_factory``, ``sharded``, ``spark``) are in ``conftest.py``.
"""
