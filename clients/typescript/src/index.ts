export { Backoff, Jobfair } from './client.js'
export type { ActivateOptions, ClientOptions, Completion, FailOptions, StreamOptions } from './client.js'
export {
  Conflict,
  Forbidden,
  InvalidArgument,
  JobfairError,
  NotFound,
  OutcomeUnknown,
  ProblemError,
  ResourceExhausted,
  StaleActivation,
  Unauthorized,
} from './errors.js'
export { parseJson, stringifyJson } from './json.js'
export { readSse } from './sse.js'
export type { SseEvent } from './sse.js'
export { BusinessError } from './types.js'
export type { Job, JobRef, JobState, JobTypeConfig, KeyConfig, NewJob, RateLimit, TenantConfig, Variables } from './types.js'
export { Worker } from './worker.js'
export type { Handler, HandlerResult, Logger, WorkerOptions, WorkerStats } from './worker.js'
