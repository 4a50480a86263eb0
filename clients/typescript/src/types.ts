// The API's bodies and answers under short names, all taken from src/schema.d.ts (generated from jobq's
// openapi.json), so that a field the service adds or changes reaches this client's types with the next
// `npm run generate`, not by hand. Fields keep the API's names (snake_case), as they travel.

import type { components, operations } from "./schema.js";

type Schemas = components["schemas"];

export type Job = Schemas["Job"];
/** An enqueue's answer: the job, and whether it is an active job that already held the `dedup_key`. */
export type EnqueuedJob = Schemas["EnqueuedJob"];
export type EnqueueRequest = Schemas["EnqueueRequest"];
export type JobStatus = Schemas["JobStatus"];
export type JobPage = Schemas["JobPage"];
export type DeadPage = Schemas["DeadPage"];

export type LeaseRequest = Schemas["LeaseRequest"];
/** A job this worker holds until `lease_expires_at`; ack, nack and extend need its `lease_token`. */
export type LeasedJob = Schemas["LeasedJob"];
/** What names a lease: a `LeasedJob` is one, and so is `{ id, lease_token }`. */
export type Lease = Pick<Schemas["ReleaseItem"], "id" | "lease_token">;
/** An item of `POST /release`: a lease, and `delay`, the seconds until the job is due again (a durable
 * sleep: the attempt not counted; left out or null: due again at once). */
export type ReleaseItem = Schemas["ReleaseItem"];
export type AckRequest = Schemas["AckRequest"];
export type AckResponse = Schemas["AckResponse"];
export type NackRequest = Schemas["NackRequest"];
export type NackResponse = Schemas["NackResponse"];
export type ExtendResponse = Schemas["ExtendResponse"];
/** One item of a batch ack or release: `ok`, or the `code` of the problem it met (`lease_lost`, ...). */
export type ItemResult = Schemas["ItemResult"];
/** One item of a batch nack: as `ItemResult`, with `status` (pending or dead) and `run_at` when `ok`. */
export type NackItemResult = Schemas["NackItemResult"];

export type RetryDeadRequest = Schemas["RetryDeadRequest"];
export type RetryDeadResponse = Schemas["RetryDeadResponse"];
export type PurgeResponse = Schemas["PurgeResponse"];

export type QueueRow = Schemas["QueueRow"];
export type QueueDetail = Schemas["QueueDetail"];
export type QueueSettings = Schemas["QueueSettings"];
export type QueueSettingsPatch = Schemas["QueueSettingsPatch"];
export type Rate = Schemas["Rate"];
export type KeyView = Schemas["KeyView"];
export type KeyOverrides = Schemas["KeyOverrides"];
export type DeletedKey = Schemas["DeletedKey"];
export type WorkerView = Schemas["WorkerView"];

export type Schedule = Schemas["Schedule"];
export type ScheduleRequest = Schemas["ScheduleRequest"];
export type TriggeredSchedule = Schemas["TriggeredSchedule"];
export type DeletedSchedule = Schemas["DeletedSchedule"];
export type CatchUp = Schemas["CatchUp"];

/** A job of `POST /workflows`: a job as `POST /jobs` takes it (no dedup_key or debounce), named by a `ref`
 * its siblings give in their `depends_on` (beside ids of existing jobs). */
export type WorkflowJobRequest = Schemas["WorkflowJobRequest"];
export type WorkflowRequest = Schemas["WorkflowRequest"];
/** `POST /workflows`' answer: the workflow, and each job's ref, id and status in the request's order. */
export type WorkflowMade = Schemas["WorkflowMade"];
export type WorkflowJobMade = Schemas["WorkflowJobMade"];
/** A workflow, its status, its jobs' counts by status, and its jobs (`GET /workflows/{id}`). */
export type Workflow = Schemas["Workflow"];
export type WorkflowJob = Schemas["WorkflowJob"];
export type WorkflowStatus = Schemas["WorkflowStatus"];
/** A workflow as `GET /workflows` lists it (no jobs, no counts). */
export type WorkflowRow = Schemas["WorkflowRow"];
export type WorkflowPage = Schemas["WorkflowPage"];
/** A job's parent as a lease carries it and `GET /jobs/{id}/parents` pages it: id, kind, status, result. */
export type ParentJob = Schemas["ParentJob"];
export type ParentPage = Schemas["ParentPage"];
/** What a job's parents must end as for it to run: `completed` (default), `finished` or `failed`. */
export type RunIf = Schemas["RunIf"];
/** `debounce` of `POST /jobs`: `{ key, seconds, max_seconds? }`. */
export type Debounce = Schemas["Debounce"];

/** `POST /jobs/{id}/steps`' answer: the job's id, the step's name, and `recorded` (true). */
export type StepRecorded = Schemas["StepRecorded"];
/** `POST /jobs/{id}/await`'s answer: `status` waiting (parked until the event or the timeout), or pending
 * (an event of that name had come already: `event_id`), and `run_at`. (The spec's `Awaited`, renamed:
 * TypeScript has a type of that name.) */
export type AwaitResponse = Schemas["Awaited"];
/** `POST /events`' answer: the event's id and name, and the jobs awaiting it that it `woken`. */
export type EventSent = Schemas["EventSent"];
/** An event as sent: `{ id, name, payload, at }` (`GET /events`, and what `context.waitForEvent` gives). */
export type JobEvent = Schemas["EventView"];
/** A page of `GET /events`, newest first; `next_before_id` is the next page's `before_id` (null: none). */
export type EventPage = Schemas["EventPage"];
/** An entry of a lease's `events`: an event that reached the job, or (`timed_out`) a wait that ran out. */
export type EventReached = Schemas["EventReached"];
/** While a job waits for an event: its name and the wait's deadline (a job's `waiting_for`). */
export type WaitingFor = Schemas["WaitingFor"];

export type Health = Schemas["Health"];
export type Readiness = Schemas["Readiness"];

/** An error answer's body (RFC 9457 problem details). */
export type Problem = Schemas["Problem"];
/** The codes this client's spec knows; the service may add others (read those by `status`). */
export type ProblemCode = Problem["code"];
export type FieldError = Schemas["FieldError"];

type Query<Operation extends keyof operations> = NonNullable<operations[Operation]["parameters"]["query"]>;

/** The filters of `GET /jobs`: queue, status, kind, key, `q` (text search), limit, before_id. */
export type ListJobsQuery = Query<"list_jobs">;
/** The filters of `GET /dead`: queue, limit, before_id. */
export type ListDeadQuery = Query<"list_dead">;
export type ListKeysQuery = Query<"list_keys">;
/** The filters of `GET /workflows`: status, name, limit, before_id. */
export type ListWorkflowsQuery = Query<"list_workflows">;
/** The filters of `GET /events`: name, limit (default 100, at most 1000), before_id. */
export type ListEventsQuery = Query<"list_events">;
/** The paging of `GET /jobs/{id}/parents`: limit (default 100, at most 1000), after_id. */
export type ListParentsQuery = Query<"get_parents">;

/** The fields of a job beside its queue and payload, as `POST /jobs` takes them. */
export type JobOptions = Omit<EnqueueRequest, "queue" | "payload">;

/** The statuses a wait for a job ends on: nothing more happens to the job unless someone acts on it. */
export const FINISHED: ReadonlySet<JobStatus> = new Set<JobStatus>(["completed", "dead", "cancelled"]);

/** The statuses a wait for a workflow ends on: none of its jobs may run any more (until a retry). */
export const WORKFLOW_FINISHED: ReadonlySet<WorkflowStatus> = new Set<WorkflowStatus>([
  "completed",
  "failed",
  "cancelled",
]);

/** The body jobq POSTs to a queue's push URL (push delivery), which `verifyPush` answers once its
 * signature holds. Written here, not taken from src/schema.d.ts: openapi.json does not describe it (yet).
 * `attempts` counts this one; `parents` comes only for a job that has parents. */
export interface PushedJob {
  id: number;
  queue: string;
  kind: string | null;
  key: string | null;
  /** The job's JSON, as enqueued. */
  payload: unknown;
  attempts: number;
  max_attempts: number;
  run_at: string;
  created_at: string;
  parents?: ParentJob[];
}
