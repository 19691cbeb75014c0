/** The job record of API.md, and what a handler may return. */

export type JobState = 'CREATED' | 'ACTIVATED' | 'COMPLETED' | 'FAILED' | 'ERROR_THROWN' | 'CANCELED'
// Integers beyond 2^53 read as `bigint` (and a `bigint` is sent as a JSON integer), so
// 64-bit values round-trip exactly; see json.ts.
export type Variables = Record<string, unknown>

export interface Job {
  jobKey: string
  type: string
  tenantId: string
  state: JobState
  priority: number
  effectivePriority: number
  retries: number
  /** The fencing token: +1 on every activation. */
  activationCount: number
  worker: string | null
  deadline: string | null
  runAt: string
  variables: Variables
  customHeaders: Variables
  errorCode: string | null
  errorMessage: string | null
  createdAt: string
  activatedAt: string | null
  completedAt: string | null
  idempotencyKey: string | null
  /** Its fairness key inside its tenant ('<default>' when created without one). */
  fairnessKey: string
  /** What it declares it costs (1 unless sent); charged where its type is fair by cost. */
  cost: number
}

export interface NewJob {
  type: string
  tenantId?: string
  priority?: number
  retries?: number
  variables?: Variables
  customHeaders?: Variables
  runAt?: string
  delay?: number
  idempotencyKey?: string
  /** Divides the tenant's share among its keys (an end user, a project). */
  fairnessKey?: string
  /** A positive number, charged where the job type is fair by cost (default 1). */
  cost?: number
}

/** A token bucket: `perSecond` activations a second on average, up to `burst` at once. */
export interface RateLimit {
  perSecond: number
  burst: number
}

/**
 * A tenant's configuration (PUT /v2/tenants/{tenantId}). A PUT sets the whole of it: a
 * field left out is its default (no cap, no minimum, no limit), so read, change and put
 * back to change one field alone. `paused`, `configured` and the bucket's `tokens` are
 * answered, never sent.
 */
export interface TenantConfig {
  /** Its share against the other tenants, 1-10,000 (default 1). */
  weight?: number
  /** Its ACTIVATED jobs of every type at most; null: no cap. */
  maxActiveJobs?: number | null
  /** Its guaranteed minimum of ACTIVATED jobs (at most maxActiveJobs), served first. */
  minActiveJobs?: number | null
  rateLimit?: RateLimit | null
  readonly tenantId?: string
  readonly paused?: boolean
  readonly configured?: boolean
}

/** A fairness key's configuration (PUT /v2/tenants/{tenantId}/keys/{fairnessKey}). */
export interface KeyConfig {
  /** Its share against its tenant's other keys, 1-10,000 (default 1). */
  weight?: number
  /** Its ACTIVATED jobs of every type at most; null: no cap. */
  maxActiveJobs?: number | null
  readonly tenantId?: string
  readonly fairnessKey?: string
  readonly configured?: boolean
}

/** A job type's configuration (PUT /v2/job-types/{type}); a PUT sets the whole of it. */
export interface JobTypeConfig {
  maxActiveJobs?: number | null
  agingIntervalMs?: number
  agingStep?: number
  rateLimit?: RateLimit | null
  /** What its lanes are charged by (default activations). */
  fairnessBy?: 'activations' | 'workerTime' | 'cost'
  /** Every fairness key's ACTIVATED jobs of the type at most; null: no cap. */
  maxActivePerKey?: number | null
  /** 'fifo': each fairness key's jobs one at a time, in creation order. */
  keyOrdering?: 'fifo' | null
  readonly type?: string
  readonly paused?: boolean
  readonly configured?: boolean
}

/** A job to finish: the record itself, or its key and activationCount. */
export type JobRef = Pick<Job, 'jobKey' | 'activationCount'>

/** Return (or throw) this from a handler to throw a job error: ERROR_THROWN, no retry. */
export class BusinessError extends Error {
  constructor(
    readonly code: string,
    message?: string,
    readonly variables?: Variables,
  ) {
    super(message ?? code)
    this.name = 'BusinessError'
  }
}
