import createClient from "openapi-fetch";
import type { components, paths } from "./schema.js";

type Problem = components["schemas"]["Problem"];

const queue = process.env.QUEUE ?? "generated";
const client = createClient<paths>({ baseUrl: process.env.JOBQ_URL });

const enqueued = await client.POST("/jobs", { body: { queue, payload: { to: "ada@example.com" } } });
if (!enqueued.data) throw new Error(`enqueue: ${enqueued.response.status}`);
const leased = await client.POST("/lease", { body: { queue, max_jobs: 1 } });
const mine = leased.data?.jobs[0];
if (!mine) throw new Error(`lease: ${leased.response.status}`);

const stale = await client.POST("/ack", {
  body: { id: mine.id, lease_token: `00000000-0000-4000-8000-000000000000.${queue}` },
});
// Compiles only while error bodies are typed as Problem.
const problem: Problem | undefined = stale.error;
const code: Problem["code"] | undefined = stale.error?.code;

const acked = await client.POST("/ack", { body: { id: mine.id, lease_token: mine.lease_token } });
const job = await client.GET("/jobs/{id}", { params: { path: { id: enqueued.data.id } } });
const missing = await client.GET("/jobs/{id}", { params: { path: { id: 999999999 } } });

console.log(
  JSON.stringify({
    id: enqueued.data.id,
    leased: mine.id,
    stale_status: stale.response.status,
    code,
    detail: problem?.detail,
    acked: acked.data?.status,
    status: job.data?.status,
    missing: missing.error?.code,
  }),
);
