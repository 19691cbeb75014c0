package dev.jobfair.client;

import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * A job worker: a handler per job on a fixed pool of {@code concurrency} platform threads,
 * fed by long polling or an SSE stream.
 *
 * <p>The handler's return value completes the job (a map becomes its variables); an
 * exception, or a result with no JSON form (NaN), fails it with {@code retries - 1} and an
 * exponential back-off; a
 * {@link BusinessError} throws a job error. A 409 on finishing means this worker's
 * activation is no longer current: logged and dropped, never retried. Long handlers keep
 * their lease by heartbeat. {@link #stop()} stops activating, gives handlers the grace
 * period and releases the jobs of those still running.
 */
public final class Worker {
    /** Returns the variables to complete the job with (or null); throws to fail it. */
    @FunctionalInterface
    public interface Handler {
        Map<String, Object> handle(Job job) throws Exception;
    }

    public enum Mode { POLL, STREAM }

    public static final class Options {
        int concurrency = 4;
        Mode mode = Mode.POLL;
        long timeoutMs = 60_000;
        Long requestTimeoutMs;
        String name;
        List<String> tenantIds;
        Backoff failBackoff = new Backoff(1_000, 2, 300_000);
        boolean heartbeat = true;
        long shutdownGraceMs = 30_000;

        public Options concurrency(int n) { if (n < 1) throw new IllegalArgumentException("concurrency >= 1"); concurrency = n; return this; }
        public Options mode(Mode m) { mode = m; return this; }
        public Options timeoutMs(long ms) { timeoutMs = ms; return this; }
        public Options requestTimeoutMs(long ms) { requestTimeoutMs = ms; return this; }
        public Options name(String n) { name = n; return this; }
        public Options tenantIds(List<String> ids) { tenantIds = ids; return this; }
        public Options failBackoff(Backoff b) { failBackoff = b; return this; }
        public Options heartbeat(boolean on) { heartbeat = on; return this; }
        public Options shutdownGraceMs(long ms) { shutdownGraceMs = ms; return this; }
    }

    public static final class Stats {
        public final AtomicInteger completed = new AtomicInteger();
        public final AtomicInteger failed = new AtomicInteger();
        public final AtomicInteger errorsThrown = new AtomicInteger();
        public final AtomicInteger conflicts = new AtomicInteger();
        public final AtomicInteger released = new AtomicInteger();
    }

    private static final Logger LOG = Logger.getLogger("dev.jobfair.client");
    private static final long STOP_ABORT_DELAY_MS = 250;

    public final Stats stats = new Stats();
    private final Jobfair client;
    private final String type;
    private final Handler handler;
    private final Options o;
    private final Semaphore slots;
    private final ExecutorService handlers;
    private final ScheduledExecutorService beats;
    private final Map<Job, Future<?>> inflight = new ConcurrentHashMap<>();
    private final AtomicReference<CompletableFuture<?>> activation = new AtomicReference<>();
    private final AtomicReference<AutoCloseable> stream = new AtomicReference<>();
    private volatile boolean stopping;

    public Worker(Jobfair client, String type, Handler handler, Options options) {
        this.client = client;
        this.type = type;
        this.handler = handler;
        this.o = options;
        this.slots = new Semaphore(options.concurrency);
        this.handlers = Executors.newFixedThreadPool(options.concurrency, r -> {
            Thread t = new Thread(r, "jobfair-handler");
            t.setDaemon(true);
            return t;
        });
        this.beats = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread t = new Thread(r, "jobfair-heartbeat");
            t.setDaemon(true);
            return t;
        });
    }

    /** Stop activating; {@link #run()} returns once in-flight jobs are finished or released. */
    public void stop() {
        if (stopping) return;
        stopping = true;
        slots.release(); // wake a poller waiting for a free slot
        // An activation answered this instant carries jobs the server counts as delivered:
        // cutting the connection then would strand them until their lease ends. So a request
        // in flight gets a moment to come back (its jobs are then handled); one still waiting
        // after that is cut, and the server releases what it activates for us meanwhile.
        beats.schedule(this::cutConnections, STOP_ABORT_DELAY_MS, TimeUnit.MILLISECONDS);
    }

    private void cutConnections() {
        CompletableFuture<?> pending = activation.get();
        if (pending != null) pending.cancel(true);
        AutoCloseable open = stream.get();
        if (open != null) {
            try {
                open.close();
            } catch (Exception ignored) {
                // closing a broken stream: nothing more to release
            }
        }
    }

    /** Blocks until {@link #stop()} has been called and in-flight jobs are done. */
    public void run() {
        try {
            if (o.mode == Mode.POLL) poll();
            else streamJobs();
        } finally {
            drain();
        }
    }

    private void poll() {
        int failures = 0;
        while (!stopping) {
            int free = slots.availablePermits();
            if (free <= 0) {
                slots.acquireUninterruptibly();
                slots.release();
                continue;
            }
            List<Job> jobs;
            try {
                jobs = client.activate(type, new Jobfair.Activate(free, o.timeoutMs, o.requestTimeoutMs, o.name, o.tenantIds),
                        activation::set);
                failures = 0;
            } catch (JobfairException e) {
                if (stopping) return;
                failures++;
                LOG.log(Level.WARNING, "activating {0} failed ({1}); backing off", new Object[] {type, e.getMessage()});
                pause(client.backoff().delayMs(Math.min(failures, 8), -1));
                continue;
            }
            for (Job job : jobs) start(job);
        }
    }

    private void streamJobs() {
        int failures = 0;
        while (!stopping) {
            try {
                client.stream(type, o.concurrency, o.timeoutMs, o.name, job -> {
                    start(job);
                    if (stopping) cutConnections();
                }, stream::set);
            } catch (JobfairException e) {
                if (stopping) return;
                LOG.log(Level.WARNING, "stream of {0} broke ({1}); reconnecting", new Object[] {type, e.getMessage()});
            }
            if (stopping) return;
            failures++;
            pause(client.backoff().delayMs(Math.min(failures, 8), -1));
        }
    }

    private void start(Job job) {
        if (o.mode == Mode.POLL) slots.acquireUninterruptibly();
        Future<?> f = handlers.submit(() -> {
            try {
                handle(job);
            } finally {
                inflight.remove(job);
                if (o.mode == Mode.POLL) slots.release();
            }
        });
        inflight.put(job, f);
    }

    private void handle(Job job) {
        ScheduledFuture<?> beat = null;
        if (o.heartbeat) {
            long every = Math.max(50, o.timeoutMs / 3);
            beat = beats.scheduleAtFixedRate(() -> heartbeat(job), every, every, TimeUnit.MILLISECONDS);
        }
        Map<String, Object> result;
        try {
            result = handler.handle(job);
        } catch (BusinessError e) {
            cancel(beat);
            if (finish(job, () -> client.throwError(job, e.code, e.getMessage(), e.variables))) stats.errorsThrown.incrementAndGet();
            return;
        } catch (InterruptedException e) {
            cancel(beat);
            return; // released at shutdown
        } catch (Exception e) {
            cancel(beat);
            if (stopping && Thread.currentThread().isInterrupted()) return;
            fail(job, e);
            return;
        }
        cancel(beat);
        try {
            if (finish(job, () -> client.complete(job, result))) stats.completed.incrementAndGet();
        } catch (IllegalArgumentException e) {
            // Json cannot write the result (NaN, a type it does not know), so nothing was
            // sent: the handler's fault, failed like its exceptions rather than left, unlogged,
            // to wait out the lease and come back the same.
            fail(job, e);
        }
    }

    private void fail(Job job, Exception e) {
        long backoff = o.failBackoff.exactMs(Math.max(0, job.activationCount() - 1));
        String message = e.getClass().getSimpleName() + ": " + e.getMessage();
        if (finish(job, () -> client.fail(job, Math.max(0, job.retries() - 1), message, backoff))) stats.failed.incrementAndGet();
    }

    private static void cancel(ScheduledFuture<?> beat) {
        if (beat != null) beat.cancel(false);
    }

    private boolean finish(Job job, Runnable call) {
        try {
            call.run();
            return true;
        } catch (ProblemException.Conflict e) {
            // Our activation is no longer current; retrying cannot help and must not happen.
            stats.conflicts.incrementAndGet();
            LOG.log(Level.WARNING, "job {0}: finishing refused ({1}); dropped", new Object[] {job.key(), e.detail});
        } catch (JobfairException e) {
            LOG.log(Level.SEVERE, "job {0}: finishing failed ({1}); its lease will expire", new Object[] {job.key(), e.getMessage()});
        }
        return false;
    }

    private void heartbeat(Job job) {
        try {
            client.extendLease(job, o.timeoutMs);
        } catch (ProblemException.Conflict e) {
            LOG.log(Level.WARNING, "job {0}: lease lost ({1})", new Object[] {job.key(), e.detail});
        } catch (JobfairException e) {
            LOG.log(Level.WARNING, "job {0}: heartbeat failed ({1})", new Object[] {job.key(), e.getMessage()});
        }
    }

    private void drain() {
        handlers.shutdown();
        try {
            if (!handlers.awaitTermination(o.shutdownGraceMs, TimeUnit.MILLISECONDS)) {
                for (Map.Entry<Job, Future<?>> e : inflight.entrySet()) {
                    Job job = e.getKey();
                    e.getValue().cancel(true);
                    // Give the job back at once, without spending one of its retries.
                    if (finish(job, () -> client.fail(job, job.retries(), "worker shut down", 0))) stats.released.incrementAndGet();
                }
                handlers.shutdownNow();
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } finally {
            beats.shutdownNow();
        }
    }

    private static void pause(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
