// The retry policy: which calls go again after a 503, a lost answer or a refused connection, and that an
// enqueue sent again is carried out once. A small local server plays the service where it must misbehave.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { type IncomingMessage, type ServerResponse, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { Client, LeaseLost, NotFound, RetryPolicy, Unavailable, Unreachable } from "../src/index.js";
import { client, queueName, url } from "./helpers.js";

interface Seen {
  method: string;
  path: string;
  headers: IncomingMessage["headers"];
  body: string;
}

type Answer = (response: ServerResponse, request: Seen) => void | Promise<void>;

/** A local HTTP server giving `answers` in turn (the last one again once they run out); what it was sent. */
async function fake(...answers: Answer[]): Promise<{ url: string; seen: Seen[]; close(): Promise<void> }> {
  const seen: Seen[] = [];
  const server = createServer(async (request, response) => {
    let body = "";
    for await (const chunk of request) body += chunk;
    const one = { method: request.method ?? "", path: request.url ?? "", headers: request.headers, body };
    seen.push(one);
    await answers[Math.min(seen.length, answers.length) - 1]!(response, one);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    seen,
    close: () => {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

const json =
  (status: number, body: unknown, headers: Record<string, string> = {}): Answer =>
  (response) => {
    const type = status >= 400 ? "application/problem+json" : "application/json";
    response.writeHead(status, { "content-type": type, ...headers }).end(JSON.stringify(body));
  };
const problem = (status: number, code: string, extra: object = {}) =>
  json(
    status,
    { type: `urn:jobq:problem:${code}`, title: code, status, detail: `it is ${code}`, code, ...extra },
    status === 503 ? { "retry-after": "0" } : {},
  );
/** The connection closed with no answer: the request may have been carried out. */
const drop: Answer = (response) => void response.socket?.destroy();

const quick = new RetryPolicy({ attempts: 4, backoff: 0.01, cap: 0.05 });
const job = { id: 7, queue: "q", status: "pending" };

test("an idempotent call goes again after a 503 and gets the next answer", async () => {
  const service = await fake(problem(503, "unavailable"), json(200, job));
  try {
    const found = await new Client({ url: service.url, retry: quick }).getJob(7);
    assert.deepEqual(found, job);
    assert.equal(service.seen.length, 2);
  } finally {
    await service.close();
  }
});

test("a 503 on every try: Unavailable after the policy's attempts", async () => {
  const service = await fake(problem(503, "unavailable"));
  try {
    await assert.rejects(new Client({ url: service.url, retry: quick }).listQueues(), Unavailable);
    assert.equal(service.seen.length, 4);
  } finally {
    await service.close();
  }
});

test("never again after another 4xx", async () => {
  const service = await fake(problem(404, "not_found"), problem(409, "lease_lost"), json(200, job));
  try {
    const jobq = new Client({ url: service.url, retry: quick });
    await assert.rejects(jobq.getJob(7), NotFound);
    await assert.rejects(jobq.ack({ id: 7, lease_token: "t" }), LeaseLost);
    assert.equal(service.seen.length, 2);
  } finally {
    await service.close();
  }
});

test("a nack goes again after a 503 only when it says nothing was done", async () => {
  const maybeDone = await fake(problem(503, "unavailable"), json(200, { id: 7, status: "pending" }));
  const nothingDone = await fake(
    problem(503, "unavailable", { nothing_done: true }),
    json(200, { id: 7, status: "pending" }),
  );
  try {
    await assert.rejects(
      new Client({ url: maybeDone.url, retry: quick }).nack({ id: 7, lease_token: "t" }, "e"),
      Unavailable,
    );
    assert.equal(maybeDone.seen.length, 1);
    const nacked = await new Client({ url: nothingDone.url, retry: quick }).nack(
      { id: 7, lease_token: "t" },
      "e",
    );
    assert.equal(nacked.status, "pending");
    assert.equal(nothingDone.seen.length, 2);
    assert.deepEqual(JSON.parse(nothingDone.seen[1]!.body), {
      id: 7,
      lease_token: "t",
      error: "e",
      dead: false,
    });
  } finally {
    await maybeDone.close();
    await nothingDone.close();
  }
});

test("an answer lost on the way: idempotent calls go again, a nack does not", async () => {
  const service = await fake(drop, json(200, job), drop);
  try {
    const jobq = new Client({ url: service.url, retry: quick });
    assert.deepEqual(await jobq.getJob(7), job);
    assert.equal(service.seen.length, 2);
    await assert.rejects(jobq.nack({ id: 7, lease_token: "t" }), Unreachable);
    assert.equal(service.seen.length, 3);
  } finally {
    await service.close();
  }
});

test("no answer in time is an answer lost: an idempotent call goes again", async () => {
  const service = await fake(() => {}, json(200, job)); // the first request is never answered
  try {
    const found = await new Client({ url: service.url, retry: quick, timeout: 0.2 }).getJob(7);
    assert.deepEqual(found, job);
    assert.equal(service.seen.length, 2);
  } finally {
    await service.close();
  }
});

test("a refused connection never reached the service: every call goes again, then Unreachable", async () => {
  const closed = await fake(json(200, job));
  await closed.close(); // nothing listens on its port now
  const tries: number[] = [];
  const counting = new (class extends RetryPolicy {
    override delay(retry: number): number {
      tries.push(retry);
      return 0.01;
    }
  })({ attempts: 3 });
  const error = await new Client({ url: closed.url, retry: counting })
    .nack({ id: 7, lease_token: "t" })
    .catch((e: unknown) => e);
  assert.ok(error instanceof Unreachable && error instanceof Unavailable);
  assert.equal(error.status, undefined);
  assert.match(error.detail, /^POST \/nack: /);
  assert.deepEqual(tries, [0, 1]);

  // Refused once, then answered: the call succeeds.
  let calls = 0;
  const refusedOnce: typeof fetch = async (input, init) => {
    calls += 1;
    if (calls > 1) return fetch(input, init);
    const refused = Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" });
    throw new TypeError("fetch failed", { cause: refused }); // as undici says it
  };
  const service = await fake(json(200, { id: 7, status: "pending", run_at: "2026-01-01T00:00:00Z" }));
  try {
    const jobq = new Client({ url: service.url, retry: quick, fetch: refusedOnce });
    assert.equal((await jobq.nack({ id: 7, lease_token: "t" })).status, "pending");
    assert.deepEqual([calls, service.seen.length], [2, 1]);
  } finally {
    await service.close();
  }
});

test("an enqueue sends one Idempotency-Key on each of its tries, a fresh one per call", async () => {
  const enqueued = { ...job, duplicate: false };
  const service = await fake(
    problem(503, "unavailable"),
    json(201, enqueued),
    json(201, enqueued),
    json(201, enqueued),
  );
  try {
    const jobq = new Client({ url: service.url, retry: quick, token: "s3cret" });
    await jobq.enqueue("q", { n: 1 });
    await jobq.enqueueBatch([{ queue: "q", payload: 2 }], { idempotencyKey: "mine" });
    const keys = service.seen.map((seen) => seen.headers["idempotency-key"]);
    assert.equal(keys[0], keys[1]);
    assert.match(String(keys[0]), /^[0-9a-f-]{36}$/);
    assert.equal(keys[2], "mine");
    assert.deepEqual(
      service.seen.map((seen) => [seen.method, seen.path, seen.headers.authorization]),
      [
        ["POST", "/jobs", "Bearer s3cret"],
        ["POST", "/jobs", "Bearer s3cret"],
        ["POST", "/jobs/batch", "Bearer s3cret"],
      ],
    );
    assert.deepEqual(JSON.parse(service.seen[0]!.body), { queue: "q", payload: { n: 1 } });
  } finally {
    await service.close();
  }
});

test("an enqueue whose answer is lost is sent again and enqueued once (the live service)", async () => {
  // In front of the service: the first enqueue is carried out there, and its answer thrown away.
  const upstream = (request: Seen) =>
    fetch(url + request.path, {
      method: request.method,
      headers: {
        "content-type": "application/json",
        "idempotency-key": String(request.headers["idempotency-key"]),
      },
      body: request.body,
    });
  const forwardThenDrop: Answer = async (response, request) => {
    await (await upstream(request)).text();
    drop(response, request);
  };
  const forward: Answer = async (response, request) => {
    const answer = await upstream(request);
    response.writeHead(answer.status, { "content-type": "application/json" }).end(await answer.text());
  };
  const proxy = await fake(forwardThenDrop, forward);
  const queue = queueName("once");
  try {
    const enqueued = await new Client({ url: proxy.url, retry: quick }).enqueue(queue, { id: randomUUID() });
    assert.equal(proxy.seen.length, 2);
    const page = await client().listJobs({ queue });
    assert.deepEqual(
      page.jobs.map((job) => job.id),
      [enqueued.id],
    );
  } finally {
    await proxy.close();
  }
});

test("an enqueue with depends_on or debounce keeps one Idempotency-Key across its tries", async () => {
  const enqueued = { ...job, duplicate: false };
  const service = await fake(
    drop, // a child's enqueue whose answer is lost: sent again under its key, made at most once
    json(201, { ...enqueued, status: "waiting" }),
    problem(503, "unavailable"),
    json(200, { ...enqueued, debounced: true }),
  );
  try {
    const jobq = new Client({ url: service.url, retry: quick });
    const child = await jobq.enqueue("q", null, { depends_on: [1] });
    assert.equal(child.status, "waiting");
    const debounced = await jobq.enqueue("q", 1, { debounce: { key: "k", seconds: 5 } });
    assert.equal(debounced.debounced, true);
    const keys = service.seen.map((seen) => seen.headers["idempotency-key"]);
    assert.equal(keys.length, 4);
    assert.ok(keys.every((key) => typeof key === "string"));
    assert.equal(keys[0], keys[1]);
    assert.equal(keys[2], keys[3]);
    assert.notEqual(keys[0], keys[2]);
    assert.deepEqual(JSON.parse(service.seen[2]!.body), {
      queue: "q",
      payload: 1,
      debounce: { key: "k", seconds: 5 },
    });
  } finally {
    await service.close();
  }
});

test("a workflow is made with one Idempotency-Key on each of its tries; a retry of one is not sent twice", async () => {
  const made = { id: 3, name: null, status: "running", created_at: "2026-01-01T00:00:00Z", jobs: [] };
  const service = await fake(problem(503, "unavailable"), json(201, made), drop);
  try {
    const jobq = new Client({ url: service.url, retry: quick });
    const request = { jobs: [{ ref: "a", queue: "q", payload: null }] };
    assert.deepEqual(await jobq.createWorkflow(request), made);
    await assert.rejects(jobq.retryWorkflow(3), Unreachable);
    const keys = service.seen.map((seen) => seen.headers["idempotency-key"]);
    assert.equal(keys[0], keys[1]);
    assert.match(String(keys[0]), /^[0-9a-f-]{36}$/);
    assert.deepEqual(
      service.seen.map((seen) => [seen.method, seen.path]),
      [
        ["POST", "/workflows"],
        ["POST", "/workflows"],
        ["POST", "/workflows/3/retry"],
      ],
    );
    assert.deepEqual(JSON.parse(service.seen[0]!.body), request);
  } finally {
    await service.close();
  }
});
