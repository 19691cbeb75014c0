// W2 through the TypeScript client's worker (bench.peers): `node drain.mjs CONCURRENCY BASE JOBS`
// drains JOBS ready jobs of type "bench" with a handler that does nothing, and prints one
// JSON line: jobs completed, seconds from the worker's start until the last completion was
// acknowledged, and this process's CPU seconds over that time.
import { Jobfair, Worker } from '../../clients/typescript/dist/index.js'

const [concurrency, base, jobs] = [Number(process.argv[2]), process.argv[3], Number(process.argv[4])]
const jf = new Jobfair(base)
await jf.activate('warmup', { maxJobs: 1, requestTimeoutMs: -1 }) // warm-up: a first request of its own
const cpu0 = process.cpuUsage()
const t0 = performance.now()
const worker = new Worker(jf, 'bench', async () => undefined, { concurrency })
const running = worker.run()
await new Promise((resolve) => {
  const check = setInterval(() => {
    if (worker.stats.completed >= jobs) {
      clearInterval(check)
      resolve()
    }
  }, 2)
})
const seconds = (performance.now() - t0) / 1000
const cpu = process.cpuUsage(cpu0)
worker.stop()
await running
console.log(JSON.stringify({ completed: worker.stats.completed, seconds, cpuSeconds: (cpu.user + cpu.system) / 1e6 }))
