/**
 * OpenTelemetry, where the application has it (the optional peer dependency
 * `@opentelemetry/api`, with a tracer provider, a context manager and the W3C propagator
 * registered, as its SDK's `register()` does): creates and finishes carry the active span
 * as a `traceparent` header, and a worker runs each handler in a span ("<type> process")
 * whose parent is the trace the job keeps (its `customHeaders.traceparent`, which the
 * server fills from the producer's header), linked to it too. One trace then spans
 * producer -> server -> worker (docs/tracing.md). Without the API installed, both are
 * no-ops; with it and no SDK, the API's own no-ops.
 */
import type { Job } from './types.js'

type Api = typeof import('@opentelemetry/api')

let loaded: Promise<Api | null> | undefined

/** The API module, once; null when it is not installed. */
function api(): Promise<Api | null> {
  loaded ??= import('@opentelemetry/api').then(
    (m) => m as Api,
    () => null,
  )
  return loaded
}

/** The active context as headers (`traceparent`, `tracestate`); none without a span. */
export async function traceHeaders(): Promise<Record<string, string>> {
  const otel = await api()
  if (!otel) return {}
  const carrier: Record<string, string> = {}
  otel.propagation.inject(otel.context.active(), carrier)
  return carrier
}

/** `run` inside the span of `job`'s trace. */
export async function inJobSpan<T>(job: Job, run: () => Promise<T>): Promise<T> {
  const otel = await api()
  if (!otel) return run()
  const kept = job.customHeaders?.traceparent
  const parent =
    typeof kept === 'string' ? otel.propagation.extract(otel.ROOT_CONTEXT, { traceparent: kept }) : otel.context.active()
  const linked = otel.trace.getSpanContext(parent)
  const options = {
    kind: otel.SpanKind.CONSUMER,
    links: linked && otel.trace.isSpanContextValid(linked) ? [{ context: linked }] : [],
    attributes: {
      'jobfair.job_key': job.jobKey,
      'jobfair.type': job.type,
      'jobfair.tenant': job.tenantId,
      'jobfair.activation_count': job.activationCount,
    },
  }
  return otel.trace.getTracer('jobfair-client').startActiveSpan(`${job.type} process`, options, parent, async (span) => {
    try {
      return await run()
    } finally {
      span.end()
    }
  })
}
