/** Jobfair's problem+json answers (RFC 9457) as errors a caller can branch on. */

export class JobfairError extends Error {}

export interface ProblemBody {
  type?: string
  title?: string
  status?: number
  detail?: string
  instance?: string
}

export class ProblemError extends JobfairError {
  readonly status: number
  readonly type: string
  readonly title: string
  readonly detail: string
  readonly instance: string
  /** Seconds the server asked us to wait (503/429), if it said. */
  readonly retryAfterS: number | undefined

  constructor(status: number, body: ProblemBody, retryAfterS?: number) {
    super(`${status} ${body.title ?? ''}: ${body.detail ?? ''}`)
    this.name = new.target.name
    this.status = status
    this.type = body.type ?? 'about:blank'
    this.title = body.title ?? ''
    this.detail = body.detail ?? ''
    this.instance = body.instance ?? ''
    this.retryAfterS = retryAfterS
  }
}

/** 400: malformed or out of range; nothing changed. */
export class InvalidArgument extends ProblemError {}
/** 401: missing or invalid API key. */
export class Unauthorized extends ProblemError {}
/** 403: the key may not touch this tenant, job type or operation. */
export class Forbidden extends ProblemError {}
/** 404: no such job. */
export class NotFound extends ProblemError {}
/** 409: the job is not in a state that allows this. */
export class Conflict extends ProblemError {}
/** 409 `urn:jobfair:stale-activation`: this activation is no longer current. */
export class StaleActivation extends Conflict {}
/** 503 or 429: back pressure, or the database unavailable; nothing changed. */
export class ResourceExhausted extends ProblemError {}
/**
 * 503 `urn:jobfair:outcome-unknown`: the server's database went away while the call's
 * changes were being committed; they may or may not have been made. Retried only when
 * sending the call twice is harmless; otherwise read before creating again.
 */
export class OutcomeUnknown extends ProblemError {}

const BY_STATUS: Record<number, typeof ProblemError> = {
  400: InvalidArgument,
  401: Unauthorized,
  403: Forbidden,
  404: NotFound,
  409: Conflict,
  429: ResourceExhausted,
  503: ResourceExhausted,
}

export function problem(status: number, body: unknown, retryAfter: string | null): ProblemError {
  const parsed: ProblemBody =
    typeof body === 'object' && body !== null ? (body as ProblemBody) : { title: 'HTTP_ERROR', detail: String(body).slice(0, 500) }
  let Kind = BY_STATUS[status] ?? ProblemError
  if (status === 409 && parsed.type === 'urn:jobfair:stale-activation') Kind = StaleActivation
  if (status === 503 && parsed.type === 'urn:jobfair:outcome-unknown') Kind = OutcomeUnknown
  const seconds = retryAfter === null ? undefined : Number(retryAfter)
  return new Kind(status, parsed, seconds !== undefined && Number.isFinite(seconds) ? Math.max(0, seconds) : undefined)
}
