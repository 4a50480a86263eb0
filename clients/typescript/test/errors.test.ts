// Error answers become the JobqError of their code: against the live service, and from bodies made here.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  Conflict,
  Forbidden,
  JobqError,
  LeaseLost,
  NotFound,
  PayloadTooLarge,
  Unauthorized,
  Unavailable,
  ValidationError,
  errorFrom,
} from "../src/index.js";
import { client, queueName } from "./helpers.js";

const jobq = client();
const STALE_TOKEN = "00000000-0000-4000-8000-000000000000";

test("an ack with a stale token is LeaseLost (409 lease_lost), and changes nothing", async () => {
  const queue = queueName("stale");
  const job = await jobq.enqueue(queue, null);
  const [leased] = await jobq.lease(queue, { wait: 5 });
  assert.equal(leased?.id, job.id);
  const error = await jobq.ack({ id: job.id, lease_token: `${STALE_TOKEN}.${queue}` }).then(
    () => assert.fail("a stale token acked"),
    (error: unknown) => error,
  );
  assert.ok(error instanceof LeaseLost);
  assert.ok(error instanceof JobqError);
  assert.deepEqual([error.status, error.code, error.name], [409, "lease_lost", "LeaseLost"]);
  assert.match(error.detail, new RegExp(`\\b${job.id}\\b`));
  assert.equal(error.problem.code, "lease_lost");
  assert.equal((await jobq.getJob(job.id)).status, "running");
  // The holder's token still works; after its nack, the token is stale too.
  await jobq.nack(leased!, "once", { retry_after: 3600 });
  await assert.rejects(jobq.ack(leased!), LeaseLost);
  await assert.rejects(jobq.extend(leased!, 30), LeaseLost);
  await assert.rejects(jobq.nack(leased!), LeaseLost);
});

test("an unknown job is NotFound (404); an invalid request is ValidationError (422)", async () => {
  await assert.rejects(jobq.getJob(2 ** 52), (error: unknown) => {
    assert.ok(error instanceof NotFound);
    assert.deepEqual([error.status, error.code], [404, "not_found"]);
    return true;
  });
  await assert.rejects(jobq.getQueue(queueName("never")), NotFound);

  const invalid = await jobq.lease(queueName("invalid"), { max_jobs: 0 }).catch((error: unknown) => error);
  assert.ok(invalid instanceof ValidationError);
  assert.deepEqual([invalid.status, invalid.code], [422, "validation_error"]);
  assert.deepEqual(invalid.errors[0]?.loc.at(-1), "max_jobs");
  await assert.rejects(
    jobq.enqueue(queueName("both"), null, { delay: 1, run_at: new Date().toISOString() }),
    ValidationError,
  );
  await assert.rejects(jobq.retryDead({}), ValidationError);
});

test("cancelling a running job is Conflict (409 conflict)", async () => {
  const queue = queueName("conflict");
  const job = await jobq.enqueue(queue, null);
  await jobq.lease(queue, { wait: 5 });
  const error = await jobq.cancelJob(job.id).catch((error: unknown) => error);
  assert.ok(error instanceof Conflict && !(error instanceof LeaseLost));
  assert.deepEqual([error.status, error.code, error.problem.job_status], [409, "conflict", "running"]);
});

test("codes choose the class; an unknown code is a plain JobqError; no body falls back on the status", () => {
  const problem = (status: number, code: string) =>
    JSON.stringify({ type: `urn:jobq:problem:${code}`, title: "t", status, detail: `about ${code}`, code });
  const cases: [number, string, typeof JobqError][] = [
    [401, "unauthorized", Unauthorized],
    [403, "forbidden", Forbidden],
    [404, "not_found", NotFound],
    [409, "lease_lost", LeaseLost],
    [409, "conflict", Conflict],
    [413, "payload_too_large", PayloadTooLarge],
    [422, "validation_error", ValidationError],
    [503, "unavailable", Unavailable],
  ];
  for (const [status, code, cls] of cases) {
    const error = errorFrom(status, problem(status, code));
    assert.equal(error.constructor, cls, code);
    assert.deepEqual([error.status, error.code, error.detail], [status, code, `about ${code}`]);
  }

  const unknown = errorFrom(409, problem(409, "key_busy"));
  assert.equal(unknown.constructor, JobqError);
  assert.deepEqual([unknown.status, unknown.code, unknown.detail], [409, "key_busy", "about key_busy"]);

  const proxied = errorFrom(404, "<html>no such thing</html>", "Not Found");
  assert.equal(proxied.constructor, NotFound);
  assert.deepEqual(
    [proxied.code, proxied.detail, proxied.problem],
    ["not_found", "<html>no such thing</html>", {}],
  );
  const bare = errorFrom(502, "", "Bad Gateway");
  assert.equal(bare.constructor, JobqError);
  assert.deepEqual([bare.code, bare.detail], ["error", "Bad Gateway"]);
});
