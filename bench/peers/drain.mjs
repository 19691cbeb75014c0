// W2 through the TypeScript client's worker (bench.peers): `node drain.mjs CONCURRENCY BASE JOBS WARM`
// drains WARM + JOBS ready jobs of type "bench" with a handler that does nothing. It prints
// "warm" once WARM of them are acknowledged (V8 has compiled the worker's paths by then),
// then one JSON line: jobs completed in all, those completed after the warm-up, seconds
// from the warm-up's end until the last completion was acknowledged, and this process's
// CPU seconds over that time.
import { Jobfair, Worker } from '../../clients/typescript/dist/index.js'

const [concurrency, base, jobs, warm] = [
  Number(process.argv[2]),
  process.argv[3],
  Number(process.argv[4]),
  Number(process.argv[5]),
]
const jf = new Jobfair(base)
await jf.activate('warmup', { maxJobs: 1, requestTimeoutMs: -1 }) // a first request of its own
const worker = new Worker(jf, 'bench', async () => undefined, { concurrency })
const running = worker.run()
const reached = (n) =>
  new Promise((resolve) => {
    const check = setInterval(() => {
      if (worker.stats.completed >= n) {
        clearInterval(check)
        resolve()
      }
    }, 1)
  })
await reached(warm)
const c0 = worker.stats.completed
const cpu0 = process.cpuUsage()
const t0 = performance.now()
console.log('warm')
await reached(warm + jobs)
const seconds = (performance.now() - t0) / 1000
const cpu = process.cpuUsage(cpu0)
const completed = worker.stats.completed
worker.stop()
await running
console.log(
  JSON.stringify({ completed, measured: completed - c0, seconds, cpuSeconds: (cpu.user + cpu.system) / 1e6 }),
)
