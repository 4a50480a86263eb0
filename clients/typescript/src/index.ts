// jobq-client: the jobq HTTP API (`Client`), its errors, the worker runner (`Worker`, `run`, `Tasks`) with
// durable steps, sleeps and waits for events (`context.step`, `Suspend`), and the receiving end of push
// delivery (`verifyPush`).

export { Client, DEFAULT_URL, MAX_PARENTS, MAX_WAIT } from "./client.js";
export type {
  ClientOptions,
  CreateWorkflowOptions,
  EnqueueOptions,
  ExtendOptions,
  LeaseOptions,
  NackOptions,
  SignalOptions,
} from "./client.js";
export {
  Conflict,
  Forbidden,
  JobqError,
  LeaseLost,
  NotFound,
  PayloadTooLarge,
  PushVerificationError,
  Unauthorized,
  Unavailable,
  Unreachable,
  ValidationError,
  errorFrom,
} from "./errors.js";
export type { JobqErrorOptions, ProblemBody, PushVerificationReason } from "./errors.js";
export { RetryPolicy } from "./http.js";
export type { Call, Method, RetryPolicyOptions } from "./http.js";
export { PUSH_TOLERANCE, signPush, verifyPush } from "./push.js";
export type { PushBody, PushHeaders, VerifyPushOptions } from "./push.js";
export { MAX_SUSPEND, Suspend } from "./durable.js";
export type { Suspension } from "./durable.js";
export { Fail, Flow, Retry, Signature, Step, Task, Tasks, UnknownTask } from "./tasks.js";
export type { FlowJob, JobContext, StepOptions, TaskFunction, TaskJobOptions, TaskOptions } from "./tasks.js";
export { FINISHED, WORKFLOW_FINISHED } from "./types.js";
export type * from "./types.js";
export { Worker, run } from "./worker.js";
export type { Handler, Logger, Stats, WorkerOptions } from "./worker.js";
