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
// - Workflows: `task.s(args)` is a signature, the task with its arguments, not yet enqueued; a `Flow`
//   puts signatures together, each after others, and `flow.submit()` makes them all at once (`POST
//   /workflows`). A child reads its parents' results in its handler with `await context.parents()`
//   (carried by the lease: no request for a job with at most 100), and `task.resultOf(parents)` picks
//   the result of a parent of that task, typed as the task's result.
//
//   const flow = new Flow("checkout");
//   const paid = flow.add(charge.s({ order: 7 }));
//   const pdf = flow.add(render.s({ order: 7 }));
//   flow.add(sendInvoice.s({ order: 7 }), { after: [paid, pdf] });
//   const made = await flow.submit();   // { id, status, jobs: [{ ref, id, status }] }

import { Client, type CreateWorkflowOptions, type EnqueueOptions } from "./client.js";
import type {
  EnqueuedJob,
  EnqueueRequest,
  JobEvent,
  JobOptions,
  LeasedJob,
  ParentJob,
  RunIf,
  WorkflowJobRequest,
  WorkflowMade,
  WorkflowRequest,
} from "./types.js";

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
  /** The job's parents (`depends_on`; none for a job without), each `{ id, kind, status, result }`: the
   * lease's list when it carries one (a job with at most 100 parents, in id order), with no
   * request; else all of them read from `GET /jobs/{id}/parents` (in id order). `task.resultOf(parents)`
   * picks a task's result among them. */
  parents(): Promise<ParentJob[]>;
  /** A durable step: the result recorded for `name` (1-128 characters) by an earlier run of the job (or
   * earlier in this one), without calling `fn`; else `fn`'s result, recorded with the job under its lease
   * (`POST /jobs/{id}/steps`) before this resolves with it (if the name was recorded meanwhile, the first
   * result stands and is the answer). So a job run again (after a crash, a retry, a sleep or an event)
   * does not redo a step's side effect. The result is what JSON makes of it (undefined: null), on the
   * first run as on replays. `LeaseLost` if the lease moved on (the job is another worker's). Names
   * starting with `jobq.` are kept for the client's own steps. */
  step<T>(name: string, fn: () => T | Promise<T>): Promise<T>;
  /** A durable sleep of `seconds` (0 to a year): the job is released until then, its attempt not
   * counted and no worker held, and runs again from the top; on that run this call returns. It throws
   * `Suspend` to end the run: let it through (rethrow it if you catch errors). */
  sleep(seconds: number): Promise<void>;
  /** Wait for an event of this name (`client.sendEvent(name, payload)`) for at most `options.timeout`
   * seconds (1 to a year): the job is parked `waiting`, its attempt not counted and no worker held, and
   * runs again from the top once the event comes (or came already, since the job was enqueued) or the
   * wait runs out; on that run this call gives the event, `{ id, name, payload, at }`, or null when the
   * wait ran out. The k-th wait for a name in a run gets the k-th event of that name. It throws `Suspend`
   * to end the run: let it through (rethrow it if you catch errors). */
  waitForEvent(name: string, options: { timeout: number }): Promise<JobEvent | null>;
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
  | "priority"
  | "max_attempts"
  | "delay"
  | "run_at"
  | "dedup_key"
  | "key"
  | "depends_on"
  | "run_if"
  | "debounce"
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

  /** The task with these arguments (and job options), not yet enqueued: a step of a `Flow`, or
   * enqueued later with its `enqueue()`. `s` for short. */
  signature(args: Args, options: TaskJobOptions = {}): Signature<Args, Result> {
    return new Signature(this, args, options);
  }

  /** `signature`, for short: `flow.add(charge.s({ order: 7 }))`. */
  s(args: Args, options: TaskJobOptions = {}): Signature<Args, Result> {
    return this.signature(args, options);
  }

  /** The result of the first of `parents` (as `context.parents()` gives them) that is a job of this
   * task, typed as this task's result (as JSON brought it back); undefined when none is. */
  resultOf(parents: readonly ParentJob[]): Result | undefined {
    const parent = parents.find((job) => job.kind === this.name);
    return parent === undefined ? undefined : (parent.result as Result);
  }

  /** The client its jobs are enqueued with: the registry's. */
  get client(): Client {
    return this.#tasks.client;
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

/** A task with its arguments and job options, not yet enqueued (made by `task.s(args)`): a step of a
 * `Flow`, or a job to enqueue later. */
export class Signature<Args extends object | null = Record<string, unknown>, Result = unknown> {
  readonly task: Task<Args, Result>;
  readonly args: Args;
  readonly options: Readonly<TaskJobOptions>;

  constructor(task: Task<Args, Result>, args: Args, options: TaskJobOptions = {}) {
    this.task = task;
    this.args = args;
    this.options = options;
  }

  /** The job it is, as `POST /jobs` (and `Client.enqueueBatch`) takes it: the task's options, then its
   * own. */
  job(): EnqueueRequest {
    return this.task.using(this.options).job(this.args);
  }

  /** Queue it on its own (through the task's client). */
  enqueue(options: Pick<EnqueueOptions, "idempotencyKey" | "wait" | "signal"> = {}): Promise<EnqueuedJob> {
    return this.task.using(this.options).enqueue(this.args, options);
  }
}

/** A job of a flow that is no task's: as `POST /workflows` takes it, less its ref and parents (given by
 * `add`), for a kind some other program runs. */
export type FlowJob = Omit<WorkflowJobRequest, "ref" | "depends_on" | "run_if">;

export interface StepOptions {
  /** Its parents: steps of this flow, or ids of jobs that exist already. It waits until they have all
   * ended, then runs if `run_if` holds. */
  after?: readonly (Step | number)[];
  /** With `after`: `completed` (default; every parent completed), `finished` (however they ended) or
   * `failed` (one at least dead or cancelled). Otherwise it is cancelled. */
  run_if?: RunIf;
  /** Its ref in the workflow, 1-128 characters, unique in the flow; default the task's name (its kind),
   * numbered from the second step of that name on (`charge`, `charge-2`, ...). */
  ref?: string;
}

/** A step of a `Flow` (what `flow.add` returns): give it in a later step's `after`. */
export class Step {
  readonly flow: Flow;
  readonly ref: string;
  /** Its place in the flow, which is its place in the workflow's jobs. */
  readonly index: number;

  constructor(flow: Flow, ref: string, index: number) {
    this.flow = flow;
    this.ref = ref;
    this.index = index;
  }

  /** Its job's id in `made`, the flow's `submit()` answer. */
  idIn(made: WorkflowMade): number {
    const job = made.jobs.find((made) => made.ref === this.ref);
    if (job === undefined) throw new Error(`no job of the workflow has the ref ${this.ref}`);
    return job.id;
  }
}

// A workflow's job takes the fields of POST /jobs but these; `depends_on` is given by `after`.
const NOT_IN_WORKFLOWS = ["dedup_key", "debounce", "depends_on"] as const;
const WORKFLOW_FIELDS = ["kind", "key", "priority", "max_attempts", "delay", "run_at"] as const;

/**
 * Jobs made together, all or none, each after the steps it names (`POST /workflows`): a builder of the
 * request over tasks' signatures.
 *
 *   const flow = new Flow("checkout");
 *   const paid = flow.add(charge.s({ order: 7 }));
 *   flow.add(sendInvoice.s({ order: 7 }), { after: [paid] });
 *   const made = await flow.submit();   // through the tasks' client, or flow.submit(client)
 *   await client.waitWorkflow(made.id, 60);
 */
export class Flow {
  readonly name: string | undefined;
  readonly #jobs: WorkflowJobRequest[] = [];
  readonly #refs = new Set<string>();
  #client: Client | undefined;

  constructor(name?: string) {
    this.name = name;
  }

  /** A step running `what` (a signature, `task.s(args)`, or a job of another program's kind) after the
   * steps (or existing job ids) of `after`; the step, for later steps' `after`. */
  add<Args extends object | null, Result>(
    what: Signature<Args, Result> | FlowJob,
    options: StepOptions = {},
  ): Step {
    const signature = what instanceof Signature;
    const job: EnqueueRequest = signature ? what.job() : { ...what };
    for (const field of NOT_IN_WORKFLOWS) {
      if (job[field] !== undefined && job[field] !== null) {
        const instead = field === "depends_on" ? ": give its parents in `after`" : "";
        throw new TypeError(`a job of a workflow takes no ${field}${instead}`);
      }
    }
    if (typeof job.queue !== "string" || !("payload" in job)) {
      throw new TypeError("each job needs a queue and a payload (null is a valid payload)");
    }
    const ref = options.ref ?? this.#freeRef(job.kind ?? "job");
    if (this.#refs.has(ref)) throw new Error(`the flow has a step of ref ${ref} already`);
    const parents = (options.after ?? []).map((parent) => {
      if (typeof parent === "number") return parent;
      if (parent.flow !== this) throw new Error(`step ${parent.ref} is of another flow`);
      return parent.ref;
    });
    const request: WorkflowJobRequest = { ref, queue: job.queue, payload: job.payload };
    for (const field of WORKFLOW_FIELDS) {
      if (job[field] !== undefined) Object.assign(request, { [field]: job[field] });
    }
    if (parents.length) request.depends_on = parents;
    if (options.run_if !== undefined) request.run_if = options.run_if;
    this.#refs.add(ref);
    this.#jobs.push(request);
    if (signature) this.#client ??= what.task.client;
    return new Step(this, ref, this.#jobs.length - 1);
  }

  /** The ref a step of this name gets: the name, then name-2, name-3, ... */
  #freeRef(name: string): string {
    const base = name.slice(0, 120);
    if (!this.#refs.has(base)) return base;
    for (let n = 2; ; n++) if (!this.#refs.has(`${base}-${n}`)) return `${base}-${n}`;
  }

  /** Its steps, in the order added. */
  get size(): number {
    return this.#jobs.length;
  }

  /** The `POST /workflows` body it makes. */
  request(): WorkflowRequest {
    return {
      ...(this.name === undefined ? {} : { name: this.name }),
      jobs: this.#jobs.map((job) => ({ ...job })),
    };
  }

  /** Make its jobs, all or none (`Client.createWorkflow`), through `client` (default: the client of its
   * first task). The answer gives each step's job id (`step.idIn(made)`); `client.waitWorkflow(made.id,
   * timeout)` waits for it to finish. */
  async submit(client?: Client, options: CreateWorkflowOptions = {}): Promise<WorkflowMade> {
    if (!this.#jobs.length) throw new Error("a flow needs one step at least");
    return (client ?? (this.#client ??= new Client())).createWorkflow(this.request(), options);
  }
}
