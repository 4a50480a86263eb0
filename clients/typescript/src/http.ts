// Sending one API call: the request on the platform's fetch, and the retry policy around it, as the
// Python client's (clients/python/jobq/client.py, `RetryPolicy` and `_exchange`) so that every jobq
// client retries the same calls, the same way.

import { JobqError, Unreachable, errorFrom } from "./errors.js";

export type Method = "GET" | "POST" | "PUT" | "PATCH" | "DELETE";
type QueryValue = string | number | boolean | null | undefined;

/** One API call: the request, and what is safe to do when its answer is lost. */
export interface Call {
  method: Method;
  path: string;
  query?: Readonly<Record<string, QueryValue>> | undefined;
  body?: unknown;
  headers?: Readonly<Record<string, string>> | undefined;
  /** Seconds the service may hold the request on purpose (a long-poll), added to the timeout. */
  wait?: number | undefined;
  /** Whether sending it again is harmless when an answer was lost in transit (the request may have
   * been carried out). Requests that never reached the service are always sent again. Default true. */
  idempotent?: boolean | undefined;
  /** Tried once, whatever the policy: a probe reports the service as it is now. Default false. */
  once?: boolean | undefined;
  /** The answer is text (GET /metrics), not JSON. */
  text?: boolean | undefined;
  signal?: AbortSignal | undefined;
}

export interface RetryPolicyOptions {
  /** Tries in all, the first one included (default 6: about 8 s of trying at most). */
  attempts?: number;
  /** Seconds before the first retry (default 0.25). */
  backoff?: number;
  /** Longest sleep between tries, in seconds (default 5). */
  cap?: number;
}

/**
 * How calls are retried, never after an answer other than 503 (or a proxy's 502 or 504):
 *
 * - Idempotent calls (reads, lease, ack, extend, release, queue and schedule settings, and enqueues,
 *   which carry an Idempotency-Key) go again after connection errors, 503, 502 and 504: a repeat is
 *   harmless.
 * - The others (nack, cancel, run now, dead retry, purge, key delete, schedule trigger and delete) go
 *   again only when they surely were not carried out: the connection was never made, or the 503 says
 *   `nothing_done` (the service had sent nothing to its database). A lost answer or another 503 may
 *   follow their commit: they throw.
 *
 * The n-th retry sleeps `backoff * 2**n` seconds, capped at `cap`, less up to half of it at random, or
 * the answer's `Retry-After` when that is longer (up to `cap`).
 */
export class RetryPolicy {
  readonly attempts: number;
  readonly backoff: number;
  readonly cap: number;

  constructor({ attempts = 6, backoff = 0.25, cap = 5 }: RetryPolicyOptions = {}) {
    this.attempts = attempts;
    this.backoff = backoff;
    this.cap = cap;
  }

  /** Seconds to sleep before retry number `retry` (0 for the first). */
  delay(retry: number): number {
    return Math.min(this.cap, this.backoff * 2 ** retry) * (0.5 + Math.random() / 2);
  }
}

interface Answer {
  status: number;
  statusText: string;
  headers: Headers;
  text: string;
}

/** No answer: the error, and whether the request surely never reached the service. */
interface Failed {
  error: unknown;
  notSent: boolean;
}

// Causes of a failed fetch (undici's error codes) where no connection was made, so the request never
// reached the service: always safe to send again.
const NOT_SENT = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EADDRNOTAVAIL",
  "UND_ERR_CONNECT_TIMEOUT",
]);

function notSent(error: unknown): boolean {
  const cause = error instanceof Error ? (error.cause as { code?: unknown } | undefined) : undefined;
  return typeof cause?.code === "string" && NOT_SENT.has(cause.code);
}

function nothingDone(answer: Answer): boolean {
  try {
    return (JSON.parse(answer.text) as { nothing_done?: unknown } | null)?.nothing_done === true;
  } catch {
    return false;
  }
}

function retryAfter(answer: Answer): number {
  const seconds = Number(answer.headers.get("retry-after") ?? 0);
  return Number.isFinite(seconds) ? seconds : 0;
}

function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const cause = error.cause instanceof Error ? `: ${error.cause.message}` : "";
  return `${error.name}: ${error.message}${cause}`;
}

/** Seconds on a clock that only goes forward. */
export function now(): number {
  return performance.now() / 1000;
}

/** Resolves after `seconds`, or rejects with the signal's reason when it is aborted first. */
export function sleep(seconds: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const aborted = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", aborted);
      resolve();
    }, seconds * 1000);
    signal?.addEventListener("abort", aborted, { once: true });
  });
}

export interface TransportOptions {
  url: string;
  headers: Record<string, string>;
  /** Seconds per request; a long-poll gets its `wait` on top. */
  timeout: number;
  retry: RetryPolicy;
  fetch: typeof fetch;
}

export class Transport {
  readonly url: string;
  readonly timeout: number;
  readonly retry: RetryPolicy;
  readonly #headers: Record<string, string>;
  readonly #fetch: typeof fetch;

  constructor({ url, headers, timeout, retry, fetch }: TransportOptions) {
    this.url = url;
    this.#headers = headers;
    this.#fetch = fetch;
    this.timeout = timeout;
    this.retry = retry;
  }

  /** The call's answer, read as JSON (as text for a `text` call); a `JobqError` for an error answer. */
  async send<T>(call: Call): Promise<T> {
    const attempts = call.once ? 1 : Math.max(1, this.retry.attempts);
    const idempotent = call.idempotent ?? true;
    for (let n = 0; ; n++) {
      const last = n === attempts - 1;
      const outcome = await this.#attempt(call);
      if ("error" in outcome) {
        if (call.signal?.aborted) throw call.signal.reason;
        if (last || !(idempotent || outcome.notSent)) {
          throw new Unreachable(`${call.method} ${call.path}: ${describe(outcome.error)}`, {
            cause: outcome.error,
          });
        }
        await sleep(this.retry.delay(n), call.signal);
        continue;
      }
      const status = outcome.status;
      // 503: the service could not answer (its database is away), but the request may have been
      // carried out before the connection to the database was lost; a proxy's 502/504 may hide one
      // too. So only idempotent calls go again, unless the service says nothing was done.
      const again = idempotent || (status === 503 && nothingDone(outcome));
      if (!last && (status === 502 || status === 503 || status === 504) && again) {
        await sleep(
          Math.max(this.retry.delay(n), Math.min(retryAfter(outcome), this.retry.cap)),
          call.signal,
        );
        continue;
      }
      if (status >= 200 && status < 300) return (call.text ? outcome.text : JSON.parse(outcome.text)) as T;
      throw errorFrom(status, outcome.text, outcome.statusText);
    }
  }

  async #attempt(call: Call): Promise<Answer | Failed> {
    let url = this.url + call.path;
    if (call.query) {
      const params = new URLSearchParams();
      for (const [name, value] of Object.entries(call.query)) {
        if (value !== undefined && value !== null) params.set(name, String(value));
      }
      const search = params.toString();
      if (search) url += `?${search}`;
    }
    const headers: Record<string, string> = { ...this.#headers, ...call.headers };
    let body: string | undefined;
    if (call.body !== undefined) {
      body = JSON.stringify(call.body);
      headers["content-type"] = "application/json";
    }
    // One signal for the caller's abort and this try's timeout; it covers reading the body too.
    const controller = new AbortController();
    const seconds = this.timeout + (call.wait ?? 0);
    const timer = setTimeout(
      () => controller.abort(new JobqError(`no answer in ${seconds}s`, { code: "timeout" })),
      seconds * 1000,
    );
    const aborted = (): void => controller.abort(call.signal?.reason);
    if (call.signal?.aborted) aborted();
    call.signal?.addEventListener("abort", aborted, { once: true });
    try {
      const response = await this.#fetch(url, {
        method: call.method,
        headers,
        body,
        signal: controller.signal,
      });
      const text = await response.text();
      return { status: response.status, statusText: response.statusText, headers: response.headers, text };
    } catch (error) {
      return { error: controller.signal.aborted ? controller.signal.reason : error, notSent: notSent(error) };
    } finally {
      clearTimeout(timer);
      call.signal?.removeEventListener("abort", aborted);
    }
  }
}
