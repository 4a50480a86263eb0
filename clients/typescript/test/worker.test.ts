// The worker runner against a live service: each test waits on states (a job finished, a count reached),
// stops the worker, and checks what the service holds.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Client, Fail, type Handler, type LeasedJob, Retry, Worker, run } from "../src/index.js";
import { client, deferred, queueName, recorder, start, until, url } from "./helpers.js";

const jobq = client();

/** A client that counts its requests per path, and the items of its batches. */
function counted(): { client: Client; requests: Map<string, number>; items: Map<string, number> } {
  const requests = new Map<string, number>();
  const items = new Map<string, number>();
  const count: typeof fetch = (input, init) => {
    const path = new URL(String(input)).pathname;
    requests.set(path, (requests.get(path) ?? 0) + 1);
    const body = typeof init?.body === "string" ? (JSON.parse(init.body) as { items?: unknown[] }) : {};
    items.set(path, (items.get(path) ?? 0) + (body.items?.length ?? 0));
    return fetch(input, init);
  };
  return { client: new Client({ url, fetch: count }), requests, items };
}

/** Every job of `queue`, oldest first. */
async function jobsOf(queue: string) {
  return (await jobq.listJobs({ queue, limit: 500 })).jobs.reverse();
}

test("handlers by kind and a default handler; what they return is the job's result", async (t) => {
  const queue = queueName("kinds");
  const jobs = await jobq.enqueueBatch([
    { queue, kind: "add", payload: [1, 2, 3] },
    { queue, kind: "upper", payload: "ada" },
    { queue, kind: "other", payload: null },
    { queue, payload: null },
  ]);
  const worker = new Worker({
    queue,
    concurrency: 4,
    handlers: {
      add: (job) => (job.payload as number[]).reduce((a, b) => a + b, 0),
      upper: async (job) => (job.payload as string).toUpperCase(),
    },
    handler: (job) => ({ default: job.kind }),
  });
  const running = start(t, worker);
  const finished = await Promise.all(jobs.map((job) => jobq.wait(job.id, 30)));
  worker.stop();
  const stats = await running;
  assert.deepEqual(
    finished.map((job) => [job.status, job.attempts, job.result]),
    [
      ["completed", 1, 6],
      ["completed", 1, "ADA"],
      ["completed", 1, { default: "other" }],
      ["completed", 1, { default: null }],
    ],
  );
  assert.deepEqual(stats, { done: 4, failed: 0, lost: 0, released: 0, suspended: 0, inFlight: 0 });
});

test("a kind no handler has fails with an error naming the kinds the worker knows", async (t) => {
  const queue = queueName("unknown");
  const [unknown, kindless, retried] = await jobq.enqueueBatch([
    { queue, kind: "resize", payload: null, max_attempts: 1 },
    { queue, payload: null, max_attempts: 1 },
    { queue, kind: "resize", payload: null, max_attempts: 2 },
  ]);
  const worker = new Worker({ queue, handlers: { send_email: () => {}, build_report: () => {} } });
  const running = start(t, worker);
  const dead = await jobq.wait(unknown!.id, 30);
  assert.equal(dead.status, "dead");
  assert.equal(
    dead.last_error,
    'UnknownTask: no handler or task is named "resize" in this worker (it knows: build_report, send_email)',
  );
  assert.match(
    (await jobq.wait(kindless!.id, 30)).last_error ?? "",
    /^UnknownTask: the job has no kind to name its handler/,
  );
  // With attempts left it is retried on the queue's backoff, for a worker that knows the kind.
  const pending = await until(async () => {
    const job = await jobq.getJob(retried!.id);
    return job.attempts === 1 && job.status === "pending" && job;
  }, "the retry of the unknown kind");
  assert.ok(Date.parse(pending.run_at) > Date.now());
  worker.stop();
  assert.equal((await running).failed, 3);
});

test("Retry runs the job again later, Fail makes it dead now, other errors go by the backoff", async (t) => {
  const queue = queueName("failures");
  const [later, hopeless, broken] = await jobq.enqueueBatch([
    { queue, kind: "later", payload: null },
    { queue, kind: "hopeless", payload: null },
    { queue, kind: "broken", payload: null, max_attempts: 1 },
  ]);
  const worker = new Worker({
    queue,
    concurrency: 3,
    handlers: {
      later: () => {
        throw new Retry("the partner is down", { after: 3600 });
      },
      hopeless: async () => {
        throw new Fail("no such address");
      },
      broken: function brokenHandler() {
        throw new RangeError("out of range");
      },
    },
  });
  const running = start(t, worker);
  const dead = await Promise.all([hopeless!, broken!].map((job) => jobq.wait(job.id, 30)));
  const retried = await until(async () => {
    const job = await jobq.getJob(later!.id);
    return job.status === "pending" && job.attempts === 1 && job;
  }, "the Retry's nack");
  worker.stop();
  assert.equal((await running).failed, 3);

  assert.ok(Date.parse(retried.run_at) > Date.now() + 3000 * 1000);
  assert.match(retried.last_error ?? "", /^Retry: the partner is down\n/);
  assert.deepEqual(
    dead.map((job) => [job.status, job.attempts]),
    [
      ["dead", 1],
      ["dead", 1],
    ],
  );
  assert.match(dead[0]!.last_error ?? "", /^Fail: no such address/);
  // The error's name and message, then the handler's own frames (not the worker's).
  const error = dead[1]!.last_error ?? "";
  assert.match(error, /^RangeError: out of range\n {4}at .*brokenHandler .*worker\.test\.js:\d+:\d+\)/);
  assert.doesNotMatch(error, /src[/\\]worker\.js|node:internal/);
});

test("a result JSON cannot hold completes the job without one, with a warning", async (t) => {
  const queue = queueName("results");
  const [big, nan] = await jobq.enqueueBatch([
    { queue, kind: "big", payload: null },
    { queue, kind: "nan", payload: null },
  ]);
  const logger = recorder();
  const worker = new Worker({
    queue,
    logger,
    concurrency: 2,
    handlers: { big: () => 10n ** 30n, nan: () => ({ ratio: NaN }) },
  });
  const running = start(t, worker);
  const done = await Promise.all([big!, nan!].map((job) => jobq.wait(job.id, 30)));
  worker.stop();
  assert.equal((await running).done, 2);
  assert.deepEqual(
    done.map((job) => [job.status, job.result]),
    [
      ["completed", null],
      ["completed", null],
    ],
  );
  for (const job of [big!, nan!]) {
    assert.ok(
      logger.lines.some((line) =>
        line.startsWith(`warn: job ${job.id}: its handler returned what JSON cannot hold`),
      ),
      logger.lines.join("\n"),
    );
  }
});

test("a thousand jobs drained by concurrency 16: each run once, acks and leases in batches", async (t) => {
  const queue = queueName("drain");
  const count = 1000;
  const enqueued = await jobq.enqueueBatch(Array.from({ length: count }, (_, n) => ({ queue, payload: n })));
  const runs = new Map<number, number>();
  const { client: counting, requests, items } = counted();
  const worker = new Worker({
    queue,
    client: counting,
    concurrency: 16,
    handler: async (job) => {
      runs.set(job.id, (runs.get(job.id) ?? 0) + 1);
      return job.payload;
    },
  });
  const running = start(t, worker);
  await until(async () => (await jobq.getQueue(queue)).completed === count, "every job completed", 60);
  worker.stop();
  const stats = await running;

  assert.deepEqual(stats, { done: count, failed: 0, lost: 0, released: 0, suspended: 0, inFlight: 0 });
  assert.equal(runs.size, count);
  assert.ok(
    [...runs.values()].every((n) => n === 1),
    "a job ran twice",
  );
  assert.deepEqual(new Set(runs.keys()), new Set(enqueued.map((job) => job.id)));
  const row = await jobq.getQueue(queue);
  assert.deepEqual([row.pending, row.running, row.dead, row.completed], [0, 0, 0, count]);
  const sample = await jobq.getJob(enqueued[count - 1]!.id);
  assert.deepEqual([sample.attempts, sample.result], [1, count - 1]);
  // Every job acked once, many to a request; leased many at a time.
  assert.equal(items.get("/ack/batch"), count);
  assert.ok(requests.get("/ack/batch")! <= count / 8, `${requests.get("/ack/batch")} ack requests`);
  assert.ok(requests.get("/lease")! <= count / 8, `${requests.get("/lease")} lease requests`);
  assert.equal(requests.get("/ack") ?? 0, 0);
});

test("two workers on one queue: no job runs twice", async (t) => {
  const queue = queueName("pair");
  const count = 600;
  await jobq.enqueueBatch(Array.from({ length: count }, (_, n) => ({ queue, payload: n })));
  const runs = new Map<number, number>();
  const handler: Handler = async (job) => void runs.set(job.id, (runs.get(job.id) ?? 0) + 1);
  const workers = [1, 2].map((n) => new Worker({ queue, handler, concurrency: 8, workerId: `pair-${n}` }));
  const running = workers.map((worker) => start(t, worker));
  await until(async () => (await jobq.getQueue(queue)).completed === count, "every job completed", 60);
  workers.forEach((worker) => worker.stop());
  const stats = await Promise.all(running);
  assert.equal(stats[0]!.done + stats[1]!.done, count);
  assert.equal(runs.size, count);
  assert.ok(
    [...runs.values()].every((n) => n === 1),
    "a job ran twice",
  );
});

test("a handler running past its visibility timeout keeps its lease; its progress is shown", async (t) => {
  const queue = queueName("extend");
  await jobq.configureQueue(queue, { visibility_timeout: 2 }); // read by the worker at start
  const job = await jobq.enqueue(queue, null);
  const runs: number[] = [];
  const worker = new Worker({
    queue,
    handler: async (leased, context) => {
      runs.push(leased.id);
      context.progress({ step: 1 });
      // Run until the lease has been extended two seconds past its first deadline: past the timeout.
      const first = Date.parse(leased.lease_expires_at);
      await until(
        async () => Date.parse((await jobq.getJob(leased.id)).lease_expires_at ?? "") >= first + 2000,
        "extensions",
      );
      return "slow but done";
    },
  });
  const running = start(t, worker);
  const done = await jobq.wait(job.id, 60);
  worker.stop();
  const stats = await running;
  assert.deepEqual(
    [done.status, done.attempts, done.result, done.last_error],
    ["completed", 1, "slow but done", null],
  );
  assert.deepEqual(done.progress, { step: 1 }); // sent with an extension
  assert.deepEqual(runs, [job.id]);
  assert.deepEqual([stats.done, stats.lost], [1, 0]);
});

test("stop on SIGTERM: buffered jobs are given back untouched, running handlers finish", async (t) => {
  const queue = queueName("stop");
  await jobq.enqueueBatch(Array.from({ length: 6 }, (_, n) => ({ queue, payload: n })));
  const started: LeasedJob[] = [];
  const gate = deferred();
  const worker = new Worker({
    queue,
    concurrency: 2,
    handler: async (job) => {
      started.push(job);
      await gate.promise;
      return job.payload;
    },
  });
  const listening = process.listenerCount("SIGTERM");
  const running = run(worker);
  t.after(async () => {
    worker.stop();
    gate.resolve();
    await running.catch(() => {});
  });
  // Two running, and two more in the buffer (concurrency jobs beyond those running, at first).
  await until(
    async () => started.length === 2 && (await jobq.getQueue(queue)).running === 4,
    "two running, two buffered",
  );
  process.kill(process.pid, "SIGTERM");
  await until(async () => (await jobq.getQueue(queue)).running === 2, "the buffered jobs given back");
  assert.equal(worker.stopping, true);
  gate.resolve();
  const stats = await running;

  assert.deepEqual(stats, { done: 2, failed: 0, lost: 0, released: 2, suspended: 0, inFlight: 0 });
  const ran = new Set(started.map((job) => job.id));
  for (const job of await jobsOf(queue)) {
    const expected = ran.has(job.id) ? ["completed", 1, job.payload] : ["pending", 0, null];
    assert.deepEqual([job.status, job.attempts, job.result, job.last_error], [...expected, null], `job ${job.id}`);
  }
  assert.equal(ran.size, 2);
  assert.equal(process.listenerCount("SIGTERM"), listening); // run() took its handler away again
});

test("a short lease answered as stop() comes: its jobs are given back, not left claimed", async (t) => {
  const queue = queueName("stop-lease");
  await jobq.enqueueBatch(Array.from({ length: 6 }, (_, n) => ({ queue, payload: n })));
  const started: LeasedJob[] = [];
  const gate = deferred();
  // The leases after the first (short ones: the first found the queue full) are carried out by the
  // service at once, but their answers reach the worker only once it is stopping: on their way when
  // stop() comes, as on a loaded machine when SIGTERM and the answer arrive together.
  let leases = 0;
  const late: typeof fetch = async (input, init) => {
    const response = await fetch(input, init);
    if (new URL(String(input)).pathname === "/lease" && ++leases > 1) {
      await until(() => worker.stopping, "the worker stopping");
    }
    return response;
  };
  const worker: Worker = new Worker({
    queue,
    client: new Client({ url, fetch: late }),
    concurrency: 2,
    handler: async (job) => {
      started.push(job);
      await gate.promise;
      return job.payload;
    },
  });
  const running = start(t, worker);
  t.after(() => gate.resolve());
  // Two running, and the second lease's two jobs leased by the service, its answer held.
  await until(
    async () => started.length === 2 && leases === 2 && (await jobq.getQueue(queue)).running === 4,
    "two running, two more leased",
  );
  worker.stop();
  gate.resolve();
  const stats = await running;

  assert.deepEqual(stats, { done: 2, failed: 0, lost: 0, released: 2, suspended: 0, inFlight: 0 });
  const ran = new Set(started.map((job) => job.id));
  assert.equal(ran.size, 2);
  // The jobs of the held answer are pending again at once, their attempt not counted.
  for (const job of await jobsOf(queue)) {
    const expected = ran.has(job.id) ? ["completed", 1] : ["pending", 0];
    assert.deepEqual([job.status, job.attempts], expected, `job ${job.id}`);
  }
});

test("a second stop releases running jobs now: their attempt counts, their signal aborts", async (t) => {
  const queue = queueName("hurry");
  const job = await jobq.enqueue(queue, null);
  const started = deferred<AbortSignal>();
  const worker = new Worker({
    queue,
    grace: 600,
    handler: (_job, context) => {
      started.resolve(context.signal);
      return new Promise((resolve) => context.signal.addEventListener("abort", resolve));
    },
  });
  const running = start(t, worker);
  const signal = await started.promise;
  worker.stop();
  worker.stop();
  const stats = await running;
  assert.equal(signal.aborted, true);
  assert.deepEqual([stats.done, stats.released], [0, 1]);
  const released = await jobq.getJob(job.id);
  assert.deepEqual([released.status, released.attempts], ["pending", 1]);
  assert.match(
    released.last_error ?? "",
    /^released: the worker stopped; the job ran past the 600s grace period/,
  );
  assert.ok(Date.parse(released.run_at) <= Date.now());
});

test("a job is not kept in the buffer past a third of its visibility timeout", async (t) => {
  const queue = queueName("stale");
  await jobq.configureQueue(queue, { visibility_timeout: 1.5 });
  const jobs = await jobq.enqueueBatch([0, 1, 2].map((n) => ({ queue, payload: n })));
  const runs = new Map<number, number>();
  const worker: Worker = new Worker({
    queue,
    handler: async (job) => {
      runs.set(job.id, (runs.get(job.id) ?? 0) + 1);
      // The first job holds the only slot until a job behind it has waited too long and gone back.
      if (job.id === jobs[0]!.id) await until(() => worker.stats.released > 0, "a buffered job given back");
    },
  });
  const running = start(t, worker);
  await until(async () => (await jobq.getQueue(queue)).completed === 3, "every job completed");
  worker.stop();
  const stats = await running;
  assert.ok(stats.released >= 1);
  assert.deepEqual([...runs.values()], [1, 1, 1]);
  // Given back before it started: its attempt did not count.
  for (const job of await jobsOf(queue)) assert.deepEqual([job.status, job.attempts], ["completed", 1]);
});

test("a queue that does not exist yet is warned of at start, with the queues that do", async (t) => {
  const queue = queueName("emails");
  await jobq.enqueue(queue, null);
  const typo = `${queue}-typo`;
  const logger = recorder();
  const worker = new Worker({ queue: [typo, queue], logger, handler: () => null });
  const running = start(t, worker);
  await until(() => logger.lines.some((line) => line.startsWith("info: worker ")), "the worker's start");
  worker.stop();
  await running;
  const warned = logger.lines.filter((line) => line.includes("does not exist"));
  assert.equal(warned.length, 1, logger.lines.join("\n"));
  const expected = `warn: queue ${typo} does not exist yet (no jobs, no settings)`;
  assert.ok(warned[0]!.startsWith(expected), warned[0]);
  assert.ok(warned[0]!.includes("queues that exist: "), warned[0]);
});
