// The worker runner: lease jobs from queues, run a handler on each, ack or nack them. It behaves as the
// Python client's (clients/python/jobq/worker.py); the constants and the reasons for them are the same.
//
//   const worker = new Worker({ queue: "emails", handler: async (job) => mail(job.payload) });
//   await run(worker);   // until SIGTERM or SIGINT; or worker.run() and worker.stop()
//
// - Up to `concurrency` handlers run at once, on the event loop: a handler is an async function (a
//   plain function that works for long blocks every other job and the lease keeper with it).
// - Handlers are chosen by the job's `kind`: `handlers` by kind, `tasks` (a registry, ./tasks.ts) by
//   name, and `handler` for any other kind (every job, when it is the only one given). A job whose kind
//   none has is nacked with an error naming the kinds this worker knows, and retried on the queue's
//   backoff, so that a worker of a newer release can take it during a rolling deploy.
// - A fetcher per queue leases jobs in batches (`POST /lease`) into one local buffer, kept at about
//   `concurrency` jobs beyond those running, so a handler that returns finds its next job at hand. It
//   long-polls only when the buffer is empty (or its queue was found empty); with several queues, a
//   long-poll asks for no more than its share of the room, so an idle queue cannot crowd out a busy one.
// - A job does not wait in the buffer past a third of its visibility timeout: it is given back (`POST
//   /release`, the attempt not counted) rather than started late, and the buffer is halved, since jobs
//   that slow gain nothing from one.
// - Acks and nacks go in batches (`/ack/batch`, `/nack/batch`): those of jobs finishing within a few ms
//   of each other, or while the previous batch is in flight, go together.
// - A handler that returns acks its job, with what it returned as the result; one that throws nacks it
//   with the error's name, message and the innermost frames of its stack, and the queue's backoff
//   decides when it runs again (`Retry` chooses when, `Fail` makes the job dead now).
// - While a handler runs, its lease is extended every half visibility timeout (one timer looks after all
//   the running jobs), with the progress it reported since; a lease lost anyway (the worker was stalled)
//   aborts the handler's `signal` and makes its ack a counted, logged no-op.
// - A handler that sleeps or waits for an event (`context.sleep`, `context.waitForEvent`, ./durable.ts)
//   ends its run with `Suspend`: its job is released with a delay (a new sleep's wake-up time recorded
//   first as a step) or parked with `POST /jobs/{id}/await`, not acked or nacked, and runs again from the
//   top later, its recorded steps answered from the lease. Steps still on their way are let finish first.
// - `stop()` (SIGTERM or SIGINT under `run()`) stops leasing at once (a waiting long-poll is aborted,
//   which closes its connection, so the service claims nothing more for this worker; a short lease on
//   its way is let finish, since the service may have leased its jobs already), gives the buffered jobs
//   back (`POST /release`, the attempt not counted) and gives running handlers `grace` seconds to
//   finish; the jobs still running then are nacked with `retry_after` 0, so another worker takes them
//   now, and their handlers' `signal` is aborted. A second `stop()` does that without waiting (and
//   aborts a short lease still on its way).

import { hostname } from "node:os";
import { fileURLToPath } from "node:url";

import { Batcher, Flag, MAX_BATCH } from "./batcher.js";
import { Client } from "./client.js";
import { Durable, type Suspend, delayOf } from "./durable.js";
import {
  Conflict,
  Forbidden,
  JobqError,
  LeaseLost,
  NotFound,
  PayloadTooLarge,
  Unavailable,
} from "./errors.js";
import { now, sleep } from "./http.js";
import { Fail, type JobContext, Retry, type Tasks, UnknownTask } from "./tasks.js";
import type { AckRequest, ItemResult, Lease, LeasedJob, NackItemResult, NackRequest } from "./types.js";

/** A function of the leased job: what it returns (or resolves to) is the job's result; what it throws
 * fails the job. */
export type Handler = (job: LeasedJob, context: JobContext) => unknown;

/** Where the worker's messages go; `console` is one. Default: warnings and errors on stderr. */
export interface Logger {
  debug(message: string): void;
  info(message: string): void;
  warn(message: string): void;
  error(message: string): void;
}

export interface WorkerOptions {
  /** One queue or several; default the queues of `tasks`. */
  queue?: string | readonly string[];
  /** The handler of jobs whose kind has no handler or task of its own (of every job, alone). */
  handler?: Handler;
  /** Handlers by the kind of job they run. */
  handlers?: Readonly<Record<string, Handler>>;
  /** A registry of tasks, each running the jobs of its name's kind. */
  tasks?: Tasks;
  /** Default: a `Client` on $JOBQ_URL and $JOBQ_TOKEN. */
  client?: Client;
  /** Jobs run at once (default 1). */
  concurrency?: number;
  /** Seconds each lease long-polls (default 20, at most 60). */
  wait?: number;
  /** Seconds each lease lasts before it is extended; default the queue's, read once at start. */
  visibilityTimeout?: number;
  /** Seconds running handlers get to finish after `stop()` (default 30). */
  grace?: number;
  /** Sent with each lease (`GET /workers` lists it); default `host:pid`. */
  workerId?: string;
  logger?: Logger;
}

/** What a worker did: jobs done (acked), failed (nacked), lost (the lease had moved on when the ack or
 * nack came: another worker has the job), released (given back unstarted, or still running when the
 * grace period ended and nacked to run again at once), suspended (asleep or waiting for an event, to run
 * again from the top later), and running now. */
export interface Stats {
  done: number;
  failed: number;
  lost: number;
  released: number;
  suspended: number;
  inFlight: number;
}

/** The contract's default for a queue nobody configured, in seconds. */
const DEFAULT_VISIBILITY_TIMEOUT = 30;
/** Stack frames kept in a nack's error (the innermost ones). */
const ERROR_FRAMES = 5;
/** Longest error text sent with a nack. */
const ERROR_CHARS = 4000;
/** Queues named at most when warning of one that does not exist. */
const LISTED_QUEUES = 20;
/** The part of its visibility timeout a job may wait in the buffer before it is given back. */
const BUFFER_AGE = 1 / 3;
// Jobs buffered beyond the running ones: at most what the handlers, at their average time so far, finish
// in this many seconds (and at most a lease's limit). Fast handlers get big leases, whose cost per job is
// lowest; slow ones leave the queue's jobs to other workers. 0.5 s of no-op handlers is a full lease.
const PREFETCH_SECONDS = 0.5;
/** Weight of each finished job in the handlers' average time. */
const HANDLER_TIME_WEIGHT = 0.05;

const quiet: Logger = {
  debug: () => {},
  info: () => {},
  warn: (message) => console.warn(`jobq: ${message}`),
  error: (message) => console.error(`jobq: ${message}`),
};

// This package's own files and Node's internals: left out of the stacks sent with nacks.
const OWN_FILES = ["./worker.js", "./tasks.js", "./durable.js"]
  .map((file) => new URL(file, import.meta.url).href)
  .flatMap((url) => [url, fileURLToPath(url)]);

/** A failure as a nack's error: `Name: message`, then the innermost frames of its stack (this
 * package's and Node's internal frames left out), cut to ERROR_CHARS. */
export function describe(error: unknown): string {
  if (!(error instanceof Error)) {
    if (typeof error === "string") return error.slice(0, ERROR_CHARS);
    try {
      return (JSON.stringify(error) ?? String(error)).slice(0, ERROR_CHARS);
    } catch {
      return String(error).slice(0, ERROR_CHARS);
    }
  }
  // A class that does not name its instances (`class Timeout extends Error {}`) is known by its own name.
  const kind = error.name && error.name !== "Error" ? error.name : error.constructor?.name || "Error";
  let text = error.message ? `${kind}: ${error.message}` : kind;
  // Frames with a place in a file of the application's (not `at async Promise.all (index 0)`).
  const frames = (error.stack ?? "")
    .split("\n")
    .filter((line) => /^\s+at .*:\d+:\d+\)?$/.test(line))
    .filter((line) => !line.includes("node:internal") && !OWN_FILES.some((file) => line.includes(file)));
  if (frames.length) {
    const shown = frames.slice(0, ERROR_FRAMES);
    const trimmed = frames.length > shown.length ? `\n    ... ${frames.length - shown.length} more` : "";
    text += `\n${shown.join("\n")}${trimmed}`;
  }
  return text.slice(0, ERROR_CHARS).trimEnd();
}

/** Throws on what JSON cannot hold: non-finite numbers (JSON.stringify would write null). */
function finite(_key: string, value: unknown): unknown {
  if (typeof value === "number" && !Number.isFinite(value)) {
    throw new TypeError(`${value} is not a JSON number`);
  }
  return value;
}

interface Route {
  run: Handler;
  /** Seconds its job's lease lasts while it runs (undefined: as long as the lease it came with). */
  visibilityTimeout?: number | undefined;
}

/** A running job, how it runs, and when its lease is next extended. */
interface Held {
  job: LeasedJob;
  visibilityTimeout: number; // seconds each extension of its lease asks for
  due: number; // now() when the lease is extended
  started: number;
  extending: boolean;
  lost: boolean; // an extension found the lease gone: no more tries
  // The latest progress the handler reported, how many reports were made, and how many were sent: the
  // keeper sends what is new with the next extension.
  progress: unknown;
  reported: number;
  sent: number;
  abort: AbortController; // the handler's signal
}

interface Buffered {
  job: LeasedJob;
  sent: number; // now() when its lease was asked for: it ends no sooner than its timeout after
}

/** A job done, and what its handler returned (undefined: no result). */
interface Completion {
  job: LeasedJob;
  result: unknown;
}

/** A job failed, as its nack says it. */
interface Failure {
  job: LeasedJob;
  error: string;
  retry_after?: number;
  dead: boolean;
}

export class Worker {
  readonly queues: readonly string[];
  readonly client: Client;
  readonly concurrency: number;
  readonly wait: number;
  readonly visibilityTimeout: number | undefined;
  readonly grace: number;
  readonly workerId: string;
  readonly stats: Stats = { done: 0, failed: 0, lost: 0, released: 0, suspended: 0, inFlight: 0 };
  readonly #log: Logger;
  readonly #routes = new Map<string, Route>();
  readonly #fallback: Route | undefined;
  #ran = false;
  readonly #stopping = new AbortController(); // aborted by stop(): also ends the long-polls in flight
  readonly #hurry = new Flag(); // a second stop: release running jobs without waiting
  readonly #hurried = new AbortController(); // aborted by a second stop: also ends the short leases in flight
  readonly #room = new Flag(); // a job finished or left the buffer: the fetchers may lease more
  readonly #noneRunning = new Flag();
  readonly #finished = new AbortController(); // aborted once the run is over: ends extensions in flight
  #buffer: Buffered[] = []; // jobs leased but not started, oldest first
  // Jobs buffered beyond those running: doubled when a handler finds the buffer empty while a queue is
  // not (handlers outpace leasing), up to #prefetchLimit(); halved when a job waits too long in the buffer.
  #prefetch: number;
  #handlerTime: number | undefined; // seconds a handler takes, on average (undefined: none ran yet)
  readonly #drained: Map<string, boolean>; // the queue's last lease found fewer jobs than asked
  #asking = 0; // jobs the leases in flight may bring
  #starved = false; // a handler found the buffer empty since the last lease
  readonly #running = new Map<number, Held>();
  readonly #extensions = new Set<Promise<void>>();
  readonly #suspending = new Set<Promise<void>>(); // sleeps and waits on their way to the service
  // Each queue's leases' timeout, set by run(); jobs leave the buffer after BUFFER_AGE of the shortest.
  readonly #visibility = new Map<string, number>();
  #shortest = DEFAULT_VISIBILITY_TIMEOUT;
  readonly #acks: Batcher<Completion, ItemResult>;
  readonly #nacks: Batcher<Failure, NackItemResult>;
  readonly #releases: Batcher<LeasedJob, ItemResult>;

  constructor(options: WorkerOptions) {
    const { concurrency = 1, tasks, handlers = {}, handler } = options;
    if (!Number.isInteger(concurrency) || concurrency < 1) {
      throw new RangeError("concurrency must be an integer of at least 1");
    }
    for (const [kind, run] of Object.entries(handlers)) this.#routes.set(kind, { run });
    for (const task of tasks ?? []) {
      if (this.#routes.has(task.name)) throw new Error(`kind ${task.name} has both a handler and a task`);
      this.#routes.set(task.name, {
        run: (job, context) => task.run(job, context),
        visibilityTimeout: task.visibilityTimeout,
      });
    }
    this.#fallback = handler === undefined ? undefined : { run: handler };
    if (!this.#routes.size && !this.#fallback) {
      throw new Error("give the worker a handler, handlers by kind, or tasks");
    }
    const queue = options.queue ?? tasks?.queues;
    if (queue === undefined) throw new Error("name the queue to work on");
    this.queues = typeof queue === "string" ? [queue] : [...new Set(queue)];
    if (!this.queues.length) throw new Error("name at least one queue to work on");
    this.client = options.client ?? tasks?.client ?? new Client();
    this.concurrency = concurrency;
    this.wait = options.wait ?? 20;
    this.visibilityTimeout = options.visibilityTimeout;
    this.grace = options.grace ?? 30;
    this.workerId = options.workerId ?? `${hostname()}:${process.pid}`;
    this.#log = options.logger ?? quiet;
    this.#prefetch = Math.min(concurrency, MAX_BATCH);
    this.#drained = new Map(this.queues.map((queue) => [queue, true]));
    this.#acks = new Batcher(
      (items) =>
        this.client.ackBatch(items.map(({ job, result }): AckRequest => ({ ...lease(job), result }))),
      (completion, result) => this.#acked(completion, result),
      (batch, error) => this.#unsent(batch, error),
    );
    this.#nacks = new Batcher(
      (items) =>
        this.client.nackBatch(
          items.map(({ job, ...failure }): NackRequest => ({ ...lease(job), ...failure })),
        ),
      (failure, result) => this.#nacked(failure, result),
      (batch, error) => this.#unsent(batch, error),
    );
    this.#releases = new Batcher(
      (jobs) => this.client.release(jobs),
      (job, result) => this.#givenBack(job, result),
      (batch, error) => this.#unsent(batch, error),
    );
  }

  /** The queues worked on, as one name for messages (`emails,reports`). */
  get queue(): string {
    return this.queues.join(",");
  }

  get stopping(): boolean {
    return this.#stopping.signal.aborted;
  }

  /** Stop leasing and let running handlers finish within `grace`; called again, release them now. */
  stop(): void {
    if (this.stopping) {
      this.#hurry.set();
      this.#hurried.abort();
    }
    this.#stopping.abort();
  }

  /** Work until `stop()`; the counts of what was done. A refusal by the service other than
   * `unavailable` (a bad token, an invalid queue name) ends the run with that error. A worker runs once. */
  async run(): Promise<Stats> {
    if (this.#ran) throw new Error("this worker has run already: make another");
    this.#ran = true;
    const missing: string[] = [];
    for (const queue of this.queues) {
      const lease = await this.#queueVisibilityTimeout(queue, missing);
      this.#visibility.set(queue, this.visibilityTimeout ?? lease);
    }
    if (missing.length) await this.#warnOfMissing(missing);
    this.#shortest = Math.min(...this.#visibility.values());
    const leases = [...new Set(this.#visibility.values())].map((v) => `${v}s`).join(", ");
    this.#log.info(
      `worker ${this.workerId} on ${this.queue}: up to ${this.concurrency} jobs at once, ` +
        `leases of ${leases}, grace ${this.grace}s`,
    );
    const started = now();
    const tick = Math.min(1, this.#shortest / 10);
    const keeper = setInterval(() => this.#keepLeased(), tick * 1000);
    let failure: { error: unknown } | undefined;
    const fetchers = this.queues.flatMap((queue) =>
      [false, true].map((second) =>
        this.#fetch(queue, second).catch((error: unknown) => {
          failure ??= { error };
          this.#stopping.abort(); // when one failed: the others stop too
        }),
      ),
    );
    try {
      await Promise.all(fetchers);
    } finally {
      await this.#drain();
      clearInterval(keeper);
      this.#finished.abort();
      await Promise.allSettled(this.#extensions);
    }
    const { done, failed, lost, released, suspended } = this.stats;
    const elapsed = now() - started;
    const rate = elapsed ? (done + failed) / elapsed : 0;
    this.#log.info(
      `worker stopped after ${elapsed.toFixed(1)}s (${rate.toFixed(1)} jobs/s on average): ` +
        `${done} done, ${failed} failed, ${lost} lost, ${released} released, ${suspended} suspended`,
    );
    if (failure) throw failure.error;
    return { ...this.stats };
  }

  /** The queue's visibility timeout; a queue that does not exist yet is added to `missing`. */
  async #queueVisibilityTimeout(queue: string, missing: string[]): Promise<number> {
    try {
      return (await this.client.getQueue(queue)).settings.visibility_timeout;
    } catch (error) {
      if (error instanceof NotFound) {
        missing.push(queue); // a queue nobody configured yet, with no jobs: the defaults
        return DEFAULT_VISIBILITY_TIMEOUT;
      }
      if (!(error instanceof JobqError)) throw error;
      this.#log.warn(
        `cannot read the settings of ${queue} (${error.detail}); ` +
          `leasing for ${DEFAULT_VISIBILITY_TIMEOUT}s: give the worker a visibilityTimeout to choose`,
      );
      return DEFAULT_VISIBILITY_TIMEOUT;
    }
  }

  /** A queue that does not exist yet (no job, no settings) is most often a typo, which would wait for ever
   * without a word: say so at start, naming the queues that exist (the first LISTED_QUEUES of those the
   * token may list), and work on, since the queue may yet get its first job. */
  async #warnOfMissing(missing: string[]): Promise<void> {
    let there: string;
    try {
      const names = (await this.client.listQueues()).map((row) => row.queue).sort();
      const more = names.length > LISTED_QUEUES ? `, and ${names.length - LISTED_QUEUES} more` : "";
      const shown = names.slice(0, LISTED_QUEUES).join(", ");
      there = names.length ? `queues that exist: ${shown}${more}` : "no queue exists yet";
    } catch (error) {
      if (!(error instanceof JobqError)) throw error;
      there =
        error instanceof Forbidden
          ? "this token may not list the queues"
          : `the queues could not be listed (${error.detail})`;
    }
    for (const queue of missing) {
      this.#log.warn(
        `queue ${queue} does not exist yet (no jobs, no settings): waiting for its first job; ${there}`,
      );
    }
  }

  // --- leasing into the buffer -----------------------------------------------------------------------

  /**
   * Keep the buffer filled from `queue`: lease when at least half the room it may hold is free (any room
   * at all when it is empty), long-polling when the queue's last lease found fewer jobs than it asked
   * for. The buffer holds `concurrency` jobs to begin with, more when handlers find it empty. Room asked
   * for by the leases in flight counts as taken.
   *
   * Each queue has two fetchers, and a lease asks for at most half the room, so that while one lease is
   * on its way the other can ask for the room that handlers free meanwhile (fast handlers otherwise wait
   * for each lease's round trip); the `second` never long-polls: while its queue is found empty, it
   * waits for the first to find jobs.
   */
  async #fetch(queue: string, second: boolean): Promise<void> {
    const stopping = this.#stopping.signal;
    let pause = 0;
    while (!stopping.aborted) {
      if (this.#starved) {
        this.#starved = false;
        this.#prefetch = Math.max(1, 2 * this.#prefetch);
      }
      this.#prefetch = Math.min(this.#prefetch, this.#prefetchLimit());
      const capacity = this.concurrency + this.#prefetch;
      const held = this.#buffer.length + this.#running.size + this.#asking;
      let room = Math.min(MAX_BATCH, capacity - held, Math.floor((capacity + 1) / 2));
      const longPoll = this.#drained.get(queue) ?? true;
      if (room < 1 || (this.#buffer.length && room < Math.floor(capacity / 2)) || (second && longPoll)) {
        this.#room.clear();
        await this.#room.wait({ signal: stopping });
        continue;
      }
      if (longPoll && this.queues.length > 1) {
        room = Math.min(room, Math.max(1, Math.floor(capacity / this.queues.length)));
      }
      // stop() aborts a long-poll, which may wait long: the service sees its client leave, leases nothing
      // more for it, and hands back what it leased for it meanwhile. A short lease is let finish (a second
      // stop() aborts it): its answer is a round trip away, and by the time stop() comes the service may
      // have leased its jobs, which an answer thrown away would leave claimed by nobody until their
      // visibility timeout; read, they go to the buffer, which #drain() gives back.
      const sent = now();
      this.#asking += room;
      let jobs: LeasedJob[];
      try {
        jobs = await this.client.lease(queue, {
          max_jobs: room,
          visibility_timeout: this.#visibility.get(queue),
          wait: longPoll ? this.wait : 0,
          worker_id: this.workerId,
          signal: longPoll ? stopping : this.#hurried.signal,
        });
      } catch (error) {
        if (stopping.aborted) break;
        if (!(error instanceof Unavailable)) throw error;
        pause = Math.min(Math.max(2 * pause, 1), 30);
        this.#log.warn(`cannot lease from ${queue}: ${error.detail}; trying again in ${pause}s`);
        await sleep(pause, stopping).catch(() => {}); // stopped meanwhile: the loop ends
        continue;
      } finally {
        this.#asking -= room;
      }
      pause = 0;
      this.#drained.set(queue, jobs.length < room);
      for (const job of jobs) this.#buffer.push({ job, sent });
      this.#room.set(); // the other fetchers see their room again
      this.#handOut();
    }
  }

  /** The most jobs to buffer beyond the running ones: what the handlers finish in PREFETCH_SECONDS at
   * their average time, at least `concurrency` (no more until one has finished) and at most a lease. */
  #prefetchLimit(): number {
    const least = Math.min(this.concurrency, MAX_BATCH);
    if (this.#handlerTime === undefined) return least;
    const inTime = (this.concurrency * PREFETCH_SECONDS) / Math.max(this.#handlerTime, 1e-6);
    return Math.max(least, Math.min(MAX_BATCH, Math.floor(inTime)));
  }

  #route(job: LeasedJob): Route {
    const kind = job.kind ?? undefined; // null, or left out by a service older than kinds
    const route = (kind === undefined ? undefined : this.#routes.get(kind)) ?? this.#fallback;
    if (route === undefined) {
      const known = [...this.#routes.keys()].sort().join(", ");
      if (kind === undefined) {
        throw new UnknownTask(`the job has no kind to name its handler (this worker knows: ${known})`);
      }
      throw new UnknownTask(`no handler or task is named "${kind}" in this worker (it knows: ${known})`);
    }
    return route;
  }

  /** Start buffered jobs while fewer than `concurrency` run. Jobs that waited too long are given back on
   * the way. */
  #handOut(): void {
    if (this.stopping) return;
    this.#giveBackStale();
    while (this.#running.size < this.concurrency) {
      const buffered = this.#buffer.shift();
      if (buffered === undefined) {
        this.#starved = ![...this.#drained.values()].every(Boolean);
        return;
      }
      const { job } = buffered;
      let route: Route;
      try {
        route = this.#route(job);
      } catch (error) {
        this.#nacks.add(failureOf(job, error)); // never started: nacked straight away
        this.#room.set();
        continue;
      }
      const leasedFor = this.#visibility.get(job.queue) ?? this.#shortest;
      const own = route.visibilityTimeout !== undefined && route.visibilityTimeout !== leasedFor;
      const held: Held = {
        job,
        // The task's own timeout is set at the keeper's next round; else the lease is extended halfway.
        visibilityTimeout: own ? route.visibilityTimeout! : leasedFor,
        due: own ? now() : buffered.sent + leasedFor / 2,
        started: now(),
        extending: false,
        lost: false,
        progress: undefined,
        reported: 0,
        sent: 0,
        abort: new AbortController(),
      };
      this.#running.set(job.id, held);
      this.stats.inFlight = this.#running.size;
      this.#start(held, route);
    }
  }

  /** Give back the buffered jobs leased more than BUFFER_AGE of their visibility timeout ago, and
   * prefetch half as many from now on. */
  #giveBackStale(): void {
    const oldest = now() - this.#shortest * BUFFER_AGE;
    let stale = 0;
    while (this.#buffer.length && this.#buffer[0]!.sent < oldest) {
      this.#releases.add(this.#buffer.shift()!.job);
      stale += 1;
    }
    if (stale) {
      this.#prefetch = Math.floor(this.#prefetch / 2);
      this.#room.set();
      this.#log.info(
        `gave back ${stale} jobs that waited past ${Math.round(100 * BUFFER_AGE)}% of their lease ` +
          `in the buffer; prefetching ${this.#prefetch} now`,
      );
    }
  }

  // --- running handlers ------------------------------------------------------------------------------

  #start(held: Held, route: Route): void {
    // Steps, sleeps and waits (./durable.ts): nothing is asked of the service until the handler calls one.
    const durable = new Durable(this.client, held.job, held.abort.signal);
    const context: JobContext = {
      job: held.job,
      signal: held.abort.signal,
      progress: (value) => {
        held.progress = value;
        held.reported += 1;
      },
      // The lease's list when it carries one (a job with at most 100 parents): no request.
      parents: () => this.client.allParents(held.job),
      step: (name, fn) => durable.step(name, fn),
      sleep: (seconds) => durable.sleep(seconds),
      waitForEvent: (name, options) => durable.waitForEvent(name, options),
    };
    // Started on a later microtask, never inside #handOut: a handler that throws at once, or stops the
    // worker, finds the worker as it is between jobs.
    void Promise.resolve()
      .then(() => route.run(held.job, context))
      .then(
        (value) => ({ value }),
        (error: unknown) => ({ error }),
      )
      .then(async (outcome) => {
        const suspend = durable.suspended;
        if (suspend === undefined) return this.#done(held, outcome);
        // A step that ran beside the sleep or wait (Promise.all) is recorded before the lease ends.
        await durable.settled();
        this.#suspend(held, suspend, outcome);
      });
  }

  /** A handler returned or threw: ack its job, with what it returned as the result, or nack it; unless
   * it was released meanwhile. */
  #done(held: Held, outcome: { value: unknown } | { error: unknown }): void {
    const { job } = held;
    if (!this.#ended(held)) return;
    if ("error" in outcome) this.#nacks.add(failureOf(job, outcome.error));
    else this.#acks.add({ job, result: this.#resultOf(job, outcome.value) });
    this.#handOut();
  }

  /** A handler ended: its job is no longer running here. False when it was released meanwhile (the
   * grace period after a stop ran out): nothing more is sent for it. */
  #ended(held: Held): boolean {
    if (this.#running.get(held.job.id) !== held) return false;
    this.#running.delete(held.job.id);
    const took = now() - held.started;
    const average = this.#handlerTime;
    this.#handlerTime = average === undefined ? took : average + HANDLER_TIME_WEIGHT * (took - average);
    this.stats.inFlight = this.#running.size;
    if (!this.#running.size) this.#noneRunning.set();
    this.#room.set();
    return true;
  }

  /** A handler met a sleep or a wait for an event: the job is suspended, whatever the handler did with
   * the `Suspend` after (one that caught it and went on is warned of). */
  #suspend(held: Held, suspend: Suspend, outcome: { value: unknown } | { error: unknown }): void {
    const { job } = held;
    if (!this.#ended(held)) return;
    if (!("error" in outcome) || outcome.error !== suspend) {
      const ended = "error" in outcome ? `threw ${describe(outcome.error).split("\n")[0]}` : "returned";
      this.#log.warn(
        `job ${job.id}: its handler caught Suspend and ${ended}; suspended anyway: ` +
          "rethrow Suspend (`if (error instanceof Suspend) throw error`)",
      );
    }
    const suspending = this.#suspendJob(job, suspend).finally(() => this.#suspending.delete(suspending));
    this.#suspending.add(suspending);
    this.#handOut();
  }

  /** Carry out a suspension: record a new sleep's wake-up time, then release the job until then; or park
   * it until its event. A lost lease drops the job (another worker has it); a suspension that fails
   * otherwise fails the job, as an error of its handler's would. */
  async #suspendJob(job: LeasedJob, { suspension }: Suspend): Promise<void> {
    try {
      if (suspension.kind === "event") {
        const awaited = await this.client.awaitEvent(job, suspension.event, { timeout: suspension.timeout });
        this.stats.suspended += 1;
        this.#log.debug(`job ${job.id} awaits the event ${suspension.event}: now ${awaited.status}`);
        return;
      }
      let delay = suspension.delay;
      if (suspension.step !== undefined) {
        try {
          await this.client.recordStep(job, suspension.step.name, suspension.step.wake);
        } catch (error) {
          // Recorded already (a repeat of the request after a lost answer): the first wake-up time stands.
          const wake = error instanceof Conflict ? error.problem.result : undefined;
          if (typeof wake !== "number") throw error;
          delay = delayOf(wake - Date.now() / 1000);
        }
      }
      const [result] = await this.client.release([{ ...lease(job), delay }]);
      if (result?.ok) {
        this.stats.suspended += 1;
        this.#log.debug(`job ${job.id} sleeps for ${delay}s`);
      } else if (result?.code === LeaseLost.code) {
        this.#lost(job);
      } else {
        this.#log.error(`job ${job.id}: could not release it to sleep: ${result?.code}`);
      }
    } catch (error) {
      if (error instanceof LeaseLost) return this.#lost(job);
      this.#nacks.add({ job, error: `could not suspend the job: ${describe(error)}`, dead: false });
    }
  }

  /** What a handler returned, as the job's result: none when JSON cannot hold it (logged), since the
   * job is done either way. */
  #resultOf(job: LeasedJob, value: unknown): unknown {
    const plain = typeof value === "string" || typeof value === "boolean" || Number.isFinite(value);
    if (value === undefined || value === null || plain) return value;
    let why: string;
    try {
      if (JSON.stringify(value, finite) !== undefined) return value;
      why = `a ${typeof value}`;
    } catch (error) {
      why = error instanceof Error ? error.message : String(error);
    }
    this.#log.warn(`job ${job.id}: its handler returned what JSON cannot hold (${why}); done with no result`);
    return undefined;
  }

  // --- answers ---------------------------------------------------------------------------------------

  #acked(completion: Completion, result: ItemResult): void {
    const { job } = completion;
    if (result.ok) {
      this.stats.done += 1;
      this.#log.debug(`job ${job.id} done`);
    } else if (result.code === LeaseLost.code) {
      this.#lost(job);
    } else if (result.code === PayloadTooLarge.code && completion.result !== undefined) {
      this.#log.warn(`job ${job.id}: its result is larger than the service keeps; done without it`);
      this.#acks.add({ job, result: undefined }); // the job is still running under its lease
    } else {
      this.#log.error(`job ${job.id}: could not ack it: ${result.code}`);
    }
  }

  #nacked(failure: Failure, result: NackItemResult): void {
    const { job } = failure;
    if (result.ok) {
      this.stats.failed += 1;
      const attempt = `attempt ${job.attempts} of ${job.max_attempts}, now ${result.status}`;
      this.#log.warn(`job ${job.id} failed (${attempt}): ${failure.error.split("\n")[0]}`);
    } else if (result.code === LeaseLost.code) {
      this.#lost(job);
    } else {
      this.#log.error(`job ${job.id}: could not nack it: ${result.code}`);
    }
  }

  #givenBack(job: LeasedJob, result: ItemResult): void {
    if (result.ok) {
      this.stats.released += 1;
      this.#log.debug(`job ${job.id} given back, not started`);
    } else {
      this.stats.lost += 1;
    }
  }

  #unsent(batch: unknown[], error: unknown): void {
    // They come back by themselves when their leases expire.
    const detail = error instanceof JobqError ? error.detail : String(error);
    this.#log.error(
      `could not send ${batch.length} acks, nacks or releases (${detail}); those jobs run again later`,
    );
  }

  #lost(job: LeasedJob): void {
    this.stats.lost += 1;
    this.#log.warn(`job ${job.id}: the lease had moved on, another worker has the job`);
  }

  // --- leases of running jobs ------------------------------------------------------------------------

  /** Extend the lease of each running job every half visibility timeout (or sooner, with progress to
   * send), and give back the buffered jobs that waited too long. Deadlines are counted from before the
   * request that set them, so a lease never ends later than we think. */
  #keepLeased(): void {
    this.#giveBackStale();
    const time = now();
    for (const held of this.#running.values()) {
      if ((time >= held.due || held.reported !== held.sent) && !held.extending && !held.lost) {
        held.extending = true;
        const extension = this.#extend(held);
        this.#extensions.add(extension);
        void extension.finally(() => this.#extensions.delete(extension));
      }
    }
  }

  /** Extend a running job's lease, with its progress when it reported any since the last time. */
  async #extend(held: Held): Promise<void> {
    const sent = now();
    const reported = held.reported; // a report made meanwhile goes next time
    const progress = reported !== held.sent ? held.progress : undefined;
    try {
      await this.client.extend(held.job, held.visibilityTimeout, { progress, signal: this.#finished.signal });
      held.sent = reported;
      held.due = sent + held.visibilityTimeout / 2;
      this.#log.debug(`job ${held.job.id}: lease extended by ${held.visibilityTimeout}s`);
    } catch (error) {
      if (error instanceof LeaseLost) {
        held.lost = true;
        held.abort.abort(error);
        this.#log.warn(`job ${held.job.id}: lease lost while running (the worker was too slow to extend it)`);
      } else if (!this.#finished.signal.aborted) {
        const detail = error instanceof JobqError ? error.detail : String(error);
        this.#log.warn(`job ${held.job.id}: could not extend the lease: ${detail}`);
        held.due = now() + Math.min(1, held.visibilityTimeout / 10);
      }
    } finally {
      held.extending = false;
    }
  }

  // --- stopping --------------------------------------------------------------------------------------

  /** After stop(): give the buffer back, wait up to `grace` for running handlers, release the rest,
   * and send the last acks and nacks. */
  async #drain(): Promise<void> {
    this.#stopping.abort(); // also when leasing failed: nothing more starts
    if (this.#buffer.length) {
      this.#log.info(`stopping: giving back ${this.#buffer.length} jobs leased but not started`);
      for (const { job } of this.#buffer) this.#releases.add(job);
      this.#buffer = [];
    }
    if (this.#running.size) {
      this.#log.info(`stopping: ${this.#running.size} jobs running, waiting up to ${this.grace}s for them`);
      const deadline = now() + this.grace;
      while (this.#running.size && !this.#hurry.isSet && now() < deadline) {
        this.#noneRunning.clear();
        const round = new AbortController(); // ends the other wait, its timer and listener with it
        const timeout = deadline - now();
        await Promise.race([
          this.#noneRunning.wait({ timeout, signal: round.signal }),
          this.#hurry.wait({ signal: round.signal }),
        ]);
        round.abort();
      }
    }
    const cut = [...this.#running.values()];
    this.#running.clear();
    this.stats.inFlight = 0;
    const why = `the worker stopped; the job ran past the ${this.grace}s grace period`;
    for (const held of cut) held.abort.abort(new Error(why));
    await this.#release(
      cut.map((held) => held.job),
      why,
    );
    while (this.#suspending.size) await Promise.allSettled([...this.#suspending]);
    await Promise.all([this.#acks.flush(), this.#nacks.flush(), this.#releases.flush()]);
  }

  /** Jobs still running: nacked to run again at once (they ran, so the attempt counts). */
  async #release(jobs: LeasedJob[], why: string): Promise<void> {
    for (let start = 0; start < jobs.length; start += MAX_BATCH) {
      const batch = jobs.slice(start, start + MAX_BATCH);
      let results: NackItemResult[];
      try {
        results = await this.client.nackBatch(
          batch.map((job) => ({ ...lease(job), error: `released: ${why}`, retry_after: 0 })),
        );
      } catch (error) {
        const detail = error instanceof JobqError ? error.detail : String(error);
        this.#log.error(
          `could not release ${batch.length} jobs (${detail}); they come back when their leases expire`,
        );
        continue;
      }
      batch.forEach((job, n) => {
        if (results[n]?.ok) {
          this.stats.released += 1;
          this.#log.warn(`job ${job.id} released: ${why}`);
        } else {
          this.stats.lost += 1;
        }
      });
    }
  }
}

const lease = (job: LeasedJob): Lease => ({ id: job.id, lease_token: job.lease_token });

/** The nack of a job whose handler threw `error`: when it runs again (`Retry`), or dead now (`Fail`). */
function failureOf(job: LeasedJob, error: unknown): Failure {
  if (error instanceof Retry) {
    return {
      job,
      error: describe(error),
      ...(error.after === undefined ? {} : { retry_after: error.after }),
      dead: false,
    };
  }
  return { job, error: describe(error), dead: error instanceof Fail };
}

/** Run `worker` until SIGTERM or SIGINT (a second signal releases the running jobs without waiting for
 * them); its counts. */
export async function run(
  worker: Worker,
  signals: readonly NodeJS.Signals[] = ["SIGTERM", "SIGINT"],
): Promise<Stats> {
  const stop = (): void => worker.stop();
  for (const signal of signals) process.on(signal, stop);
  try {
    return await worker.run();
  } finally {
    for (const signal of signals) process.off(signal, stop);
  }
}
