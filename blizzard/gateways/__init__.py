"""Gateways: stateless processes that speak another queue's protocol to its clients and
Blizzard's own client protocol to the cluster (``beanstalkd.py``: beanstalkd's text protocol).

A gateway is a client of the cluster like any other (a client key, ``--master``); it may run
anywhere and as many times as needed. It holds no data: what a connection reserved is leased
in the cluster and given back when the connection closes.
"""
