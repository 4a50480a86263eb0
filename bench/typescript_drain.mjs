// One drain of the TypeScript runner (clients/typescript, built: `npm ci && npm run build` there): a
// Worker with a no-op handler on a queue holding `--n` jobs, timed from its start until every job has
// been handled and the queue holds none pending or running (the last acks have landed). Prints one JSON
// line. Run by bench/typescript_runner.py, with JOBQ_URL set.
import { parseArgs } from "node:util";

import { Client, Worker } from "../clients/typescript/dist/src/index.js";

const { values } = parseArgs({
  options: { queue: { type: "string" }, n: { type: "string" }, concurrency: { type: "string", default: "16" } },
});
const n = Number(values.n);
const client = new Client();
let handled = 0;
let all;
const allHandled = new Promise((resolve) => (all = resolve));
const worker = new Worker({
  queue: values.queue,
  client,
  concurrency: Number(values.concurrency),
  handler: async () => {
    if (++handled === n) all();
  },
});

const started = performance.now();
const running = worker.run();
await allHandled;
for (;;) {
  const queue = await client.getQueue(values.queue);
  if (queue.pending === 0 && queue.running === 0) break;
  await new Promise((resolve) => setTimeout(resolve, 5));
}
const seconds = (performance.now() - started) / 1000;
worker.stop();
const stats = await running;
const queue = await client.getQueue(values.queue);
console.log(JSON.stringify({ seconds, handled, done: stats.done, completed: queue.completed }));
