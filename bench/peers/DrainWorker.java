// W2 through the Java client's worker (bench.peers): `java DrainWorker CONCURRENCY BASE JOBS`
// drains JOBS ready jobs of type "bench" with a handler that does nothing, and prints one
// JSON line: jobs completed, seconds from the worker's start until the last completion was
// acknowledged, and this process's CPU seconds over that time.
import dev.jobfair.client.Jobfair;
import dev.jobfair.client.Worker;
import java.lang.management.ManagementFactory;

public final class DrainWorker {
    public static void main(String[] args) throws Exception {
        int concurrency = Integer.parseInt(args[0]);
        String base = args[1];
        int jobs = Integer.parseInt(args[2]);
        Jobfair jf = new Jobfair(base);
        jf.activate("warmup", new Jobfair.Activate(1, 60_000, -1L)); // a first request of its own
        var os = (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        long cpu0 = os.getProcessCpuTime();
        long t0 = System.nanoTime();
        Worker worker = new Worker(jf, "bench", job -> null, new Worker.Options().concurrency(concurrency));
        Thread running = new Thread(worker::run, "drain-worker");
        running.start();
        while (worker.stats.completed.get() < jobs && running.isAlive()) Thread.sleep(2);
        double seconds = (System.nanoTime() - t0) / 1e9;
        double cpuSeconds = (os.getProcessCpuTime() - cpu0) / 1e9;
        worker.stop();
        running.join();
        System.out.println("{\"completed\": " + worker.stats.completed.get() + ", \"seconds\": " + seconds
                + ", \"cpuSeconds\": " + cpuSeconds + "}");
        System.exit(0);
    }
}
