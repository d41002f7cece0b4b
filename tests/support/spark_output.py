"""What a Spark job wrote: its rows read back, and the check that each item is there once."""

from __future__ import annotations

from blizzard.spark import SCHEMA


def output(spark, path: str, fmt: str = "parquet") -> list:
    """The rows written under ``path`` (Blizzard's schema, in format ``fmt``)."""
    return spark.read.schema(SCHEMA).format(fmt).load(path).collect()


def assert_exactly_once(rows: list, expected: dict[int, bytes]) -> None:
    """Each id of ``expected`` is in ``rows`` once, with its payload byte for byte."""
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} ids written twice"
    missing = expected.keys() - set(ids)
    assert not missing, f"{len(missing)} ids missing, e.g. {sorted(missing)[:5]}"
    assert set(ids) == expected.keys()
    damaged = [r.id for r in rows if bytes(r.data) != expected[r.id]]
    assert not damaged, f"{len(damaged)} payloads differ, e.g. {damaged[:5]}"
