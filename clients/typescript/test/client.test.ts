// The Client against a live service: every call, each checked by the state it leaves (GET /jobs/{id}).

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { Conflict } from "../src/index.js";
import { client, leaseOne, queueName } from "./helpers.js";

const jobq = client();

test("round trip: enqueue, lease, extend with progress, ack with a result, the job", async () => {
  const queue = queueName("trip");
  const job = await jobq.enqueue(
    queue,
    { to: "ada@example.com" },
    { kind: "send_email", key: "ada", priority: 3 },
  );
  assert.equal(job.status, "pending");
  assert.equal(job.duplicate, false);
  assert.deepEqual([job.kind, job.key, job.priority], ["send_email", "ada", 3]);

  const leased = await leaseOne(jobq, queue);
  assert.equal(leased.id, job.id);
  assert.deepEqual(leased.payload, { to: "ada@example.com" });
  assert.equal(leased.attempts, 1);
  assert.equal((await jobq.getJob(job.id)).status, "running");

  const extended = await jobq.extend(leased, 120, { progress: { done: 1, of: 2 } });
  assert.ok(Date.parse(extended.lease_expires_at) > Date.parse(leased.lease_expires_at));
  assert.deepEqual((await jobq.getJob(job.id)).progress, { done: 1, of: 2 });

  assert.deepEqual(await jobq.ack(leased, { sent: true }), { id: job.id, status: "completed" });
  const done = await jobq.wait(job.id, 5);
  assert.equal(done.status, "completed");
  assert.deepEqual(done.result, { sent: true });
  assert.equal(done.attempts, 1);
});

test("enqueue: dedup_key, Idempotency-Key, options, batches", async () => {
  const queue = queueName("enqueue");
  const first = await jobq.enqueue(queue, 1, { dedup_key: "once" });
  const again = await jobq.enqueue(queue, 2, { dedup_key: "once" });
  assert.equal(again.duplicate, true);
  assert.equal(again.id, first.id);

  // The same key twice is one request carried out once: the repeat gets the first answer.
  const idempotencyKey = randomUUID();
  const sent = await jobq.enqueue(queue, "a", { idempotencyKey });
  const resent = await jobq.enqueue(queue, "a", { idempotencyKey });
  assert.equal(resent.id, sent.id);

  const later = await jobq.enqueue(queue, null, { delay: 3600, max_attempts: 2 });
  assert.equal(later.max_attempts, 2);
  assert.ok(Date.parse(later.run_at) > Date.now() + 3000 * 1000);
  assert.equal((await jobq.getQueue(queue)).scheduled, 1);

  const batch = await jobq.enqueueBatch([
    { queue, payload: { n: 1 }, kind: "a" },
    { queue, payload: { n: 2 }, dedup_key: "twice" },
    { queue, payload: { n: 3 }, dedup_key: "twice" },
  ]);
  assert.deepEqual(
    batch.map((job) => [job.payload, job.duplicate]),
    [
      [{ n: 1 }, false],
      [{ n: 2 }, false],
      [{ n: 2 }, true],
    ],
  );
  assert.equal(batch[2]!.id, batch[1]!.id);
  const page = await jobq.listJobs({ queue, limit: 500 });
  assert.equal(page.jobs.length, 5);
  await assert.rejects(jobq.enqueueBatch([{ queue } as never]), TypeError);
});

test("enqueue with wait answers the finished job, with its result", async () => {
  const queue = queueName("reply");
  const worker = (async () => {
    const job = await leaseOne(jobq, queue);
    await jobq.ack(
      job,
      (job.payload as number[]).reduce((a, b) => a + b, 0),
    );
  })();
  const job = await jobq.enqueue(queue, [1, 2, 3], { wait: 30 });
  await worker;
  assert.equal(job.status, "completed");
  assert.equal(job.result, 6);
  assert.equal(job.duplicate, false);
  // A wait that runs out answers the job as it is.
  const pending = await jobq.enqueue(queue, null, { delay: 3600 });
  assert.equal((await jobq.wait(pending.id, 0.2)).status, "pending");
  assert.equal((await jobq.getJob(pending.id, { wait: 0.1 })).status, "pending");
});

test("nack, run now, dead letters, batches and release", async () => {
  const queue = queueName("nack");
  const [a, b, c, d] = await jobq.enqueueBatch(
    [1, 2, 3, 4].map((n) => ({ queue, payload: n, max_attempts: 3 })),
  );

  let leased = await jobq.lease(queue, { max_jobs: 4, wait: 5 });
  assert.deepEqual(
    leased.map((job) => job.id),
    [a!.id, b!.id, c!.id, d!.id],
  );
  const [la, lb, lc, ld] = leased;
  const retried = await jobq.nack(la!, "try later", { retry_after: 3600 });
  assert.equal(retried.status, "pending");
  assert.ok(Date.parse(retried.run_at) > Date.now() + 3000 * 1000);
  assert.equal((await jobq.nack(lb!, "hopeless", { dead: true })).status, "dead");
  // Where an item leaves retry_after or dead out, the call's apply.
  const results = await jobq.nackBatch(
    [
      { ...lc!, error: "later", dead: false },
      { ...ld!, error: "dead" },
    ],
    {
      retry_after: 3600,
      dead: true,
    },
  );
  assert.deepEqual(
    results.map((r) => [r.id, r.ok, r.status]),
    [
      [c!.id, true, "pending"],
      [d!.id, true, "dead"],
    ],
  );
  const job = await jobq.getJob(a!.id);
  assert.deepEqual([job.status, job.attempts, job.last_error], ["pending", 1, "try later"]);
  assert.ok(Date.parse((await jobq.getJob(c!.id)).run_at) > Date.now() + 3000 * 1000);

  // Run the delayed one now, lease it, give it back untouched: pending, the attempt not counted.
  assert.equal((await jobq.runJobNow(a!.id)).id, a!.id);
  await assert.rejects(jobq.runJobNow(a!.id), Conflict);
  const again = await leaseOne(jobq, queue);
  assert.equal(again.attempts, 2);
  assert.deepEqual(await jobq.release([again]), [{ id: a!.id, ok: true }]);
  assert.deepEqual(await jobq.release([again]), [{ id: a!.id, ok: false, code: "lease_lost" }]);
  const released = await jobq.getJob(a!.id);
  assert.deepEqual([released.status, released.attempts], ["pending", 1]);

  const dead = await jobq.listDead({ queue });
  assert.deepEqual(
    dead.jobs.map((job) => job.id),
    [d!.id, b!.id],
  );
  assert.equal(dead.next_before_id, null);
  assert.deepEqual(await jobq.retryDead({ ids: [b!.id] }), { retried: 1, skipped: [] });
  assert.deepEqual(await jobq.purgeDead(d!.id), { id: d!.id, purged: true });
  await assert.rejects(jobq.purgeDead(d!.id));

  leased = await jobq.lease(queue, { max_jobs: 10, wait: 5 });
  assert.deepEqual(
    leased.map((job) => job.id),
    [a!.id, b!.id],
  );
  const acked = await jobq.ackBatch([leased[0]!, { ...leased[1]!, result: "two" }]);
  assert.deepEqual(acked, [
    { id: a!.id, ok: true },
    { id: b!.id, ok: true },
  ]);
  assert.equal((await jobq.getJob(b!.id)).result, "two");
  assert.equal((await jobq.getJob(a!.id)).result, null);
});

test("cancel and list jobs", async () => {
  const queue = queueName("list");
  const jobs = await jobq.enqueueBatch([
    { queue, payload: { to: "ada" }, kind: "mail", key: "k1" },
    { queue, payload: { to: "bob" }, kind: "sms" },
    { queue, payload: { to: "cy" }, kind: "mail" },
  ]);
  assert.equal((await jobq.cancelJob(jobs[1]!.id)).status, "cancelled");
  await assert.rejects(jobq.cancelJob(jobs[1]!.id), Conflict);

  const ids = async (query: Parameters<typeof jobq.listJobs>[0]) =>
    (await jobq.listJobs({ queue, ...query })).jobs.map((j) => j.id);
  assert.deepEqual(await ids({}), [jobs[2]!.id, jobs[1]!.id, jobs[0]!.id]);
  assert.deepEqual(await ids({ status: "cancelled" }), [jobs[1]!.id]);
  assert.deepEqual(await ids({ kind: "mail" }), [jobs[2]!.id, jobs[0]!.id]);
  assert.deepEqual(await ids({ key: "k1" }), [jobs[0]!.id]);
  assert.deepEqual(await ids({ q: "bob" }), [jobs[1]!.id]);
  const first = await jobq.listJobs({ queue, limit: 2 });
  assert.equal(first.jobs.length, 2);
  assert.deepEqual(await ids({ before_id: first.next_before_id }), [jobs[0]!.id]);
});

test("queues, keys and workers", async () => {
  const queue = queueName("queues");
  await jobq.enqueue(queue, null, { key: "tenant-1" });
  const settings = await jobq.configureQueue(queue, {
    visibility_timeout: 45,
    max_attempts: 7,
    rate: { limit: 10, period: 60 },
  });
  assert.deepEqual([settings.settings.visibility_timeout, settings.settings.max_attempts], [45, 7]);
  assert.deepEqual(settings.settings.rate, { limit: 10, period: 60 });
  assert.equal((await jobq.configureQueue(queue, { rate: null })).settings.rate, null);

  assert.equal((await jobq.pauseQueue(queue)).paused, true);
  assert.deepEqual(await jobq.lease(queue), []);
  assert.equal((await jobq.resumeQueue(queue)).paused, false);
  const row = (await jobq.listQueues()).find((q) => q.queue === queue);
  assert.deepEqual([row?.pending, row?.running], [1, 0]);

  const key = await jobq.putKey(queue, "tenant-1", { concurrency: 2 });
  assert.deepEqual([key.concurrency, key.rate, key.pending], [2, null, 1]);
  assert.equal((await jobq.getKey(queue, "tenant-1")).concurrency, 2);
  assert.deepEqual(
    (await jobq.listKeys(queue, { limit: 10 })).map((k) => k.key),
    ["tenant-1"],
  );
  assert.deepEqual(await jobq.deleteKey(queue, "tenant-1"), { queue, key: "tenant-1", deleted: true });

  const workerId = `ts-test-${randomUUID()}`;
  await jobq.lease(queue, { worker_id: workerId });
  const seen = (await jobq.listWorkers()).find((w) => w.worker_id === workerId);
  assert.deepEqual([seen?.queues, seen?.held], [[queue], 1]);
});

test("schedules", async () => {
  const name = queueName("schedule");
  const queue = queueName("scheduled");
  const made = await jobq.putSchedule(name, {
    cron: "0 3 * * *",
    queue,
    payload: { report: true },
    kind: "report",
  });
  assert.deepEqual(
    [made.name, made.cron, made.timezone, made.catch_up, made.paused],
    [name, "0 3 * * *", "UTC", "once", false],
  );
  assert.ok(made.next_run_at);
  assert.equal((await jobq.getSchedule(name)).queue, queue);
  assert.ok((await jobq.listSchedules()).some((s) => s.name === name));
  const paused = await jobq.pauseSchedule(name);
  assert.deepEqual([paused.paused, paused.next_run_at], [true, null]);
  assert.equal((await jobq.resumeSchedule(name)).paused, false);
  const triggered = await jobq.triggerSchedule(name);
  const job = await jobq.getJob(triggered.job_id);
  assert.deepEqual(
    [job.queue, job.kind, job.payload, job.schedule],
    [queue, "report", { report: true }, name],
  );
  assert.deepEqual(await jobq.deleteSchedule(name), { name, deleted: true });
  await assert.rejects(jobq.getSchedule(name), { name: "NotFound", status: 404 });
});

test("health, readiness and metrics", async () => {
  assert.deepEqual(await jobq.health(), { status: "ok" });
  const ready = await jobq.ready();
  assert.equal(ready.ready, true);
  assert.equal(ready.schema_revision, ready.expected_revision);
  assert.match(await jobq.metrics(), /^# TYPE jobq_jobs_enqueued_total counter$/m);
});
