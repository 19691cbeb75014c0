/**
 * A job worker: a handler per job, bounded concurrency, over long polling or an SSE stream.
 *
 * The handler's return value completes the job (an object becomes its variables); a
 * thrown error fails it with `retries - 1` and an exponential back-off; a
 * `BusinessError` (returned or thrown) throws a job error. A 409 on finishing means this
 * worker's activation is no longer current: logged and dropped, never retried. Long
 * handlers keep their lease by heartbeat. `stop()` stops activating, gives handlers
 * `shutdownGraceMs` and releases the jobs of those still running.
 *
 * Completions are sent together (`batchCompletion`, on by default): the handlers that
 * finish while a batch is on its way are completed by the next one, each still fenced by
 * its activationCount and each with its own verdict. One request per job would cost the
 * worker more than a short job does: with fifty handlers, fifty requests in flight.
 */
import { Backoff, Jobfair, completionItem, sleep } from './client.js'
import { Conflict, ProblemError } from './errors.js'
import { BusinessError, type Job, type Variables } from './types.js'
import { inJobSpan } from './tracing.js'

export type HandlerResult = Variables | BusinessError | undefined | void
export type Handler = (job: Job, signal: AbortSignal) => Promise<HandlerResult> | HandlerResult

export interface Logger {
  info(message: string): void
  warn(message: string): void
  error(message: string): void
}

export interface WorkerOptions {
  concurrency?: number
  mode?: 'poll' | 'stream'
  timeoutMs?: number
  requestTimeoutMs?: number
  name?: string
  tenantIds?: string[]
  failBackoff?: Backoff
  heartbeat?: boolean
  shutdownGraceMs?: number
  logger?: Logger
  /** Send completions together (default true); false: one request per job. */
  batchCompletion?: boolean
}

export interface WorkerStats {
  completed: number
  failed: number
  errorsThrown: number
  conflicts: number
  released: number
}

const STOP_ABORT_DELAY_MS = 250
// A batch of completions: at most this many jobs (the server's limit) and about this many
// bytes (a handler's variables can be large; the server's body limit is 16 MiB).
const BATCH_MAX_JOBS = 1_000
const BATCH_MAX_BYTES = 1 << 20
const quiet: Logger = { info() {}, warn() {}, error() {} }

interface Queued {
  item: string
  bytes: number
  resolve(status: number): void
  reject(err: unknown): void
}

/**
 * A worker's completions, sent together: whatever is queued when the previous batch comes
 * back goes in the next one, so a batch grows with the load and a lone completion goes at
 * once. Each queued job gets its own verdict (204, 404 or 409), or the error that failed
 * its batch.
 */
class Completions {
  private queue: Queued[] = []
  private sender: Promise<void> | undefined

  constructor(private readonly client: Jobfair) {}

  /** Queue `job`'s completion (throws at once when `variables` have no JSON form). */
  complete(job: Job, variables?: Variables): Promise<number> {
    const item = completionItem(job, variables)
    return new Promise<number>((resolve, reject) => {
      this.queue.push({ item, bytes: Buffer.byteLength(item), resolve, reject })
      this.sender ??= this.send()
    })
  }

  async flushed(): Promise<void> {
    while (this.sender) await this.sender
  }

  private async send(): Promise<void> {
    // The next turn of the loop, not now: handlers finishing in this one join in.
    await new Promise((resolve) => setImmediate(resolve))
    try {
      while (this.queue.length > 0) {
        const batch = this.take()
        let verdicts: number[]
        try {
          verdicts = await this.client.sendCompletions(batch.map((q) => q.item))
        } catch (err) {
          for (const q of batch) q.reject(err)
          continue
        }
        batch.forEach((q, i) => q.resolve(verdicts[i]))
      }
    } finally {
      this.sender = undefined // no await since the queue was seen empty: nothing is stranded
    }
  }

  private take(): Queued[] {
    let bytes = 0
    let n = 0
    for (const q of this.queue) {
      if (n === BATCH_MAX_JOBS || (n > 0 && bytes + q.bytes > BATCH_MAX_BYTES)) break
      bytes += q.bytes + 1
      n++
    }
    return this.queue.splice(0, n)
  }
}

export class Worker {
  readonly stats: WorkerStats = { completed: 0, failed: 0, errorsThrown: 0, conflicts: 0, released: 0 }
  private readonly concurrency: number
  private readonly mode: 'poll' | 'stream'
  private readonly timeoutMs: number
  private readonly failBackoff: Backoff
  private readonly log: Logger
  // From activation to verdict; `handling`: the handler is still running.
  private readonly inflight = new Map<Promise<void>, { job: Job; abort: AbortController; handling: boolean }>()
  private handling = 0
  private readonly completions: Completions | undefined
  private readonly stopping = new AbortController()
  private stopRequested = false
  private abortTimer: NodeJS.Timeout | undefined
  private slotFreed: (() => void) | undefined

  constructor(
    private readonly client: Jobfair,
    private readonly type: string,
    private readonly handler: Handler,
    private readonly options: WorkerOptions = {},
  ) {
    this.concurrency = options.concurrency ?? 4
    if (this.concurrency < 1) throw new RangeError('concurrency must be at least 1')
    this.mode = options.mode ?? 'poll'
    this.timeoutMs = options.timeoutMs ?? 60_000
    this.failBackoff = options.failBackoff ?? new Backoff(1_000, 2, 300_000)
    this.log = options.logger ?? quiet
    this.completions = options.batchCompletion === false ? undefined : new Completions(client)
  }

  /** Stop activating; `run()` resolves once in-flight jobs are finished or released. */
  stop(): void {
    if (this.stopped || this.stopRequested) return
    this.stopRequested = true
    this.slotFreed?.()
    // An activation answered this instant carries jobs the server counts as delivered:
    // cutting the connection then would strand them until their lease ends. So a request
    // in flight gets a moment to come back (its jobs are then handled); one still waiting
    // after that is cut, and the server releases what it activates for us meanwhile.
    this.abortTimer = setTimeout(() => this.stopping.abort(new Error('worker stopped')), STOP_ABORT_DELAY_MS)
  }

  async run(): Promise<void> {
    try {
      if (this.mode === 'poll') await this.poll()
      else await this.streamJobs()
    } finally {
      clearTimeout(this.abortTimer) // the feed came back by itself: nothing left to cut
      await this.drain()
      await this.completions?.flushed()
    }
  }

  private get stopped(): boolean {
    return this.stopRequested || this.stopping.signal.aborted
  }

  private async poll(): Promise<void> {
    let failures = 0
    while (!this.stopped) {
      // A handler's slot is free once it returns: the next activation goes out while its
      // completion is on its way. Jobs waiting for their verdicts are bounded too, so a
      // slow server slows the worker down instead of piling up its jobs.
      const free = Math.min(this.concurrency - this.handling, 2 * this.concurrency - this.inflight.size)
      if (free <= 0) {
        await new Promise<void>((resolve) => (this.slotFreed = resolve))
        continue
      }
      let jobs: Job[]
      try {
        jobs = await this.client.activate(this.type, {
          maxJobs: free,
          timeoutMs: this.timeoutMs,
          requestTimeoutMs: this.options.requestTimeoutMs,
          worker: this.options.name,
          tenantIds: this.options.tenantIds,
          // Aborting drops the connection: the server releases what it activated for us.
          signal: this.stopping.signal,
        })
        failures = 0
      } catch (err) {
        if (this.stopped) return
        failures++
        this.log.warn(`activating ${this.type} failed (${(err as Error).message}); backing off`)
        await this.pause(failures)
        continue
      }
      for (const job of jobs) this.start(job)
    }
  }

  private async streamJobs(): Promise<void> {
    let failures = 0
    while (!this.stopped) {
      try {
        for await (const job of this.client.stream(this.type, {
          credit: this.concurrency,
          timeoutMs: this.timeoutMs,
          worker: this.options.name,
          tenantIds: this.options.tenantIds,
          signal: this.stopping.signal,
        })) {
          failures = 0
          this.start(job)
        }
      } catch (err) {
        if (this.stopped) return
        this.log.warn(`stream of ${this.type} broke (${(err as Error).message}); reconnecting`)
      }
      failures++
      await this.pause(failures)
    }
  }

  /** Back off after a failed activation or a broken stream; stop() cuts it short. */
  private async pause(failures: number): Promise<void> {
    await sleep(this.client.backoff.delayMs(Math.min(failures, 8)), this.stopping.signal).catch(() => {})
  }

  private start(job: Job): void {
    const abort = new AbortController()
    const entry = { job, abort, handling: true }
    this.handling++
    const task: Promise<void> = this.handle(job, abort.signal, entry).finally(() => {
      this.handlerReturned(entry)
      this.inflight.delete(task)
      this.slotFreed?.()
    })
    this.inflight.set(task, entry)
  }

  /** The handler, and the finish sent from it, in the span of the job's trace (./tracing.ts). */
  private handle(job: Job, signal: AbortSignal, entry: { handling: boolean }): Promise<void> {
    return inJobSpan(job, () => this.handleInSpan(job, signal, entry))
  }

  private async handleInSpan(job: Job, signal: AbortSignal, entry: { handling: boolean }): Promise<void> {
    const beat = this.options.heartbeat === false ? undefined : this.heartbeat(job)
    let result: HandlerResult
    try {
      result = await this.handler(job, signal)
    } catch (err) {
      if (signal.aborted) return // released at shutdown
      if (err instanceof BusinessError) {
        result = err
      } else {
        await this.failJob(job, err)
        return
      }
    } finally {
      beat?.stop()
      // Without batches the slot stays taken until the job is finished, as before.
      if (this.completions) this.handlerReturned(entry)
    }
    if (signal.aborted) return
    if (result instanceof BusinessError) {
      if (await this.finish(job, () => this.client.throwError(job, result.code, result.message, result.variables))) {
        this.stats.errorsThrown++
      }
    } else if (this.completions) {
      let verdict: Promise<number>
      try {
        verdict = this.completions.complete(job, result ?? undefined)
      } catch (err) {
        // What the handler returned has no JSON form (a cycle, a function): nothing was
        // sent, so fail it like the handler's errors rather than wait out the lease.
        await this.failJob(job, new TypeError(`its result cannot be sent as JSON (${(err as Error).message})`))
        return
      }
      if (await this.finish(job, () => verdict)) this.stats.completed++
    } else if (await this.finish(job, () => this.client.complete(job, result ?? undefined))) {
      this.stats.completed++
    }
  }

  private handlerReturned(entry: { handling: boolean }): void {
    if (!entry.handling) return
    entry.handling = false
    this.handling--
    this.slotFreed?.()
  }

  /** The handler failed: retry later, one attempt fewer. */
  private async failJob(job: Job, err: unknown): Promise<void> {
    const backoff = this.failBackoff.exactMs(Math.max(0, job.activationCount - 1))
    const message = err instanceof Error ? `${err.name}: ${err.message}` : String(err)
    this.log.info(`job ${job.jobKey} failed: ${message}; retrying in ${backoff} ms`)
    if (await this.finish(job, () => this.client.fail(job, {
      retries: Math.max(0, job.retries - 1), errorMessage: message, retryBackOffMs: backoff,
    }))) this.stats.failed++
  }

  private async finish(job: Job, call: () => Promise<void | number>): Promise<boolean> {
    try {
      const status = await call()
      if (status === undefined || status === 204) return true
      // A batched completion's verdict: 409 (not this activation's) or 404 (gone).
      this.stats.conflicts++
      this.log.warn(`job ${job.jobKey}: finishing refused (${status}); dropped`)
      return false
    } catch (err) {
      if (err instanceof Conflict) {
        // Our activation is no longer current; retrying cannot help and must not happen.
        this.stats.conflicts++
        this.log.warn(`job ${job.jobKey}: finishing refused (${err.detail}); dropped`)
      } else {
        this.log.error(`job ${job.jobKey}: finishing failed (${(err as Error).message}); its lease will expire`)
      }
      return false
    }
  }

  private heartbeat(job: Job): { stop(): void } {
    const every = Math.max(50, this.timeoutMs / 3)
    let busy = false
    const timer = setInterval(async () => {
      if (busy) return
      busy = true
      try {
        await this.client.extendLease(job, this.timeoutMs)
      } catch (err) {
        if (err instanceof Conflict) {
          this.log.warn(`job ${job.jobKey}: lease lost (${err.detail})`)
          clearInterval(timer)
        } else if (err instanceof ProblemError || err instanceof Error) {
          this.log.warn(`job ${job.jobKey}: heartbeat failed (${err.message})`)
        }
      } finally {
        busy = false
      }
    }, every)
    return { stop: () => clearInterval(timer) }
  }

  private async drain(): Promise<void> {
    if (this.inflight.size === 0) return
    const grace = this.options.shutdownGraceMs ?? 30_000
    let timer: NodeJS.Timeout | undefined
    const timedOut = await Promise.race([
      Promise.allSettled([...this.inflight.keys()]).then(() => false),
      new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(true), grace))),
    ])
    clearTimeout(timer) // a pending grace timer would keep the process alive
    if (!timedOut) return
    for (const { job, abort, handling } of [...this.inflight.values()]) {
      if (!handling) continue // its handler returned: its completion is on its way
      abort.abort(new Error('worker shut down'))
      // Give the job back at once, without spending one of its retries.
      if (await this.finish(job, () => this.client.fail(job, { retries: job.retries, errorMessage: 'worker shut down' }))) {
        this.stats.released++
      }
    }
  }
}
