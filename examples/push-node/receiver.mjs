// A receiver of jobq's push delivery in Node.js 18+, on node:http alone and jobq-client's verifyPush:
//
//   (cd clients/typescript && npm ci && npm run build)   # build the package, once
//   (cd examples/push-node && npm install)               # link it here as jobq-client
//   JOBQ_PUSH_SECRET=whsec_... PORT=8080 node examples/push-node/receiver.mjs
//
// jobq POSTs each job of a queue with a push URL here, signed (Standard Webhooks). This answers:
//   200 and the JSON result     the job is completed, with that result;
//   503 and Retry-After: <s>    call again in <s> seconds (the attempt is not counted);
//   401                         a bad signature (not jobq, another secret, or a body changed on the way);
//   500                         the work failed: the attempt fails, and runs again while attempts remain.
// `webhook-id` (job_<id>) is the same on every attempt of a job: deduplicate on it (below, in memory; keep
// it where the work's effects are, in the same transaction, in a real receiver).
import { createServer } from "node:http";
import { realpathSync } from "node:fs";
import { fileURLToPath } from "node:url";

import { PushVerificationError, verifyPush } from "jobq-client";

/** Thrown by a handler to be called again in `seconds` (503 with Retry-After), the attempt not counted. */
export class Later extends Error {
  constructor(seconds, message = `call again in ${seconds} s`) {
    super(message);
    this.name = "Later";
    this.seconds = seconds;
  }
}

// The work, one function per job `kind`: what it returns is the job's result; what it throws fails the
// attempt (a `Later` puts the job back instead). Replace them with yours.
export const handlers = {
  async send_email(payload) {
    if (!payload?.to) throw new Error("no address to send to");
    return { sent_to: payload.to };
  },
  async sync_account(payload) {
    if (payload?.rate_limited) throw new Later(30, "the accounts API is rate limiting us"); // stands in for its 429
    return { synced: payload?.account ?? null };
  },
};

const MAX_BODY = 16 * 1024 * 1024;

/**
 * The HTTP server receiving pushes (not yet listening): `secret` the queue's push secret (`whsec_...`),
 * `handlers` the functions by job kind, `log` where to say what happened.
 */
export function createReceiver({ secret = process.env.JOBQ_PUSH_SECRET, handlers: byKind = handlers, log = console.log } = {}) {
  if (!secret) throw new Error("set JOBQ_PUSH_SECRET to the queue's push secret (whsec_...)");
  const done = new Map(); // webhook-id -> the promise of its result: a repeat gets the first one's answer

  async function receive(request, response) {
    if (request.method !== "POST") return answer(response, 405, { error: "POST jobs here" }, { allow: "POST" });
    const body = await rawBody(request); // the bytes as they came: verify them before parsing
    if (body === undefined) return answer(response, 413, { error: `a body of more than ${MAX_BODY} bytes` });

    let job;
    try {
      job = await verifyPush(request.headers, body, secret);
    } catch (error) {
      if (!(error instanceof PushVerificationError)) throw error;
      log(`refused a push: ${error.message}`);
      return answer(response, 401, { error: error.message });
    }

    const id = request.headers["webhook-id"]; // job_<id>, on every attempt
    const attempt = request.headers["jobq-attempt"] ?? job.attempts;
    const handle = Object.hasOwn(byKind, job.kind ?? "") ? byKind[job.kind] : undefined;
    if (!handle) return answer(response, 500, { error: `no handler for kind ${JSON.stringify(job.kind)}` });
    let result = done.get(id);
    const repeat = result !== undefined;
    if (!repeat) {
      result = (async () => handle(job.payload, job))();
      done.set(id, result);
      if (done.size > 10_000) done.delete(done.keys().next().value); // the oldest
    }
    try {
      const value = await result;
      log(`job ${job.id} (${job.kind}) ${repeat ? "done before: its result again" : "done"}, attempt ${attempt}`);
      return answer(response, 200, value ?? null);
    } catch (error) {
      done.delete(id); // not done: the next attempt runs it again
      if (error instanceof Later) {
        log(`job ${job.id} (${job.kind}) put back for ${error.seconds} s: ${error.message}`);
        return answer(response, 503, { error: error.message }, { "retry-after": String(error.seconds) });
      }
      log(`job ${job.id} (${job.kind}) failed, attempt ${attempt}: ${error?.stack ?? error}`);
      return answer(response, 500, { error: String(error?.message ?? error) });
    }
  }

  return createServer((request, response) => {
    receive(request, response).catch((error) => {
      log(`error: ${error?.stack ?? error}`);
      if (!response.headersSent) answer(response, 500, { error: "the receiver failed" });
      else response.destroy();
    });
  });
}

/** The request's body as a Buffer, or undefined when it is larger than MAX_BODY. */
async function rawBody(request) {
  const chunks = [];
  let size = 0;
  for await (const chunk of request) {
    size += chunk.length;
    if (size > MAX_BODY) return undefined;
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

function answer(response, status, body, headers = {}) {
  response.writeHead(status, { "content-type": "application/json", ...headers });
  response.end(JSON.stringify(body));
}

// Run as a program (not imported): listen on $PORT (8080 by default; 0 for any free port), until SIGTERM.
if (process.argv[1] && realpathSync(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const server = createReceiver();
  server.listen(Number(process.env.PORT ?? 8080), process.env.HOST ?? "127.0.0.1", () => {
    const { address, port } = server.address();
    console.log(`receiving pushes on http://${address}:${port}`);
  });
  for (const signal of ["SIGTERM", "SIGINT"]) {
    process.once(signal, () => {
      server.close(() => console.log("stopped"));
      server.closeIdleConnections(); // kept-alive ones, which close() waits for before Node 19
    });
  }
}
