// Tasks: enqueued by name with their arguments and settings, run by a worker serving the registry.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Tasks, UnknownTask, Worker } from "../src/index.js";
import { client, queueName, start, until } from "./helpers.js";

const jobq = client();

test("a task enqueues its kind, arguments and settings; a worker runs it on them", async (t) => {
  const tasks = new Tasks({ queue: queueName("tasks"), client: jobq });
  const add = tasks.task(
    "add",
    ({ a, b }: { a: number; b: number }, context) => ({ sum: a + b, attempt: context.job.attempts }),
    {
      max_attempts: 2,
      priority: 5,
    },
  );
  const report = tasks.task("report", async ({ month }: { month: string }) => `report for ${month}`, {
    queue: queueName("reports"),
  });
  assert.deepEqual(tasks.queues, [tasks.queue, report.queue]);
  assert.equal(tasks.get("add"), add);
  assert.throws(() => tasks.get("nope"), UnknownTask);
  assert.throws(() => tasks.task("add", () => {}), /registered already/);

  const sum = await add.enqueue({ a: 1, b: 2 });
  assert.deepEqual(
    [sum.queue, sum.kind, sum.payload, sum.max_attempts, sum.priority],
    [tasks.queue, "add", { a: 1, b: 2 }, 2, 5],
  );
  const later = await add.using({ delay: 3600, dedup_key: "later" }).enqueue({ a: 2, b: 2 });
  assert.equal(later.dedup_key, "later");
  assert.ok(Date.parse(later.run_at) > Date.now() + 3000 * 1000);
  const [monthly, wrong] = await jobq.enqueueBatch([
    report.job({ month: "2026-11" }),
    { ...add.job({ a: 0, b: 0 }), payload: [1, 2] }, // as another producer might send it
  ]);

  const worker = new Worker({ tasks, concurrency: 2 });
  assert.deepEqual(worker.queues, tasks.queues);
  const running = start(t, worker);
  const done = await Promise.all([sum, monthly!, wrong!].map((job) => jobq.wait(job.id, 30)));
  worker.stop();
  await running;
  assert.deepEqual(done[0]!.result, { sum: 3, attempt: 1 });
  assert.equal(done[1]!.result, "report for 2026-11");
  // A payload that cannot be the task's arguments is dead at once: no retry can fix it.
  assert.deepEqual([done[2]!.status, done[2]!.attempts], ["dead", 1]);
  assert.match(
    done[2]!.last_error ?? "",
    /^Fail: task add takes its arguments from a JSON object payload; this job's payload is an array/,
  );
  assert.equal((await jobq.getJob(later.id)).status, "pending");
});

test("a task's own visibility timeout is the lease its jobs run under", async (t) => {
  const tasks = new Tasks({ queue: queueName("task-lease"), client: jobq });
  const slow = tasks.task(
    "slow",
    async (_args: Record<string, never>, context) => {
      // Leased for the queue's 30 s; the worker sets the task's 2 s at once, then keeps extending it.
      const first = Date.parse(context.job.lease_expires_at);
      await until(
        async () => Date.parse((await jobq.getJob(context.job.id)).lease_expires_at ?? "") < first - 20_000,
        "the task's lease",
      );
      return "done";
    },
    { visibilityTimeout: 2 },
  );
  const job = await slow.enqueue({});
  const worker = new Worker({ tasks });
  const running = start(t, worker);
  const done = await jobq.wait(job.id, 60);
  worker.stop();
  assert.equal((await running).done, 1);
  assert.deepEqual([done.status, done.attempts, done.result], ["completed", 1, "done"]);
});
