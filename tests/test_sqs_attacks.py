"""``blizzard sqs`` against what an attacker's review tried: text XML cannot carry, bodies
that only look like the gateway's envelopes, ambiguous HTTP framing, an action header left
out of the signature, JSON bodies that cost many times their size, parameters of the wrong
type, a send racing a delete, and floods of unique keys. Each gets an error (or is served)
and changes nothing it should not."""

from __future__ import annotations

import http.client
import json
import socket
import tracemalloc

import msgpack
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from blizzard import Client
from blizzard.gateways import sqs_messages as msgs
from blizzard.gateways import sqs_wire as wire
from blizzard.gateways.sqs import MAX_BODY
from master.state.machine import State
from master.state.records import AckItems

from support.records import commit
from support.sqs import KEYS, boto, code, gateway_on_new_cluster, signed

DAY = 86400.0


@pytest.fixture
def gateway(cluster_factory, tmp_path):
    yield from gateway_on_new_cluster(cluster_factory, tmp_path, max_connections=32)


def signed_json(gw, target: str, params: dict, role: str = "admin", *,
                drop_target_from_signature: bool = False) -> tuple[int, dict, bytes]:
    """A JSON protocol request signed as botocore signs it; (status, headers, body). With
    ``drop_target_from_signature`` the X-Amz-Target header is added after signing (a signer
    that signs only what SigV4 requires: host and x-amz-date, plus content-type)."""
    body = json.dumps(params).encode()
    headers = {"Content-Type": "application/x-amz-json-1.0"}
    if not drop_target_from_signature:
        headers["X-Amz-Target"] = target
    req = AWSRequest(method="POST", url=gw.url + "/", data=body, headers=headers)
    SigV4Auth(Credentials(*KEYS[role]), "sqs", "us-east-1").add_auth(req)
    prepared = req.prepare()
    sent = dict(prepared.headers)
    if drop_target_from_signature:
        sent["X-Amz-Target"] = target
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    try:
        conn.request("POST", "/", body=prepared.body, headers=sent)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def raw_all(gw, data: bytes, wait_s: float = 3.0) -> bytes:
    """Send ``data`` on one connection; everything read back until it closes or ``wait_s``
    passes without a byte."""
    with socket.create_connection(("127.0.0.1", gw.port), timeout=wait_s) as s:
        s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            out += chunk
        return out


# -- 1. text XML cannot carry, stored by a client-role key, kills other users' replies --------

def test_text_xml_cannot_carry_is_refused_where_it_would_be_stored(gateway):
    client = boto(gateway.url, role="client")
    for call in (lambda: client.create_queue(QueueName="tagged", tags={"t": "\ud800"}),
                 lambda: client.create_queue(QueueName="policied", Attributes={
                     "RedriveAllowPolicy": '{"redrivePermission":"allowAll","x":"\u0001"}'})):
        with pytest.raises(ClientError) as e:
            call()
        assert code(e.value) in ("InvalidParameterValue", "InvalidAttributeValue")
    url = client.create_queue(QueueName="plain")["QueueUrl"]
    with pytest.raises(ClientError) as e:
        boto(gateway.url).tag_queue(QueueUrl=url, Tags={"k": "\x02"})
    assert code(e.value) == "InvalidParameterValue"
    status, body = signed(gateway, {"Action": "ListQueueTags", "QueueUrl": url})
    assert status == 200, body  # the query protocol's XML still answers


# -- 2. a payload that merely starts like an envelope poisons receives -------------------------

@pytest.mark.parametrize("envelope", [["body", [], "", ""],  # attributes not a map
                                      [5, {}, "", ""]],  # body not text
                         ids=["attrs-list", "body-int"])
def test_a_malformed_envelope_does_not_break_receives_of_other_messages(gateway, envelope):
    sqs = boto(gateway.url)
    url = sqs.create_queue(QueueName="victim")["QueueUrl"]
    with Client(gateway.cluster.master_addr, timeout_s=10) as native:  # another producer
        native.enqueue("victim", msgs.ENVELOPE + msgpack.packb(envelope, use_bin_type=True))
    sqs.send_message(QueueUrl=url, MessageBody="innocent")
    try:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2)
    except ClientError as exc:
        pytest.fail(f"a receive failed with {code(exc)}; the innocent message is now leased "
                    "for the visibility timeout and counted as a failed delivery")
    assert "innocent" in [m["Body"] for m in got.get("Messages", [])]


def test_an_envelope_with_binary_ids_gets_a_reply(gateway):
    sqs = boto(gateway.url)
    url = sqs.create_queue(QueueName="grouped.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    with Client(gateway.cluster.master_addr, timeout_s=10) as native:
        native.enqueue("grouped.fifo", msgs.ENVELOPE + msgpack.packb(["x", {}, b"g", b"d"],
                                                                      use_bin_type=True),
                       key="g")
    status, _, body = signed_json(gateway, "AmazonSQS.ReceiveMessage",
                                  {"QueueUrl": url, "MessageSystemAttributeNames": ["All"],
                                   "WaitTimeSeconds": 2})
    assert status == 200, body  # now: no reply at all (json.dumps fails outside the try)


# -- 3. request framing ------------------------------------------------------------------------

def test_a_content_length_in_non_ascii_digits_is_a_400_and_ends_the_connection(gateway):
    # '\xb2' (superscript two) passes str.isdigit() but not int(); the body is then left
    # unread and parsed as the next request on the kept-alive connection
    inner = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
    out = raw_all(gateway, b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: \xb2\r\n"
                           b"\r\n" + inner)
    assert out.startswith(b"HTTP/1.1 400"), out[:200]
    assert out.count(b"HTTP/1.1 ") == 1, out  # the body was not taken for a second request


@pytest.mark.parametrize("framing", [
    b"Content-Length: 0\r\nContent-Length: 57\r\n",
    b"Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n",
], ids=["two-content-lengths", "second-transfer-encoding"])
def test_ambiguous_framing_is_refused(gateway, framing):
    inner = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
    out = raw_all(gateway, b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + framing + b"\r\n" + inner)
    assert out.startswith((b"HTTP/1.1 400", b"HTTP/1.1 411")), out[:200]
    assert out.count(b"HTTP/1.1 ") == 1, out  # one request, as a proxy in front would see it


# -- 4. the action is chosen by a header the signature need not cover -------------------------

def test_the_action_header_must_be_covered_by_the_signature(gateway):
    sqs = boto(gateway.url)
    url = sqs.create_queue(QueueName="payroll")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="keep me")
    # an admin's request whose signature covers host, x-amz-date, content-type and the body
    # {"QueueUrl": url}, but not X-Amz-Target: whoever relays it picks the action
    status, _, body = signed_json(gateway, "AmazonSQS.PurgeQueue", {"QueueUrl": url},
                                  drop_target_from_signature=True)
    assert status == 403, body
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "1"


# -- 5. a signed JSON body costs many times its size in memory -----------------------------------

def test_parsing_a_request_body_costs_a_bounded_multiple_of_its_size():
    body = b'{"Entries":[' + b"{}," * (MAX_BODY // 3 - 10) + b"{}]}"
    assert len(body) <= MAX_BODY
    tracemalloc.start()
    try:
        try:
            wire.from_json("AmazonSQS.SendMessageBatch", body)
        except wire.SqsError:
            return  # refused: fine
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # 256 connections at once, each this much: 256 * peak
    assert peak < 4 * MAX_BODY, f"{peak / 2**20:.0f} MiB for a {len(body) / 2**20:.0f} MiB body"


# -- 6. parameters of the wrong JSON type: 500s (one after items were leased) -----------------

def test_parameters_of_the_wrong_type_are_400s_not_500s(gateway):
    sqs = boto(gateway.url)
    url = sqs.create_queue(QueueName="typed", Attributes={
        "RedriveAllowPolicy": '{"redrivePermission":"allowAll"}'})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="m",
                     MessageAttributes={"a": {"DataType": "String", "StringValue": "v"}})
    cases = [("AmazonSQS.ListQueues", {"QueueNamePrefix": 5}),
             ("AmazonSQS.GetQueueAttributes", {"QueueUrl": url, "AttributeNames": [["x"]]}),
             ("AmazonSQS.GetQueueUrl", {"QueueName": "x"}),  # a control: 400
             ("AmazonSQS.SendMessage", {"QueueUrl": "http://[oops/000000000000/typed",
                                        "MessageBody": "x"}),
             ("AmazonSQS.CreateQueue", {"QueueName": "typed", "Attributes": {
                 "RedriveAllowPolicy": '{"redrivePermission":"allowAll","maxReceiveCount":"x"}'
             }}),
             ("AmazonSQS.ReceiveMessage", {"QueueUrl": url, "MessageAttributeNames": 5})]
    statuses = {}
    for target, params in cases:
        status, headers, body = signed_json(gateway, target, params)
        statuses[f"{target} {json.dumps(params)[:60]}"] = status
    assert all(s < 500 for s in statuses.values()), statuses
    # and the malformed receive above must not have consumed the message
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages")


# -- 7. a queue deleted elsewhere comes back on the next send (the 2 s attribute cache) --------

def test_a_send_after_delete_does_not_resurrect_the_queue(gateway):
    sqs = boto(gateway.url)
    url = sqs.create_queue(QueueName="gone")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="warm the cache")
    with Client(gateway.cluster.master_addr, timeout_s=10, admin=True) as native:
        native.delete_queue("gone", force=True)  # or DeleteQueue on another gateway
        try:
            sqs.send_message(QueueUrl=url, MessageBody="after delete")
        except ClientError as exc:
            assert code(exc) == "AWS.SimpleQueueService.NonExistentQueue"
        # what happens now: the send succeeds and the enqueue made the queue again, with
        # Blizzard's defaults (max_attempts 10, dead letters to gone.dead), not SQS's
        assert not native.admin.describe("gone").exists, native.queue_config("gone")


# -- 8. the master's unique keys: a heap entry per take, never bounded by MAX_UNIQUES ----------

def test_unique_keys_retaken_before_they_run_out_do_not_grow_the_master_without_bound():
    # unique_until_done=True: once the holder is acked, the next enqueue with the same key
    # takes it again (master/produce/enqueue.py _firsts); the old heap entry stays for 30 days
    s = State()
    now = 1000.0
    for item_id in range(1, 2001):
        s.apply(commit([item_id], ["k"], at=now, until=now + 30 * DAY))
        s.apply(AckItems(ids=[item_id]))
        now += 0.01
    assert len(s.uniques) == 1
    assert len(s.uniques._heap) <= 2 * len(s.uniques) + 1024, \
        f"{len(s.uniques._heap)} heap entries for {len(s.uniques)} key"


def test_one_queues_unique_keys_do_not_refuse_every_other_queues_enqueues(monkeypatch):
    import types

    import master.state.unique_keys as uniques_mod
    from blizzard.wire import protocol as p
    from blizzard.wire.errors import TooManyItems
    monkeypatch.setattr(uniques_mod, "MAX_PER_QUEUE", 1000)  # 100,000 in the real master
    state = State()
    state.apply(commit(list(range(1, 1001)), [f"dedup-{i}" for i in range(1000)], at=100.0,
                       until=100.0 + 300.0, queue="flood.fifo"))
    fake = types.SimpleNamespace(state=state, log=state.apply)
    fake._room_for_uniques = lambda queue, n, now: enqueue_mod.Enqueues._room_for_uniques(
        fake, queue, n, now)

    def enqueue(queue: str, at: float) -> None:
        msg = p.Enqueue(queue, [5000], [1], [0], [0], [0.0], ["g"], False, "r", False,
                        1.0, None, ["order-1"], 300.0)
        enqueue_mod.Enqueues._check_uniques(fake, msg, 1, at)

    import master.produce.enqueue as enqueue_mod
    enqueue("orders.fifo", 200.0)  # another queue: served
    with pytest.raises(TooManyItems, match="flood.fifo holds 1000"):
        enqueue("flood.fifo", 200.0)  # the flooding queue: at its cap
    enqueue("flood.fifo", 401.0)  # its keys ran out: room again
    assert len(state.uniques) == 0


def test_list_dead_letter_source_queues_costs_a_bounded_number_of_master_calls(gateway,
                                                                                  monkeypatch):
    # a client-role key may create up to the master's --client-queues (1000) queues and then
    # ask ListDeadLetterSourceQueues, from 64 connections at once: each request is one
    # Stats round trip to the master per queue, in a row (the admin can fill 10,000)
    client = boto(gateway.url, role="client")
    urls = [client.create_queue(QueueName=f"q{i}")["QueueUrl"] for i in range(40)]
    calls = []
    real = Client.queue_config
    monkeypatch.setattr(Client, "queue_config",
                        lambda self, q: calls.append(q) or real(self, q))
    client.list_dead_letter_source_queues(QueueUrl=urls[0])
    assert len(calls) <= 4, f"{len(calls)} master round trips for 40 queues"
