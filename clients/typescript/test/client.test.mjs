// The TypeScript client against a live Jobfair whose address is in JOBFAIR_URL (started,
// with embedded PostgreSQL, by tests/acceptance/test_client_typescript.py). The server
// runs its lease sweep and promotion every 50 ms and admits 3 waiting long polls.
import assert from 'node:assert/strict'
import http from 'node:http'
import { test } from 'node:test'

import { BusinessError, Conflict, InvalidArgument, Jobfair, JobfairError, NotFound, OutcomeUnknown, ResourceExhausted, StaleActivation, Worker, Backoff } from '../dist/index.js'

const URL = process.env.JOBFAIR_URL
assert.ok(URL, 'JOBFAIR_URL must point at a running Jobfair')
const jf = new Jobfair(URL)
// A suffix per run: job types of an earlier run against the same server never mix in.
const RUN = Date.now().toString(36)

async function statesOf(keys) {
  const counts = {}
  for (const k of keys) {
    const { state } = await jf.getJob(k)
    counts[state] = (counts[state] ?? 0) + 1
  }
  return counts
}

/** Until the server holds `n` long polls (its /metrics gauge; there is no event to await). */
async function untilWaiting(n) {
  for (;;) {
    const metrics = await (await fetch(`${URL}/metrics`)).text()
    if (Number(/^jobfair_waiters (\d+)(?:\.0)?$/m.exec(metrics)?.[1]) >= n) return
    await new Promise((r) => setTimeout(r, 10))
  }
}

function deferred() {
  let resolve
  const promise = new Promise((r) => (resolve = r))
  return { promise, resolve }
}

test('producer API and typed errors', async () => {
  const job = await jf.createJob({ type: `ts-mail-${RUN}`, tenantId: 'acme', priority: 70, variables: { to: 'a@b' } })
  assert.equal(job.state, 'CREATED')
  assert.equal(job.priority, 70)
  assert.equal(job.fairnessKey, '<default>')
  assert.equal(job.cost, 1)
  const keyed = await jf.createJob({ type: `ts-other-${RUN}`, fairnessKey: 'user:7', cost: 2.5 })
  assert.equal(keyed.fairnessKey, 'user:7')
  assert.equal(keyed.cost, 2.5)
  const a = await jf.createJob({ type: `ts-mail-${RUN}`, idempotencyKey: 'k1' })
  const b = await jf.createJob({ type: `ts-mail-${RUN}`, idempotencyKey: 'k1' })
  assert.equal(a.jobKey, b.jobKey)
  const keys = await jf.createJobs([0, 1, 2].map((n) => ({ type: `ts-mail-${RUN}`, variables: { n } })))
  assert.deepEqual((await jf.getJob(keys[2])).variables, { n: 2 })
  await jf.cancelJob(keys[0])
  assert.equal((await jf.getJob(keys[0])).state, 'CANCELED')
  await assert.rejects(jf.cancelJob(keys[0]), Conflict)
  await assert.rejects(jf.getJob('4242'), (err) => err instanceof NotFound && err.type === 'urn:jobfair:not-found')
  await assert.rejects(jf.createJob({ type: 'no spaces' }), InvalidArgument)

  const [active] = await jf.activate(`ts-mail-${RUN}`, { requestTimeoutMs: -1 })
  await jf.extendLease(active, 120_000)
  await jf.complete(active, { sent: true })
  await assert.rejects(jf.complete({ jobKey: active.jobKey, activationCount: active.activationCount + 1 }), StaleActivation)
  await assert.rejects(jf.complete(active), Conflict)
  assert.equal((await jf.getJob(active.jobKey)).state, 'COMPLETED')
})

test('64-bit integers in variables round-trip exactly, polled and streamed', async () => {
  const type = `ts-big-${RUN}`
  const big = { max: 2n ** 63n - 1n, min: -(2n ** 63n), beyond: 9007199254740993n, small: 7 }
  const created = await jf.createJob({ type, variables: big })
  assert.deepEqual(created.variables, big)
  const [polled] = await jf.activate(type, { requestTimeoutMs: -1 })
  assert.deepEqual(polled.variables, big)
  await jf.complete(polled, { result: 2n ** 62n + 1n })
  assert.deepEqual((await jf.getJob(created.jobKey)).variables, { ...big, result: 2n ** 62n + 1n })
  await jf.createJob({ type, variables: big })
  for await (const job of jf.stream(type, { credit: 1 })) {
    assert.deepEqual(job.variables, big)
    await jf.complete(job)
    break
  }
})

for (const mode of ['poll', 'stream']) {
  test(`4 handlers drain 1,000 jobs, each exactly once (${mode})`, async () => {
    const type = `ts-drain-${mode}-${RUN}`
    const keys = await jf.createJobs(Array.from({ length: 1000 }, (_, i) => ({ type, tenantId: `t${i % 3}` })))
    const seen = new Map()
    let running = 0
    let peak = 0
    const all = deferred()
    const worker = new Worker(jf, type, async (job) => {
      running++
      peak = Math.max(peak, running)
      seen.set(job.jobKey, (seen.get(job.jobKey) ?? 0) + 1)
      await new Promise((r) => setImmediate(r))
      running--
      if (seen.size === 1000) all.resolve()
      return { handled: 1 }
    }, { concurrency: 4, mode, requestTimeoutMs: 1000 })
    const run = worker.run()
    await all.promise
    worker.stop()
    await run
    assert.equal(seen.size, 1000)
    assert.deepEqual(new Set(seen.values()), new Set([1]))
    assert.deepEqual(new Set(seen.keys()), new Set(keys))
    assert.ok(peak <= 4, `peak ${peak}`)
    assert.equal(worker.stats.completed, 1000)
    assert.deepEqual(await statesOf(keys), { COMPLETED: 1000 })
  })
}

/** Counts the requests this process sends to each kind of path while `body` runs. */
async function countingRequests(body) {
  const counts = { batch: 0, single: 0, activate: [] }
  const real = globalThis.fetch
  globalThis.fetch = (url, init) => {
    const path = new globalThis.URL(url).pathname
    if (path === '/v2/jobs/complete') counts.batch++
    else if (/^\/v2\/jobs\/\d+\/complete$/.test(path)) counts.single++
    else if (path === '/v2/jobs/activate') counts.activate.push(JSON.parse(init.body).maxJobs)
    return real(url, init)
  }
  try {
    await body()
  } finally {
    globalThis.fetch = real
  }
  return counts
}

async function drainCounting(type, n, options) {
  const keys = await jf.createJobs(Array.from({ length: n }, () => ({ type })))
  const seen = new Map()
  let running = 0
  let peak = 0
  const all = deferred()
  const worker = new Worker(jf, type, async (job) => {
    running++
    peak = Math.max(peak, running)
    seen.set(job.jobKey, (seen.get(job.jobKey) ?? 0) + 1)
    await new Promise((r) => setTimeout(r, 1))
    running--
    if (seen.size === n) all.resolve()
    return { n: seen.size }
  }, { concurrency: 20, requestTimeoutMs: 1000, ...options })
  const counts = await countingRequests(async () => {
    const run = worker.run()
    await all.promise
    worker.stop()
    await run
  })
  assert.deepEqual(new Set(seen.values()), new Set([1]))
  assert.ok(peak <= 20, `peak ${peak}`)
  assert.ok(Math.max(...counts.activate) <= 20, counts.activate.join())
  assert.equal(worker.stats.completed, n)
  assert.equal(worker.stats.conflicts, 0)
  assert.deepEqual(await statesOf(keys), { COMPLETED: n })
  return counts
}

test('completions go in batches, one per job otherwise (batchCompletion: false)', async () => {
  const batched = await drainCounting(`ts-batch-${RUN}`, 200, {})
  assert.equal(batched.single, 0)
  assert.ok(batched.batch >= 1 && batched.batch < 200, `${batched.batch} batches`)
  const single = await drainCounting(`ts-single-${RUN}`, 60, { batchCompletion: false })
  assert.deepEqual([single.single, single.batch], [60, 0])
})

test('a batch of completions has a verdict per job: a stale one is 409, the others 204', async () => {
  const type = `ts-verdicts-${RUN}`
  await jf.createJobs([0, 1, 2].map((n) => ({ type, variables: { n } })))
  const [a, b, c] = (await jf.activate(type, { maxJobs: 3, requestTimeoutMs: -1 })).sort((x, y) => x.variables.n - y.variables.n)
  await jf.complete(a)
  const stale = { jobKey: c.jobKey, activationCount: c.activationCount + 1 }
  assert.deepEqual(await jf.completeMany([a, { job: b, variables: { done: true } }, stale]), [409, 204, 409])
  assert.deepEqual(await jf.completeMany([{ job: c }, b]), [204, 409])
  assert.deepEqual((await jf.getJob(b.jobKey)).variables, { n: 1, done: true })
  assert.deepEqual(await statesOf([a.jobKey, b.jobKey, c.jobKey]), { COMPLETED: 3 })
})

test('a handler exception fails the job and it is retried', async () => {
  const job = await jf.createJob({ type: `ts-flaky-${RUN}`, retries: 3 })
  const attempts = []
  const done = deferred()
  const worker = new Worker(jf, `ts-flaky-${RUN}`, (j) => {
    attempts.push(j.activationCount)
    if (j.activationCount === 1) throw new Error('first try breaks')
    done.resolve()
    return { ok: true }
  }, { requestTimeoutMs: 500, failBackoff: new Backoff(100, 2, 1000) })
  const run = worker.run()
  await done.promise
  worker.stop()
  await run
  const after = await jf.getJob(job.jobKey)
  assert.deepEqual(attempts, [1, 2])
  assert.equal(after.state, 'COMPLETED')
  assert.equal(after.retries, 2)
  assert.equal(after.errorMessage, 'Error: first try breaks')
})

test('a BusinessError result throws a job error', async () => {
  const job = await jf.createJob({ type: `ts-pay-${RUN}` })
  const called = deferred()
  const worker = new Worker(jf, `ts-pay-${RUN}`, () => {
    called.resolve()
    return new BusinessError('CARD_DECLINED', 'insufficient funds', { declined: true })
  }, { requestTimeoutMs: 500 })
  const run = worker.run()
  await called.promise
  worker.stop()
  await run
  const after = await jf.getJob(job.jobKey)
  assert.equal(after.state, 'ERROR_THROWN')
  assert.equal(after.errorCode, 'CARD_DECLINED')
})

test('a slow handler keeps its lease by heartbeat', async () => {
  // Lease 600 ms, handler 2.5 s, lease sweep every 50 ms: without the heartbeat a rival
  // polling for the job would get it.
  const job = await jf.createJob({ type: `ts-slow-${RUN}` })
  const started = deferred()
  let finished = false
  const worker = new Worker(jf, `ts-slow-${RUN}`, async (j) => {
    started.resolve()
    await new Promise((r) => setTimeout(r, 2500))
    finished = true
    return { count: j.activationCount }
  }, { timeoutMs: 600, requestTimeoutMs: 500 })
  const run = worker.run()
  await started.promise
  const rivalSaw = []
  while (!finished) rivalSaw.push(...(await jf.activate(`ts-slow-${RUN}`, { requestTimeoutMs: 200 })))
  worker.stop()
  await run
  const after = await jf.getJob(job.jobKey)
  assert.deepEqual(rivalSaw, [])
  assert.equal(after.state, 'COMPLETED')
  assert.equal(after.activationCount, 1)
  assert.equal(worker.stats.conflicts, 0)
})

test('shutdown mid-drain loses nothing', async () => {
  const keys = await jf.createJobs(Array.from({ length: 200 }, () => ({ type: `ts-shut-${RUN}` })))
  const handled = new Map()
  const twenty = deferred()
  const everything = deferred()
  const handler = async (j) => {
    await new Promise((r) => setTimeout(r, 20))
    handled.set(j.jobKey, (handled.get(j.jobKey) ?? 0) + 1)
    if (handled.size >= 20) twenty.resolve()
    if (handled.size === 200) everything.resolve()
  }
  const first = new Worker(jf, `ts-shut-${RUN}`, handler, { concurrency: 4, requestTimeoutMs: 500 })
  const run1 = first.run()
  await twenty.promise
  first.stop()
  await run1
  const afterStop = await statesOf(keys)
  assert.equal(afterStop.ACTIVATED, undefined, JSON.stringify(afterStop))
  assert.ok(first.stats.completed < 200)
  const second = new Worker(jf, `ts-shut-${RUN}`, handler, { concurrency: 4, requestTimeoutMs: 500 })
  const run2 = second.run()
  await everything.promise
  second.stop()
  await run2
  // Nothing of the workers outlives run(): a pending timer would keep a process alive.
  assert.ok(!process.getActiveResourcesInfo().includes('Timeout'), process.getActiveResourcesInfo().join())
  assert.deepEqual(new Set(handled.values()), new Set([1]))
  assert.deepEqual(await statesOf(keys), { COMPLETED: 200 })
})

test('a 503 is retried no sooner than Retry-After; other 4xx are not', async () => {
  // The server admits 3 waiting long polls: hold them all for 1.5 s.
  const hold = () => fetch(`${URL}/v2/jobs/activate`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ type: `ts-idle-${RUN}`, maxJobs: 1, timeout: 1000, requestTimeout: 1500 }),
  }).then((r) => r.json())
  const holders = [hold(), hold(), hold()]
  await untilWaiting(3)
  const impatient = new Jobfair(URL, { maxAttempts: 1 })
  await assert.rejects(impatient.activate(`ts-later-${RUN}`, { requestTimeoutMs: 5000 }), (err) => err instanceof ResourceExhausted && err.retryAfterS === 1)
  const patient = new Jobfair(URL)
  const later = patient.activate(`ts-later-${RUN}`, { requestTimeoutMs: 10_000 })
  assert.deepEqual(await Promise.all(holders), [{ jobs: [] }, { jobs: [] }, { jobs: [] }])
  await jf.createJob({ type: `ts-later-${RUN}` })
  const jobs = await later
  assert.equal(jobs.length, 1)
  assert.ok(patient.retried >= 1)
  const strict = new Jobfair(URL)
  await assert.rejects(strict.activate('bad type!'), InvalidArgument)
  assert.equal(strict.retried, 0)
})

test('the API key is sent as a bearer token', async () => {
  // Jobfair's own auth is not built yet: a plain HTTP server records the header.
  let seen
  const server = http.createServer((req, res) => {
    seen = req.headers.authorization
    req.resume()
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end('{"jobs": []}'))
  })
  await new Promise((r) => server.listen(0, '127.0.0.1', r))
  const { port } = server.address()
  const keyed = new Jobfair(`http://127.0.0.1:${port}`, { apiKey: 'jf_secret' })
  assert.deepEqual(await keyed.activate('t', { requestTimeoutMs: -1 }), [])
  server.close()
  assert.equal(seen, 'Bearer jf_secret')
})

test('an unknown outcome is retried only where sending twice is safe', async () => {
  // A plain HTTP server answers the first call of each path as a server whose database
  // went away at commit would, then accepts.
  const calls = {}
  const bodies = []
  const server = http.createServer((req, res) => {
    let text = ''
    req.on('data', (chunk) => (text += chunk))
    req.on('end', () => {
      bodies.push(text)
      calls[req.url] = (calls[req.url] ?? 0) + 1
      if (calls[req.url] === 1) {
        const problem = { type: 'urn:jobfair:outcome-unknown', title: 'OUTCOME_UNKNOWN', status: 503, detail: 'lost at commit' }
        res.writeHead(503, { 'content-type': 'application/problem+json' }).end(JSON.stringify(problem))
      } else {
        res.writeHead(201, { 'content-type': 'application/json' }).end('{"jobKey": "1", "state": "CREATED"}')
      }
    })
  })
  await new Promise((r) => server.listen(0, '127.0.0.1', r))
  const { port } = server.address()
  const bare = new Jobfair(`http://127.0.0.1:${port}`, { backoff: new Backoff(1, 1, 1), idempotentCreates: false })
  // No idempotency key (the client's own turned off): a second create could make a
  // second job; the caller decides.
  await assert.rejects(bare.createJob({ type: 't' }), (err) => err instanceof OutcomeUnknown && err.retryAfterS === undefined)
  assert.equal(calls['/v2/jobs'], 1)
  assert.equal(JSON.parse(bodies[0]).idempotencyKey, undefined)
  calls['/v2/jobs'] = 0
  // With one, a retry finds the job the first call may have made.
  assert.equal((await bare.createJob({ type: 't', idempotencyKey: 'k' })).jobKey, '1')
  assert.equal(calls['/v2/jobs'], 2)
  // By default the client gives a create a key of its own, the same in each attempt.
  calls['/v2/jobs'] = 0
  bodies.length = 0
  const client = new Jobfair(`http://127.0.0.1:${port}`, { backoff: new Backoff(1, 1, 1) })
  assert.equal((await client.createJob({ type: 't' })).jobKey, '1')
  assert.equal(calls['/v2/jobs'], 2)
  const [first, second] = bodies.map((b) => JSON.parse(b).idempotencyKey)
  assert.match(first, /^auto-[0-9a-f]{32}$/)
  assert.equal(first, second)
  server.close()
})

test('connection errors are retried until the server is up', async () => {
  const probe = http.createServer()
  await new Promise((r) => probe.listen(0, '127.0.0.1', r))
  const { port } = probe.address()
  await new Promise((r) => probe.close(r)) // nothing listens there now
  const client = new Jobfair(`http://127.0.0.1:${port}`, { backoff: new Backoff(100, 2, 1000) })
  const call = client.activate('t', { requestTimeoutMs: -1 })
  while (client.retried < 1) await new Promise((r) => setTimeout(r, 10)) // the client's counter
  const server = http.createServer((req, res) => {
    req.resume()
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end('{"jobs": []}'))
  })
  await new Promise((r) => server.listen(port, '127.0.0.1', r))
  assert.deepEqual(await call, [])
  server.close()
  assert.ok(client.retried >= 1)
})

test('configuration round-trips every field, and bad values are InvalidArgument', async () => {
  const tenant = `cfg-${RUN}`.slice(0, 31)
  assert.equal((await jf.getTenant(tenant)).configured, false)
  const put = await jf.putTenant(tenant, { weight: 3, maxActiveJobs: 10, minActiveJobs: 2, rateLimit: { perSecond: 5, burst: 10 } })
  assert.deepEqual([put.weight, put.maxActiveJobs, put.minActiveJobs, put.rateLimit.perSecond, put.rateLimit.burst, put.configured], [3, 10, 2, 5, 10, true])
  // A record read back puts back as it is (its answered fields are not sent).
  const read = await jf.getTenant(tenant)
  assert.equal((await jf.putTenant(tenant, read)).minActiveJobs, 2)
  await assert.rejects(jf.putTenant(tenant, { ...read, minActiveJobs: 11 }), (err) => err instanceof InvalidArgument && /minActiveJobs/.test(err.detail))
  assert.equal((await jf.getTenant(tenant)).minActiveJobs, 2)
  // The whole configuration: what is left out is cleared.
  const cleared = await jf.putTenant(tenant, { weight: 2 })
  assert.deepEqual([cleared.maxActiveJobs, cleared.minActiveJobs, cleared.rateLimit], [null, null, null])

  // '.' and '..' are valid names that fetch cannot put in a path: refused, not misdirected.
  await assert.rejects(jf.putTenant('..', { weight: 7 }), (err) => err instanceof JobfairError && /cannot be sent/.test(err.message))
  await assert.rejects(jf.getKey(tenant, '.'), JobfairError)
  assert.equal((await jf.getTenant(tenant)).weight, 2)

  const key = await jf.putKey(tenant, 'user:7', { weight: 4, maxActiveJobs: 1 })
  assert.deepEqual([key.weight, key.maxActiveJobs, key.configured], [4, 1, true])
  assert.equal((await jf.getKey(tenant, 'user:7')).maxActiveJobs, 1)

  const type = `billing/ts-${RUN}` // a type may have a '/'
  const fifo = { maxActiveJobs: 50, agingIntervalMs: 1000, agingStep: 5, fairnessBy: 'cost', maxActivePerKey: 2, keyOrdering: 'fifo' }
  const got = await jf.putJobType(type, fifo)
  for (const [field, value] of Object.entries(fifo)) assert.equal(got[field], value, field)
  assert.equal((await jf.getJobType(type)).keyOrdering, 'fifo')
  await assert.rejects(jf.putJobType(type, { ...fifo, keyOrdering: 'lifo' }), (err) => err instanceof InvalidArgument && /keyOrdering/.test(err.detail))
  await assert.rejects(jf.putJobType(type, { ...fifo, maxActivePerKey: 0 }), (err) => err instanceof InvalidArgument && /maxActivePerKey/.test(err.detail))
  assert.equal((await jf.getJobType(type)).maxActivePerKey, 2)
})

test('creates whose answers are lost are made once each', { skip: !process.env.JOBFAIR_DROPPING_URL && 'JOBFAIR_DROPPING_URL is not set' }, async () => {
  // A proxy resets the connection of every other create once the server has answered
  // it (tests/answer_dropper.py): the jobs were made, and the client cannot know it.
  const dropping = new Jobfair(process.env.JOBFAIR_DROPPING_URL, { backoff: new Backoff(1, 5, 1) })
  const type = `ts-idem-${RUN}`
  const keys = []
  for (let i = 0; i < 10; i++) keys.push((await dropping.createJob({ type, tenantId: 't' })).jobKey)
  for (let i = 0; i < 3; i++) keys.push(...(await dropping.createJobs(Array.from({ length: 10 }, () => ({ type, tenantId: 't' })))))
  assert.ok(dropping.retried >= 5, `${dropping.retried} retries`)
  assert.equal(new Set(keys).size, 40)
  const made = await (await fetch(`${URL}/v2/jobs?type=${type}&limit=1000`)).json()
  assert.deepEqual(made.items.map((j) => j.jobKey).sort(), [...keys].sort())
})

test('one trace from the producer to the worker, with OpenTelemetry', async () => {
  const { context, propagation, trace } = await import('@opentelemetry/api')
  const { AsyncLocalStorageContextManager } = await import('@opentelemetry/context-async-hooks')
  const { W3CTraceContextPropagator } = await import('@opentelemetry/core')
  const { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } = await import('@opentelemetry/sdk-trace-base')
  const exporter = new InMemorySpanExporter()
  trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }))
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable())
  propagation.setGlobalPropagator(new W3CTraceContextPropagator())
  try {
    const type = `ts-trace-${RUN}`
    const producer = await trace.getTracer('producer').startActiveSpan('signup', async (span) => {
      await jf.createJob({ type, tenantId: 'acme' })
      span.end()
      return span
    })
    let seen
    let kept
    const worker = new Worker(jf, type, async (job) => {
      seen = trace.getActiveSpan()?.spanContext().traceId
      kept = job.customHeaders.traceparent
      worker.stop()
    }, { concurrency: 1, batchCompletion: false })
    await worker.run()
    const traceId = producer.spanContext().traceId
    // The server kept the producer's context (traced off there) and handed it over.
    assert.equal(kept, `00-${traceId}-${producer.spanContext().spanId}-01`)
    const handled = exporter.getFinishedSpans().find((s) => s.name === `${type} process`)
    assert.ok(handled, exporter.getFinishedSpans().map((s) => s.name).join(', '))
    assert.equal(handled.spanContext().traceId, traceId)
    assert.equal(seen, traceId) // the handler ran in it
    assert.equal(handled.parentSpanContext?.spanId ?? handled.parentSpanId, producer.spanContext().spanId)
    assert.equal(handled.links[0].context.traceId, traceId)
    assert.equal(handled.attributes['jobfair.type'], type)
  } finally {
    trace.disable()
    context.disable()
    propagation.disable()
  }
})
