// The AWS SDK for JavaScript v3 (@aws-sdk/client-sqs) against `blizzard sqs`, signed with
// SigV4 credentials: send, receive with a long poll, change visibility, batch delete, and a
// FIFO group in order. Prints one JSON line of what it saw; tests/test_sqs_node.py runs it
// (arguments: the endpoint, the access key id, the secret) and checks that line.
import {
  SQSClient, CreateQueueCommand, SendMessageCommand, SendMessageBatchCommand,
  ReceiveMessageCommand, ChangeMessageVisibilityCommand, DeleteMessageBatchCommand,
  GetQueueAttributesCommand,
} from "@aws-sdk/client-sqs";

const [endpoint, accessKeyId, secretAccessKey] = process.argv.slice(2);
const sqs = new SQSClient({ endpoint, region: "us-east-1", credentials: { accessKeyId, secretAccessKey },
                            maxAttempts: 1 });
const seen = {};
try {
  const { QueueUrl: url } = await sqs.send(new CreateQueueCommand({ QueueName: "js-jobs" }));
  const sent = await sqs.send(new SendMessageCommand({
    QueueUrl: url, MessageBody: "from js \u00e9\u2744",
    MessageAttributes: { color: { DataType: "String", StringValue: "blue" } } }));
  seen.sentMd5 = sent.MD5OfMessageBody;
  let got = await sqs.send(new ReceiveMessageCommand({
    QueueUrl: url, WaitTimeSeconds: 5, MessageAttributeNames: ["All"],
    MessageSystemAttributeNames: ["ApproximateReceiveCount"] }));
  let m = got.Messages[0];
  seen.first = { body: m.Body, color: m.MessageAttributes.color.StringValue,
                 count: m.Attributes.ApproximateReceiveCount };
  await sqs.send(new ChangeMessageVisibilityCommand({
    QueueUrl: url, ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0 }));
  got = await sqs.send(new ReceiveMessageCommand({
    QueueUrl: url, WaitTimeSeconds: 5, MessageSystemAttributeNames: ["ApproximateReceiveCount"] }));
  m = got.Messages[0];
  seen.again = { body: m.Body, count: m.Attributes.ApproximateReceiveCount };
  await sqs.send(new SendMessageBatchCommand({ QueueUrl: url, Entries: [
    { Id: "a", MessageBody: "batch a" }, { Id: "b", MessageBody: "batch b" }] }));
  const handles = [{ Id: "m", ReceiptHandle: m.ReceiptHandle }];
  const bodies = [];
  while (bodies.length < 2) {
    const more = await sqs.send(new ReceiveMessageCommand({
      QueueUrl: url, WaitTimeSeconds: 5, MaxNumberOfMessages: 10 }));
    for (const x of more.Messages || []) {
      bodies.push(x.Body);
      handles.push({ Id: `h${handles.length}`, ReceiptHandle: x.ReceiptHandle });
    }
  }
  seen.batch = bodies.sort();
  const deleted = await sqs.send(new DeleteMessageBatchCommand({ QueueUrl: url, Entries: handles }));
  seen.deleted = (deleted.Successful || []).length;
  seen.failed = (deleted.Failed || []).length;
  const attrs = await sqs.send(new GetQueueAttributesCommand({
    QueueUrl: url, AttributeNames: ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"] }));
  seen.left = attrs.Attributes;
  const { QueueUrl: fifo } = await sqs.send(new CreateQueueCommand({
    QueueName: "js-jobs.fifo", Attributes: { FifoQueue: "true", ContentBasedDeduplication: "true" } }));
  for (const n of [1, 2, 3]) {
    await sqs.send(new SendMessageCommand({ QueueUrl: fifo, MessageBody: `step ${n}`, MessageGroupId: "g" }));
  }
  seen.fifo = [];
  while (seen.fifo.length < 3) {
    const more = await sqs.send(new ReceiveMessageCommand({ QueueUrl: fifo, WaitTimeSeconds: 5 }));
    for (const x of more.Messages || []) {
      seen.fifo.push(x.Body);
      await sqs.send(new DeleteMessageBatchCommand({ QueueUrl: fifo, Entries: [
        { Id: "x", ReceiptHandle: x.ReceiptHandle }] }));
    }
  }
  console.log(JSON.stringify(seen));
} catch (err) {
  console.log(JSON.stringify({ error: String(err && err.stack || err), seen }));
  process.exit(1);
}
