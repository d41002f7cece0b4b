"""``blizzard enqueue|dequeue|ack|nack|extend`` as real processes against a real cluster."""

from __future__ import annotations

import base64
import json

from blizzard import Client

from support.cli import run


def test_the_safe_way_dequeue_no_ack_json_then_ack_nack_extend(cluster):
    m = cluster.master_addr
    ids = run("enqueue", "jobs", "one", "two", master=m).stdout.decode().split()
    # Given two items leased with --no-ack --json
    doc = json.loads(run("dequeue", "jobs", "--n", "2", "--no-ack", "--json", master=m).stdout)
    assert doc["queue"] == "jobs" and doc["acked"] is False
    first, second = doc["items"]
    assert [first["id"], second["id"]] == [int(i) for i in ids]
    assert first["data"] == "one" and base64.b64decode(first["data_b64"]) == b"one"
    assert first["attempts"] == 0 and isinstance(first["token"], int) and first["key"] is None
    # When the first is extended, then acked, and the second nacked with an error
    assert "extended" in run("extend", "jobs", str(first["id"]), str(first["token"]),
                             "--lease-s", "60", master=m).stdout.decode()
    assert run("ack", "jobs", str(first["id"]), str(first["token"]), master=m).stdout \
        == f"acked {first['id']}\n".encode()
    run("nack", "jobs", str(second["id"]), str(second["token"]), "--delay-s", "0",
        "--error", "boom", master=m)
    # Then only the second comes back, its attempt counted and its error kept
    again = json.loads(run("dequeue", "jobs", "--no-ack", "--json", master=m).stdout)["items"]
    assert [(i["id"], i["attempts"], i["error"]) for i in again] == [(second["id"], 1, "boom")]
    # And a stale token is refused with a clear error naming what may have happened
    stale = run("ack", "jobs", str(second["id"]), str(second["token"]), master=m, check=False)
    assert stale.returncode == 1 and b"WrongLease" in stale.stderr  # held under the new lease
    assert b"nacked" in stale.stderr
    run("ack", "jobs", str(again[0]["id"]), str(again[0]["token"]), master=m)
    empty = run("dequeue", "jobs", "--json", master=m, check=False)
    assert empty.returncode == 3 and json.loads(empty.stdout)["items"] == []


def test_enqueue_reads_stdin_and_files_byte_for_byte(cluster, tmp_path):
    m = cluster.master_addr
    blob = bytes(range(256)) * 3 + b"\n\t\\"
    path = tmp_path / "job.bin"
    path.write_bytes(b"from a file\x00")
    out = run("enqueue", "bin", "-", "--file", str(path), master=m, stdin=blob).stdout.split()
    assert len(out) == 2
    with Client(m) as c:
        got = [msg.data for msg in c.dequeue_many("bin", 2)]
    assert got == [blob, b"from a file\x00"]
    nothing = run("enqueue", "bin", master=m, check=False)
    assert nothing.returncode == 2 and b"nothing to enqueue" in nothing.stderr


def test_dequeue_text_is_one_line_per_item_escaped(cluster):
    m = cluster.master_addr
    with Client(m) as c:
        c.enqueue("esc", b"a\tb\nc\\d\xff")
    line = run("dequeue", "esc", master=m).stdout.decode()
    item_id, token, data = line.rstrip("\n").split("\t")
    assert data == "data=a\\tb\\nc\\\\d\\xff" and int(token.removeprefix("token=")) > 0
    item_id, token = item_id.removeprefix("id="), token.removeprefix("token=")
    run("ack", "esc", item_id, token, master=m)


def test_bad_queue_names_are_refused_with_the_rule(cluster):
    bad = run("enqueue", "bad name!", "x", master=cluster.master_addr, check=False)
    assert bad.returncode == 2 and b"A-Z a-z 0-9 . _ : -" in bad.stderr
    with Client(cluster.master_addr) as c:
        c.enqueue("ok.name_1:x-y", b"fine")
