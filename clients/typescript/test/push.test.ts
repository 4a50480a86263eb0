// Push delivery's receiving end: verifyPush takes what the Standard Webhooks reference library (npm
// `standardwebhooks`) signs and refuses what it must; the library takes what signPush signs. No service.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { test } from "node:test";
import { promisify } from "node:util";

import { Webhook } from "standardwebhooks";

import {
  PUSH_TOLERANCE,
  PushVerificationError,
  signPush,
  verifyPush,
  type PushVerificationReason,
  type PushedJob,
} from "../src/index.js";

const secret = () => `whsec_${randomBytes(32).toString("base64")}`;
const SECRET = secret();
const now = () => Math.floor(Date.now() / 1000);

const JOB: PushedJob = {
  id: 42,
  queue: "emails",
  kind: "send_email",
  key: "ada",
  payload: { to: "ada@example.com", name: "Ada Lovelace — ✉️" },
  attempts: 2,
  max_attempts: 5,
  run_at: "2025-01-02T03:04:05.678901+00:00",
  created_at: "2025-01-02T03:04:00+00:00",
  parents: [{ id: 41, kind: "render", status: "completed", result: { html: "<p>hi</p>" } }],
};
const BODY = JSON.stringify(JOB);

/** The three headers as the reference library signs `body`. */
function headers(
  body: string | Uint8Array,
  { key = SECRET, id = `job_${JOB.id}`, timestamp = now() } = {},
): Record<string, string> {
  return {
    "webhook-id": id,
    "webhook-timestamp": String(timestamp),
    "webhook-signature": new Webhook(key).sign(id, new Date(timestamp * 1000), body),
  };
}

/** The PushVerificationError of `verifying`, whose reason must be `reason` and message match `message`. */
async function refused(verifying: Promise<unknown>, reason: PushVerificationReason, message: RegExp) {
  const error = await verifying.then(
    () => assert.fail("verified"),
    (error: unknown) => error,
  );
  assert.ok(error instanceof PushVerificationError, String(error));
  assert.equal(error.name, "PushVerificationError");
  assert.equal(error.reason, reason);
  assert.match(error.message, message);
  return error;
}

test("what the reference library signs verifies, as a string or bytes, with Headers or a record", async () => {
  assert.deepEqual(await verifyPush(headers(BODY), BODY, SECRET), JOB);
  const bytes = Buffer.from(BODY); // as a Node request's chunks give it: non-ASCII as UTF-8
  assert.notEqual(bytes.length, BODY.length);
  assert.deepEqual(await verifyPush(headers(bytes), bytes, SECRET), JOB);
  assert.deepEqual(await verifyPush(headers(bytes), new Uint8Array(bytes), SECRET), JOB);
  assert.deepEqual(await verifyPush(headers(BODY), bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length), SECRET), JOB);

  const fetchHeaders = new Headers(headers(BODY));
  fetchHeaders.set("content-type", "application/json");
  assert.deepEqual(await verifyPush(fetchHeaders, BODY, SECRET), JOB);

  // Names in any case; values as Node's IncomingHttpHeaders has them (string, string[] or undefined).
  const { "webhook-id": id, "webhook-timestamp": timestamp, "webhook-signature": signature } = headers(BODY);
  const record = { "Webhook-Id": id, "WEBHOOK-TIMESTAMP": timestamp, "webhook-Signature": [signature], "x-none": undefined };
  assert.deepEqual(await verifyPush(record, BODY, SECRET), JOB);

  // A secret without its prefix is the same key, as the libraries take it.
  assert.deepEqual(await verifyPush(headers(BODY), BODY, SECRET.slice("whsec_".length)), JOB);
  // A job without parents (the field is left out then), and with null kind and key.
  const plain = JSON.stringify({ ...JOB, kind: null, key: null, parents: undefined, payload: [1, "two", null] });
  assert.deepEqual(await verifyPush(headers(plain), plain, SECRET), JSON.parse(plain));
});

test("a body changed by a byte, or parsed and serialized again, is refused", async () => {
  const signed = headers(BODY);
  await refused(verifyPush(signed, BODY.replace('"attempts":2', '"attempts":3'), SECRET), "signature", /no signature .* matches .*job_42.*raw body/);
  await refused(verifyPush(signed, `${BODY}\n`, SECRET), "signature", /matches/);
  await refused(verifyPush(signed, JSON.stringify(JSON.parse(BODY), null, 1), SECRET), "signature", /matches/);
  const bytes = Buffer.from(BODY);
  bytes[bytes.length - 2] ^= 1;
  await refused(verifyPush(signed, bytes, SECRET), "signature", /matches/);
  // The id and the timestamp are signed too.
  await refused(verifyPush({ ...signed, "webhook-id": "job_43" }, BODY, SECRET), "signature", /job_43/);
  const later = String(Number(signed["webhook-timestamp"]) + 1);
  await refused(verifyPush({ ...signed, "webhook-timestamp": later }, BODY, SECRET), "signature", /matches/);
});

test("another secret's signature is refused", async () => {
  await refused(verifyPush(headers(BODY, { key: secret() }), BODY, SECRET), "signature", /not the queue's push secret/);
  // The same bytes given raw (not as base64) are another key.
  const raw = `whsec_${Buffer.from(SECRET).toString("base64")}`;
  await refused(verifyPush(headers(BODY, { key: raw }), BODY, SECRET), "signature", /matches/);
});

test("a missing or empty webhook header is refused, naming it", async () => {
  for (const name of ["webhook-id", "webhook-timestamp", "webhook-signature"]) {
    const without: Record<string, string> = { ...headers(BODY) };
    delete without[name];
    await refused(verifyPush(without, BODY, SECRET), "missing_header", new RegExp(`no ${name} header`));
    await refused(verifyPush(new Headers(without), BODY, SECRET), "missing_header", new RegExp(`no ${name} header`));
    await refused(verifyPush({ ...without, [name]: " " }, BODY, SECRET), "missing_header", new RegExp(name));
    await refused(verifyPush({ ...without, [name]: [] }, BODY, SECRET), "missing_header", new RegExp(name));
  }
  await refused(verifyPush({}, BODY, SECRET), "missing_header", /no webhook-id header/);
});

test("a timestamp more than the tolerance old or ahead is refused; within it, taken", async () => {
  const old = now() - PUSH_TOLERANCE - 5;
  await refused(verifyPush(headers(BODY, { timestamp: old }), BODY, SECRET), "timestamp", /is 30\d s old, more than the 300 s tolerated/);
  const ahead = now() + PUSH_TOLERANCE + 5;
  await refused(verifyPush(headers(BODY, { timestamp: ahead }), BODY, SECRET), "timestamp", /ahead of this machine's clock/);
  // A test of a second here or there would race the clock: these are a minute inside the bounds.
  assert.equal((await verifyPush(headers(BODY, { timestamp: now() - 240 }), BODY, SECRET)).id, 42);
  assert.equal((await verifyPush(headers(BODY, { timestamp: now() + 240 }), BODY, SECRET)).id, 42);

  // options.tolerance, both ways.
  const minuteOld = headers(BODY, { timestamp: now() - 60 });
  await refused(verifyPush(minuteOld, BODY, SECRET, { tolerance: 10 }), "timestamp", /more than the 10 s tolerated/);
  const hourOld = headers(BODY, { timestamp: now() - 3000 });
  assert.equal((await verifyPush(hourOld, BODY, SECRET, { tolerance: 3600 })).id, 42);
  await assert.rejects(verifyPush(hourOld, BODY, SECRET, { tolerance: -1 }), TypeError);

  for (const timestamp of ["soon", "1.7e9", "-5", `${now()}.5`]) {
    const signed = { ...headers(BODY), "webhook-timestamp": timestamp };
    await refused(verifyPush(signed, BODY, SECRET), "invalid_header", /not a unix time in seconds/);
  }
});

test("a signature of another scheme than v1 is not taken, even with v1's bytes", async () => {
  const signed = headers(BODY);
  const base64 = signed["webhook-signature"]!.slice("v1,".length);
  for (const scheme of ["v2", "v1a", "V1", ""]) {
    const other = { ...signed, "webhook-signature": `${scheme},${base64}` };
    await refused(verifyPush(other, BODY, SECRET), "signature", /no v1 signature .*jobq signs with v1/);
  }
  await refused(verifyPush({ ...signed, "webhook-signature": base64 }, BODY, SECRET), "signature", /no v1 signature/);
  // A v1 whose base64 is not base64 matches nothing.
  const garbled = { ...signed, "webhook-signature": `v1,${base64.slice(1)}!` };
  await refused(verifyPush(garbled, BODY, SECRET), "signature", /no signature .* matches/);
});

test("several signatures (a secret's rotation): one matching is enough, none is not", async () => {
  const right = headers(BODY)["webhook-signature"]!;
  const wrong = headers(BODY, { key: secret() })["webhook-signature"]!;
  const alsoWrong = headers(BODY, { key: secret() })["webhook-signature"]!;
  const [id, timestamp] = [`job_${JOB.id}`, headers(BODY)["webhook-timestamp"]!];
  const verify = (signature: string | string[]) =>
    verifyPush({ "webhook-id": id, "webhook-timestamp": timestamp, "webhook-signature": signature }, BODY, SECRET);

  for (const signature of [`${wrong} ${right}`, `${right} ${wrong}`, `${wrong}  v1a,${right.slice(3)} ${right}`]) {
    assert.equal((await verify(signature)).id, 42, signature);
  }
  // A header sent twice: Node's record has both; Node's and fetch's joined value has ", " between.
  assert.equal((await verify([wrong, right])).id, 42);
  assert.equal((await verify(`${wrong}, ${right}`)).id, 42);
  assert.equal((await verify(`${right}, ${wrong}`)).id, 42);
  const twice = new Headers({ "webhook-id": id, "webhook-timestamp": timestamp });
  twice.append("webhook-signature", wrong);
  twice.append("webhook-signature", right);
  assert.equal((await verifyPush(twice, BODY, SECRET)).id, 42);

  await refused(verify(`${wrong} ${alsoWrong}`), "signature", /no signature .* matches/);
  await refused(verify([wrong, alsoWrong]), "signature", /no signature .* matches/);
  // The right bytes under another scheme, beside a v1 that does not match, are not taken either.
  await refused(verify(`${wrong} v1a,${right.slice(3)}`), "signature", /no signature .* matches/);
});

test("the reference library's Webhook.verify takes what signPush signs, and signs the same", async () => {
  const timestamp = now();
  const signature = await signPush(SECRET, "job_42", timestamp, BODY);
  assert.match(signature, /^v1,[A-Za-z0-9+/]{43}=$/);
  const sent = { "webhook-id": "job_42", "webhook-timestamp": String(timestamp), "webhook-signature": signature };
  assert.deepEqual(new Webhook(SECRET).verify(BODY, sent), JOB);
  assert.deepEqual(new Webhook(SECRET).verify(Buffer.from(BODY), sent), JOB);
  assert.equal(signature, new Webhook(SECRET).sign("job_42", new Date(timestamp * 1000), BODY));
  assert.equal(await signPush(SECRET, "job_42", new Date(timestamp * 1000 + 999), Buffer.from(BODY)), signature);
  assert.deepEqual(await verifyPush(sent, BODY, SECRET), JOB);

  // And refuses what it must, so that the agreement above is not that of a check that takes anything.
  assert.throws(() => new Webhook(SECRET).verify(`${BODY} `, sent), /No matching signature/);
  assert.throws(() => new Webhook(secret()).verify(BODY, sent), /No matching signature/);
  const otherId = await signPush(SECRET, "job_43", timestamp, BODY);
  assert.throws(() => new Webhook(SECRET).verify(BODY, { ...sent, "webhook-signature": otherId }), /No matching/);
  await assert.rejects(signPush(SECRET, "job_42", 1.5, BODY), TypeError);
});

test("a signed body that is not a job is refused; the receiver's own mistakes are TypeErrors", async () => {
  for (const body of ["not json", "[1, 2]", '{"queue": "emails"}', '{"id": "42", "queue": "emails"}', "null"]) {
    await refused(verifyPush(headers(body), body, SECRET), "body", /is signed but is not/);
  }
  // A parsed body (an express.json() body, say) is not the bytes signed: said so, not answered 401.
  const parsed = JSON.parse(BODY) as unknown as string;
  await assert.rejects(verifyPush(headers(BODY), parsed, SECRET), (error: unknown) => {
    assert.ok(error instanceof TypeError);
    assert.match(error.message, /raw body as received .* not Object: a body parsed as JSON/);
    return true;
  });
  for (const bad of ["", "whsec_", "whsec_not base64!", "whsec_A"]) {
    await assert.rejects(verifyPush(headers(BODY), BODY, bad), TypeError, bad);
  }
  await assert.rejects(signPush("whsec_%%%", "job_42", now(), BODY), /not "whsec_" followed by base64/);
});

test("without a global crypto (Node 18 without --experimental-global-webcrypto), node:crypto's", async () => {
  const index = new URL("../src/index.js", import.meta.url).href;
  const timestamp = now();
  const program = `
    delete globalThis.crypto;
    if (globalThis.crypto !== undefined) throw new Error("crypto is still global");
    const { signPush, verifyPush } = await import(${JSON.stringify(index)});
    const [secret, body, timestamp] = [${JSON.stringify(SECRET)}, ${JSON.stringify(BODY)}, ${timestamp}];
    const signature = await signPush(secret, "job_42", timestamp, body);
    const headers = { "webhook-id": "job_42", "webhook-timestamp": String(timestamp), "webhook-signature": signature };
    const job = await verifyPush(headers, body, secret);
    const refused = await verifyPush(headers, body + " ", secret).then(() => "verified", (error) => error.name);
    console.log(JSON.stringify({ signature, id: job.id, refused }));
  `;
  const { stdout } = await promisify(execFile)(process.execPath, ["--input-type=module", "-e", program]);
  const ran = JSON.parse(stdout) as { signature: string; id: number; refused: string };
  assert.equal(ran.signature, new Webhook(SECRET).sign("job_42", new Date(timestamp * 1000), BODY));
  assert.deepEqual([ran.id, ran.refused], [42, "PushVerificationError"]);
});
