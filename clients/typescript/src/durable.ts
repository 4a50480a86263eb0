// Durable steps, sleeps and waits for events: what `context.step`, `context.sleep` and
// `context.waitForEvent` do in a handler (API part 8). The model is replay: a handler suspended (asleep,
// or waiting for an event) or crashed runs again from the top, and each step it recorded is answered
// from the record (the lease's `steps`) instead of running again; so the code between steps must do the
// same thing on every run.
//
//   const charge = await context.step("charge", () => payments.charge(order));   // runs once
//   await context.sleep(3600);                     // the job is released for an hour, no worker held
//   const paid = await context.waitForEvent(`paid:${order}`, { timeout: 86400 });   // null: timed out
//
// A sleep or a wait that is not over ends the handler's run: it throws `Suspend`, which the worker
// catches and carries out (a release with a delay, or `POST /jobs/{id}/await`) instead of acking or
// nacking the job. Nothing is asked of the service until a handler calls one of these: a job that uses
// none of them costs no request more than the lease and the ack.

import type { Client } from "./client.js";
import { Conflict } from "./errors.js";
import type { EventReached, JobEvent, LeasedJob } from "./types.js";

/** The longest sleep and the longest wait for an event, in seconds (a year: the service's limit). */
export const MAX_SUSPEND = 31_536_000;
/** The longest step name the service takes. */
const MAX_STEP_NAME = 128;
/** The longest event name the service takes. */
const MAX_EVENT_NAME = 256;
/** Step names the client keeps for itself: `jobq.sleep:<n>`, the wake-up time of a run's n-th sleep. */
const RESERVED = "jobq.";
const SLEEP_STEP = `${RESERVED}sleep:`;

/** What a suspended job's worker does in place of an ack: release it for `delay` seconds (recording
 * `step`, the sleep's wake-up time, first when it is new), or park it until an event of a name. */
export type Suspension =
  | { kind: "sleep"; delay: number; step?: { name: string; wake: number } }
  | { kind: "event"; event: string; timeout: number };

/**
 * Thrown by `context.sleep` and `context.waitForEvent` when the job has to stop here for now: the worker
 * carries out the sleep or the wait instead of acking or nacking the job, and the job runs again from the
 * top once it is over. A handler must let it through: one that catches errors rethrows it,
 *
 *   try { ... } catch (error) { if (error instanceof Suspend) throw error; ... }
 *
 * (a handler that swallows it is suspended anyway, with a warning, once it ends).
 */
export class Suspend extends Error {
  readonly suspension: Suspension;

  constructor(message: string, suspension: Suspension) {
    super(message);
    this.name = "Suspend";
    this.suspension = suspension;
  }
}

/** Now, in Unix epoch seconds (what a sleep step records). */
const epoch = (): number => Date.now() / 1000;

/** Seconds as the API takes a sleep's delay: within its bounds, to the millisecond. */
export function delayOf(seconds: number): number {
  return Math.min(MAX_SUSPEND, Math.max(0, Math.round(seconds * 1000) / 1000));
}

/** A JSON value as it comes back from the service: what a step's replays answer, so that its first run
 * answers the same (a Date becomes its string, undefined null). */
function asJSON(value: unknown): unknown {
  const text = JSON.stringify(value);
  return text === undefined ? null : JSON.parse(text);
}

function checkSeconds(what: string, seconds: unknown, least: number): number {
  if (typeof seconds !== "number" || !Number.isFinite(seconds) || seconds < least || seconds > MAX_SUSPEND) {
    const bounds = `from ${least} to ${MAX_SUSPEND}`;
    throw new RangeError(`${what} must be a number of seconds ${bounds}, not ${String(seconds)}`);
  }
  return seconds;
}

function checkName(what: string, name: unknown, longest: number): string {
  if (typeof name !== "string" || !name.length || name.length > longest) {
    throw new TypeError(`${what} must be a string of 1 to ${longest} characters`);
  }
  return name;
}

/** One run of a handler on a leased job: its recorded steps, its sleeps and waits counted in the order
 * called, and the suspension it met (the first one). The worker makes one per run. */
export class Durable {
  readonly #client: Client;
  readonly #job: LeasedJob;
  readonly #signal: AbortSignal | undefined;
  // The lease's steps, and those recorded in this run; read lazily (most jobs never ask).
  #steps: Map<string, unknown> | undefined;
  readonly #running = new Map<string, Promise<unknown>>(); // steps whose function or record is on its way
  #sleeps = 0;
  readonly #waits = new Map<string, number>(); // waits for events so far, by name
  #suspended: Suspend | undefined;

  constructor(client: Client, job: LeasedJob, signal?: AbortSignal) {
    this.#client = client;
    this.#job = job;
    this.#signal = signal;
  }

  /** The suspension this run met, if any: the worker carries it out when the handler ends. */
  get suspended(): Suspend | undefined {
    return this.#suspended;
  }

  get #recorded(): Map<string, unknown> {
    this.#steps ??= new Map(Object.entries(this.#job.steps ?? {}));
    return this.#steps;
  }

  /** Once the steps on their way have ended (their results recorded, or not): before the job is
   * suspended, so that a step that ran beside the sleep or wait is not lost with the lease. */
  async settled(): Promise<void> {
    while (this.#running.size) await Promise.allSettled([...this.#running.values()]);
  }

  /** `context.step`: the recorded result of step `name`, else `fn`'s, recorded under the lease. */
  async step<T>(name: string, fn: () => T | Promise<T>): Promise<T> {
    checkName("a step's name", name, MAX_STEP_NAME);
    if (name.startsWith(RESERVED)) {
      throw new TypeError(`step names starting with "${RESERVED}" are jobq's own: ${name}`);
    }
    if (this.#suspended) throw this.#suspended;
    const recorded = this.#recorded;
    if (recorded.has(name)) return recorded.get(name) as T;
    // The same name twice at once (Promise.all): one run of the function, both get its result.
    let running = this.#running.get(name);
    if (running === undefined) {
      running = this.#run(name, fn).finally(() => this.#running.delete(name));
      this.#running.set(name, running);
    }
    return (await running) as T;
  }

  async #run(name: string, fn: () => unknown): Promise<unknown> {
    // A lease known lost (or a worker past its grace period): no new side effect, its record would fail.
    this.#signal?.throwIfAborted();
    const result = asJSON(await fn());
    try {
      await this.#client.recordStep(this.#job, name, result);
    } catch (error) {
      // Recorded already (a repeat of this request after a lost answer, or another run of the job under
      // a lease of its own): the first result stands, as it will on every later run.
      if (!(error instanceof Conflict) || !("result" in error.problem)) throw error;
      this.#recorded.set(name, error.problem.result);
      return error.problem.result;
    }
    this.#recorded.set(name, result);
    return result;
  }

  /** `context.sleep`: on with the run once the n-th sleep's wake-up time has come, else suspended. */
  async sleep(seconds: number): Promise<void> {
    checkSeconds("a sleep", seconds, 0);
    if (this.#suspended) throw this.#suspended;
    const name = `${SLEEP_STEP}${this.#sleeps++}`;
    const recorded = this.#recorded;
    if (recorded.has(name)) {
      const wake = recorded.get(name);
      // Not a time (nothing but this client writes these steps): taken as over, never a sleep for ever.
      if (typeof wake !== "number" || wake <= epoch()) return;
      throw this.#suspend(`sleeps until ${new Date(wake * 1000).toISOString()}`, {
        kind: "sleep",
        delay: delayOf(wake - epoch()),
      });
    }
    const wake = Math.round((epoch() + seconds) * 1000) / 1000;
    throw this.#suspend(`sleeps for ${seconds}s`, {
      kind: "sleep",
      delay: delayOf(seconds),
      step: { name, wake },
    });
  }

  /** `context.waitForEvent`: the k-th event of this name that reached the job (null: that wait ran out),
   * else suspended until it comes. */
  async waitForEvent(name: string, options: { timeout: number }): Promise<JobEvent | null> {
    checkName("an event's name", name, MAX_EVENT_NAME);
    const timeout = checkSeconds("the timeout of a wait for an event", options?.timeout, 1);
    if (this.#suspended) throw this.#suspended;
    const k = this.#waits.get(name) ?? 0;
    this.#waits.set(name, k + 1);
    const entry = (this.#job.events ?? []).filter((event: EventReached) => event.name === name)[k];
    if (entry === undefined) {
      throw this.#suspend(`waits for the event ${name} (at most ${timeout}s)`, {
        kind: "event",
        event: name,
        timeout,
      });
    }
    if (entry.timed_out) return null;
    return { id: entry.id as number, name: entry.name, payload: entry.payload ?? null, at: entry.at };
  }

  #suspend(what: string, suspension: Suspension): Suspend {
    this.#suspended = new Suspend(
      `job ${this.#job.id} ${what}: the worker suspends it, and runs it again from the top after ` +
        "(a handler that catches errors must rethrow Suspend)",
      suspension,
    );
    return this.#suspended;
  }
}
