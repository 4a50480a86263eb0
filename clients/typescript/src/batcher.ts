// The worker runner's machinery, as the Python client's (clients/python/jobq/pools.py): a flag to wait
// on, and requests sent in batches.

/** The API's limit on a lease's max_jobs and on the items of a batch. */
export const MAX_BATCH = 1000;
/** Seconds an ack or nack waits for others to share its request. */
export const LINGER = 0.002;

/** A flag that promises wait on, as asyncio's Event: `set` wakes every waiter, `clear` lowers it. */
export class Flag {
  #isSet = false;
  readonly #waiters = new Set<() => void>();

  get isSet(): boolean {
    return this.#isSet;
  }

  set(): void {
    this.#isSet = true;
    for (const wake of [...this.#waiters]) wake();
  }

  clear(): void {
    this.#isSet = false;
  }

  /** Resolves once the flag is set, or `timeout` seconds have passed, or `signal` is aborted: whichever
   * comes first; nothing of the wait is left behind then (no timer, no listener). */
  wait(options: { timeout?: number; signal?: AbortSignal | undefined } = {}): Promise<void> {
    const { timeout, signal } = options;
    if (this.#isSet || signal?.aborted) return Promise.resolve();
    return new Promise((resolve) => {
      const wake = (): void => {
        this.#waiters.delete(wake);
        clearTimeout(timer);
        signal?.removeEventListener("abort", wake);
        resolve();
      };
      const timer = timeout === undefined ? undefined : setTimeout(wake, timeout * 1000);
      this.#waiters.add(wake);
      signal?.addEventListener("abort", wake, { once: true });
    });
  }
}

/**
 * Items (acks, nacks, releases) sent together: an item waits up to LINGER seconds for others, or for the
 * request in flight, then all go in one request of up to MAX_BATCH. `settle` gets each item's result;
 * `failed` a whole batch the service did not answer.
 */
export class Batcher<T, R> {
  readonly #send: (batch: T[]) => Promise<R[]>;
  readonly #settle: (item: T, result: R) => void;
  readonly #failed: (batch: T[], error: unknown) => void;
  #waiting: T[] = [];
  readonly #full = new Flag(); // a batch is full, or a flush wants everything now
  #sender: Promise<void> | undefined;
  // Whether #sender still runs. Set back inside #run, with no await between its last look at the waiting
  // items and the end: an item added after that look starts a sender of its own.
  #sending = false;

  constructor(
    send: (batch: T[]) => Promise<R[]>,
    settle: (item: T, result: R) => void,
    failed: (batch: T[], error: unknown) => void,
  ) {
    this.#send = send;
    this.#settle = settle;
    this.#failed = failed;
  }

  add(item: T): void {
    this.#waiting.push(item);
    if (this.#waiting.length >= MAX_BATCH) this.#full.set();
    if (!this.#sending) {
      this.#sending = true;
      this.#sender = this.#run();
    }
  }

  /** Send what waits, now, and wait for the answers. */
  async flush(): Promise<void> {
    this.#full.set();
    while (this.#sending) await this.#sender;
  }

  async #run(): Promise<void> {
    try {
      while (this.#waiting.length) {
        if (!this.#full.isSet) await this.#full.wait({ timeout: LINGER });
        if (this.#waiting.length <= MAX_BATCH) this.#full.clear();
        const batch = this.#waiting.splice(0, MAX_BATCH);
        let results: R[];
        try {
          results = await this.#send(batch);
        } catch (error) {
          this.#failed(batch, error); // the whole batch gets the error
          continue;
        }
        batch.forEach((item, n) => this.#settle(item, results[n] as R));
      }
    } finally {
      this.#sending = false;
    }
  }
}
