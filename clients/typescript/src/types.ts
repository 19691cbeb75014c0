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
