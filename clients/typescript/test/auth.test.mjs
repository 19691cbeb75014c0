// The client's API key against a Jobfair that requires keys, at each URL of
// JOBFAIR_AUTH_URLS (plain HTTP and HTTPS; the HTTPS server's CA is trusted through
// NODE_EXTRA_CA_CERTS): JOBFAIR_ADMIN_KEY may do everything, JOBFAIR_WORKER_KEY is a worker
// key scoped to tenant acme. Started by tests/acceptance/test_client_auth.py; skipped
// when those are not set (the main suite runs against a server without keys).
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { Jobfair, NotFound, Unauthorized } from '../dist/index.js'

const URLS = (process.env.JOBFAIR_AUTH_URLS ?? '').split(',').filter(Boolean)
const ADMIN = process.env.JOBFAIR_ADMIN_KEY
const WORKER = process.env.JOBFAIR_WORKER_KEY
const skip = URLS.length === 0 && 'JOBFAIR_AUTH_URLS is not set'

for (const url of URLS.length ? URLS : ['(none)']) {
  test(`keys: good, bad, and scoped to a tenant, at ${url.split(':')[0]}`, { skip }, async () => {
    const type = `ts-auth-${Date.now().toString(36)}`
    const admin = new Jobfair(url, { apiKey: ADMIN })
    const mine = await admin.createJob({ type, tenantId: 'acme' })
    const theirs = await admin.createJob({ type, tenantId: 'globex' })

    const worker = new Jobfair(url, { apiKey: WORKER })
    assert.equal((await worker.getJob(mine.jobKey)).tenantId, 'acme')
    // Another tenant's job is, to this key, a job that does not exist.
    await assert.rejects(worker.getJob(theirs.jobKey), NotFound)
    const jobs = await worker.activate(type, { maxJobs: 10, timeoutMs: 60_000, requestTimeoutMs: -1 })
    assert.deepEqual(jobs.map((j) => j.jobKey), [mine.jobKey])
    await worker.complete(jobs[0], { done: true })
    assert.equal((await admin.getJob(mine.jobKey)).state, 'COMPLETED')
    assert.equal((await admin.getJob(theirs.jobKey)).state, 'CREATED')

    const bad = new Jobfair(url, { apiKey: WORKER.slice(0, -1) + (WORKER.endsWith('x') ? 'y' : 'x') })
    await assert.rejects(bad.getJob(mine.jobKey), (err) => err instanceof Unauthorized && err.status === 401)
    await assert.rejects(new Jobfair(url).getJob(mine.jobKey), Unauthorized)
  })
}
