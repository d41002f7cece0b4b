"""The fuzz campaign: hostile input for every server, and the checks that nothing was lost.

``frames`` makes hostile ZeroMQ frames, ``raw`` hostile bytes below ZeroMQ, ``floods`` and
``http_floods`` floods of connections; ``guard`` spares the frames that would be real requests;
``state`` reads what a cluster holds on disk; ``campaign`` runs them all against a cluster and
``run`` (``scripts/fuzz``) starts one and reports.
"""
