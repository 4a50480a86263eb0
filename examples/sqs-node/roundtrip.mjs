// Send, receive and delete a message through jobq's SQS API with the AWS SDK for JavaScript v3.
// Usage: node roundtrip.mjs <endpoint> <queue>; prints a JSON line with what happened.
// Credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (any values when jobq has no tokens).
import {
  SQSClient, CreateQueueCommand, SendMessageCommand, ReceiveMessageCommand, DeleteMessageCommand,
} from "@aws-sdk/client-sqs";

const [endpoint, queue] = process.argv.slice(2);
const sqs = new SQSClient({
  endpoint,
  region: "us-east-1",
  credentials: {
    accessKeyId: process.env.AWS_ACCESS_KEY_ID ?? "test",
    secretAccessKey: process.env.AWS_SECRET_ACCESS_KEY ?? "test",
  },
});

const { QueueUrl } = await sqs.send(new CreateQueueCommand({ QueueName: queue }));
const sent = await sqs.send(new SendMessageCommand({
  QueueUrl,
  MessageBody: "hello from node",
  MessageAttributes: { lang: { DataType: "String", StringValue: "javascript" } },
}));
// The SDK checks MD5OfMessageBody and MD5OfMessageAttributes itself.
const received = await sqs.send(new ReceiveMessageCommand({
  QueueUrl, WaitTimeSeconds: 5, MessageAttributeNames: ["All"], MessageSystemAttributeNames: ["All"],
}));
const [message] = received.Messages ?? [];
await sqs.send(new DeleteMessageCommand({ QueueUrl, ReceiptHandle: message.ReceiptHandle }));
console.log(JSON.stringify({
  queueUrl: QueueUrl,
  sentId: sent.MessageId,
  receivedId: message.MessageId,
  body: message.Body,
  lang: message.MessageAttributes?.lang?.StringValue,
  receiveCount: message.Attributes?.ApproximateReceiveCount,
}));
