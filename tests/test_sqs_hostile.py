"""``blizzard sqs`` against callers who are not who they say, or send what SQS never would:
signatures (none, wrong, stale, another role's), the query protocol's forms and XML, and
malformed, oversized or never-finished requests. Each is refused with SQS's error and
changes nothing; the gateway keeps serving."""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import time
import xml.etree.ElementTree as ET

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from blizzard.gateways import sigv4
from blizzard.gateways.sqs import SqsConfig, SqsServer

from support.sqs import KEYS, boto, code, gateway_on_new_cluster, signed

pytestmark = pytest.mark.cluster
NS = {"q": "http://queue.amazonaws.com/doc/2012-11-05/"}


@pytest.fixture
def gateway(cluster_factory, tmp_path):
    yield from gateway_on_new_cluster(cluster_factory, tmp_path, max_connections=32)


def xml_code(body: bytes) -> str:
    return ET.fromstring(body).find("q:Error/q:Code", NS).text


def test_signatures_none_wrong_unknown_or_stale_are_refused(gateway):
    good = boto(gateway.url)
    url = good.create_queue(QueueName="safe")["QueueUrl"]
    for client, expected in ((boto(gateway.url, key=("AKIDADMIN", "not-the-secret")),
                              "SignatureDoesNotMatch"),
                             (boto(gateway.url, key=("AKIDNOBODY", "whatever-secret")),
                              "InvalidClientTokenId")):
        with pytest.raises(ClientError) as e:
            client.send_message(QueueUrl=url, MessageBody="forged")
        assert code(e.value) == expected
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    # no signature at all
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    conn.request("POST", "/", body=json.dumps({"QueueUrl": url, "MessageBody": "x"}),
                 headers={"X-Amz-Target": "AmazonSQS.SendMessage",
                          "Content-Type": "application/x-amz-json-1.0"})
    resp = conn.getresponse()
    assert resp.status == 403
    assert resp.getheader("x-amzn-query-error") == "MissingAuthenticationToken;Sender"
    resp.read()
    # a request signed an hour ago (a captured one, replayed)
    status, body = signed(gateway, {"Action": "SendMessage", "QueueUrl": url,
                                    "MessageBody": "replayed"}, when=time.time() - 3600)
    assert (status, xml_code(body)) == (403, "RequestExpired")
    assert "Messages" not in good.receive_message(QueueUrl=url)  # nothing got in


def test_a_client_role_key_cannot_do_what_needs_an_admin(gateway):
    admin, client = boto(gateway.url), boto(gateway.url, role="client")
    url = client.create_queue(QueueName="mine")["QueueUrl"]  # a client may create a queue
    client.send_message(QueueUrl=url, MessageBody="x")
    for call in (lambda: client.delete_queue(QueueUrl=url),
                 lambda: client.purge_queue(QueueUrl=url),
                 lambda: client.set_queue_attributes(QueueUrl=url,
                                                     Attributes={"VisibilityTimeout": "1"}),
                 lambda: client.tag_queue(QueueUrl=url, Tags={"a": "b"})):
        with pytest.raises(ClientError) as e:
            call()
        assert code(e.value) == "AccessDenied"
    dlq_arn = "arn:aws:sqs:us-east-1:000000000000:mine"
    with pytest.raises(ClientError) as e:
        client.create_queue(QueueName="other", Attributes={"RedrivePolicy": json.dumps(
            {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 3})})
    assert code(e.value) == "AccessDenied"
    attrs = admin.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "1"  # nothing changed
    admin.delete_queue(QueueUrl=url)


def test_the_query_protocol_form_in_and_xml_out(gateway):
    status, body = signed(gateway, {"Action": "CreateQueue", "QueueName": "legacy",
                                    "Attribute.1.Name": "VisibilityTimeout",
                                    "Attribute.1.Value": "40", "Version": "2012-11-05"})
    assert status == 200, body
    url = ET.fromstring(body).find("q:CreateQueueResult/q:QueueUrl", NS).text
    status, body = signed(gateway, {
        "Action": "SendMessage", "QueueUrl": url, "MessageBody": "via form",
        "MessageAttribute.1.Name": "color", "MessageAttribute.1.Value.DataType": "String",
        "MessageAttribute.1.Value.StringValue": "blue"})
    assert status == 200, body
    sent = ET.fromstring(body).find("q:SendMessageResult", NS)
    status, body = signed(gateway, {"Action": "ReceiveMessage", "QueueUrl": url,
                                    "AttributeName.1": "All", "MessageAttributeName.1": "All",
                                    "WaitTimeSeconds": "5"})
    assert status == 200, body
    m = ET.fromstring(body).find("q:ReceiveMessageResult/q:Message", NS)
    assert m.find("q:Body", NS).text == "via form"
    assert m.find("q:MessageId", NS).text == sent.find("q:MessageId", NS).text
    assert m.find("q:MD5OfMessageAttributes", NS).text == \
        sent.find("q:MD5OfMessageAttributes", NS).text
    names = {a.find("q:Name", NS).text for a in m.findall("q:Attribute", NS)}
    assert {"SentTimestamp", "ApproximateReceiveCount"} <= names
    attr = m.find("q:MessageAttribute", NS)
    assert attr.find("q:Name", NS).text == "color"
    assert attr.find("q:Value/q:StringValue", NS).text == "blue"
    status, body = signed(gateway, {"Action": "GetQueueAttributes", "QueueUrl": url,
                                    "AttributeName.1": "VisibilityTimeout"})
    assert [(a.find("q:Name", NS).text, a.find("q:Value", NS).text) for a in
            ET.fromstring(body).findall("q:GetQueueAttributesResult/q:Attribute", NS)] == \
        [("VisibilityTimeout", "40")]
    status, body = signed(gateway, {"Action": "DeleteMessage", "QueueUrl": url,
                                    "ReceiptHandle": m.find("q:ReceiptHandle", NS).text})
    assert status == 200, body
    status, body = signed(gateway, {"Action": "GetQueueUrl", "QueueName": "absent"})
    assert (status, xml_code(body)) == (400, "AWS.SimpleQueueService.NonExistentQueue")
    status, body = signed(gateway, {"Action": "Frobnicate"})
    assert (status, xml_code(body)) == (400, "InvalidAction")
    status, body = signed(gateway, {"Action": "ListQueues", "QueueNamePrefix": "leg"})
    assert [u.text for u in ET.fromstring(body).findall("q:ListQueuesResult/q:QueueUrl",
                                                         NS)] == [url]


def raw(gateway, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=20) as s:
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


# a body of every kind of character SQS allows: tab, LF, CR (alone and before LF), XML's
# specials and an entity's text, accented Latin, a BMP symbol, the edges of the ranges, astral
EVERY_KIND = ('h\u00e9llo \u2744 {"n": 1} <xml>&amp;</xml>\n\t\r\nend\r "\' '
              "\x20\ud7ff\ue000\ufffd\U00010000\U0010ffff \U0001f600")


def test_every_character_sqs_allows_comes_back_with_its_md5_in_both_protocols(gateway):
    status, body = signed(gateway, {"Action": "CreateQueue", "QueueName": "chars"})
    url = ET.fromstring(body).find("q:CreateQueueResult/q:QueueUrl", NS).text
    digest = hashlib.md5(EVERY_KIND.encode()).hexdigest()
    status, body = signed(gateway, {"Action": "SendMessage", "QueueUrl": url,
                                    "MessageBody": EVERY_KIND})
    assert status == 200, body
    assert ET.fromstring(body).find("q:SendMessageResult/q:MD5OfMessageBody", NS).text == digest
    status, body = signed(gateway, {"Action": "ReceiveMessage", "QueueUrl": url,
                                    "WaitTimeSeconds": "5", "VisibilityTimeout": "0"})
    m = ET.fromstring(body).find("q:ReceiveMessageResult/q:Message", NS)  # as an SDK parses
    assert (m.find("q:Body", NS).text, m.find("q:MD5OfBody", NS).text) == (EVERY_KIND, digest)
    sqs = boto(gateway.url)  # the JSON protocol: boto3 checks the MD5s itself
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]
    assert (got["Body"], got["MD5OfBody"]) == (EVERY_KIND, digest)
    assert sqs.send_message(QueueUrl=url, MessageBody=EVERY_KIND)["MD5OfMessageBody"] == digest


@pytest.mark.parametrize("bad", ["\x00", "\x08", "\x0b", "\x0c", "\x1f", "\ufffe", "\uffff"])
def test_a_character_sqs_does_not_allow_is_refused_in_both_protocols(gateway, bad):
    sqs = boto(gateway.url)
    url = sqs.create_queue(QueueName="strict")["QueueUrl"]
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody=f"a{bad}b")
    assert code(e.value) == "InvalidMessageContents"
    status, body = signed(gateway, {"Action": "SendMessage", "QueueUrl": url,
                                    "MessageBody": f"a{bad}b"})
    assert (status, xml_code(body)) == (400, "InvalidMessageContents")
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "0"  # nothing was sent


def test_malformed_and_oversized_requests_get_errors_and_change_nothing(gateway):
    sqs = boto(gateway.url)
    url = sqs.create_queue(QueueName="steady")["QueueUrl"]
    huge = raw(gateway, b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2147483648\r\n"
                        b"X-Amz-Target: AmazonSQS.SendMessage\r\n\r\n" + b"x" * 1000)
    assert huge.startswith(b"HTTP/1.1 413")
    chunked = raw(gateway, b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked"
                           b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    assert chunked.startswith(b"HTTP/1.1 411")
    # signed requests whose bodies are not what they claim
    for target, body, expected in (("AmazonSQS.SendMessage", b"{not json",
                                    "SerializationException"),
                                   ("AmazonSQS.SendMessage", b"[1, 2]", "SerializationException"),
                                   ("Other.SendMessage", b"{}", "InvalidAction"),
                                   ("AmazonSQS.SendMessage",
                                    json.dumps({"QueueUrl": url, "MessageBody": 7}).encode(),
                                    "MissingParameter"),
                                   ("AmazonSQS.ReceiveMessage",
                                    json.dumps({"QueueUrl": url,
                                                "MaxNumberOfMessages": "ten"}).encode(),
                                    "InvalidParameterValue")):
        req = AWSRequest(method="POST", url=gateway.url + "/", data=body,
                         headers={"X-Amz-Target": target,
                                  "Content-Type": "application/x-amz-json-1.0"})
        SigV4Auth(Credentials(*KEYS["admin"]), "sqs", "us-east-1").add_auth(req)
        p = req.prepare()
        conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
        conn.request("POST", "/", body=p.body, headers=dict(p.headers))
        resp = conn.getresponse()
        assert resp.status == 400
        assert resp.getheader("x-amzn-query-error").split(";")[0] == expected, resp.read()
        conn.close()
    status, body = signed(gateway, {"Action": "SendMessage", "QueueUrl": url,
                                    "MessageBody": "x", "DelaySeconds": "soon"})
    assert (status, xml_code(body)) == (400, "InvalidParameterValue")
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "0"


def test_a_request_never_finished_is_cut_and_the_gateway_serves_on(gateway):
    gateway.server.head_s = 1.0  # a request's head is due in 1 s
    gateway.server.connection_s = 3.0  # and the rest of it in 3 s more
    hung = []
    for _ in range(5):  # heads that never end
        s = socket.create_connection(("127.0.0.1", gateway.port), timeout=30)
        s.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        hung.append(s)
    s = socket.create_connection(("127.0.0.1", gateway.port), timeout=30)
    s.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\nx")
    hung.append(s)  # a body that never comes
    sqs = boto(gateway.url)
    url = sqs.create_queue(QueueName="alive")["QueueUrl"]  # served meanwhile
    sqs.send_message(QueueUrl=url, MessageBody="ok")
    for s in hung:  # each cut by its deadline (a recv that times out fails the test)
        while s.recv(4096):
            pass
        s.close()
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2)["Messages"][0]["Body"] == "ok"


def test_credentials_readable_by_others_or_malformed_are_refused_at_start(tmp_path):
    path = tmp_path / "creds"
    path.write_text("AKID secret-123456 admin\n")
    path.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        SqsServer(SqsConfig("tcp://127.0.0.1:1", "127.0.0.1", 0, credentials=str(path)))
    path.chmod(0o600)
    for text in ("AKID secret-123456 root\n", "AKID short admin\n", "onlyone\n", "# none\n"):
        path.write_text(text)
        with pytest.raises(ValueError):
            sigv4.load_credentials(str(path))
