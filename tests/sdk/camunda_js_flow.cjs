// Run by tests/acceptance/test_camunda_js_sdk.py with Node: drives Camunda's JavaScript
// SDK (@camunda8/sdk, installed by `make test` under CAMUNDA_JS_PREFIX) against the
// Jobfair at ZEEBE_REST_ADDRESS, and prints one JSON line of what it saw.
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

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
