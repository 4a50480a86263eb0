// The errors of the jobq API: one class per problem `code`, all `JobqError`. Catch the class
// (`err instanceof LeaseLost`) or read `err.code`.

import type { FieldError, Problem } from "./types.js";

/** An error answer's body as it came: the `Problem` fields, and any the service adds. */
export type ProblemBody = Partial<Problem> & Record<string, unknown>;

export interface JobqErrorOptions {
  status?: number | undefined;
  code?: string | undefined;
  problem?: ProblemBody | undefined;
  cause?: unknown;
}

/** An error answer (an RFC 9457 problem), or no answer at all (`status` is undefined then). */
export class JobqError extends Error {
  /** The problem code this class stands for. */
  static readonly code: string = "error";
  /** The HTTP status; undefined when no answer came. */
  readonly status: number | undefined;
  /** The answer's `code`, as sent, also one this client does not know yet. */
  readonly code: string;
  /** What went wrong, for people. */
  readonly detail: string;
  /** The whole problem body ({} when the answer had none). */
  readonly problem: ProblemBody;

  constructor(detail: string, options: JobqErrorOptions = {}) {
    super(detail, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.detail = detail;
    this.status = options.status;
    this.code = options.code ?? (new.target as typeof JobqError).code;
    this.problem = options.problem ?? {};
  }
}

/** `422`: the request is not valid; `errors` says what is wrong with it, field by field. */
export class ValidationError extends JobqError {
  static override readonly code: string = "validation_error";

  get errors(): FieldError[] {
    return Array.isArray(this.problem.errors) ? this.problem.errors : [];
  }
}

export class Unauthorized extends JobqError {
  static override readonly code: string = "unauthorized";
}

export class Forbidden extends JobqError {
  static override readonly code: string = "forbidden";
}

export class NotFound extends JobqError {
  static override readonly code: string = "not_found";
}

/** The lease token is not the job's current one: the lease expired and moved on, or was ended. */
export class LeaseLost extends JobqError {
  static override readonly code: string = "lease_lost";
}

/** The job is not in a state that allows this (cancel a running job, purge a live one). */
export class Conflict extends JobqError {
  static override readonly code: string = "conflict";
}

export class PayloadTooLarge extends JobqError {
  static override readonly code: string = "payload_too_large";
}

/** The service cannot do it now (its database is unreachable); try again later. */
export class Unavailable extends JobqError {
  static override readonly code: string = "unavailable";
}

/** No answer: connection refused, reset or timed out, after the retries. */
export class Unreachable extends Unavailable {
  static override readonly code: string = "unreachable";
}

const BY_CODE: ReadonlyMap<string, typeof JobqError> = new Map(
  [ValidationError, Unauthorized, Forbidden, NotFound, LeaseLost, Conflict, PayloadTooLarge, Unavailable].map(
    (cls) => [cls.code, cls],
  ),
);

// For answers with no problem body (a proxy in between, an older service). An answer whose code this
// client does not know is a plain JobqError instead: codes are open to additions, and a new one is
// more precise than the status it shares with others; its status and code are on the error.
const BY_STATUS: ReadonlyMap<number, typeof JobqError> = new Map<number, typeof JobqError>([
  [401, Unauthorized],
  [403, Forbidden],
  [404, NotFound],
  [409, Conflict],
  [413, PayloadTooLarge],
  [422, ValidationError],
  [503, Unavailable],
]);

function problemOf(text: string): ProblemBody {
  try {
    const body: unknown = JSON.parse(text);
    return typeof body === "object" && body !== null && !Array.isArray(body) ? (body as ProblemBody) : {};
  } catch {
    return {};
  }
}

/** The error an error answer stands for, from its status, body and status text. */
export function errorFrom(status: number, text: string, statusText = ""): JobqError {
  const problem = problemOf(text);
  const code = typeof problem.code === "string" ? problem.code : undefined;
  const cls = code === undefined ? (BY_STATUS.get(status) ?? JobqError) : (BY_CODE.get(code) ?? JobqError);
  const detail =
    typeof problem.detail === "string" && problem.detail ? problem.detail : text.slice(0, 300) || statusText;
  return new cls(detail || `HTTP ${status}`, { status, code, problem });
}

/** Why `verifyPush` refused a request: a `webhook-*` header missing or malformed, a timestamp outside the
 * tolerance, no signature matching, or a signed body that is not a job. */
export type PushVerificationReason = "missing_header" | "invalid_header" | "timestamp" | "signature" | "body";

/** A pushed request that `verifyPush` refuses: not signed with this secret, signed too long ago (or
 * ahead), or not a job. Answer it 401. Not a `JobqError`: no jobq answer, but a request to you. */
export class PushVerificationError extends Error {
  /** What was wrong, for code; the message says it for people. */
  readonly reason: PushVerificationReason;

  constructor(message: string, reason: PushVerificationReason, options: { cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.reason = reason;
  }
}
