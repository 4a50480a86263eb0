// Tasks: functions registered by name, enqueued with their arguments, run by one worker for many kinds,
// as the Python client's (clients/python/jobq/tasks.py).
//
//   const tasks = new Tasks({ queue: "emails" });
//   const sendEmail = tasks.task("send_email", async ({ to }: { to: string }) => { ... }, {
//     max_attempts: 3,
//   });
//   await sendEmail.enqueue({ to: "ada@example.com" });   // kind send_email, payload { to: ... }
//   await run(new Worker({ tasks, concurrency: 16 }));     // runs it: sendEmail's function on the payload
//
// - A task's name is the job's `kind`, so a producer in any language enqueues the same job as
//   `{"queue": "emails", "kind": "send_email", "payload": {"to": "ada@example.com"}}`.
// - Its arguments are the payload: one JSON object, typed by the function's parameter (checked by tsc in
//   the producer; a job whose payload is not an object is dead at once, since no retry can fix it).
// - In a handler: `throw new Retry("why", { after: 300 })` runs the job again in 5 minutes (an attempt,
//   like any failure), `throw new Fail("why")` makes it dead now, any other error retries it on the
//   queue's backoff. What it returns is the job's result.

import { Client, type EnqueueOptions } from "./client.js";
import type { EnqueuedJob, EnqueueRequest, JobOptions, LeasedJob } from "./types.js";

/** What a handler gets beside its job. */
export interface JobContext {
  /** The job being run (for a task: its id, attempts, ...). */
  readonly job: LeasedJob;
  /** Aborted when the worker gives the job up: its lease was lost, or the worker stopped and the grace
   * period ran out. A handler that takes long should stop then: its ack would change nothing. */
  readonly signal: AbortSignal;
  /** Report how far the job got (any JSON value: `{ done: 40, of: 100 }`), shown on the job. It goes with
   * the lease's next extension, within a second: calling it often costs no request per call, and only
   * the latest value is sent. */
  progress(value: unknown): void;
}

/** Thrown by a handler: run the job again after `after` seconds (default: the queue's backoff). The
 * attempt counts, as any failure does: past the job's max_attempts it goes dead. */
export class Retry extends Error {
  readonly after: number | undefined;

  constructor(reason = "", options: { after?: number } = {}) {
    super(reason);
    this.name = "Retry";
    this.after = options.after;
  }
}

/** Thrown by a handler: the job goes dead now, whatever attempts remain, with `reason` as its error. */
export class Fail extends Error {
  constructor(reason = "") {
    super(reason);
    this.name = "Fail";
  }
}

/** A job of a kind that no handler or task of the worker's has. */
export class UnknownTask extends Error {
  constructor(message: string) {
    super(message);
    this.name = "UnknownTask";
  }
}

/** The job fields a task sends with every job it enqueues (the API's names), beside its kind. */
export type TaskJobOptions = Pick<
  JobOptions,
  "priority" | "max_attempts" | "delay" | "run_at" | "dedup_key" | "key"
>;

export interface TaskOptions extends Pick<TaskJobOptions, "priority" | "max_attempts"> {
  /** The queue of its jobs; default the registry's. */
  queue?: string;
  /** Seconds each lease of its jobs lasts while it runs (extended as it runs); default the queue's. */
  visibilityTimeout?: number;
}

/** A task's function: its arguments (the job's payload) and the job's context; returns the result. */
export type TaskFunction<Args, Result> = (args: Args, context: JobContext) => Result | Promise<Result>;

/** A function registered as a kind of job (made by `Tasks.task`): `enqueue` queues a job that a worker
 * runs with these arguments. */
export class Task<Args extends object | null = Record<string, unknown>, Result = unknown> {
  readonly name: string;
  readonly queue: string;
  readonly visibilityTimeout: number | undefined;
  readonly options: Readonly<TaskJobOptions>;
  readonly #function: TaskFunction<Args, Result>;
  readonly #tasks: Tasks;

  constructor(
    tasks: Tasks,
    name: string,
    fn: TaskFunction<Args, Result>,
    queue: string,
    options: TaskJobOptions = {},
    visibilityTimeout?: number,
  ) {
    this.#tasks = tasks;
    this.name = name;
    this.#function = fn;
    this.queue = queue;
    this.options = options;
    this.visibilityTimeout = visibilityTimeout;
  }

  /** The same task with these options for the jobs it enqueues (the others kept). */
  using(options: TaskJobOptions): Task<Args, Result> {
    const merged = { ...this.options, ...options };
    return new Task(this.#tasks, this.name, this.#function, this.queue, merged, this.visibilityTimeout);
  }

  /** The job `enqueue` sends, for `Client.enqueueBatch` (to send many in one request). */
  job(args: Args): EnqueueRequest {
    return { ...this.options, queue: this.queue, kind: this.name, payload: args };
  }

  /** Queue a job that runs this task with these arguments (through the registry's client). */
  enqueue(
    args: Args,
    options: Pick<EnqueueOptions, "idempotencyKey" | "wait" | "signal"> = {},
  ): Promise<EnqueuedJob> {
    return this.#tasks.client.enqueue(this.queue, args, { ...this.options, kind: this.name, ...options });
  }

  /** Run the function on a leased job's payload (what the worker calls). */
  run(job: LeasedJob, context: JobContext): Result | Promise<Result> {
    const payload = job.payload ?? {};
    if (typeof payload !== "object" || Array.isArray(payload)) {
      const what = Array.isArray(payload) ? "an array" : `a ${typeof payload}`;
      throw new Fail(
        `task ${this.name} takes its arguments from a JSON object payload; this job's payload is ${what}`,
      );
    }
    return this.#function(payload as Args, context);
  }
}

/** A registry of tasks: `tasks.task(...)` registers a function, a worker given the registry runs them
 * all, each job by its kind. `client` enqueues (default: one on $JOBQ_URL and $JOBQ_TOKEN, made when
 * first used); `queue` is the queue of a task that names none (default "default"). */
export class Tasks implements Iterable<Task<never, unknown>> {
  readonly queue: string;
  #client: Client | undefined;
  readonly #tasks = new Map<string, Task<never, unknown>>();

  constructor(options: { queue?: string; client?: Client } = {}) {
    this.queue = options.queue ?? "default";
    this.#client = options.client;
  }

  /** Register `fn` as the task `name` (the kind of its jobs). */
  task<Args extends object | null, Result>(
    name: string,
    fn: TaskFunction<Args, Result>,
    options: TaskOptions = {},
  ): Task<Args, Awaited<Result>> {
    if (this.#tasks.has(name)) throw new Error(`a task named ${name} is registered already`);
    const { queue, visibilityTimeout, ...jobOptions } = options;
    const task = new Task<Args, Awaited<Result>>(
      this,
      name,
      fn as TaskFunction<Args, Awaited<Result>>,
      queue ?? this.queue,
      jobOptions,
      visibilityTimeout,
    );
    this.#tasks.set(name, task as unknown as Task<never, unknown>);
    return task;
  }

  /** The task `name`; `UnknownTask` if none. */
  get(name: string): Task<never, unknown> {
    const task = this.#tasks.get(name);
    if (task === undefined) {
      const known = [...this.#tasks.keys()].sort().join(", ") || "none";
      throw new UnknownTask(`no task is named "${name}" (known: ${known})`);
    }
    return task;
  }

  [Symbol.iterator](): Iterator<Task<never, unknown>> {
    return this.#tasks.values();
  }

  get size(): number {
    return this.#tasks.size;
  }

  /** The queues of the registered tasks, in the order first named. */
  get queues(): string[] {
    return [...new Set([...this.#tasks.values()].map((task) => task.queue))];
  }

  get client(): Client {
    this.#client ??= new Client();
    return this.#client;
  }
}
