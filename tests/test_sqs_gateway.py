"""``blizzard sqs``: boto3 against the gateway in front of a real (secure) cluster, for every
action the gateway serves: queues and their attributes, sends and receives, visibility,
batches, FIFO groups and deduplication, dead letters and their redrive, tags."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import subprocess
import threading
import time

import pytest
from botocore.exceptions import ClientError

from blizzard import Client
from blizzard.local.harness import free_port

from support.cli import BLIZZARD
from support.gateway import gateway_process, listening
from support.sqs import boto, code, credentials_file, gateway_on_new_cluster
from support.wait import wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture
def gateway(cluster_factory, tmp_path):
    yield from gateway_on_new_cluster(cluster_factory, tmp_path)


@pytest.fixture
def sqs(gateway):
    return boto(gateway.url)


def md5_of_attributes(attrs: dict) -> str:
    """SQS's documented digest of message attributes, written out independently."""
    out = b""
    for name in sorted(attrs):
        kind = attrs[name]["DataType"]
        if "BinaryValue" in attrs[name]:
            value, transport = attrs[name]["BinaryValue"], b"\x02"
        else:
            value, transport = attrs[name]["StringValue"].encode(), b"\x01"
        for part in (name.encode(), kind.encode()):
            out += struct.pack(">I", len(part)) + part
        out += transport + struct.pack(">I", len(value)) + value
    return hashlib.md5(out).hexdigest()


def test_send_receive_delete_round_trip(sqs, gateway):
    url = sqs.create_queue(QueueName="emails")["QueueUrl"]
    assert url == f"{gateway.url}/000000000000/emails"
    assert sqs.get_queue_url(QueueName="emails")["QueueUrl"] == url
    attrs = {"lang": {"DataType": "String", "StringValue": "en"},
             "n": {"DataType": "Number", "StringValue": "42"},
             "raw": {"DataType": "Binary", "BinaryValue": b"\x00\xff"}}
    sent = sqs.send_message(QueueUrl=url, MessageBody="héllo", MessageAttributes=attrs)
    assert sent["MD5OfMessageBody"] == hashlib.md5("héllo".encode()).hexdigest()
    assert sent["MD5OfMessageAttributes"] == md5_of_attributes(attrs)
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=5,
                              MessageAttributeNames=["All"],
                              MessageSystemAttributeNames=["All"])["Messages"]
    assert len(got) == 1
    m = got[0]
    assert (m["MessageId"], m["Body"]) == (sent["MessageId"], "héllo")
    assert m["MessageAttributes"] == attrs
    assert m["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert m["Attributes"]["ApproximateReceiveCount"] == "1"
    assert abs(int(m["Attributes"]["SentTimestamp"]) / 1000 - time.time()) < 60
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    with Client(gateway.cluster.master_addr, timeout_s=10) as native:
        stats = native.stats("emails")
        assert stats["ready"] == stats["leased"] == 0


def test_a_plain_message_is_the_item_itself_both_ways(sqs, gateway):
    url = sqs.create_queue(QueueName="mixed")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="plain text")
    with Client(gateway.cluster.master_addr, timeout_s=10) as native:
        m = native.dequeue("mixed", wait_s=5)
        assert m.data == b"plain text"
        m.ack(wait=True)
        native.enqueue("mixed", b"\xff\x00binary")
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5,
                              MessageAttributeNames=["Blizzard.*"])["Messages"][0]
    assert got["Body"] == "/wBiaW5hcnk="  # base64, and said so
    assert got["MessageAttributes"]["Blizzard.BodyEncoding"]["StringValue"] == "base64"


def test_unknown_queues_and_bad_parameters_are_refused_with_sqs_codes(sqs):
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as e:
        sqs.get_queue_url(QueueName="nope")
    assert code(e.value) == "AWS.SimpleQueueService.NonExistentQueue"
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl="http://127.0.0.1:1/000000000000/nope", MessageBody="x")
    assert code(e.value) == "AWS.SimpleQueueService.NonExistentQueue"
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName="bad name!")
    assert code(e.value) == "InvalidParameterValue"
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="bad \x01 char")
    assert code(e.value) == "InvalidMessageContents"
    for bad in ({"MaxNumberOfMessages": 11}, {"WaitTimeSeconds": 21},
                {"VisibilityTimeout": 43_201}):
        with pytest.raises(ClientError) as e:
            sqs.receive_message(QueueUrl=url, **bad)
        assert code(e.value) == "InvalidParameterValue"
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes={
            "AWS.x": {"DataType": "String", "StringValue": "v"}})
    assert code(e.value) == "InvalidParameterValue"
    with pytest.raises(ClientError) as e:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": "{}"})
    assert code(e.value) == "InvalidAttributeName"
    with pytest.raises(ClientError) as e:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "901"})
    assert code(e.value) == "InvalidAttributeValue"
    assert "Messages" not in sqs.receive_message(QueueUrl=url)  # nothing was sent


def test_queue_attributes_tags_listing_purge_and_delete(sqs, gateway):
    url = sqs.create_queue(QueueName="orders", Attributes={
        "VisibilityTimeout": "45", "DelaySeconds": "0", "MaximumMessageSize": "2048"},
        tags={"team": "shop"})["QueueUrl"]
    # the same attributes again: the same queue; a different value: refused
    assert sqs.create_queue(QueueName="orders", Attributes={"VisibilityTimeout": "45"})[
        "QueueUrl"] == url
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName="orders", Attributes={"VisibilityTimeout": "46"})
    assert code(e.value) == "QueueAlreadyExists"
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "45" and attrs["MaximumMessageSize"] == "2048"
    assert attrs["QueueArn"] == "arn:aws:sqs:us-east-1:000000000000:orders"
    with Client(gateway.cluster.master_addr, timeout_s=10) as native:
        assert native.queue_config("orders")["lease_s"] == 45.0  # the setting itself
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="x" * 2049)
    assert code(e.value) == "InvalidParameterValue"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "5",
                                                       "ReceiveMessageWaitTimeSeconds": "1"})
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "VisibilityTimeout", "ReceiveMessageWaitTimeSeconds", "ApproximateNumberOfMessages"])
    assert attrs["Attributes"] == {"VisibilityTimeout": "5",
                                   "ReceiveMessageWaitTimeSeconds": "1",
                                   "ApproximateNumberOfMessages": "0"}
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "shop"}
    sqs.tag_queue(QueueUrl=url, Tags={"env": "test"})
    sqs.untag_queue(QueueUrl=url, TagKeys=["team"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "test"}
    for name in ("orders-2", "other"):
        sqs.create_queue(QueueName=name)
    listed = sqs.list_queues(QueueNamePrefix="orders")["QueueUrls"]
    assert [u.rsplit("/", 1)[1] for u in listed] == ["orders", "orders-2"]
    page = sqs.list_queues(MaxResults=2)
    assert len(page["QueueUrls"]) == 2 and "NextToken" in page
    rest = sqs.list_queues(MaxResults=2, NextToken=page["NextToken"])["QueueUrls"]
    assert not set(rest) & set(page["QueueUrls"])
    sqs.send_message(QueueUrl=url, MessageBody="a")
    sqs.purge_queue(QueueUrl=url)
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "0"
    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName="orders")


def test_visibility_timeout_redelivery_and_stale_handles(sqs):
    url = sqs.create_queue(QueueName="vis")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="job")
    first = sqs.receive_message(QueueUrl=url, VisibilityTimeout=1, WaitTimeSeconds=5,
                                AttributeNames=["ApproximateReceiveCount"])["Messages"][0]
    assert "Messages" not in sqs.receive_message(QueueUrl=url)  # in flight: invisible
    second = wait_for(lambda: sqs.receive_message(
        QueueUrl=url, WaitTimeSeconds=1, VisibilityTimeout=60,
        AttributeNames=["ApproximateReceiveCount"]).get("Messages"), timeout_s=15)[0]
    assert second["MessageId"] == first["MessageId"]
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"
    # the first delivery's handle: as SQS on a standard queue, its delete is answered and
    # deletes nothing (the item is the second consumer's now)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    with pytest.raises(ClientError) as e:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"],
                                      VisibilityTimeout=10)
    assert code(e.value) == "AWS.SimpleQueueService.MessageNotInflight"
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "1"
    # visibility 0: visible again at once
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"],
                                  VisibilityTimeout=0)
    third = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]
    assert third["MessageId"] == first["MessageId"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=third["ReceiptHandle"],
                                  VisibilityTimeout=600)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=third["ReceiptHandle"])
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "0"


def test_receipt_handles_never_issued_or_for_another_queue_are_invalid(sqs):
    a = sqs.create_queue(QueueName="a")["QueueUrl"]
    b = sqs.create_queue(QueueName="b")["QueueUrl"]
    sqs.send_message(QueueUrl=a, MessageBody="x")
    m = sqs.receive_message(QueueUrl=a, WaitTimeSeconds=5)["Messages"][0]
    body, _, tag = m["ReceiptHandle"].partition(".")
    for forged in ("garbage", body + "." + "0" * len(tag), "x" * 2000):
        with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
            sqs.delete_message(QueueUrl=a, ReceiptHandle=forged)
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
        sqs.delete_message(QueueUrl=b, ReceiptHandle=m["ReceiptHandle"])
    sqs.delete_message(QueueUrl=a, ReceiptHandle=m["ReceiptHandle"])


def test_batches_answer_each_entry(sqs):
    url = sqs.create_queue(QueueName="batch", Attributes={"MaximumMessageSize": "1024"})[
        "QueueUrl"]
    sent = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "a", "MessageBody": "one"}, {"Id": "b", "MessageBody": "two", "DelaySeconds": 0},
        {"Id": "big", "MessageBody": "x" * 1025}])
    assert {e["Id"] for e in sent["Successful"]} == {"a", "b"}
    assert [(f["Id"], f["Code"], f["SenderFault"]) for f in sent["Failed"]] == \
        [("big", "InvalidParameterValue", True)]
    for entries, expected in (([], "AWS.SimpleQueueService.EmptyBatchRequest"),
                              ([{"Id": str(i), "MessageBody": "x"} for i in range(11)],
                               "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"),
                              ([{"Id": "same", "MessageBody": "x"}] * 2,
                               "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
                              ([{"Id": "bad id!", "MessageBody": "x"}],
                               "AWS.SimpleQueueService.InvalidBatchEntryId")):
        with pytest.raises(ClientError) as e:
            sqs.send_message_batch(QueueUrl=url, Entries=entries)
        assert code(e.value) == expected
    got = wait_for(lambda: (sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                                WaitTimeSeconds=1).get("Messages") or [])
                   or None, timeout_s=10)
    while len(got) < 2:
        got += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                   WaitTimeSeconds=2).get("Messages", [])
    assert sorted(m["Body"] for m in got) == ["one", "two"]
    changed = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "x", "ReceiptHandle": got[0]["ReceiptHandle"], "VisibilityTimeout": 100},
        {"Id": "y", "ReceiptHandle": "forged", "VisibilityTimeout": 100}])
    assert [e["Id"] for e in changed["Successful"]] == ["x"]
    assert [(f["Id"], f["Code"]) for f in changed["Failed"]] == [("y", "ReceiptHandleIsInvalid")]
    deleted = sqs.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)])
    assert len(deleted["Successful"]) == 2 and not deleted["Failed"]


def test_long_polling_returns_a_message_sent_while_waiting(sqs):
    url = sqs.create_queue(QueueName="poll")["QueueUrl"]
    other = boto(sqs.meta.endpoint_url)
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(
        sqs.receive_message(QueueUrl=url, WaitTimeSeconds=20)))
    waiter.start()
    time.sleep(0.5)  # (not a synchronisation: the receive may start waiting before or after)
    other.send_message(QueueUrl=url, MessageBody="late")
    waiter.join(30)
    assert got and got[0]["Messages"][0]["Body"] == "late"


def test_fifo_groups_in_order_one_in_flight_each_and_deduplicated(sqs):
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName="jobs.fifo")  # FifoQueue must be said
    assert code(e.value) == "InvalidParameterValue"
    url = sqs.create_queue(QueueName="jobs.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    ids = {}
    for body, group in (("a1", "A"), ("b1", "B"), ("a2", "A"), ("a3", "A"), ("b2", "B")):
        ids[body] = sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group,
                                     MessageDeduplicationId=body)["MessageId"]
    # a duplicate within five minutes: answered with the first's id, not queued again
    again = sqs.send_message(QueueUrl=url, MessageBody="a1 again", MessageGroupId="A",
                             MessageDeduplicationId="a1")
    assert again["MessageId"] == ids["a1"]
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="A")  # no dedup id
    assert code(e.value) == "InvalidParameterValue"
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageDeduplicationId="x")  # no group
    assert code(e.value) == "MissingParameter"
    order: list[str] = []
    while len(order) < 5:
        batch = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=5,
                                    AttributeNames=["All"])["Messages"]
        groups = [m["Attributes"]["MessageGroupId"] for m in batch]
        assert len(groups) == len(set(groups))  # one message of a group in flight at a time
        for m in batch:
            order.append(m["Body"])
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert [b for b in order if b[0] == "a"] == ["a1", "a2", "a3"]
    assert [b for b in order if b[0] == "b"] == ["b1", "b2"]


def test_fifo_content_based_deduplication_and_expired_handles(sqs):
    url = sqs.create_queue(QueueName="cbd.fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true",
        "VisibilityTimeout": "1"})["QueueUrl"]
    first = sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")
    second = sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")
    assert first["MessageId"] == second["MessageId"]
    m = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]
    again = wait_for(lambda: sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1,
                                                 VisibilityTimeout=60).get("Messages"),
                     timeout_s=15)[0]
    assert again["MessageId"] == m["MessageId"]
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):  # FIFO: expired is refused
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])


def test_dead_letters_and_their_move_back(sqs):
    dlq = sqs.create_queue(QueueName="work-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2})
    url = sqs.create_queue(QueueName="work", Attributes={"RedrivePolicy": policy})["QueueUrl"]
    assert json.loads(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])[
        "Attributes"]["RedrivePolicy"]) == {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2}
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [url]
    sqs.send_message(QueueUrl=url, MessageBody="poison")
    for _ in range(2):  # two receives that give it back: then it is dead
        m = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"],
                                      VisibilityTimeout=0)
    dead = sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=5, VisibilityTimeout=1)
    assert dead["Messages"][0]["Body"] == "poison"
    wait_for(lambda: sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=[
        "ApproximateNumberOfMessages"])["Attributes"]["ApproximateNumberOfMessages"] == "1",
        timeout_s=15)
    sqs.start_message_move_task(SourceArn=dlq_arn)
    back = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]
    assert back["Body"] == "poison"
    with pytest.raises(ClientError) as e:
        sqs.start_message_move_task(SourceArn="arn:aws:sqs:us-east-1:000000000000:work")
    assert code(e.value) == "InvalidParameterValue"  # not a dead-letter queue


def test_blizzard_sqs_serves_signed_requests_until_ctrl_c(cluster_factory, tmp_path):
    cluster = cluster_factory(datanodes=2, replication=2)
    port = free_port()
    proc = gateway_process(cluster.master_addr, port, "--credentials",
                           credentials_file(str(tmp_path)), "--admin", kind="sqs", secure=True)
    try:
        wait_for(lambda: listening(port), timeout_s=30, what="blizzard sqs listening")
        sqs = boto(f"http://127.0.0.1:{port}")
        url = sqs.create_queue(QueueName="cli")["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="from the command")
        assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]["Body"] \
            == "from the command"
        with pytest.raises(ClientError) as e:
            boto(f"http://127.0.0.1:{port}", key=("AKIDADMIN", "wrong-secret")).list_queues()
        assert code(e.value) == "SignatureDoesNotMatch"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert f"SQS gateway on http://127.0.0.1:{port}".encode() in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def test_blizzard_sqs_refuses_a_credentials_file_others_can_read(tmp_path):
    path = credentials_file(str(tmp_path))
    os.chmod(path, 0o644)
    out = subprocess.run([*BLIZZARD, "sqs", "--master", "tcp://127.0.0.1:1", "--listen",
                          f"127.0.0.1:{free_port()}", "--credentials", path],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "chmod 600" in out.stderr


def test_a_gateway_without_the_clusters_keys_refuses_to_start(cluster_factory):
    cluster = cluster_factory(datanodes=1, replication=1)  # secure: keys of this process
    for kind in ("sqs", "beanstalkd"):
        proc = gateway_process(cluster.master_addr, free_port(), kind=kind)  # without keys
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, err
        assert b"refuses this gateway" in err and b"--keys" in err
