// Two tenants, one queue: a flood of 1,000 jobs, then a trickle of 10.
// Build the client (cd clients/typescript && npm install && npm run build), then
//   node clients/examples/two_tenants.mjs [URL]
// With a FIFO queue the trickle's jobs would wait behind the whole flood; Jobfair's fair
// share hands them out within the first few dozen activations.
import { randomUUID } from 'node:crypto'
import { Jobfair, Worker } from '../typescript/dist/index.js'

const FLOOD = 1000
const TRICKLE = 10
const jf = new Jobfair(process.argv[2] ?? 'http://127.0.0.1:8080')
const type = `demo-${randomUUID().slice(0, 8)}`

await jf.createJobs(Array.from({ length: FLOOD }, () => ({ type, tenantId: 'flood' })))
await jf.createJobs(Array.from({ length: TRICKLE }, () => ({ type, tenantId: 'trickle' })))
console.log(`queued ${FLOOD} jobs of tenant 'flood', then ${TRICKLE} of tenant 'trickle'`)

const order = []
let finished
const done = new Promise((resolve) => (finished = resolve))
const worker = new Worker(jf, type, (job) => {
  order.push(job.tenantId)
  if (order.length === FLOOD + TRICKLE) finished()
}, { concurrency: 4, requestTimeoutMs: 1000 })
const running = worker.run()
await done
worker.stop()
await running

const positions = order.flatMap((tenant, i) => (tenant === 'trickle' ? [i + 1] : []))
console.log(`trickle jobs were handled at positions [${positions.join(', ')}] of ${order.length}`)
console.log(`TRICKLE_DONE_BY=${positions.at(-1)} (a FIFO queue would need ${FLOOD + TRICKLE})`)
