// A jobq worker in Node.js 18+, with the standard library only (the built-in fetch).
//
//   JOBQ_URL=http://127.0.0.1:8000 node examples/node/worker.mjs emails
//
// It long-polls the queue, runs handle() on each job, acks the job when handle() returns and nacks it
// with the error when it throws (the queue's backoff decides when it runs again). While handle() runs,
// the lease is extended every half visibility timeout. SIGTERM or SIGINT: no more leases; the job in
// hand finishes, then the process exits. One job at a time: run more processes for more.
// JOBQ_TOKEN, if set, is sent as a bearer token; JOBQ_VISIBILITY_TIMEOUT is the lease in seconds (30).

const JOBQ = (process.env.JOBQ_URL ?? "http://127.0.0.1:8000").replace(/\/$/, "");
const QUEUE = process.argv[2] ?? "default";
const VISIBILITY_TIMEOUT = Number(process.env.JOBQ_VISIBILITY_TIMEOUT ?? 30);
const WAIT = 20; // seconds each lease request waits for a job

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// The work. Replace it with yours: `job.payload` is the job's JSON; throwing fails the job.
async function handle(job) {
  const { seconds = 0, fail } = job.payload ?? {};
  await sleep(seconds * 1000); // stands in for real work
  if (fail) throw new Error(fail);
}

class Problem extends Error {
  constructor(answer) {
    super(`${answer.detail} (${answer.code})`);
    this.code = answer.code;
  }
}

// POST to jobq; connection errors and 503 are retried with backoff, other errors become a Problem.
async function post(path, body, signal) {
  const headers = { "content-type": "application/json" };
  if (process.env.JOBQ_TOKEN) headers.authorization = `Bearer ${process.env.JOBQ_TOKEN}`;
  for (let attempt = 1; ; attempt++) {
    let response = null;
    try {
      response = await fetch(JOBQ + path, { method: "POST", headers, body: JSON.stringify(body), signal });
    } catch (error) {
      if (signal?.aborted || attempt === 6) throw error;
    }
    if (response && (response.status !== 503 || attempt === 6)) {
      const answer = await response.json();
      if (!response.ok) throw new Problem(answer);
      return answer;
    }
    await sleep(Math.min(250 * 2 ** attempt, 5000));
  }
}

async function run(job) {
  const lease = { id: job.id, lease_token: job.lease_token };
  const extend = () =>
    post("/extend", { ...lease, visibility_timeout: VISIBILITY_TIMEOUT }).catch((error) =>
      console.error(`job ${job.id}: could not extend the lease: ${error.message}`),
    );
  const keeper = setInterval(extend, (VISIBILITY_TIMEOUT * 1000) / 2);
  let failure = null;
  try {
    await handle(job);
  } catch (error) {
    failure = error;
  } finally {
    clearInterval(keeper);
  }
  try {
    if (failure === null) {
      await post("/ack", lease);
      console.log(`job ${job.id} done`);
    } else {
      // The error's name, message and the top of its stack.
      const error = (failure.stack ?? String(failure)).split("\n").slice(0, 6).join("\n");
      const answer = await post("/nack", { ...lease, error });
      console.log(`job ${job.id} failed, now ${answer.status}: ${failure.message}`);
    }
  } catch (error) {
    console.error(`job ${job.id}: ${error.message}`); // lease_lost: another worker has it now
  }
}

let stopping = false;
const leasing = new AbortController();
for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, () => {
    stopping = true;
    leasing.abort(); // a waiting lease request ends now; a running job finishes
  });
}

console.log(`working on ${QUEUE} at ${JOBQ}`);
while (!stopping) {
  let jobs;
  try {
    const request = { queue: QUEUE, wait: WAIT, visibility_timeout: VISIBILITY_TIMEOUT };
    ({ jobs } = await post("/lease", request, leasing.signal));
  } catch (error) {
    if (stopping) break;
    console.error(`lease: ${error.message}; trying again`);
    await sleep(1000);
    continue;
  }
  for (const job of jobs) await run(job);
}
console.log("stopped");
