// Run by tests/acceptance/test_camunda_js_sdk.py with Node: drives Camunda's JavaScript
// SDK (@camunda8/sdk, installed by `make test` under CAMUNDA_JS_PREFIX) against the
// Jobfair at ZEEBE_REST_ADDRESS, and prints one JSON line of what it saw.
// `node camunda_js_flow.cjs` runs the job calls one by one; `... auth TYPE OUTSIDE
// [assigned]` (tests/acceptance/test_camunda_sdk_auth.py) activates and completes the
// jobs of TYPE with the credentials the environment configures (CAMUNDA_AUTH_STRATEGY
// BASIC or OAUTH; with tenantFilter ASSIGNED if asked), then activates naming tenant
// OUTSIDE, which the key may not use.
const path = require('node:path')
const { createRequire } = require('node:module')

const load = createRequire(path.join(process.env.CAMUNDA_JS_PREFIX, 'package.json'))
const { Camunda8 } = load('@camunda8/sdk')

// How a call ended, in the SDK's own terms: "ok", or the error class and HTTP status.
async function outcome(call) {
  try {
    await call()
    return 'ok'
  } catch (e) {
    return `${e.constructor.name} ${e.statusCode ?? e.response?.statusCode}`
  }
}

async function main() {
  const rest = new Camunda8().getCamundaRestClient()
  const seen = {}
  seen.clusterSize = (await rest.getTopology()).clusterSize
  const jobs = await rest.activateJobs({
    type: 'js', maxJobsToActivate: 3, timeout: 30000, requestTimeout: -1, worker: 'node',
  })
  seen.activated = jobs.map((j) => j.jobKey)
  seen.firstVariables = jobs[0].variables
  const [paid, declined, third] = jobs
  seen.complete = await outcome(() => rest.completeJob({ jobKey: paid.jobKey, variables: { paid: true } }))
  seen.fail = await outcome(() => rest.failJob({
    jobKey: declined.jobKey, retries: 2, errorMessage: 'card declined', retryBackOff: 60000,
  }))
  // The activated job's own helper, as a worker written against the SDK would finish it.
  seen.jobComplete = await outcome(() => third.complete({ by: 'job.complete' }))
  // A stale worker finishing a job that is already finished: the SDK's 409.
  seen.completeAgain = await outcome(() => rest.completeJob({ jobKey: paid.jobKey }))
  seen.failAgain = await outcome(() => rest.failJob({ jobKey: declined.jobKey, retries: 1 }))
  seen.missing = await outcome(() => rest.completeJob({ jobKey: '4242' }))
  console.log(JSON.stringify(seen))
}

async function auth(type, outside, assigned) {
  const rest = new Camunda8().getCamundaRestClient()
  const seen = {}
  // No tenantIds here: the SDK sends [CAMUNDA_TENANT_ID] (by default '<default>'), which
  // tenantFilter ASSIGNED ("the tenants assigned to me") overrides.
  const tenants = assigned ? { tenantFilter: 'ASSIGNED' } : {}
  const jobs = await rest.activateJobs({
    type, maxJobsToActivate: 10, timeout: 30000, requestTimeout: -1, ...tenants,
  })
  seen.activated = jobs.map((j) => [j.jobKey, j.tenantId]).sort()
  seen.completed = []
  for (const job of jobs) seen.completed.push(await outcome(() => rest.completeJob({ jobKey: job.jobKey })))
  seen.outside = await outcome(() => rest.activateJobs({
    type, maxJobsToActivate: 10, timeout: 30000, requestTimeout: -1, tenantIds: [outside],
  }))
  // What the SDK put on its requests: "Basic ...", or "Bearer <the token it fetched>".
  const [scheme, credentials] = (await rest.getHeaders()).authorization.split(' ')
  seen.scheme = scheme
  seen.accessToken = scheme === 'Bearer' ? credentials : null
  console.log(JSON.stringify(seen))
}

const [mode, ...args] = process.argv.slice(2)
const run = mode === 'auth' ? () => auth(args[0], args[1], args[2] === 'assigned') : main
run().catch((e) => {
  console.error(e)
  process.exit(1)
})
