// The jobq HTTP API as methods of `Client`, one per operation of openapi.json (named after its
// operationId), typed with the spec's own bodies and answers (./types.ts).
//
//   const jobq = new Client();                       // $JOBQ_URL, else http://127.0.0.1:8000
//   await jobq.enqueue("emails", { to: "ada@example.com" });
//   for (const job of await jobq.lease("emails", { wait: 5 })) {
//     ...
//     await jobq.ack(job);
//   }
//
// Error answers throw the `JobqError` of their code (errors.ts); calls are retried as the Python client
// retries them (http.ts).

import { randomUUID } from "node:crypto";

import { type Call, RetryPolicy, Transport, now } from "./http.js";
import {
  type AckRequest,
  type AckResponse,
  type AwaitResponse,
  type DeadPage,
  type DeletedKey,
  type DeletedSchedule,
  type EnqueuedJob,
  type EnqueueRequest,
  type EventPage,
  type EventSent,
  type ExtendResponse,
  FINISHED,
  type Health,
  type ItemResult,
  type Job,
  type JobOptions,
  type JobPage,
  type KeyOverrides,
  type KeyView,
  type Lease,
  type LeasedJob,
  type LeaseRequest,
  type ListDeadQuery,
  type ListEventsQuery,
  type ListJobsQuery,
  type ListKeysQuery,
  type ListParentsQuery,
  type ListWorkflowsQuery,
  type NackItemResult,
  type NackRequest,
  type NackResponse,
  type ParentJob,
  type ParentPage,
  type PurgeResponse,
  type QueueDetail,
  type QueueRow,
  type QueueSettingsPatch,
  type Readiness,
  type ReleaseItem,
  type RetryDeadRequest,
  type RetryDeadResponse,
  type Schedule,
  type ScheduleRequest,
  type StepRecorded,
  type TriggeredSchedule,
  WORKFLOW_FINISHED,
  type WorkerView,
  type Workflow,
  type WorkflowMade,
  type WorkflowPage,
  type WorkflowRequest,
} from "./types.js";

export const DEFAULT_URL = "http://127.0.0.1:8000";
/** Seconds one long-poll may wait, at most (the service's limit). */
export const MAX_WAIT = 60;
/** Parents a job may have, at most (`depends_on`), and so parents one page of them may hold. */
export const MAX_PARENTS = 1000;

export interface ClientOptions {
  /** The service; default $JOBQ_URL, else http://127.0.0.1:8000. */
  url?: string;
  /** Sent as `Authorization: Bearer <token>`; default $JOBQ_TOKEN (none when unset). */
  token?: string;
  /** Seconds per request (default 10); a long-poll gets its `wait` on top. */
  timeout?: number;
  /** How calls are retried after connection errors and 503 (default: `new RetryPolicy()`). */
  retry?: RetryPolicy;
  /** Headers sent with every request. */
  headers?: Record<string, string>;
  /** The fetch to send requests with (default the platform's): one with a proxy, or instrumented. */
  fetch?: typeof fetch;
}

/** Options of the calls that may wait: an AbortSignal ends the call (and its long-poll) at once. */
export interface SignalOptions {
  signal?: AbortSignal;
}

export interface EnqueueOptions extends JobOptions, SignalOptions {
  /** The `Idempotency-Key` sent with the enqueue, the same on each of its tries; default a fresh UUID. */
  idempotencyKey?: string;
  /** Seconds to wait, after the enqueue, for the job to finish (as `wait` does); the answer is then the
   * job as it is at the end of the wait (read `status` and `result`). */
  wait?: number;
}

export interface CreateWorkflowOptions {
  /** The `Idempotency-Key` sent with the request, the same on each of its tries; default a fresh UUID. */
  idempotencyKey?: string;
}

export interface LeaseOptions extends Omit<LeaseRequest, "queue">, SignalOptions {}

export interface NackOptions {
  /** Seconds until the job runs again (default: the queue's backoff). */
  retry_after?: number | null;
  /** Dead now, whatever attempts remain. */
  dead?: boolean;
}

export interface ExtendOptions extends SignalOptions {
  /** The job's progress (any JSON value), shown on it; left out (or null) keeps the last one. */
  progress?: unknown;
}

const env = (name: string): string | undefined => globalThis.process?.env?.[name] || undefined;
const segment = encodeURIComponent;

/** The header that makes an enqueue safe to send again: the service carries out a request with a given
 * key once and answers its repeats with the first answer (for a few minutes), so a retry after a lost
 * answer cannot enqueue twice. One key per call, the same on each of its tries. */
const once = (idempotencyKey: string | undefined): Record<string, string> => ({
  "Idempotency-Key": idempotencyKey ?? randomUUID(),
});

const leaseOf = (lease: Lease): Lease => ({ id: lease.id, lease_token: lease.lease_token });
const unset = (value: unknown): boolean => value === undefined || value === null;

function ackItem(item: AckRequest): AckRequest {
  // A LeasedJob is an AckRequest too: only the lease and the result are sent, not the whole job.
  return unset(item.result) ? leaseOf(item) : { ...leaseOf(item), result: item.result };
}

function releaseItem(item: ReleaseItem): ReleaseItem {
  return unset(item.delay) ? leaseOf(item) : { ...leaseOf(item), delay: item.delay };
}

function nackItem(item: NackRequest, defaults: NackOptions): NackRequest {
  const retry_after = unset(item.retry_after) ? defaults.retry_after : item.retry_after;
  return {
    ...leaseOf(item),
    ...(unset(item.error) ? {} : { error: item.error }),
    ...(unset(retry_after) ? {} : { retry_after }),
    dead: item.dead ?? defaults.dead ?? false,
  };
}

function newJob<Request extends { queue: string; payload: unknown }>(job: Request): Request {
  if (typeof job.queue !== "string" || !("payload" in job)) {
    throw new TypeError("each job needs a queue and a payload (null is a valid payload)");
  }
  return job;
}

function newWorkflow(request: WorkflowRequest): WorkflowRequest {
  if (!Array.isArray(request?.jobs)) throw new TypeError("a workflow needs its jobs");
  for (const job of request.jobs) {
    if (typeof job.ref !== "string") throw new TypeError("each job of a workflow needs a ref");
    newJob(job);
  }
  return request;
}

export class Client {
  readonly url: string;
  readonly #transport: Transport;

  constructor({
    url,
    token,
    timeout = 10,
    retry = new RetryPolicy(),
    headers = {},
    fetch: send,
  }: ClientOptions = {}) {
    this.url = (url ?? env("JOBQ_URL") ?? DEFAULT_URL).replace(/\/+$/, "");
    const bearer = token ?? env("JOBQ_TOKEN");
    this.#transport = new Transport({
      url: this.url,
      headers: {
        accept: "application/json",
        ...headers,
        ...(bearer ? { authorization: `Bearer ${bearer}` } : {}),
      },
      timeout,
      retry,
      // The global looked up at each call, not kept: what is installed later (instrumentation) counts.
      fetch: send ?? ((input, init) => fetch(input, init)),
    });
  }

  /** Send a call of your own (an endpoint this client does not know yet), with the retry policy. */
  send<T>(call: Call): Promise<T> {
    return this.#transport.send<T>(call);
  }

  // --- producers ---------------------------------------------------------------------------------

  /**
   * Enqueue a job (`POST /jobs`). With a `dedup_key` an active job of the queue already holds, the
   * answer is that job, with `duplicate` true. Lower `priority` runs first; `delay` is in seconds.
   * `kind` names what the job is (`send_email`), for workers to route it by; `key` what flow control
   * groups it by (a tenant, a customer). Sent with an `Idempotency-Key`, so its retries enqueue it at
   * most once. With `wait` (seconds), the call then waits for the job to finish, as `wait` does, and
   * answers the job as it is then: request and reply in one call (`job.status`, `job.result`).
   *
   * `depends_on` (ids of existing jobs, its parents) makes the job wait (status `waiting`) until the last
   * of them ends, then run if `run_if` holds (`completed`, the default: all completed; `finished`: however
   * they ended; `failed`: one at least dead or cancelled), else be cancelled. `debounce: { key, seconds,
   * max_seconds? }` makes a burst of enqueues with one key one job, run `seconds` after the burst with
   * the last payload: an enqueue that found the key's job still pending answers it with `debounced` true.
   */
  async enqueue(queue: string, payload: unknown, options: EnqueueOptions = {}): Promise<EnqueuedJob> {
    const { idempotencyKey, wait, signal, ...fields } = options;
    const deadline = wait === undefined ? undefined : now() + wait;
    const body = newJob({ ...fields, queue, payload });
    const job = await this.send<EnqueuedJob>({
      method: "POST",
      path: "/jobs",
      body,
      headers: once(idempotencyKey),
      signal,
    });
    if (deadline === undefined) return job;
    return { ...(await this.#waitUntil(job, deadline, signal)), duplicate: job.duplicate };
  }

  /** Enqueue 1..1000 jobs at once, all or nothing (`POST /jobs/batch`), each with the fields of `POST
   * /jobs`. Answers in request order. Sent with an `Idempotency-Key`, as `enqueue` is. */
  async enqueueBatch(
    jobs: readonly EnqueueRequest[],
    options: { idempotencyKey?: string } = {},
  ): Promise<EnqueuedJob[]> {
    const body = { jobs: jobs.map(newJob) };
    const answer = await this.send<{ jobs: EnqueuedJob[] }>({
      method: "POST",
      path: "/jobs/batch",
      body,
      headers: once(options.idempotencyKey),
    });
    return answer.jobs;
  }

  /** A job, whatever its state (`GET /jobs/{id}`). With `wait` (seconds, at most 60), once it has
   * finished (completed, dead or cancelled) or when `wait` runs out: read its `status`. */
  getJob(id: number, options: { wait?: number } & SignalOptions = {}): Promise<Job> {
    const { wait, signal } = options;
    return this.send<Job>({ method: "GET", path: `/jobs/${id}`, query: { wait }, wait, signal });
  }

  /** The job once it has finished (completed, dead or cancelled), or as it is after `timeout` seconds:
   * read its `status` (and `result`). Long-polls (`GET /jobs/{id}?wait=N`, up to a minute per request,
   * again while time is left), answered when the job finishes, not by polling. */
  async wait(id: number, timeout: number, options: SignalOptions = {}): Promise<Job> {
    const deadline = now() + timeout;
    return this.#waitUntil(await this.#waitOnce(id, deadline, options.signal), deadline, options.signal);
  }

  async #waitUntil(job: Job, deadline: number, signal: AbortSignal | undefined): Promise<Job> {
    while (!FINISHED.has(job.status) && now() < deadline)
      job = await this.#waitOnce(job.id, deadline, signal);
    return job;
  }

  #waitOnce(id: number, deadline: number, signal: AbortSignal | undefined): Promise<Job> {
    const left = Math.max(0, Math.min(MAX_WAIT, deadline - now()));
    return this.getJob(id, { wait: Math.round(left * 1000) / 1000, signal });
  }

  /** Jobs of any status, newest first (`GET /jobs`), filtered by queue, status, kind and key; `q` finds
   * text in the dedup_key, the last error or the payload. Pass `next_before_id` as `before_id` for the
   * next page: a page reads a bounded window, so with a rare filter it may be short, even empty, and
   * still have a next one. */
  listJobs(query: ListJobsQuery = {}): Promise<JobPage> {
    return this.send<JobPage>({ method: "GET", path: "/jobs", query });
  }

  /** Cancel a pending job (`DELETE /jobs/{id}`); `Conflict` if it is in any other state. */
  cancelJob(id: number): Promise<Job> {
    // A repeat after a lost answer would answer conflict: not sent twice.
    return this.send<Job>({ method: "DELETE", path: `/jobs/${id}`, idempotent: false });
  }

  /** Run a pending job that waits for its run_at now (`POST /jobs/{id}/run`); `Conflict` if it is due
   * already or in any other state. */
  runJobNow(id: number): Promise<Job> {
    return this.send<Job>({ method: "POST", path: `/jobs/${id}/run`, idempotent: false });
  }

  // --- workers -----------------------------------------------------------------------------------

  /** Claim up to `max_jobs` (default 1) ready jobs (`POST /lease`) for `visibility_timeout` seconds
   * (default: the queue's), waiting up to `wait` seconds (at most 60) for one to be ready. */
  async lease(queue: string, options: LeaseOptions = {}): Promise<LeasedJob[]> {
    const { signal, ...fields } = options;
    // A lease whose answer was lost only delays its jobs: they come back when it expires.
    const answer = await this.send<{ jobs: LeasedJob[] }>({
      method: "POST",
      path: "/lease",
      body: { ...fields, queue },
      wait: fields.wait,
      signal,
    });
    return answer.jobs;
  }

  /** Complete a leased job (`POST /ack`), keeping `result` with it (any JSON value; left out or null:
   * none). `LeaseLost` if the lease moved on. A repeat is harmless (the first result stays).
   * `PayloadTooLarge` if the result is over the service's limit: nothing changed, the job is still held,
   * so ack again without it. `lease` is the leased job, or `{ id, lease_token }`. */
  ack(lease: Lease, result?: unknown): Promise<AckResponse> {
    return this.send<AckResponse>({
      method: "POST",
      path: "/ack",
      body: ackItem({ ...leaseOf(lease), result }),
    });
  }

  /** Complete up to 1000 leased jobs at once (`POST /ack/batch`): each a leased job, or
   * `{ id, lease_token, result }`. One result per job, in order; a job whose result is over the limit
   * gets `ok` false and the code `payload_too_large`, and is still held. */
  async ackBatch(items: readonly AckRequest[]): Promise<ItemResult[]> {
    const answer = await this.send<{ results: ItemResult[] }>({
      method: "POST",
      path: "/ack/batch",
      body: { items: items.map(ackItem) },
    });
    return answer.results;
  }

  /** Fail a leased job (`POST /nack`), keeping `error` as its last_error. It runs again after
   * `retry_after` seconds (default: the queue's backoff) while attempts remain, else, or with `dead`,
   * it goes dead. */
  nack(lease: Lease, error?: string, options: NackOptions = {}): Promise<NackResponse> {
    // A nack ends the lease, so a repeat would answer lease_lost: not sent twice.
    return this.send<NackResponse>({
      method: "POST",
      path: "/nack",
      body: nackItem({ ...leaseOf(lease), error }, options),
      idempotent: false,
    });
  }

  /** Fail up to 1000 leased jobs at once (`POST /nack/batch`), each `{ id, lease_token, error,
   * retry_after, dead }`; where an item leaves `retry_after` or `dead` out, `defaults` apply. One
   * result per job, in order. */
  async nackBatch(items: readonly NackRequest[], defaults: NackOptions = {}): Promise<NackItemResult[]> {
    // Like nack: a repeat would answer lease_lost for every item, so it is not sent twice.
    const answer = await this.send<{ results: NackItemResult[] }>({
      method: "POST",
      path: "/nack/batch",
      body: { items: items.map((item) => nackItem(item, defaults)) },
      idempotent: false,
    });
    return answer.results;
  }

  /** Move a lease's deadline to now + `visibilityTimeout` seconds (`POST /extend`, at most 12 h).
   * `progress` (any JSON value) becomes the job's progress; to report progress alone, give the lease's
   * visibility timeout again. */
  extend(lease: Lease, visibilityTimeout: number, options: ExtendOptions = {}): Promise<ExtendResponse> {
    const { progress, signal } = options;
    const body = {
      ...leaseOf(lease),
      visibility_timeout: visibilityTimeout,
      ...(unset(progress) ? {} : { progress }),
    };
    return this.send<ExtendResponse>({ method: "POST", path: "/extend", body, signal });
  }

  /** Give leased jobs back untouched (`POST /release`): pending again, the attempt not counted; at once,
   * or after an item's `delay` (seconds, at most a year: a durable sleep, no worker held meanwhile). For
   * jobs this worker will not start, and for handlers that sleep. Each item is a leased job, or
   * `{ id, lease_token, delay? }`. One result per job, in order. */
  async release(items: readonly ReleaseItem[]): Promise<ItemResult[]> {
    const answer = await this.send<{ results: ItemResult[] }>({
      method: "POST",
      path: "/release",
      body: { items: items.map(releaseItem) },
    });
    return answer.results;
  }

  /** Record a step's result with a running job, under its lease (`POST /jobs/{id}/steps`): every later
   * lease of the job carries it in `steps`, so a handler run again from the top need not redo the step
   * (`context.step` in a worker does all this). `result` is any JSON value (undefined is sent as null).
   * The first result of a name stands: a second is `Conflict`, whose `problem.result` is the recorded one
   * (a repeat after a lost answer gets that too). `LeaseLost` if the lease moved on; `PayloadTooLarge`
   * when the job's steps would pass the service's limit (nothing recorded either way). */
  recordStep(lease: Lease, name: string, result: unknown): Promise<StepRecorded> {
    return this.send<StepRecorded>({
      method: "POST",
      path: `/jobs/${lease.id}/steps`,
      body: { lease_token: lease.lease_token, name, result: result === undefined ? null : result },
    });
  }

  /** End a running job's lease and park it `waiting` for an event of this name (`POST /jobs/{id}/await`),
   * for at most `timeout` seconds (1 to a year): then it is pending again, its `events` telling that the
   * wait ran out. When such an event was sent since the job was enqueued and had not reached it, the job
   * is pending again at once (`status` pending, `event_id`). The attempt is not counted. `LeaseLost` if
   * the lease moved on. (`context.waitForEvent` in a worker does this.) */
  awaitEvent(lease: Lease, event: string, options: { timeout: number }): Promise<AwaitResponse> {
    // It ends the lease, so a repeat would answer lease_lost: not sent twice.
    return this.send<AwaitResponse>({
      method: "POST",
      path: `/jobs/${lease.id}/await`,
      body: { lease_token: lease.lease_token, event, timeout: options.timeout },
      idempotent: false,
    });
  }

  // --- events ------------------------------------------------------------------------------------

  /** Send an event (`POST /events`): every job awaiting its name (`context.waitForEvent`) is pending
   * again at once, with the event and its `payload` (any JSON value) in its `events`. The event is kept
   * for a while (the service's JOBQ_EVENT_RETENTION, 7 days), so a job enqueued before it that awaits the
   * name later gets it at once. The answer's `woken` counts the jobs it woke. */
  sendEvent(name: string, payload?: unknown): Promise<EventSent> {
    // A repeat would send a second event, which a later wait of the same name would take: not sent twice.
    return this.send<EventSent>({
      method: "POST",
      path: "/events",
      body: payload === undefined ? { name } : { name, payload },
      idempotent: false,
    });
  }

  /** The events kept, newest first (`GET /events`), of one `name` or all; pass `next_before_id` as
   * `before_id` for the next page. */
  listEvents(query: ListEventsQuery = {}): Promise<EventPage> {
    return this.send<EventPage>({ method: "GET", path: "/events", query });
  }

  // --- workflows ---------------------------------------------------------------------------------

  /** Make a workflow's jobs, all or none (`POST /workflows`): `{ name?, jobs: [{ ref, queue, payload,
   * depends_on?, run_if?, ... }] }`, 1..1000 jobs, each naming its parents by the `ref` of a sibling or
   * the id of an existing job. A job without parents is pending at once, the others wait for theirs. A
   * cycle, or a ref repeated or unknown, is a `ValidationError` naming it. Sent with an
   * `Idempotency-Key`, as `enqueue` is: its retries make it at most once. The `Flow` builder (tasks.ts)
   * makes the request from tasks. */
  async createWorkflow(
    request: WorkflowRequest,
    options: CreateWorkflowOptions = {},
  ): Promise<WorkflowMade> {
    return this.send<WorkflowMade>({
      method: "POST",
      path: "/workflows",
      body: newWorkflow(request),
      headers: once(options.idempotencyKey),
    });
  }

  /** A workflow: its status, its jobs' counts by status and its jobs (`GET /workflows/{id}`). With
   * `wait` (seconds, at most 60), once it has finished (completed, failed or cancelled) or when `wait`
   * runs out: read its `status`. */
  getWorkflow(id: number, options: { wait?: number } & SignalOptions = {}): Promise<Workflow> {
    const { wait, signal } = options;
    return this.send<Workflow>({ method: "GET", path: `/workflows/${id}`, query: { wait }, wait, signal });
  }

  /** The workflow once it has finished (completed, failed or cancelled), or as it is after `timeout`
   * seconds: read its `status`. Long-polls (`GET /workflows/{id}?wait=N`, up to a minute per request,
   * again while time is left), as `wait` does for a job. */
  async waitWorkflow(id: number, timeout: number, options: SignalOptions = {}): Promise<Workflow> {
    const deadline = now() + timeout;
    const { signal } = options;
    for (;;) {
      const left = Math.max(0, Math.min(MAX_WAIT, deadline - now()));
      const workflow = await this.getWorkflow(id, { wait: Math.round(left * 1000) / 1000, signal });
      if (WORKFLOW_FINISHED.has(workflow.status) || now() >= deadline) return workflow;
    }
  }

  /** Workflows newest first (`GET /workflows`), filtered by status and name; pass `next_before_id` as
   * `before_id` for the next page. A status there is as last seen (brought up to date by any read of
   * the workflow, and by the service in the background). */
  listWorkflows(query: ListWorkflowsQuery = {}): Promise<WorkflowPage> {
    return this.send<WorkflowPage>({ method: "GET", path: "/workflows", query });
  }

  /** Cancel a workflow (`DELETE /workflows/{id}`): its waiting and pending jobs are cancelled, running
   * ones finish (and their children are cancelled). The workflow as it is then. */
  cancelWorkflow(id: number): Promise<Workflow> {
    return this.send<Workflow>({ method: "DELETE", path: `/workflows/${id}` });
  }

  /** Resume a failed workflow where it failed (`POST /workflows/{id}/retry`): its dead jobs pending
   * again (attempts reset), the jobs cancelled because of them waiting again. `Conflict` for a workflow
   * in any other status. */
  retryWorkflow(id: number): Promise<Workflow> {
    // A repeat after a lost answer would answer conflict (the workflow runs again): not sent twice.
    return this.send<Workflow>({ method: "POST", path: `/workflows/${id}/retry`, idempotent: false });
  }

  /** A page of a job's parents in id order (`GET /jobs/{id}/parents`): each one's id, kind, status and
   * result; pass `next_after_id` as `after_id` for the next page (default 100 a page, at most 1000). */
  jobParents(id: number, query: ListParentsQuery = {}): Promise<ParentPage> {
    return this.send<ParentPage>({ method: "GET", path: `/jobs/${id}/parents`, query });
  }

  /** All of a job's parents (at most 1000): for a leased job that carries them (`job.parents`, a job
   * with at most 100, in id order) that list, with no request; else read from
   * `GET /jobs/{id}/parents`, in id order, a page at a time. A job without parents has none. */
  async allParents(job: number | { id: number; parents?: ParentJob[] | null }): Promise<ParentJob[]> {
    if (typeof job !== "number" && Array.isArray(job.parents)) return job.parents;
    const id = typeof job === "number" ? job : job.id;
    const parents: ParentJob[] = [];
    let after_id: number | null = 0;
    while (after_id !== null) {
      const page: ParentPage = await this.jobParents(id, { limit: MAX_PARENTS, after_id });
      parents.push(...page.parents);
      after_id = page.next_after_id;
    }
    return parents;
  }

  // --- operators ---------------------------------------------------------------------------------

  /** Dead jobs, newest first (`GET /dead`); pass `next_before_id` as `before_id` for the next page. */
  listDead(query: ListDeadQuery = {}): Promise<DeadPage> {
    return this.send<DeadPage>({ method: "GET", path: "/dead", query });
  }

  /** Dead jobs back to pending, attempts reset (`POST /dead/retry`): these `ids`, a `queue`'s, or both.
   * Those whose dedup_key an active job holds stay dead, listed in `skipped`. */
  retryDead(request: RetryDeadRequest): Promise<RetryDeadResponse> {
    return this.send<RetryDeadResponse>({
      method: "POST",
      path: "/dead/retry",
      body: request,
      idempotent: false,
    });
  }

  /** Delete a dead job for good (`DELETE /dead/{id}`); `Conflict` if it is not dead. */
  purgeDead(id: number): Promise<PurgeResponse> {
    return this.send<PurgeResponse>({ method: "DELETE", path: `/dead/${id}`, idempotent: false });
  }

  /** Every queue's counts (`GET /queues`). */
  listQueues(): Promise<QueueRow[]> {
    return this.send<QueueRow[]>({ method: "GET", path: "/queues" });
  }

  /** A queue's counts and settings (`GET /queues/{queue}`); `NotFound` for a queue never used. */
  getQueue(queue: string): Promise<QueueDetail> {
    return this.send<QueueDetail>({ method: "GET", path: `/queues/${segment(queue)}` });
  }

  /** Change some of a queue's settings (`PATCH /queues/{queue}`); seconds for the durations. A setting
   * left out is kept; `null` removes a key concurrency or a rate. */
  configureQueue(queue: string, settings: QueueSettingsPatch): Promise<QueueDetail> {
    return this.send<QueueDetail>({ method: "PATCH", path: `/queues/${segment(queue)}`, body: settings });
  }

  /** Stop leasing from a queue; enqueues still land (`POST /queues/{queue}/pause`). */
  pauseQueue(queue: string): Promise<QueueRow> {
    return this.send<QueueRow>({ method: "POST", path: `/queues/${segment(queue)}/pause` });
  }

  /** Lease from a paused queue again (`POST /queues/{queue}/resume`). */
  resumeQueue(queue: string): Promise<QueueRow> {
    return this.send<QueueRow>({ method: "POST", path: `/queues/${segment(queue)}/resume` });
  }

  /** A queue's keys with the most jobs waiting first, and keys with limits of their own
   * (`GET /queues/{queue}/keys`). */
  async listKeys(queue: string, query: ListKeysQuery = {}): Promise<KeyView[]> {
    const answer = await this.send<{ keys: KeyView[] }>({
      method: "GET",
      path: `/queues/${segment(queue)}/keys`,
      query,
    });
    return answer.keys;
  }

  /** One key's limits and jobs (`GET /queues/{queue}/keys/{key}`); `NotFound` when it has neither. */
  getKey(queue: string, key: string): Promise<KeyView> {
    return this.send<KeyView>({ method: "GET", path: `/queues/${segment(queue)}/keys/${segment(key)}` });
  }

  /** Give a key its own concurrency and rate in place of the queue's (left out: the queue's); replaces
   * what the key had (`PUT /queues/{queue}/keys/{key}`). */
  putKey(queue: string, key: string, overrides: KeyOverrides = {}): Promise<KeyView> {
    const body = { concurrency: overrides.concurrency ?? null, rate: overrides.rate ?? null };
    return this.send<KeyView>({
      method: "PUT",
      path: `/queues/${segment(queue)}/keys/${segment(key)}`,
      body,
    });
  }

  /** Remove a key's own limits (`DELETE /queues/{queue}/keys/{key}`); `NotFound` when it had none. */
  deleteKey(queue: string, key: string): Promise<DeletedKey> {
    const path = `/queues/${segment(queue)}/keys/${segment(key)}`;
    return this.send<DeletedKey>({ method: "DELETE", path, idempotent: false });
  }

  /** Workers that leased in the last hour, by the `worker_id` they send, and any holding a running job
   * (`GET /workers`): their queues, when last seen, jobs leased and held. Most recent first. */
  async listWorkers(): Promise<WorkerView[]> {
    return (await this.send<{ workers: WorkerView[] }>({ method: "GET", path: "/workers" })).workers;
  }

  // --- schedules ---------------------------------------------------------------------------------

  /** Every schedule, by name (`GET /schedules`). */
  async listSchedules(): Promise<Schedule[]> {
    return (await this.send<{ schedules: Schedule[] }>({ method: "GET", path: "/schedules" })).schedules;
  }

  /** A schedule, with its next and last run (`GET /schedules/{name}`); `NotFound` if none. */
  getSchedule(name: string): Promise<Schedule> {
    return this.send<Schedule>({ method: "GET", path: `/schedules/${segment(name)}` });
  }

  /** Create or replace the schedule `name` (`PUT /schedules/{name}`): at each time `cron` names (5
   * fields, or 6 with a leading seconds field) in `timezone` (default UTC), it enqueues `payload` on
   * `queue`. On a replace, fields left out take their defaults, not the old values. */
  putSchedule(name: string, schedule: ScheduleRequest): Promise<Schedule> {
    return this.send<Schedule>({ method: "PUT", path: `/schedules/${segment(name)}`, body: schedule });
  }

  /** Delete a schedule (`DELETE /schedules/{name}`); jobs it enqueued stay. `NotFound` if none. */
  deleteSchedule(name: string): Promise<DeletedSchedule> {
    // A repeat after a lost answer would answer not_found: not sent twice.
    return this.send<DeletedSchedule>({
      method: "DELETE",
      path: `/schedules/${segment(name)}`,
      idempotent: false,
    });
  }

  /** Stop enqueuing on a schedule until it is resumed (`POST /schedules/{name}/pause`). */
  pauseSchedule(name: string): Promise<Schedule> {
    return this.send<Schedule>({ method: "POST", path: `/schedules/${segment(name)}/pause` });
  }

  /** Enqueue on a paused schedule again, from its next time after now (`POST /schedules/{name}/resume`). */
  resumeSchedule(name: string): Promise<Schedule> {
    return this.send<Schedule>({ method: "POST", path: `/schedules/${segment(name)}/resume` });
  }

  /** Enqueue a schedule's job now, whatever its times (`POST /schedules/{name}/trigger`); the answer's
   * `job_id` is that job. */
  triggerSchedule(name: string): Promise<TriggeredSchedule> {
    // A repeat would enqueue another job: not sent twice.
    const path = `/schedules/${segment(name)}/trigger`;
    return this.send<TriggeredSchedule>({ method: "POST", path, idempotent: false });
  }

  // --- the service -------------------------------------------------------------------------------

  /** Liveness (`GET /healthz`), tried once. */
  health(): Promise<Health> {
    return this.send<Health>({ method: "GET", path: "/healthz", once: true });
  }

  /** Readiness (`GET /readyz`), tried once: the database answers and the schema is one this build runs
   * on. Not ready is `Unavailable`, whose `problem` holds the same fields (`schema_revision`, ...). */
  ready(): Promise<Readiness> {
    return this.send<Readiness>({ method: "GET", path: "/readyz", once: true });
  }

  /** The Prometheus metrics (`GET /metrics`), as text. */
  metrics(): Promise<string> {
    return this.send<string>({ method: "GET", path: "/metrics", text: true });
  }
}
