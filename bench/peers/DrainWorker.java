// W2 through the Java client's worker (bench.peers): `java DrainWorker CONCURRENCY BASE JOBS WARM`
// drains WARM + JOBS ready jobs of type "bench" with a handler that does nothing. It prints
// "warm" once WARM of them are acknowledged (the JIT has compiled the worker's paths by
// then), then one JSON line: jobs completed in all, those completed after the warm-up,
// seconds from the warm-up's end until the last completion was acknowledged, and this
// process's CPU seconds over that time.
import dev.jobfair.client.Jobfair;
import dev.jobfair.client.Worker;
import java.lang.management.ManagementFactory;

public final class DrainWorker {
    public static void main(String[] args) throws Exception {
        int concurrency = Integer.parseInt(args[0]);
        String base = args[1];
        int jobs = Integer.parseInt(args[2]);
        int warm = Integer.parseInt(args[3]);
        Jobfair jf = new Jobfair(base);
        jf.activate("warmup", new Jobfair.Activate(1, 60_000, -1L)); // a first request of its own
        var os = (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        Worker worker = new Worker(jf, "bench", job -> null, new Worker.Options().concurrency(concurrency));
        Thread running = new Thread(worker::run, "drain-worker");
        running.start();
        while (worker.stats.completed.get() < warm && running.isAlive()) Thread.sleep(1);
        int c0 = worker.stats.completed.get();
        long cpu0 = os.getProcessCpuTime();
        long t0 = System.nanoTime();
        System.out.println("warm");
        System.out.flush();
        while (worker.stats.completed.get() < warm + jobs && running.isAlive()) Thread.sleep(1);
        double seconds = (System.nanoTime() - t0) / 1e9;
        double cpuSeconds = (os.getProcessCpuTime() - cpu0) / 1e9;
        int completed = worker.stats.completed.get();
        worker.stop();
        running.join();
        System.out.println("{\"completed\": " + completed + ", \"measured\": " + (completed - c0)
                + ", \"seconds\": " + seconds + ", \"cpuSeconds\": " + cpuSeconds + "}");
        System.exit(0);
    }
}
