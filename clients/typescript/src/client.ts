/**
 * The HTTP calls of API.md over Node's fetch. Back pressure (503/429 with Retry-After)
 * and connection failures are retried with jittered exponential back-off; no other 4xx
 * is. A request that may have reached the server is sent again only when that is
 * harmless: reads, finish calls (fenced by activationCount), and creations that carry
 * an idempotency key.
 */
import { randomUUID } from 'node:crypto'

import { JobfairError, OutcomeUnknown, ProblemError, problem } from './errors.js'
import { readSse } from './sse.js'
import { traceHeaders } from './tracing.js'
import type { Job, JobRef, JobTypeConfig, KeyConfig, NewJob, RateLimit, TenantConfig, Variables } from './types.js'
import { parseJson, stringifyJson } from './json.js'

export class Backoff {
  constructor(
    readonly baseMs = 200,
    readonly factor = 2,
    readonly maxMs = 30_000,
  ) {}

  /** Without jitter: the wait before retry number `attempt + 1`. */
  exactMs(attempt: number): number {
    return Math.min(this.maxMs, this.baseMs * this.factor ** attempt)
  }

  /** Jittered (upper half of the exact value), never sooner than Retry-After. */
  delayMs(attempt: number, retryAfterS?: number): number {
    const ceiling = this.exactMs(attempt)
    let delay = ceiling / 2 + Math.random() * (ceiling / 2)
    if (retryAfterS) delay = Math.max(delay, retryAfterS * 1000 * (1 + Math.random() * 0.2))
    return delay
  }
}

export interface ClientOptions {
  /** Sent as `Authorization: Bearer <apiKey>`. */
  apiKey?: string
  maxAttempts?: number
  backoff?: Backoff
  /** Per-request timeout for everything but long polls and streams. */
  timeoutMs?: number
  /**
   * Every job created without an `idempotencyKey` is given one of the client's own, so
   * that a create whose outcome is unknown (a 503 outcome-unknown, a connection cut after
   * sending) is sent again safely and made once (default true; false: such creates are
   * sent without a key, and not retried after an unknown outcome).
   */
  idempotentCreates?: boolean
}

export interface ActivateOptions {
  maxJobs?: number
  timeoutMs?: number
  requestTimeoutMs?: number
  worker?: string
  tenantIds?: string[]
  fetchVariables?: string[]
  signal?: AbortSignal
}

export interface StreamOptions {
  credit: number
  timeoutMs?: number
  worker?: string
  tenantIds?: string[]
  signal?: AbortSignal
}

/** One job of `completeMany`, with the variables to complete it with. */
export interface Completion {
  job: JobRef
  variables?: Variables
}

/** One job of a batched completion, encoded as JSON (so that a batch can be sized by it);
 * throws when `variables` have no JSON form. */
export function completionItem(job: JobRef, variables?: Variables): string {
  const item: Record<string, unknown> = { jobKey: job.jobKey, activationCount: job.activationCount }
  if (variables !== undefined) item.variables = variables
  return stringifyJson(item)
}

export interface FailOptions {
  retries?: number
  errorMessage?: string
  retryBackOffMs?: number
  variables?: Variables
}

interface Call {
  method: string
  path: string
  body?: unknown
  /** The body already encoded as JSON (instead of `body`). */
  encoded?: string
  idempotent?: boolean
  timeoutMs?: number
  signal?: AbortSignal
  /** Sent with the active span's trace context (./tracing.ts): creates and finishes. */
  traced?: boolean
}

/**
 * AbortSignal.any, which Node 18 lacks; `release()` removes its listeners from the inputs
 * (a worker's long-lived stop signal would otherwise collect one per request).
 */
function anySignal(signals: AbortSignal[]): { signal: AbortSignal; release(): void } {
  const controller = new AbortController()
  const undo: (() => void)[] = []
  for (const s of signals) {
    if (s.aborted) {
      controller.abort(s.reason)
      break
    }
    const onAbort = () => controller.abort(s.reason)
    s.addEventListener('abort', onAbort, { once: true })
    undo.push(() => s.removeEventListener('abort', onAbort))
  }
  return { signal: controller.signal, release: () => undo.forEach((f) => f()) }
}

/** Waits `ms`; rejects early when `signal` aborts. */
export const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason)
    const timer = setTimeout(resolve, ms)
    signal?.addEventListener('abort', () => {
      clearTimeout(timer)
      reject(signal.reason)
    }, { once: true })
  })

/** fetch's network failures: the request did not (necessarily) reach the server. */
/**
 * A tenant, key or type as one path segment. The names "." and ".." are valid, but fetch
 * (the WHATWG URL parser) takes them for dot segments however they are spelled, "%2E"
 * included: such a call is refused here rather than sent to another path.
 */
function segment(name: string): string {
  if (name === '.' || name === '..') {
    throw new JobfairError(`the name '${name}' cannot be sent in a URL path by fetch; configure it with the Python or Java client, or curl --path-as-is`)
  }
  return encodeURIComponent(name)
}

const TENANT_FIELDS = ['weight', 'maxActiveJobs', 'minActiveJobs', 'rateLimit']
const KEY_FIELDS = ['weight', 'maxActiveJobs']
const JOB_TYPE_FIELDS = ['maxActiveJobs', 'agingIntervalMs', 'agingStep', 'rateLimit', 'fairnessBy', 'maxActivePerKey', 'keyOrdering']

/**
 * What a PUT sends of a configuration: its settable fields alone (a record read back
 * carries answered ones, which the server refuses), a rate limit without its tokens.
 */
function sent(config: object, fields: string[]): Record<string, unknown> {
  const body: Record<string, unknown> = {}
  for (const field of fields) {
    const value = (config as Record<string, unknown>)[field]
    if (value === undefined) continue
    const limit = value as RateLimit | null
    body[field] = field === 'rateLimit' && limit !== null ? { perSecond: limit.perSecond, burst: limit.burst } : value
  }
  return body
}

function isConnectError(err: unknown): boolean {
  const cause = (err as { cause?: { code?: string } })?.cause
  return cause?.code === 'ECONNREFUSED' || cause?.code === 'ENOTFOUND' || cause?.code === 'EAI_AGAIN'
}

export class Jobfair {
  readonly baseUrl: string
  readonly apiKey: string | undefined
  readonly maxAttempts: number
  readonly backoff: Backoff
  readonly timeoutMs: number
  readonly idempotentCreates: boolean
  /** Requests sent again after back pressure or a connection failure. */
  retried = 0

  constructor(baseUrl: string, options: ClientOptions = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, '')
    this.apiKey = options.apiKey
    this.maxAttempts = options.maxAttempts ?? 6
    this.backoff = options.backoff ?? new Backoff()
    this.timeoutMs = options.timeoutMs ?? 30_000
    this.idempotentCreates = options.idempotentCreates ?? true
  }

  /** `job` with an idempotency key of the client's own if it has none (and they are on). */
  private keyed(job: NewJob): NewJob {
    if (job.idempotencyKey !== undefined || !this.idempotentCreates) return job
    return { ...job, idempotencyKey: `auto-${randomUUID().replaceAll('-', '')}` }
  }

  private headers(json: boolean): Record<string, string> {
    const headers: Record<string, string> = { 'user-agent': 'jobfair-client-typescript/0.1' }
    if (json) headers['content-type'] = 'application/json'
    if (this.apiKey) headers.authorization = `Bearer ${this.apiKey}`
    return headers
  }

  async send<T>(call: Call): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.once<T>(call)
      } catch (err) {
        let retryAfter: number | undefined
        if (err instanceof ProblemError) {
          if (err.status !== 503 && err.status !== 429) throw err
          if (err instanceof OutcomeUnknown && !(call.idempotent ?? true)) throw err
          retryAfter = err.retryAfterS
        } else if (call.signal?.aborted) {
          throw err
        } else if (!isConnectError(err) && !(call.idempotent ?? true)) {
          throw err
        }
        if (attempt >= this.maxAttempts) throw err
        this.retried++
        await sleep(this.backoff.delayMs(attempt - 1, retryAfter), call.signal)
      }
    }
  }

  private async once<T>(call: Call): Promise<T> {
    const timeout = AbortSignal.timeout(call.timeoutMs ?? this.timeoutMs)
    const combined = call.signal ? anySignal([call.signal, timeout]) : undefined
    let response: Response
    let text: string
    try {
      const headers = this.headers(call.body !== undefined || call.encoded !== undefined)
      if (call.traced) Object.assign(headers, await traceHeaders())
      response = await fetch(this.baseUrl + call.path, {
        method: call.method,
        headers,
        body: call.encoded ?? (call.body === undefined ? undefined : stringifyJson(call.body)),
        signal: combined?.signal ?? timeout,
      })
      text = await response.text()
    } finally {
      combined?.release()
    }
    if (response.status >= 400) {
      let body: unknown = text
      try {
        body = parseJson(text)
      } catch {
        /* not JSON: keep the text */
      }
      throw problem(response.status, body, response.headers.get('retry-after'))
    }
    return (text ? parseJson(text) : undefined) as T
  }

  // -- producing ---------------------------------------------------------------------

  createJob(job: NewJob): Promise<Job> {
    job = this.keyed(job)
    return this.send({ method: 'POST', path: '/v2/jobs', body: job, idempotent: job.idempotencyKey !== undefined, traced: true })
  }

  /** Up to 10,000 jobs in one round trip, all or nothing; their keys in order. */
  async createJobs(jobs: NewJob[]): Promise<string[]> {
    jobs = jobs.map((j) => this.keyed(j))
    const safe = jobs.every((j) => j.idempotencyKey !== undefined)
    const answer = await this.send<{ jobKeys: string[] }>({ method: 'POST', path: '/v2/jobs/batch', body: { jobs }, idempotent: safe, traced: true })
    return answer.jobKeys
  }

  getJob(key: string): Promise<Job> {
    return this.send({ method: 'GET', path: `/v2/jobs/${key}` })
  }

  async cancelJob(key: string): Promise<void> {
    await this.send({ method: 'POST', path: `/v2/jobs/${key}/cancel` })
  }

  async updateJob(key: string, changeset: { retries?: number; priority?: number }): Promise<void> {
    await this.send({ method: 'PATCH', path: `/v2/jobs/${key}`, body: { changeset } })
  }

  // -- configuring (operators) ---------------------------------------------------------

  /** Set the tenant's whole configuration (weight, cap, minimum, rate limit). */
  async putTenant(tenantId: string, config: TenantConfig): Promise<TenantConfig> {
    return this.send({ method: 'PUT', path: `/v2/tenants/${segment(tenantId)}`, body: sent(config, TENANT_FIELDS) })
  }

  /** Its configuration (the defaults, `configured` false, if it has none). */
  async getTenant(tenantId: string): Promise<TenantConfig> {
    return this.send({ method: 'GET', path: `/v2/tenants/${segment(tenantId)}` })
  }

  /** Set a fairness key's weight and cap ('<default>': the jobs sent without a key). */
  async putKey(tenantId: string, fairnessKey: string, config: KeyConfig): Promise<KeyConfig> {
    const path = `/v2/tenants/${segment(tenantId)}/keys/${segment(fairnessKey)}`
    return this.send({ method: 'PUT', path, body: sent(config, KEY_FIELDS) })
  }

  async getKey(tenantId: string, fairnessKey: string): Promise<KeyConfig> {
    return this.send({ method: 'GET', path: `/v2/tenants/${segment(tenantId)}/keys/${segment(fairnessKey)}` })
  }

  /** Set the type's whole configuration (cap, aging, rate limit, fairness, per-key cap, key ordering). */
  async putJobType(type: string, config: JobTypeConfig): Promise<JobTypeConfig> {
    return this.send({ method: 'PUT', path: `/v2/job-types/${segment(type)}`, body: sent(config, JOB_TYPE_FIELDS) })
  }

  async getJobType(type: string): Promise<JobTypeConfig> {
    return this.send({ method: 'GET', path: `/v2/job-types/${segment(type)}` })
  }

  // -- working -----------------------------------------------------------------------

  async activate(type: string, options: ActivateOptions = {}): Promise<Job[]> {
    const body: Record<string, unknown> = {
      type,
      maxJobs: options.maxJobs ?? 1,
      timeout: options.timeoutMs ?? 60_000,
    }
    if (options.requestTimeoutMs !== undefined) body.requestTimeout = options.requestTimeoutMs
    if (options.worker !== undefined) body.worker = options.worker
    if (options.tenantIds?.length) body.tenantIds = options.tenantIds
    if (options.fetchVariables?.length) body.fetchVariables = options.fetchVariables
    const waitMs = options.requestTimeoutMs && options.requestTimeoutMs > 0 ? options.requestTimeoutMs : 60_000
    const answer = await this.send<{ jobs: Job[] }>({
      method: 'POST', path: '/v2/jobs/activate', body, timeoutMs: waitMs + 30_000, signal: options.signal,
    })
    return answer.jobs
  }

  async complete(job: JobRef, variables?: Variables): Promise<void> {
    const body: Record<string, unknown> = { activationCount: job.activationCount }
    if (variables !== undefined) body.variables = variables
    await this.send({ method: 'POST', path: `/v2/jobs/${job.jobKey}/complete`, body, traced: true })
  }

  /**
   * Up to 1,000 jobs completed in one round trip, each fenced by its activationCount:
   * a job (completed without variables) or `{ job, variables }`. One verdict per job, in
   * order: 204 completed, 404 unknown, 409 not (or no longer) this activation's.
   */
  completeMany(jobs: Array<JobRef | Completion>): Promise<number[]> {
    return this.sendCompletions(jobs.map((j) => ('job' in j ? completionItem(j.job, j.variables) : completionItem(j))))
  }

  /** `completeMany` of items already encoded by `completionItem`. */
  async sendCompletions(encodedItems: string[]): Promise<number[]> {
    const answer = await this.send<{ results: { status: number }[] }>({
      method: 'POST', path: '/v2/jobs/complete', encoded: `{"jobs":[${encodedItems.join(',')}]}`,
    })
    if (answer.results.length !== encodedItems.length) {
      throw new JobfairError(`${answer.results.length} verdicts for ${encodedItems.length} completions`)
    }
    return answer.results.map((r) => Number(r.status))
  }

  async fail(job: JobRef, options: FailOptions = {}): Promise<void> {
    const body: Record<string, unknown> = {
      activationCount: job.activationCount,
      retryBackOff: options.retryBackOffMs ?? 0,
    }
    if (options.retries !== undefined) body.retries = options.retries
    if (options.errorMessage !== undefined) body.errorMessage = options.errorMessage.slice(0, 10_000)
    if (options.variables !== undefined) body.variables = options.variables
    await this.send({ method: 'POST', path: `/v2/jobs/${job.jobKey}/fail`, body, traced: true })
  }

  async throwError(job: JobRef, code: string, message?: string, variables?: Variables): Promise<void> {
    const body: Record<string, unknown> = { activationCount: job.activationCount, errorCode: code }
    if (message !== undefined) body.errorMessage = message.slice(0, 10_000)
    if (variables !== undefined) body.variables = variables
    await this.send({ method: 'POST', path: `/v2/jobs/${job.jobKey}/error`, body, traced: true })
  }

  /** Heartbeat: the lease now ends `timeoutMs` from now. */
  async extendLease(job: JobRef, timeoutMs: number): Promise<void> {
    await this.send({
      method: 'PATCH',
      path: `/v2/jobs/${job.jobKey}`,
      body: { activationCount: job.activationCount, changeset: { timeout: timeoutMs } },
    })
  }

  /**
   * Jobs pushed over SSE, at most `credit` of them unfinished at once. Abort the signal
   * (or stop iterating) to close the stream; the server releases undelivered jobs.
   */
  async *stream(type: string, options: StreamOptions): AsyncGenerator<Job> {
    const params = new URLSearchParams({
      type,
      maxJobs: String(options.credit),
      timeout: String(options.timeoutMs ?? 60_000),
    })
    if (options.worker !== undefined) params.set('worker', options.worker)
    if (options.tenantIds?.length) params.set('tenantIds', options.tenantIds.join(','))
    const controller = new AbortController()
    const combined = options.signal ? anySignal([options.signal, controller.signal]) : undefined
    const signal = combined?.signal ?? controller.signal
    let response: Response
    try {
      response = await fetch(`${this.baseUrl}/v2/jobs/stream?${params}`, {
        headers: { ...this.headers(false), accept: 'text/event-stream' },
        signal,
      })
    } catch (err) {
      combined?.release()
      throw err
    }
    if (response.status >= 400 || !response.body) {
      combined?.release()
      const text = await response.text()
      let body: unknown = text
      try {
        body = parseJson(text)
      } catch {
        /* keep the text */
      }
      throw problem(response.status, body, response.headers.get('retry-after'))
    }
    try {
      for await (const event of readSse(response.body)) {
        if (event.event === 'job') yield parseJson(event.data) as Job
      }
    } finally {
      controller.abort()
      combined?.release()
    }
    throw new JobfairError('the server ended the stream')
  }
}
