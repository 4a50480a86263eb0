// Push delivery, the receiving end: jobq POSTs each job of a queue with a push URL to that URL, signed as
// Standard Webhooks specifies (https://www.standardwebhooks.com). `verifyPush` checks a request's
// signature and answers its job; `signPush` signs as jobq does, for testing a receiver.
//
// Headers: `webhook-id: job_<id>` (the same on every attempt: deduplicate on it), `webhook-timestamp`
// (unix seconds), and `webhook-signature: v1,<base64 of HMAC-SHA256 over "<id>.<timestamp>.<body>">`,
// keyed with the bytes of the secret's base64 after `whsec_`; during a rotation several signatures,
// space-separated, of which one matching is enough.
//
// On Web Crypto alone (`crypto.subtle`), so the same code runs on Node 18+, Deno, Bun, Cloudflare
// Workers and edge runtimes.

import type { webcrypto } from "node:crypto";

import { PushVerificationError } from "./errors.js";
import type { PushedJob } from "./types.js";

/** Request headers: a fetch `Headers` (anything with `get`), or a plain record such as Node's
 * `request.headers`; names are matched whatever their case. */
export type PushHeaders =
  | { get(name: string): string | null }
  | Readonly<Record<string, string | readonly string[] | undefined>>;

/** A request's raw body: `await request.text()` or `arrayBuffer()` of a fetch Request, the Buffer of the
 * chunks of a Node request. */
export type PushBody = string | Uint8Array | ArrayBuffer;

export interface VerifyPushOptions {
  /** How far, in seconds, `webhook-timestamp` may be from this machine's clock, either way: older
   * requests are refused as replays (default 300, as Standard Webhooks says). */
  tolerance?: number;
}

/** Seconds a timestamp may be off by default: five minutes, the Standard Webhooks libraries' own. */
export const PUSH_TOLERANCE = 300;

const SECRET_PREFIX = "whsec_";
const encoder = new TextEncoder();

/**
 * The job of a pushed request, once its signature holds: `headers` and `body` as received (the raw body,
 * a string or bytes, before any JSON parsing: a body parsed and serialized again is not what was signed),
 * `secret` the queue's push secret (`whsec_...`).
 *
 * Throws a `PushVerificationError` (answer 401) when a `webhook-*` header is missing or malformed, the
 * timestamp is more than `tolerance` seconds off, no signature matches, or the body is not a job; a
 * `TypeError` when `secret` or `body` is not of the kind it must be (the receiver's mistake, not the
 * request's).
 */
export async function verifyPush(
  headers: PushHeaders,
  body: PushBody,
  secret: string,
  options: VerifyPushOptions = {},
): Promise<PushedJob> {
  const tolerance = options.tolerance ?? PUSH_TOLERANCE;
  if (typeof tolerance !== "number" || !(tolerance >= 0)) {
    throw new TypeError(`tolerance must be a number of seconds, 0 or more, not ${String(tolerance)}`);
  }
  const bytes = bodyBytes(body);
  const key = await hmacKey(secret);

  const id = required(headers, "webhook-id");
  const timestamp = required(headers, "webhook-timestamp");
  const signatures = required(headers, "webhook-signature");

  if (!/^\d{1,15}$/.test(timestamp)) {
    throw new PushVerificationError(
      `webhook-timestamp is not a unix time in seconds: ${JSON.stringify(timestamp.slice(0, 40))}`,
      "invalid_header",
    );
  }
  const off = Math.floor(Date.now() / 1000) - Number(timestamp);
  if (Math.abs(off) > tolerance) {
    const when = off > 0 ? `${off} s old` : `${-off} s ahead of this machine's clock`;
    throw new PushVerificationError(
      `webhook-timestamp ${timestamp} is ${when}, more than the ${tolerance} s tolerated: a request ` +
        "replayed or held up on the way, or a clock that is off (check NTP here and on jobq's machines)",
      "timestamp",
    );
  }

  const candidates: Uint8Array[] = [];
  const schemes = new Set<string>();
  for (const token of signatures.split(/\s+/)) {
    // A header sent twice reaches Node and fetch as one, joined by ", ": the comma is not base64's.
    const signature = token.replace(/,+$/, "");
    const comma = signature.indexOf(",");
    if (!signature) continue;
    const scheme = comma < 0 ? signature : signature.slice(0, comma);
    schemes.add(scheme);
    if (scheme !== "v1") continue;
    const decoded = fromBase64(signature.slice(comma + 1));
    if (decoded) candidates.push(decoded);
  }
  if (!schemes.has("v1")) {
    throw new PushVerificationError(
      `webhook-signature has no v1 signature (it has ${[...schemes].join(", ") || "none"}): jobq signs ` +
        'with v1 (HMAC-SHA256), as "v1,<base64>"',
      "signature",
    );
  }
  const expected = await hmac(key, signed(id, timestamp, bytes));
  // Each candidate compared in full (no early exit on the first difference, nor on a match).
  let matched = false;
  for (const candidate of candidates) matched = constantTimeEqual(candidate, expected) || matched;
  if (!matched) {
    throw new PushVerificationError(
      `no signature in webhook-signature matches (webhook-id ${id}): the secret is not the queue's push ` +
        "secret (after a rotation, the new one), or the body is not the raw body as received (verify it " +
        "before parsing it as JSON, and let no middleware decode or re-encode it)",
      "signature",
    );
  }
  return jobOf(bytes, id);
}

/**
 * The `webhook-signature` value jobq sends for a push (`v1,<base64>`): `id` is the `webhook-id`
 * (`job_<id>`), `timestamp` the `webhook-timestamp` (unix seconds, or a Date), `body` the exact body. For
 * testing a receiver: send `body` with these three headers and `verifyPush` takes it.
 */
export async function signPush(
  secret: string,
  id: string,
  timestamp: number | Date,
  body: PushBody,
): Promise<string> {
  const seconds = timestamp instanceof Date ? Math.floor(timestamp.getTime() / 1000) : timestamp;
  if (!Number.isSafeInteger(seconds) || seconds < 0) {
    throw new TypeError(`timestamp must be unix seconds (a whole number) or a Date, not ${String(timestamp)}`);
  }
  const key = await hmacKey(secret);
  return `v1,${toBase64(await hmac(key, signed(id, String(seconds), bodyBytes(body))))}`;
}

function required(headers: PushHeaders, name: string): string {
  const value = header(headers, name)?.trim();
  if (!value) {
    throw new PushVerificationError(
      `the request has no ${name} header: not a push from jobq, or a proxy in between dropped the ` +
        "webhook-* headers (pass them on)",
      "missing_header",
    );
  }
  return value;
}

function header(headers: PushHeaders, name: string): string | undefined {
  if (typeof headers.get === "function") {
    return (headers as { get(name: string): string | null }).get(name) ?? undefined;
  }
  const values: string[] = [];
  for (const [key, value] of Object.entries(headers as Record<string, unknown>)) {
    if (key.toLowerCase() !== name) continue;
    if (typeof value === "string") values.push(value);
    else if (Array.isArray(value)) values.push(...value.filter((item) => typeof item === "string"));
  }
  return values.length ? values.join(", ") : undefined;
}

function bodyBytes(body: PushBody): Uint8Array {
  if (typeof body === "string") return encoder.encode(body);
  if (body instanceof Uint8Array) return body;
  if (ArrayBuffer.isView(body)) return new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
  if (body instanceof ArrayBuffer) return new Uint8Array(body);
  throw new TypeError(
    `the body must be the raw body as received (a string, a Uint8Array such as a Buffer, or an ArrayBuffer), ` +
      `not ${describe(body)}: a body parsed as JSON and serialized again is not the bytes jobq signed`,
  );
}

function describe(value: unknown): string {
  if (value === null) return "null";
  if (typeof value === "object") return (value as object).constructor?.name ?? "an object";
  return typeof value;
}

/** `<id>.<timestamp>.<body>`, the bytes signed. */
function signed(id: string, timestamp: string, body: Uint8Array): Uint8Array {
  const prefix = encoder.encode(`${id}.${timestamp}.`);
  const bytes = new Uint8Array(prefix.length + body.length);
  bytes.set(prefix);
  bytes.set(body, prefix.length);
  return bytes;
}

function jobOf(bytes: Uint8Array, id: string): PushedJob {
  let job: unknown;
  try {
    job = JSON.parse(new TextDecoder().decode(bytes));
  } catch (error) {
    throw new PushVerificationError(`the body of ${id} is signed but is not JSON`, "body", { cause: error });
  }
  const fields = job as Partial<Record<keyof PushedJob, unknown>> | null;
  const isJob =
    typeof fields === "object" &&
    fields !== null &&
    !Array.isArray(fields) &&
    typeof fields.id === "number" &&
    typeof fields.queue === "string";
  if (!isJob) {
    throw new PushVerificationError(
      `the body of ${id} is signed but is not a job (an object with a numeric id and a queue)`,
      "body",
    );
  }
  return fields as PushedJob;
}

type Subtle = webcrypto.SubtleCrypto;
type Key = webcrypto.CryptoKey;

let subtleCrypto: Subtle | undefined;

/** Web Crypto's SubtleCrypto: the global one (Node 19+, Deno, Bun, Workers, edge runtimes, browsers), else
 * Node 18's, which has the global only behind --experimental-global-webcrypto. */
async function subtle(): Promise<Subtle> {
  if (subtleCrypto) return subtleCrypto;
  const global = (globalThis as { crypto?: { subtle?: Subtle } }).crypto?.subtle;
  if (global) return (subtleCrypto = global);
  // A name, not a literal, so that bundlers for runtimes without node:crypto leave the import alone.
  const name = "node:crypto";
  try {
    const { webcrypto } = (await import(name)) as typeof import("node:crypto");
    return (subtleCrypto = webcrypto.subtle);
  } catch (error) {
    throw new Error("no Web Crypto here: verifyPush needs crypto.subtle (HMAC SHA-256)", { cause: error });
  }
}

async function hmacKey(secret: string): Promise<Key> {
  if (typeof secret !== "string" || !secret) {
    const what = typeof secret === "string" ? "empty" : describe(secret);
    throw new TypeError(`the push secret must be the queue's "whsec_..." string; it is ${what}`);
  }
  const encoded = secret.startsWith(SECRET_PREFIX) ? secret.slice(SECRET_PREFIX.length) : secret;
  const key = fromBase64(encoded);
  if (!key || key.length === 0) {
    throw new TypeError(
      `the push secret is not "whsec_" followed by base64 (it starts ${JSON.stringify(secret.slice(0, 8))}): ` +
        "give the queue's push secret as jobq shows it",
    );
  }
  return (await subtle()).importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
}

async function hmac(key: Key, data: Uint8Array): Promise<Uint8Array> {
  return new Uint8Array(await (await subtle()).sign("HMAC", key, data));
}

/** Whether `a` and `b` hold the same bytes, in a time that depends on their lengths alone. */
function constantTimeEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let difference = 0;
  for (let i = 0; i < a.length; i++) difference |= a[i]! ^ b[i]!;
  return difference === 0;
}

/** Standard base64 (padding optional), or undefined for text that is not. */
function fromBase64(text: string): Uint8Array | undefined {
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(text) || text.length % 4 === 1) return undefined;
  try {
    return Uint8Array.from(atob(text), (char) => char.charCodeAt(0));
  } catch {
    return undefined;
  }
}

function toBase64(bytes: Uint8Array): string {
  return btoa(String.fromCharCode(...bytes));
}
