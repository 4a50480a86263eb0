// Durable steps, sleeps and waits for events against a live service: the client's calls, and handlers that
// use `context.step`, `context.sleep` and `context.waitForEvent`, each checked by what the service holds
// (the job's status, attempts, steps and events) and by counting the side effects and the requests.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  Client,
  Conflict,
  type JobContext,
  LeaseLost,
  type LeasedJob,
  Retry,
  Suspend,
  Worker,
} from "../src/index.js";
import { client, leaseOne, queueName, recorder, start, until, url } from "./helpers.js";

const jobq = client();

/** A client that counts its requests by path. */
function counted(): { client: Client; requests: Map<string, number> } {
  const requests = new Map<string, number>();
  const count: typeof fetch = (input, init) => {
    const path = new URL(String(input)).pathname;
    requests.set(path, (requests.get(path) ?? 0) + 1);
    return fetch(input, init);
  };
  return { client: new Client({ url, fetch: count }), requests };
}

/** How many times each side effect ran, by name. */
function effects(): { ran: Map<string, number>; effect: <T>(name: string, value: T) => () => T } {
  const ran = new Map<string, number>();
  const effect =
    <T>(name: string, value: T) =>
    (): T => {
      ran.set(name, (ran.get(name) ?? 0) + 1);
      return value;
    };
  return { ran, effect };
}

const epoch = (): number => Date.now() / 1000;

// --- the client --------------------------------------------------------------------------------------

test("client: a step recorded once, fenced by the lease, carried by the next lease", async () => {
  const queue = queueName("steps");
  const job = await jobq.enqueue(queue, null);
  const leased = await leaseOne(jobq, queue);
  assert.equal("steps" in leased, false); // a job without steps: its lease carries none
  assert.deepEqual(await jobq.recordStep(leased, "charge", { charge_id: "ch_1" }), {
    id: job.id,
    name: "charge",
    recorded: true,
  });
  await jobq.recordStep({ id: leased.id, lease_token: leased.lease_token }, "nothing", undefined);
  // The first write wins: a second is Conflict, with the recorded result.
  const conflict = await jobq.recordStep(leased, "charge", "other").catch((error: unknown) => error);
  assert.ok(conflict instanceof Conflict);
  assert.deepEqual(conflict.problem.result, { charge_id: "ch_1" });

  // Given back and leased again: the old token records nothing; the new lease carries the steps.
  await jobq.release([leased]);
  const again = await leaseOne(jobq, queue);
  assert.deepEqual(again.steps, { charge: { charge_id: "ch_1" }, nothing: null });
  await assert.rejects(jobq.recordStep(leased, "late", 1), LeaseLost);
  assert.deepEqual((await jobq.getJob(job.id)).steps, { charge: { charge_id: "ch_1" }, nothing: null });
});

test("client: release with a delay, await an event, send and list events", async () => {
  const queue = queueName("events");
  const [sleeper, waiter] = await jobq.enqueueBatch([
    { queue, payload: 1, priority: 1 },
    { queue, payload: 2, priority: 2 },
  ]);
  const [first, second] = await jobq.lease(queue, { max_jobs: 2 });
  assert.deepEqual([first?.id, second?.id], [sleeper!.id, waiter!.id]);

  assert.deepEqual(await jobq.release([{ ...first!, delay: 3600 }]), [{ id: sleeper!.id, ok: true }]);
  const asleep = await jobq.getJob(sleeper!.id);
  assert.deepEqual([asleep.status, asleep.attempts], ["pending", 0]);
  assert.ok(Date.parse(asleep.sleeping_until ?? "") > Date.now() + 3500 * 1000);

  const name = `paid:${waiter!.id}`;
  const awaited = await jobq.awaitEvent(second!, name, { timeout: 60 });
  assert.deepEqual([awaited.id, awaited.status, awaited.event_id], [waiter!.id, "waiting", null]);
  const parked = await jobq.getJob(waiter!.id);
  assert.deepEqual([parked.status, parked.attempts, parked.waiting_for?.event], ["waiting", 0, name]);
  // The lease ended with the await.
  await assert.rejects(jobq.awaitEvent(second!, name, { timeout: 60 }), LeaseLost);

  const sent = await jobq.sendEvent(name, { amount: 42 });
  assert.deepEqual([sent.name, sent.woken], [name, 1]);
  const woke = await leaseOne(jobq, queue);
  assert.equal(woke.id, waiter!.id);
  assert.deepEqual(woke.events, [
    { id: sent.id, name, payload: { amount: 42 }, at: woke.events![0]!.at },
  ]);
  const page = await jobq.listEvents({ name });
  assert.deepEqual(
    page.events.map((event) => [event.id, event.name, event.payload]),
    [[sent.id, name, { amount: 42 }]],
  );
  assert.equal(page.next_before_id, null);
  assert.equal((await jobq.sendEvent(`${name}-nobody`)).woken, 0); // no payload: null
});

// --- steps in a worker -------------------------------------------------------------------------------

test("steps: each side effect runs once across a crash; the retry runs only what is left", async (t) => {
  const queue = queueName("checkout");
  const job = await jobq.enqueue(queue, { order: 7 }, { max_attempts: 3 });
  const { ran, effect } = effects();
  const seen: [number, string[]][] = []; // each run's attempt and the steps its lease carried (sorted)
  const { client: counting, requests } = counted();
  const worker = new Worker({
    queue,
    client: counting,
    handler: async (leased, { step }) => {
      seen.push([leased.attempts, Object.keys(leased.steps ?? {}).sort()]);
      const charge = await step("charge", effect("charge", { charge_id: "ch_7" }));
      const ship = await step("ship", effect("ship", `parcel for ${charge.charge_id}`));
      // The first attempt crashes here, after two steps (run again at once, the attempt counted).
      if (leased.attempts === 1) throw new Retry("the process died", { after: 0 });
      const email = await step("email", effect("email", undefined)); // recorded as null
      return { charge, ship, email };
    },
  });
  const running = start(t, worker);
  const done = await jobq.wait(job.id, 30);
  worker.stop();
  const stats = await running;

  assert.deepEqual(
    [done.status, done.attempts, done.result],
    ["completed", 2, { charge: { charge_id: "ch_7" }, ship: "parcel for ch_7", email: null }],
  );
  assert.deepEqual(Object.fromEntries(ran), { charge: 1, ship: 1, email: 1 });
  assert.deepEqual(seen, [
    [1, []],
    [2, ["charge", "ship"]],
  ]);
  assert.deepEqual(done.steps, { charge: { charge_id: "ch_7" }, ship: "parcel for ch_7", email: null });
  // One request per step run, none for those answered from the lease.
  assert.equal(requests.get(`/jobs/${job.id}/steps`), 3);
  assert.deepEqual([stats.done, stats.failed, stats.suspended], [1, 1, 0]);
});

test("steps: a name recorded already answers the first result; results are as JSON has them", async (t) => {
  const queue = queueName("first-wins");
  const job = await jobq.enqueue(queue, null);
  const { ran, effect } = effects();
  const worker = new Worker({
    queue,
    handler: async (leased, { step }) => {
      // Another writer got there first, under this lease: the first write wins.
      await jobq.recordStep(leased, "charge", "first");
      const charge = await step("charge", () => "second");
      const when = await step("when", () => new Date(0)); // JSON makes it a string, as a replay would
      const twice = await Promise.all([step("once", effect("once", 1)), step("once", effect("once", 1))]);
      const misnamed = await step("jobq.mine", () => 1).catch((error: unknown) => error);
      return { charge, when, twice, misnamed: misnamed instanceof TypeError };
    },
  });
  const running = start(t, worker);
  const done = await jobq.wait(job.id, 30);
  worker.stop();
  await running;
  assert.deepEqual(done.result, {
    charge: "first",
    when: "1970-01-01T00:00:00.000Z",
    twice: [1, 1],
    misnamed: true,
  });
  assert.equal(ran.get("once"), 1);
  assert.deepEqual(done.steps, { charge: "first", when: "1970-01-01T00:00:00.000Z", once: 1 });
});

// --- sleeps ------------------------------------------------------------------------------------------

test("sleep(1) ends the run, the job is released uncounted, and the next run goes on", async (t) => {
  const queue = queueName("sleep");
  const job = await jobq.enqueue(queue, null, { max_attempts: 1 });
  const { ran, effect } = effects();
  const runs: { attempts: number; at: number; steps: Record<string, unknown> }[] = [];
  const { client: counting, requests } = counted();
  const worker = new Worker({
    queue,
    client: counting,
    handler: async (leased, { step, sleep }) => {
      runs.push({ attempts: leased.attempts, at: epoch(), steps: { ...leased.steps } });
      await step("before", effect("before", "done"));
      await sleep(1);
      return await step("after", effect("after", "slept"));
    },
  });
  const running = start(t, worker);
  const done = await jobq.wait(job.id, 30);
  worker.stop();
  const stats = await running;

  // One attempt in all (max_attempts 1): the sleep did not count one.
  assert.deepEqual([done.status, done.attempts, done.result], ["completed", 1, "slept"]);
  assert.deepEqual(Object.fromEntries(ran), { before: 1, after: 1 });
  assert.equal(runs.length, 2);
  assert.deepEqual(
    runs.map((run) => run.attempts),
    [1, 1],
  );
  const wake = runs[1]!.steps["jobq.sleep:0"] as number;
  assert.deepEqual(runs[1]!.steps, { before: "done", "jobq.sleep:0": wake });
  const slept = wake - runs[0]!.at; // the wake-up time is taken after the first step, within the run
  assert.ok(slept >= 1 && slept < 3, `wakes at ${wake}, ran at ${runs[0]!.at}`);
  assert.ok(runs[1]!.at >= wake - 0.05, "the second run came before the wake-up time");
  assert.equal(done.sleeping_until, null);
  assert.deepEqual([stats.done, stats.failed, stats.suspended], [1, 0, 1]);
  // Steps before, sleep and after; one release (with the delay).
  assert.equal(requests.get(`/jobs/${job.id}/steps`), 3);
  assert.equal(requests.get("/release"), 1);
});

test("a job run before its wake-up time sleeps again until then, recording nothing new", async (t) => {
  const queue = queueName("sleep-long");
  const job = await jobq.enqueue(queue, null);
  let runs = 0;
  const { client: counting, requests } = counted();
  const worker = new Worker({
    queue,
    client: counting,
    handler: async (_leased, { sleep }) => {
      runs += 1;
      await sleep(3600);
      return "woke";
    },
  });
  const running = start(t, worker);
  const asleep = await until(async () => {
    const seen = await jobq.getJob(job.id);
    return seen.status === "pending" && seen.sleeping_until && seen;
  }, "the job asleep");
  const wake = asleep.steps?.["jobq.sleep:0"] as number;
  assert.ok(Math.abs(wake - (epoch() + 3600)) < 60, `wakes at ${wake}`);
  assert.ok(Math.abs(Date.parse(asleep.sleeping_until!) / 1000 - wake) < 2);
  assert.equal(asleep.attempts, 0);

  // Run now (POST /jobs/{id}/run): the run finds its wake-up time ahead and sleeps again until then.
  await jobq.runJobNow(job.id);
  await until(() => worker.stats.suspended === 2, "the second sleep");
  worker.stop();
  await running;
  const again = await jobq.getJob(job.id);
  assert.deepEqual([again.status, again.attempts, again.steps], ["pending", 0, { "jobq.sleep:0": wake }]);
  assert.ok(Math.abs(Date.parse(again.sleeping_until!) / 1000 - wake) < 2, again.sleeping_until!);
  assert.equal(runs, 2);
  assert.equal(requests.get(`/jobs/${job.id}/steps`), 1);
  assert.equal(requests.get("/release"), 2);
  await jobq.cancelJob(job.id);
});

test("a handler that swallows Suspend is suspended anyway, warned; steps beside it are kept", async (t) => {
  const queue = queueName("swallow");
  const job = await jobq.enqueue(queue, null);
  const logger = recorder();
  let runs = 0;
  const worker = new Worker({
    queue,
    logger,
    handler: async (_leased, { step, sleep }: JobContext) => {
      runs += 1;
      try {
        // A step still running when the sleep suspends: recorded before the job is released.
        await Promise.all([
          step("slow", () => new Promise((resolve) => setTimeout(() => resolve("kept"), 200))),
          sleep(3600),
        ]);
      } catch (error) {
        assert.ok(error instanceof Suspend);
        return "swallowed"; // the mistake: it should rethrow it
      }
      return "woke";
    },
  });
  const running = start(t, worker);
  await until(() => worker.stats.suspended === 1, "the sleep");
  worker.stop();
  const stats = await running;
  const asleep = await jobq.getJob(job.id);
  assert.deepEqual([asleep.status, asleep.result, stats.done], ["pending", null, 0]);
  assert.equal(asleep.steps?.["slow"], "kept");
  const warning = `warn: job ${job.id}: its handler caught Suspend and returned`;
  assert.ok(
    logger.lines.some((line) => line.startsWith(warning)),
    logger.lines.join("\n"),
  );
  assert.equal(runs, 1);
  await jobq.cancelJob(job.id);
});

// --- events ------------------------------------------------------------------------------------------

test("waitForEvent parks the job until sendEvent; the next run gets the event", async (t) => {
  const queue = queueName("paid");
  const job = await jobq.enqueue(queue, { order: 7 }, { max_attempts: 1 });
  const name = `paid:${job.id}`;
  const { ran, effect } = effects();
  const worker = new Worker({
    queue,
    handler: async (_leased, { step, waitForEvent }) => {
      await step("invoice", effect("invoice", "sent"));
      const paid = await waitForEvent(name, { timeout: 60 });
      return { paid };
    },
  });
  const running = start(t, worker);
  const parked = await until(async () => {
    const seen = await jobq.getJob(job.id);
    return seen.status === "waiting" && seen;
  }, "the job waiting");
  assert.deepEqual([parked.attempts, parked.waiting_for?.event], [0, name]);

  const sent = await jobq.sendEvent(name, { amount: 4200 });
  assert.equal(sent.woken, 1);
  const done = await jobq.wait(job.id, 30);
  worker.stop();
  const stats = await running;
  assert.deepEqual([done.status, done.attempts], ["completed", 1]);
  const { paid } = done.result as { paid: { at: string } };
  assert.deepEqual(done.result, { paid: { id: sent.id, name, payload: { amount: 4200 }, at: paid.at } });
  assert.ok(!Number.isNaN(Date.parse(paid.at)));
  assert.equal(ran.get("invoice"), 1);
  assert.deepEqual([stats.done, stats.suspended], [1, 1]);
});

test("an event sent before the wait is not lost; waits for one name take its events in order", async (t) => {
  const queue = queueName("ticks");
  const job = await jobq.enqueue(queue, null);
  const first = await jobq.sendEvent(`tick:${job.id}`, 1); // after the enqueue, before any wait
  const worker = new Worker({
    queue,
    handler: async (leased, { waitForEvent }) => {
      const name = `tick:${leased.id}`;
      const one = await waitForEvent(name, { timeout: 60 });
      const two = await waitForEvent(name, { timeout: 60 });
      return [one?.payload, two?.payload];
    },
  });
  const running = start(t, worker);
  // The first wait found its event at once (no parking); the second parks the job.
  await until(async () => (await jobq.getJob(job.id)).status === "waiting", "the second wait");
  const second = await jobq.sendEvent(`tick:${job.id}`, 2);
  const done = await jobq.wait(job.id, 30);
  worker.stop();
  await running;
  assert.deepEqual([done.status, done.result], ["completed", [1, 2]]);
  assert.deepEqual(
    done.events?.map((event) => event.id),
    [first.id, second.id],
  );
});

test("a wait that runs out gives null on the next run", async (t) => {
  const queue = queueName("timeout");
  const job = await jobq.enqueue(queue, null, { max_attempts: 1 });
  const worker = new Worker({
    queue,
    handler: async (leased, { waitForEvent }) => ({
      paid: await waitForEvent(`paid:${leased.id}`, { timeout: 1 }),
    }),
  });
  const running = start(t, worker);
  const done = await jobq.wait(job.id, 30);
  worker.stop();
  await running;
  assert.deepEqual([done.status, done.attempts, done.result], ["completed", 1, { paid: null }]);
  assert.deepEqual(
    done.events?.map((event) => [event.name, event.timed_out, event.payload]),
    [[`paid:${job.id}`, true, null]],
  );
});

test("bad arguments are refused before anything is sent", async (t) => {
  const queue = queueName("bad-args");
  const job = await jobq.enqueue(queue, null);
  const worker = new Worker({
    queue,
    handler: async (_leased, context) => {
      const refused = async (call: () => Promise<unknown>) =>
        call().then(
          () => "accepted",
          (error: unknown) => (error as Error).name,
        );
      return [
        await refused(() => context.sleep(-1)),
        await refused(() => context.sleep(Number.NaN)),
        await refused(() => context.waitForEvent("paid", { timeout: 0 })),
        await refused(() => context.waitForEvent("", { timeout: 5 })),
        await refused(() => context.step("", () => 1)),
        await refused(() => context.step("n".repeat(129), () => 1)),
      ];
    },
  });
  const running = start(t, worker);
  const done = await jobq.wait(job.id, 30);
  worker.stop();
  await running;
  const [range, type] = ["RangeError", "TypeError"];
  assert.deepEqual(done.result, [range, range, range, type, type, type]);
  assert.equal(done.steps ?? null, null);
});

// --- what a job that uses none of it costs -----------------------------------------------------------

test("a job that uses no step, sleep or wait costs no request more than its lease and ack", async (t) => {
  const queue = queueName("plain");
  const job = await jobq.enqueue(queue, 1);
  const { client: counting, requests } = counted();
  const worker = new Worker({ queue, client: counting, handler: (leased: LeasedJob) => leased.payload });
  const running = start(t, worker);
  const done = await jobq.wait(job.id, 30);
  worker.stop();
  const stats = await running;
  assert.deepEqual([done.status, done.result], ["completed", 1]);
  assert.deepEqual(stats, { done: 1, failed: 0, lost: 0, released: 0, suspended: 0, inFlight: 0 });
  // The queue's settings read at start, leases, and the one ack: nothing else.
  assert.deepEqual(new Set(requests.keys()), new Set([`/queues/${queue}`, "/lease", "/ack/batch"]));
  assert.equal(requests.get("/ack/batch"), 1);
});
