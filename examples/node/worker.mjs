// A jobq worker in Node.js 18+, on the jobq-client package (clients/typescript):
//
//   (cd clients/typescript && npm ci && npm run build)   # build the package, once
//   (cd examples/node && npm install)                    # link it here as jobq-client
//   JOBQ_URL=http://127.0.0.1:8000 node examples/node/worker.mjs emails
//
// It runs handle() on each job of the queue: what handle() returns is the job's result; what it throws
// fails the job, to run again after the queue's backoff while attempts remain (throw `new Fail(...)` for
// dead at once, `new Retry({ after })` to choose when). The package leases and acks in batches, extends
// leases while handle() runs, and on SIGTERM or SIGINT gives back the jobs it has not started, lets the
// running ones finish, and exits. JOBQ_TOKEN, if set, is sent as a bearer token.
import { setTimeout as sleep } from "node:timers/promises";

import { Worker, run } from "jobq-client";

const queue = process.argv[2] ?? "default";

// The work. Replace it with yours: `job.payload` is the job's JSON; `signal` aborts when the worker gives
// the job up (its lease was lost, or the worker is stopping and the grace period ran out).
async function handle(job, { signal }) {
  const { seconds = 0, fail } = job.payload ?? {};
  await sleep(seconds * 1000, undefined, { signal }); // stands in for real work
  if (fail) throw new Error(fail);
  return { took: seconds };
}

const worker = new Worker({ queue, handler: handle, concurrency: 4, logger: console });
const running = run(worker); // until SIGTERM or SIGINT, which it listens for from now on
console.log(`working on ${queue} at ${worker.client.url}`);
await running;
console.log("stopped");
