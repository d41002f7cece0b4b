"""``blizzard sqs`` side by side with moto's SQS server (``moto[server]``, a test dependency):
the same boto3 calls made to both, the answers compared (``tests/support/sqs_diff.py``).
``DIFFERENCES`` names each difference the gateway keeps, with its reason (docs/sqs.md lists
them too); any other fails the test, and so does a listed one no longer found."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from blizzard.local.harness import free_port

from support.gateway import listening
from support.sqs import KEYS, boto, gateway_on_new_cluster
from support.sqs_diff import FormClient, Step, differences
from support.wait import wait_for

pytestmark = pytest.mark.cluster

FIFO = {"FifoQueue": "true", "ContentBasedDeduplication": "true"}
STABLE_ATTRIBUTES = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                     "VisibilityTimeout", "MaximumMessageSize", "MessageRetentionPeriod",
                     "DelaySeconds", "ReceiveMessageWaitTimeSeconds"]


def note(notes: dict[str, Any], key: str, reply: dict[str, Any], field: str) -> dict[str, Any]:
    notes[key] = reply[field]
    return reply


def received(notes: dict[str, Any], key: str, reply: dict[str, Any]) -> dict[str, Any]:
    """Keep the first received message's receipt handle as ``key``."""
    if reply.get("Messages"):
        notes[key] = reply["Messages"][0]["ReceiptHandle"]
    return reply


def received_all(notes: dict[str, Any], key: str, reply: dict[str, Any], want: int, c: Any,
                 url: str) -> dict[str, Any]:
    """Receive until ``want`` messages came (a receive may return fewer); their bodies sorted,
    their handles kept as ``key``."""
    messages = list(reply.get("Messages", []))
    for _ in range(10):
        if len(messages) >= want:
            break
        messages += c.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                      WaitTimeSeconds=1).get("Messages", [])
    notes[key] = [m["ReceiptHandle"] for m in messages]
    return {"Bodies": sorted(m["Body"] for m in messages)}


def by_group(c: Any, url: str, want: int) -> dict[str, list[str]]:
    """Receive and delete until ``want`` messages came; each group's bodies in the order they
    came (how groups interleave is the server's choice)."""
    groups: dict[str, list[str]] = {}
    for _ in range(20):
        if sum(map(len, groups.values())) >= want:
            break
        reply = c.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                                  MessageSystemAttributeNames=["MessageGroupId"])
        for m in reply.get("Messages", []):
            groups.setdefault(m["Attributes"]["MessageGroupId"], []).append(m["Body"])
            c.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    return groups


def sorted_urls(reply: dict[str, Any]) -> dict[str, Any]:
    return {"QueueUrls": sorted(reply.get("QueueUrls", []))}


def all_visible(c: Any, url: str) -> dict[str, Any]:
    """Wait until no message of the queue is in flight (a visibility timeout has run out)."""
    wait_for(lambda: c.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"])
        ["Attributes"]["ApproximateNumberOfMessagesNotVisible"] == "0",
        what="the visibility timeout to run out")
    return {}


STEPS: list[Step] = [
    ("create", lambda c, n: note(n, "std", c.create_queue(QueueName="d-std"), "QueueUrl")),
    ("create again", lambda c, n: c.create_queue(QueueName="d-std")),
    ("create again, other attributes", lambda c, n: c.create_queue(
        QueueName="d-std", Attributes={"VisibilityTimeout": "5"})),
    ("create fifo", lambda c, n: note(n, "fifo", c.create_queue(
        QueueName="d-q.fifo", Attributes=FIFO), "QueueUrl")),
    ("create bad name", lambda c, n: c.create_queue(QueueName="bad name!")),
    ("get url", lambda c, n: c.get_queue_url(QueueName="d-std")),
    ("get url missing", lambda c, n: c.get_queue_url(QueueName="d-absent")),
    ("send", lambda c, n: c.send_message(
        QueueUrl=n["std"], MessageBody="hello", MessageAttributes={
            "a": {"DataType": "String", "StringValue": "x"},
            "b": {"DataType": "Number", "StringValue": "12"}})),
    ("send delay too long", lambda c, n: c.send_message(
        QueueUrl=n["std"], MessageBody="late", DelaySeconds=901)),
    ("receive", lambda c, n: received(n, "h", c.receive_message(
        QueueUrl=n["std"], MessageAttributeNames=["All"],
        AttributeNames=["ApproximateReceiveCount"], WaitTimeSeconds=1))),
    ("change visibility", lambda c, n: c.change_message_visibility(
        QueueUrl=n["std"], ReceiptHandle=n["h"], VisibilityTimeout=0)),
    ("receive again", lambda c, n: received(n, "h", c.receive_message(
        QueueUrl=n["std"], AttributeNames=["ApproximateReceiveCount"], WaitTimeSeconds=1))),
    ("delete", lambda c, n: c.delete_message(QueueUrl=n["std"], ReceiptHandle=n["h"])),
    ("delete a handle that is none", lambda c, n: c.delete_message(
        QueueUrl=n["std"], ReceiptHandle="garbage")),
    ("receive none", lambda c, n: c.receive_message(QueueUrl=n["std"], WaitTimeSeconds=0)),
    ("send batch", lambda c, n: c.send_message_batch(QueueUrl=n["std"], Entries=[
        {"Id": "1", "MessageBody": "a"}, {"Id": "2", "MessageBody": "b"}])),
    ("send batch, ids not distinct", lambda c, n: c.send_message_batch(
        QueueUrl=n["std"], Entries=[{"Id": "1", "MessageBody": "a"},
                                    {"Id": "1", "MessageBody": "b"}])),
    ("attributes", lambda c, n: c.get_queue_attributes(
        QueueUrl=n["std"], AttributeNames=STABLE_ATTRIBUTES)),
    ("purge", lambda c, n: c.purge_queue(QueueUrl=n["std"])),
    ("fifo send without a group", lambda c, n: c.send_message(
        QueueUrl=n["fifo"], MessageBody="x")),
    ("fifo send", lambda c, n: c.send_message(
        QueueUrl=n["fifo"], MessageBody="f1", MessageGroupId="g")),
    ("fifo send again, deduplicated", lambda c, n: c.send_message(
        QueueUrl=n["fifo"], MessageBody="f1", MessageGroupId="g")),
    ("fifo send another", lambda c, n: c.send_message(
        QueueUrl=n["fifo"], MessageBody="f2", MessageGroupId="g")),
    ("fifo receive", lambda c, n: received(n, "fh", c.receive_message(
        QueueUrl=n["fifo"], MaxNumberOfMessages=1, VisibilityTimeout=1, WaitTimeSeconds=1))),
    ("fifo wait for the visibility timeout", lambda c, n: all_visible(c, n["fifo"])),
    ("fifo delete with an expired handle", lambda c, n: c.delete_message(
        QueueUrl=n["fifo"], ReceiptHandle=n["fh"])),
    ("fifo attributes after", lambda c, n: c.get_queue_attributes(
        QueueUrl=n["fifo"], AttributeNames=["ApproximateNumberOfMessages"])),
    ("tag", lambda c, n: c.tag_queue(QueueUrl=n["std"], Tags={"team": "a", "env": "t"})),
    ("list tags", lambda c, n: c.list_queue_tags(QueueUrl=n["std"])),
    ("untag", lambda c, n: c.untag_queue(QueueUrl=n["std"], TagKeys=["env"])),
    ("list tags after", lambda c, n: c.list_queue_tags(QueueUrl=n["std"])),
    ("set attributes", lambda c, n: c.set_queue_attributes(
        QueueUrl=n["std"], Attributes={"VisibilityTimeout": "10", "DelaySeconds": "0"})),
    ("set a bad attribute value", lambda c, n: c.set_queue_attributes(
        QueueUrl=n["std"], Attributes={"VisibilityTimeout": "99999"})),
    ("attributes after", lambda c, n: c.get_queue_attributes(
        QueueUrl=n["std"], AttributeNames=["VisibilityTimeout", "DelaySeconds"])),
    ("receive too many", lambda c, n: c.receive_message(
        QueueUrl=n["std"], MaxNumberOfMessages=11)),
    ("send three", lambda c, n: c.send_message_batch(QueueUrl=n["std"], Entries=[
        {"Id": str(k), "MessageBody": f"m{k}"} for k in range(3)])),
    ("receive three", lambda c, n: received_all(n, "hs", c.receive_message(
        QueueUrl=n["std"], MaxNumberOfMessages=10, WaitTimeSeconds=1), want=3, c=c,
        url=n["std"])),
    ("change visibility batch", lambda c, n: c.change_message_visibility_batch(
        QueueUrl=n["std"], Entries=[{"Id": "a", "ReceiptHandle": n["hs"][0],
                                     "VisibilityTimeout": 30},
                                    {"Id": "b", "ReceiptHandle": "garbage",
                                     "VisibilityTimeout": 30}])),
    ("delete batch", lambda c, n: c.delete_message_batch(QueueUrl=n["std"], Entries=[
        {"Id": f"d{k}", "ReceiptHandle": h} for k, h in enumerate(n["hs"])])),
    ("delete batch, a handle that is none", lambda c, n: c.delete_message_batch(
        QueueUrl=n["std"], Entries=[{"Id": "x", "ReceiptHandle": "garbage"}])),
    ("list queues", lambda c, n: sorted_urls(c.list_queues(QueueNamePrefix="d-"))),
    ("fifo two groups", lambda c, n: [c.send_message(
        QueueUrl=n["fifo"], MessageBody=f"{g}{k}", MessageGroupId=g)
        for g in "ab" for k in range(2)] and {}),
    ("fifo receive, each group in order", lambda c, n: by_group(c, n["fifo"], want=5)),
    ("delete queue", lambda c, n: c.delete_queue(QueueUrl=n["std"])),
    ("get url of a deleted queue", lambda c, n: c.get_queue_url(QueueName="d-std")),
    # last, on a queue of their own: moto takes these bodies, SQS does not
    ("create lax", lambda c, n: note(n, "lax", c.create_queue(QueueName="d-lax"), "QueueUrl")),
    ("send empty body", lambda c, n: c.send_message(QueueUrl=n["lax"], MessageBody="")),
    ("send bad character", lambda c, n: c.send_message(QueueUrl=n["lax"], MessageBody="a\x00")),
]

# The differences the gateway keeps, each with its reason (docs/sqs.md lists them too).
LAX = ("moto takes it; SQS refuses a body that is empty or holds a character outside "
       "#x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD | #x10000-#x10FFFF (the API reference of "
       "SendMessage), as the gateway does")
LAX_ATTRIBUTE = ("moto takes a VisibilityTimeout of 99999 s; SQS refuses one over 43200 (12 h) "
                 "with InvalidAttributeValue and keeps the old value, as the gateway does")
DIFFERENCES: dict[tuple[str, str], str] = {
    ("send empty body", "Error"): LAX, ("send empty body", "MD5OfMessageBody"): LAX,
    ("send bad character", "Error"): LAX, ("send bad character", "MD5OfMessageBody"): LAX,
    ("set a bad attribute value", "Error"): LAX_ATTRIBUTE,
    ("attributes after", "Attributes.VisibilityTimeout"): LAX_ATTRIBUTE,
}


@pytest.fixture
def moto_server():
    """moto's SQS server, of this environment's moto (``python -m moto.server``)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: listening(port) or proc.poll() is not None, what="moto's server to listen")
    assert proc.poll() is None, "moto's server did not start: the test extra installs moto[server]"
    yield f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait(10)


@pytest.fixture
def gateway(cluster_factory, tmp_path):
    yield from gateway_on_new_cluster(cluster_factory, tmp_path)


# the query protocol (a form in, XML out): what older SDKs and hand-written clients send
EVERY_KIND = ('h\u00e9llo \u2744 {"n": 1} <xml>&amp;</xml>\n\t\r\nend\r "\' '
              "\x20\ud7ff\ue000\ufffd\U00010000\U0010ffff \U0001f600")
Q = "QueueUrl"
QUERY_STEPS: list[Step] = [
    ("create", lambda f, n: note(n, "std", f(Action="CreateQueue", QueueName="f-std"), Q)),
    ("create fifo", lambda f, n: note(n, "fifo", f(
        Action="CreateQueue", QueueName="f-q.fifo", **{
            "Attribute.1.Name": "FifoQueue", "Attribute.1.Value": "true",
            "Attribute.2.Name": "ContentBasedDeduplication", "Attribute.2.Value": "true"}), Q)),
    ("get url", lambda f, n: f(Action="GetQueueUrl", QueueName="f-std")),
    ("get url missing", lambda f, n: f(Action="GetQueueUrl", QueueName="f-absent")),
    ("send every kind of character", lambda f, n: f(
        Action="SendMessage", QueueUrl=n["std"], MessageBody=EVERY_KIND, **{
            "MessageAttribute.1.Name": "color", "MessageAttribute.1.Value.DataType": "String",
            "MessageAttribute.1.Value.StringValue": "blue\r\n"})),
    ("receive", lambda f, n: received_form(n, "h", f(
        Action="ReceiveMessage", QueueUrl=n["std"], WaitTimeSeconds="1",
        **{"AttributeName.1": "ApproximateReceiveCount", "MessageAttributeName.1": "All"}))),
    ("change visibility", lambda f, n: f(Action="ChangeMessageVisibility", QueueUrl=n["std"],
                                         ReceiptHandle=n["h"], VisibilityTimeout="0")),
    ("delete", lambda f, n: f(Action="DeleteMessage", QueueUrl=n["std"], ReceiptHandle=n["h"])),
    ("delete a handle that is none", lambda f, n: f(
        Action="DeleteMessage", QueueUrl=n["std"], ReceiptHandle="garbage")),
    ("send batch", lambda f, n: f(Action="SendMessageBatch", QueueUrl=n["std"], **{
        f"SendMessageBatchRequestEntry.{k}.{field}": value for k in (1, 2)
        for field, value in (("Id", str(k)), ("MessageBody", "ab"[k - 1]))})),
    ("attributes", lambda f, n: f(Action="GetQueueAttributes", QueueUrl=n["std"], **{
        f"AttributeName.{k}": name for k, name in enumerate(STABLE_ATTRIBUTES, 1)})),
    ("fifo send", lambda f, n: f(Action="SendMessage", QueueUrl=n["fifo"], MessageBody="f1",
                                 MessageGroupId="g")),
    ("fifo send without a group", lambda f, n: f(Action="SendMessage", QueueUrl=n["fifo"],
                                                 MessageBody="f1")),
    ("purge", lambda f, n: f(Action="PurgeQueue", QueueUrl=n["std"])),
    ("delete queue", lambda f, n: f(Action="DeleteQueue", QueueUrl=n["std"])),
    ("unknown action", lambda f, n: f(Action="Frobnicate")),
]
QUERY_DIFFERENCES: dict[tuple[str, str], str] = {
    ("unknown action", "Error"): "moto answers an action it does not know with an HTTP 500 "
                                 "page; SQS and the gateway with the error InvalidAction",
}


def received_form(notes: dict[str, Any], key: str, reply: Any) -> Any:
    message = reply.get("Message") if isinstance(reply, dict) else None
    if isinstance(message, dict):
        notes[key] = message["ReceiptHandle"]
    return reply


def test_the_query_protocol_answers_as_moto_but_for_the_named_differences(moto_server,
                                                                           gateway):
    found, transcript = differences(QUERY_STEPS, FormClient(moto_server, KEYS["admin"]),
                                    FormClient(gateway.url, KEYS["admin"]))
    unexpected = sorted(found - QUERY_DIFFERENCES.keys())
    gone = sorted(QUERY_DIFFERENCES.keys() - found)
    assert not unexpected, "differences not on the list:\n" + "\n".join(transcript)
    assert not gone, f"listed differences no longer found (take them off the list): {gone}"


def test_the_gateway_answers_as_moto_but_for_the_named_differences(moto_server, gateway):
    found, transcript = differences(STEPS, boto(moto_server), boto(gateway.url))
    unexpected = sorted(found - DIFFERENCES.keys())
    gone = sorted(DIFFERENCES.keys() - found)
    assert not unexpected, "differences not on the list:\n" + "\n".join(transcript)
    assert not gone, f"listed differences no longer found (take them off the list): {gone}"
