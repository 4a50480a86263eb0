// Dependencies, workflows and debounce (API part 6): jobs after their parents, workflows made and acted
// on, a flow of tasks run by the worker, and a burst of enqueues made one job.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import {
  Conflict,
  Flow,
  type ParentJob,
  Tasks,
  ValidationError,
  Worker,
} from "../src/index.js";
import { client, leaseOne, queueName, recorder, start, until } from "./helpers.js";

const jobq = client();

test("depends_on: a child waits for its parents, runs once they completed, and reads their results", async () => {
  const queue = queueName("deps");
  const first = await jobq.enqueue(queue, { n: 1 }, { kind: "fetch" });
  const second = await jobq.enqueue(queue, { n: 2 }, { kind: "fetch" });
  const child = await jobq.enqueue(queue, { sum: true }, { kind: "sum", depends_on: [first.id, second.id] });
  assert.equal(child.status, "waiting");
  assert.deepEqual(child.depends_on, [first.id, second.id]);
  assert.equal(child.run_if, "completed");
  assert.equal(child.workflow_id, null);
  // What fails whatever its parents do: a child of the failure of a parent, cancelled when it completes.
  const [onFailure] = await jobq.enqueueBatch([
    { queue: queueName("deps-fail"), payload: null, depends_on: [first.id], run_if: "failed" },
  ]);
  assert.equal(onFailure!.status, "waiting");
  assert.equal((await jobq.getQueue(queue)).waiting, 1);

  for (const n of [1, 2]) {
    const leased = await leaseOne(jobq, queue);
    assert.equal(leased.parents ?? undefined, undefined); // a job without parents carries none
    await jobq.ack(leased, { got: n * 10 });
  }
  const leased = await leaseOne(jobq, queue);
  assert.equal(leased.id, child.id);
  assert.deepEqual(
    leased.parents?.map((parent) => [parent.id, parent.kind, parent.status, parent.result]),
    [
      [first.id, "fetch", "completed", { got: 10 }],
      [second.id, "fetch", "completed", { got: 20 }],
    ],
  );
  assert.equal(await jobq.allParents(leased), leased.parents); // no request: the lease's own list
  const page = await jobq.jobParents(child.id, { limit: 1 });
  assert.deepEqual(
    [page.parents.map((parent) => parent.id), page.next_after_id],
    [[first.id], first.id],
  );
  const rest = await jobq.jobParents(child.id, { limit: 1, after_id: page.next_after_id! });
  assert.deepEqual([rest.parents.map((parent) => parent.id), rest.next_after_id], [[second.id], null]);
  assert.deepEqual(
    (await jobq.allParents(child.id)).map((parent) => parent.result),
    [{ got: 10 }, { got: 20 }],
  );
  assert.deepEqual(await jobq.allParents(first.id), []);
  await jobq.ack(leased);

  const cancelled = await until(async () => {
    const job = await jobq.getJob(onFailure!.id);
    return job.status === "cancelled" && job;
  }, "the run_if failed child to be decided");
  assert.match(cancelled.last_error ?? "", new RegExp(String(first.id)));

  await assert.rejects(jobq.enqueue(queue, null, { depends_on: [2 ** 52] }), ValidationError);
});

test("a child of more than 100 parents is leased without them; allParents pages them", async () => {
  const queue = queueName("fan-in");
  const parents = await jobq.enqueueBatch(
    Array.from({ length: 101 }, (_, n) => ({ queue, payload: { n }, kind: "part" })),
  );
  const child = await jobq.enqueue(queueName("fan-in-child"), null, {
    depends_on: parents.map((job) => job.id),
  });
  const leased = await jobq.lease(queue, { max_jobs: 200, wait: 5 });
  assert.equal(leased.length, 101);
  await jobq.ackBatch(leased.map((job) => ({ ...job, result: (job.payload as { n: number }).n })));
  const [held] = await until(
    () => jobq.lease(child.queue, { wait: 5 }).then((jobs) => jobs.length && jobs),
    "the child",
  );
  assert.equal(held!.id, child.id);
  assert.equal(held!.parents ?? undefined, undefined);
  const all = await jobq.allParents(held!);
  assert.deepEqual(
    all.map((parent) => parent.result),
    Array.from({ length: 101 }, (_, n) => n),
  );
  const pages = [await jobq.jobParents(child.id, { limit: 100 })];
  assert.equal(pages[0]!.parents.length, 100);
  pages.push(await jobq.jobParents(child.id, { after_id: pages[0]!.next_after_id! }));
  assert.deepEqual([pages[1]!.parents.length, pages[1]!.next_after_id], [1, null]);
  await jobq.ack(held!);
});

test("debounce: a burst of enqueues with one key is one job, with the last payload", async () => {
  const queue = queueName("debounce");
  const debounce = { key: "reindex:7", seconds: 3600, max_seconds: 7200 };
  const first = await jobq.enqueue(queue, { v: 1 }, { debounce });
  assert.equal(first.debounced, false);
  assert.equal(first.status, "pending");
  assert.ok(Date.parse(first.run_at) > Date.now() + 3500 * 1000);
  const second = await jobq.enqueue(queue, { v: 2 }, { debounce });
  assert.equal(second.debounced, true);
  assert.equal(second.id, first.id);
  assert.deepEqual(second.payload, { v: 2 });
  assert.ok(Date.parse(second.run_at) >= Date.parse(first.run_at));
  const other = await jobq.enqueue(queue, { v: 3 }, { debounce: { ...debounce, key: "reindex:8" } });
  assert.notEqual(other.id, first.id);
  assert.equal((await jobq.listJobs({ queue })).jobs.length, 2);

  // Once its job is running, the key makes a new one.
  const soon = { key: "soon", seconds: 0 };
  const due = await jobq.enqueue(queue, "a", { debounce: soon });
  const leased = await leaseOne(jobq, queue);
  assert.equal(leased.id, due.id);
  const next = await jobq.enqueue(queue, "b", { debounce: soon });
  assert.equal(next.debounced, false);
  assert.notEqual(next.id, due.id);
  // Not left to expire: the service's lease expiry fails on a debounced job whose key has a pending job
  // again (uq_jobs_debounce), which would hold up every expiry, the other tests' waits for events too.
  await jobq.ack(leased);
});

test("workflows: made all or none with refs, read, listed, waited on and cancelled", async () => {
  const queue = queueName("wf");
  const name = `order-${randomUUID()}`;
  const idempotencyKey = randomUUID();
  const request = {
    name,
    jobs: [
      { ref: "charge", queue, kind: "charge", payload: { order: 7 } },
      { ref: "render", queue, kind: "render", payload: { order: 7 } },
      { ref: "send", queue, kind: "send", payload: { order: 7 }, depends_on: ["charge", "render"] },
    ],
  };
  const made = await jobq.createWorkflow(request, { idempotencyKey });
  assert.deepEqual(
    [made.name, made.status, made.jobs.map((job) => [job.ref, job.status])],
    [
      name,
      "running",
      [
        ["charge", "pending"],
        ["render", "pending"],
        ["send", "waiting"],
      ],
    ],
  );
  // The same key again: the first answer, nothing made twice.
  assert.deepEqual(await jobq.createWorkflow(request, { idempotencyKey }), made);

  const workflow = await jobq.getWorkflow(made.id);
  assert.deepEqual(
    workflow.jobs.map((job) => [job.ref, job.id, job.kind, job.status, job.depends_on]),
    [
      ["charge", made.jobs[0]!.id, "charge", "pending", []],
      ["render", made.jobs[1]!.id, "render", "pending", []],
      ["send", made.jobs[2]!.id, "send", "waiting", ["charge", "render"]],
    ],
  );
  assert.deepEqual(workflow.counts, { pending: 2, waiting: 1 });
  const send = await jobq.getJob(made.jobs[2]!.id);
  assert.deepEqual([send.workflow_id, send.depends_on], [made.id, [made.jobs[0]!.id, made.jobs[1]!.id]]);

  const started = Date.now();
  const still = await jobq.getWorkflow(made.id, { wait: 0.5 });
  assert.equal(still.status, "running");
  assert.ok(Date.now() - started >= 400);
  const listed = await jobq.listWorkflows({ name });
  assert.deepEqual(
    listed.workflows.map((row) => [row.id, row.status]),
    [[made.id, "running"]],
  );
  assert.equal(listed.next_before_id, null);

  const running = await leaseOne(jobq, queue); // charge or render
  const cancelled = await jobq.cancelWorkflow(made.id);
  assert.equal(cancelled.status, "cancelled");
  assert.deepEqual(
    cancelled.jobs.map((job) => [job.id === running.id, job.status]),
    made.jobs.map((job) => (job.id === running.id ? [true, "running"] : [false, "cancelled"])),
  );
  await jobq.ack(running, "done"); // a running job finishes
  const ended = await jobq.waitWorkflow(made.id, 10);
  assert.equal(ended.status, "cancelled");
  assert.ok(ended.finished_at);
  assert.deepEqual(ended.counts, { completed: 1, cancelled: 2 });
  assert.deepEqual(
    (await jobq.listWorkflows({ name, status: "cancelled" })).workflows.map((row) => row.id),
    [made.id],
  );
  await assert.rejects(jobq.retryWorkflow(made.id), Conflict);

  // A cycle, or a parent ref that is no job's, is a 422 naming it; nothing is made.
  await assert.rejects(
    jobq.createWorkflow({
      jobs: [
        { ref: "a", queue, payload: null, depends_on: ["b"] },
        { ref: "b", queue, payload: null, depends_on: ["a"] },
      ],
    }),
    (error: unknown) => error instanceof ValidationError && /cycle/.test(error.detail),
  );
  await assert.rejects(
    jobq.createWorkflow({ jobs: [{ ref: "a", queue, payload: null, depends_on: ["nope"] }] }),
    (error: unknown) => error instanceof ValidationError && /nope/.test(error.detail),
  );
  await assert.rejects(jobq.createWorkflow({ jobs: [{ queue, payload: 1 } as never] }), TypeError);
});

test("a failed workflow retried resumes where it failed", async (t) => {
  const tasks = new Tasks({ queue: queueName("wf-retry"), client: jobq });
  let broken = true;
  const step = tasks.task("step", ({ n }: { n: number }) => {
    if (broken && n === 2) throw new Error("broken");
    return n;
  });
  const flow = new Flow();
  const one = flow.add(step.s({ n: 1 }));
  const two = flow.add(step.s({ n: 2 }, { max_attempts: 1 }), { after: [one] });
  const three = flow.add(step.s({ n: 3 }), { after: [two] });
  assert.deepEqual([one.ref, two.ref, three.ref], ["step", "step-2", "step-3"]);
  const made = await flow.submit();
  const logger = recorder();
  start(t, new Worker({ tasks, wait: 1, logger }));

  const failed = await jobq.waitWorkflow(made.id, 30);
  assert.equal(failed.status, "failed");
  assert.deepEqual(
    failed.jobs.map((job) => job.status),
    ["completed", "dead", "cancelled"],
  );
  assert.match((await jobq.getJob(three.idIn(made))).last_error ?? "", new RegExp(String(two.idIn(made))));

  broken = false;
  const resumed = await jobq.retryWorkflow(made.id);
  assert.equal(resumed.status, "running");
  const done = await jobq.waitWorkflow(made.id, 30);
  assert.equal(done.status, "completed");
  assert.deepEqual(done.counts, { completed: 3 });
  const last = await jobq.getJob(three.idIn(made));
  assert.deepEqual([last.result, last.attempts], [3, 1]);
  assert.equal((await jobq.getJob(one.idIn(made))).attempts, 1); // what completed did not run again
  assert.ok(logger.lines.some((line) => /now dead\): Error: broken/.test(line)));
});

test("a diamond flow of tasks: the last one reads both parents' results", async (t) => {
  const tasks = new Tasks({ queue: queueName("diamond"), client: jobq });
  const charge = tasks.task("charge", ({ order }: { order: number }) => ({ charged: order * 100 }));
  const render = tasks.task("render", ({ order }: { order: number }) => `invoice-${order}.pdf`, {
    queue: queueName("diamond-pdf"),
  });
  const prepare = tasks.task("prepare", ({ order }: { order: number }) => order);
  let seen: { lease: ParentJob[] | null | undefined; parents: ParentJob[] } | undefined;
  const send = tasks.task("send", async ({ order }: { order: number }, context) => {
    const parents = await context.parents();
    seen = { lease: context.job.parents, parents };
    const paid = charge.resultOf(parents); // typed: { charged: number } | undefined
    const pdf = render.resultOf(parents); // typed: string | undefined
    return { order, charged: paid?.charged, pdf };
  });

  const flow = new Flow(`checkout-${randomUUID()}`);
  const first = flow.add(prepare.s({ order: 7 }));
  const paid = flow.add(charge.s({ order: 7 }), { after: [first] });
  const pdf = flow.add(render.s({ order: 7 }), { after: [first], ref: "pdf" });
  const last = flow.add(send.s({ order: 7 }), { after: [paid, pdf] });
  assert.deepEqual(flow.request(), {
    name: flow.name,
    jobs: [
      { ref: "prepare", queue: tasks.queue, kind: "prepare", payload: { order: 7 } },
      { ref: "charge", queue: tasks.queue, kind: "charge", payload: { order: 7 }, depends_on: ["prepare"] },
      { ref: "pdf", queue: render.queue, kind: "render", payload: { order: 7 }, depends_on: ["prepare"] },
      { ref: "send", queue: tasks.queue, kind: "send", payload: { order: 7 }, depends_on: ["charge", "pdf"] },
    ],
  });
  const made = await flow.submit(jobq);
  assert.equal(made.name, flow.name);

  start(t, new Worker({ tasks, concurrency: 4, wait: 1 }));
  const done = await jobq.waitWorkflow(made.id, 30);
  assert.equal(done.status, "completed");
  const result = await jobq.getJob(last.idIn(made));
  assert.deepEqual(result.result, { order: 7, charged: 700, pdf: "invoice-7.pdf" });
  assert.equal(seen!.parents, seen!.lease); // the lease carried them
  assert.deepEqual(
    seen!.parents.map((parent) => [parent.id, parent.kind, parent.status]),
    [
      [paid.idIn(made), "charge", "completed"],
      [pdf.idIn(made), "render", "completed"],
    ],
  );
});

test("a flow refuses what a workflow cannot hold", async () => {
  const tasks = new Tasks({ queue: queueName("flow") });
  const task = tasks.task("task", (_: { n: number }) => null, { max_attempts: 2, priority: 1 });
  const flow = new Flow();
  const a = flow.add(task.s({ n: 1 }, { delay: 5, key: "k" }));
  assert.deepEqual(flow.request().jobs[0], {
    ref: "task",
    queue: tasks.queue,
    kind: "task",
    payload: { n: 1 },
    priority: 1,
    max_attempts: 2,
    delay: 5,
    key: "k",
  });
  flow.add({ queue: "elsewhere", kind: "py_task", payload: [1] }, { after: [a, 42], run_if: "finished" });
  assert.deepEqual(flow.request().jobs[1], {
    ref: "py_task",
    queue: "elsewhere",
    kind: "py_task",
    payload: [1],
    depends_on: ["task", 42],
    run_if: "finished",
  });
  assert.throws(() => flow.add(task.s({ n: 2 }), { ref: "task" }), /ref task already/);
  assert.throws(() => flow.add(task.s({ n: 2 }, { dedup_key: "x" })), /no dedup_key/);
  assert.throws(() => flow.add(task.s({ n: 2 }, { depends_on: [1] })), /in `after`/);
  const elsewhere = new Flow().add(task.s({ n: 3 }));
  assert.throws(() => flow.add(task.s({ n: 2 }), { after: [elsewhere] }), /another flow/);
  assert.equal(flow.size, 2);
  await assert.rejects(new Flow().submit(), /one step/);
});
