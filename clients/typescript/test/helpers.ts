// What the tests share: the service under test ($JOBQ_URL), fresh queue names, and waiting on states.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";

import type { TestContext } from "node:test";

import { Client, type LeasedJob, type Logger, type Stats, type Worker } from "../src/index.js";

export const url = process.env.JOBQ_URL ?? "http://127.0.0.1:8000";

/** A queue of the test's own, so that test files can run at once against one service. */
export function queueName(what: string): string {
  return `ts-${what}-${randomUUID().slice(0, 8)}`;
}

export function client(): Client {
  return new Client({ url });
}

/** The one job of `queue` that a lease waiting up to 5 s gets. */
export async function leaseOne(jobq: Client, queue: string): Promise<LeasedJob> {
  const [job, ...more] = await jobq.lease(queue, { wait: 5 });
  assert.ok(job, `a job of ${queue} to lease`);
  assert.equal(more.length, 0);
  return job;
}

type Truthy<T> = Exclude<T, false | 0 | "" | null | undefined>;

/** The first truthy answer of `look`, asked again until it gives one (a state, polled; never a sleep
 * standing in for an event). Fails after `timeout` seconds. */
export async function until<T>(look: () => Promise<T> | T, what: string, timeout = 30): Promise<Truthy<T>> {
  const deadline = Date.now() + timeout * 1000;
  for (;;) {
    const seen = await look();
    if (seen) return seen as Truthy<T>;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** A promise and the function that resolves it. */
export function deferred<T = void>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((done) => (resolve = done));
  return { promise, resolve };
}

/** A logger that keeps what it is told, for assertions on warnings. */
export function recorder(): Logger & { lines: string[] } {
  const lines: string[] = [];
  const keep = (level: string) => (message: string) => void lines.push(`${level}: ${message}`);
  return { lines, debug: keep("debug"), info: keep("info"), warn: keep("warn"), error: keep("error") };
}

/** `worker.run()`, stopped when the test ends, also when it fails before stopping it itself: a worker
 * left running would keep the test file's process alive. */
export function start(t: TestContext, worker: Worker): Promise<Stats> {
  const running = worker.run();
  t.after(async () => {
    worker.stop();
    worker.stop(); // what still runs is released at once
    await running.catch(() => {});
  });
  return running;
}
