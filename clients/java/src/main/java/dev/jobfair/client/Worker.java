package dev.jobfair.client;

import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.FutureTask;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
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
 *
 * <p>Completions are sent together ({@link Options#batchCompletion}, on by default): one
 * sender thread sends what the handlers queued while its previous batch was on its way,
 * each job still fenced by its activation count and given its own verdict. One request
 * per job would cost the worker more than a short job does: with fifty handlers, fifty
 * requests in flight.
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
        boolean batchCompletion = true;

        public Options concurrency(int n) { if (n < 1) throw new IllegalArgumentException("concurrency >= 1"); concurrency = n; return this; }
        public Options mode(Mode m) { mode = m; return this; }
        public Options timeoutMs(long ms) { timeoutMs = ms; return this; }
        public Options requestTimeoutMs(long ms) { requestTimeoutMs = ms; return this; }
        public Options name(String n) { name = n; return this; }
        public Options tenantIds(List<String> ids) { tenantIds = ids; return this; }
        public Options failBackoff(Backoff b) { failBackoff = b; return this; }
        public Options heartbeat(boolean on) { heartbeat = on; return this; }
        public Options shutdownGraceMs(long ms) { shutdownGraceMs = ms; return this; }
        /** Send completions together (default true); false: one request per job. */
        public Options batchCompletion(boolean on) { batchCompletion = on; return this; }
    }

    public static final class Stats {
        public final AtomicInteger completed = new AtomicInteger();
        public final AtomicInteger failed = new AtomicInteger();
        public final AtomicInteger errorsThrown = new AtomicInteger();
        public final AtomicInteger conflicts = new AtomicInteger();
        public final AtomicInteger released = new AtomicInteger();
        /** Batched completion requests sent ({@code completed / completionBatches}: their mean size). */
        public final AtomicInteger completionBatches = new AtomicInteger();
    }

    private static final Logger LOG = Logger.getLogger("dev.jobfair.client");
    private static final long STOP_ABORT_DELAY_MS = 250;
    // How long an activation or a completion waits for the handlers still running to end
    // too (handlersGathered).
    private static final long GATHER_NS = 1_000_000;
    // A batch of completions: at most this many jobs (the server's limit) and about this many
    // bytes (a handler's variables can be large; the server's body limit is 16 MiB).
    private static final int BATCH_MAX_JOBS = 1_000;
    private static final int BATCH_MAX_BYTES = 1 << 20;

    public final Stats stats = new Stats();
    private final Jobfair client;
    private final String type;
    private final Handler handler;
    private final Options o;
    private final ExecutorService handlers;
    private final ScheduledExecutorService beats;
    private final Map<Job, Future<?>> inflight = new ConcurrentHashMap<>();
    private final AtomicReference<CompletableFuture<?>> activation = new AtomicReference<>();
    private final AtomicReference<AutoCloseable> stream = new AtomicReference<>();
    private volatile boolean stopping;
    private final Object room = new Object();
    private int handling; // guarded by room: handlers running
    private int held; // guarded by room: jobs from their activation to their verdict
    private final Completions completions; // null: batchCompletion off

    public Worker(Jobfair client, String type, Handler handler, Options options) {
        this.client = client;
        this.type = type;
        this.handler = handler;
        this.o = options;
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
        this.completions = options.batchCompletion ? new Completions() : null;
    }

    /** Stop activating; {@link #run()} returns once in-flight jobs are finished or released. */
    public void stop() {
        if (stopping) return;
        stopping = true;
        synchronized (room) {
            room.notifyAll(); // wake a poller waiting for a free slot
        }
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
            // A handler's slot is free once it returns: the next activation goes out while
            // its completion is on its way. Jobs waiting for their verdicts are bounded too,
            // so a slow server slows the worker down instead of piling up its jobs.
            int free;
            synchronized (room) {
                free = Math.min(o.concurrency - handling, 2 * o.concurrency - held);
                if (free <= 0) {
                    try {
                        room.wait();
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                        return;
                    }
                    continue;
                }
                // A batch's handlers often end together: the slots they free are asked for
                // in one activation, not one activation for the first and another for the
                // rest (each activation costs the server a claim whatever its size).
                if (!handlersGathered()) return;
                free = Math.min(o.concurrency - handling, 2 * o.concurrency - held);
                if (free <= 0) continue;
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
        synchronized (room) {
            handling++;
            held++;
        }
        FutureTask<Void> task = new FutureTask<>(() -> {
            boolean queued = false;
            try {
                queued = handle(job);
            } finally {
                inflight.remove(job);
                // Without batches the slot stays taken until the job is finished, as before.
                synchronized (room) {
                    handling--;
                    if (!queued) held--;
                    room.notifyAll();
                }
            }
        }, null);
        inflight.put(job, task); // before it runs: it removes itself when done
        handlers.execute(task);
    }

    /**
     * Waits up to GATHER_NS, or until no handler runs, for the handlers still running to
     * end (the poll loop and the completion sender, so that a batch's handlers, ending
     * together on their threads, are asked for and completed together); false if
     * interrupted.
     */
    private boolean handlersGathered() {
        synchronized (room) {
            long until = System.nanoTime() + GATHER_NS;
            long left;
            while (handling > 0 && (left = until - System.nanoTime()) > 0) {
                try {
                    room.wait(left / 1_000_000, (int) (left % 1_000_000));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    return false;
                }
            }
            return true;
        }
    }

    private void verdictGiven() {
        synchronized (room) {
            held--;
            room.notifyAll();
        }
    }

    /**
     * Runs the handler and finishes the job, in the span of the job's trace where the
     * application traces (Tracing); true when its completion is queued.
     */
    private boolean handle(Job job) {
        try (Tracing.Handling span = Jobfair.TRACING.handling(job)) {
            return handle(job, span);
        }
    }

    private boolean handle(Job job, Tracing.Handling span) {
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
            span.failed(e);
            if (finish(job, () -> client.throwError(job, e.code, e.getMessage(), e.variables))) stats.errorsThrown.incrementAndGet();
            return false;
        } catch (InterruptedException e) {
            cancel(beat);
            return false; // released at shutdown
        } catch (Exception e) {
            cancel(beat);
            if (stopping && Thread.currentThread().isInterrupted()) return false;
            span.failed(e);
            fail(job, e);
            return false;
        }
        cancel(beat);
        try {
            if (completions == null) {
                if (finish(job, () -> client.complete(job, result))) stats.completed.incrementAndGet();
                return false;
            }
            completions.complete(job, result).whenComplete((status, err) -> {
                try {
                    if (err != null) {
                        LOG.log(Level.SEVERE, "job {0}: finishing failed ({1}); its lease will expire", new Object[] {job.key(), err.getMessage()});
                    } else if (status == 204) {
                        stats.completed.incrementAndGet();
                    } else {
                        // A batched completion's verdict: 409 (not this activation's) or 404 (gone).
                        stats.conflicts.incrementAndGet();
                        LOG.log(Level.WARNING, "job {0}: finishing refused ({1}); dropped", new Object[] {job.key(), status});
                    }
                } finally {
                    verdictGiven();
                }
            });
            return true;
        } catch (IllegalArgumentException e) {
            // Json cannot write the result (NaN, a type it does not know), so nothing was
            // sent: the handler's fault, failed like its exceptions rather than left, unlogged,
            // to wait out the lease and come back the same.
            fail(job, e);
            return false;
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
            // Every completion queued goes out before run() returns.
            if (completions != null) completions.flush();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } finally {
            beats.shutdownNow();
        }
    }

    /**
     * The worker's completions, sent together by one thread: whatever is queued when the
     * previous batch comes back goes in the next one, so a batch grows with the load and a
     * lone completion goes at once. Each job's future is its verdict (204, 404 or 409), or
     * the exception that failed its batch.
     */
    private final class Completions {
        private record Queued(String item, int bytes, CompletableFuture<Integer> verdict) {}

        private final ArrayDeque<Queued> queue = new ArrayDeque<>(); // guarded by this
        private boolean sending; // guarded by this
        private final ExecutorService sender = Executors.newSingleThreadExecutor(r -> {
            Thread t = new Thread(r, "jobfair-completions");
            t.setDaemon(true);
            return t;
        });

        /** @throws IllegalArgumentException at once when the variables have no JSON form */
        CompletableFuture<Integer> complete(Job job, Map<String, Object> variables) {
            String item = Jobfair.completionItem(new Jobfair.Completion(job, variables));
            Queued q = new Queued(item, item.getBytes(StandardCharsets.UTF_8).length, new CompletableFuture<>());
            synchronized (this) {
                queue.add(q);
                if (!sending) {
                    try {
                        sender.execute(this::send);
                        sending = true;
                    } catch (RejectedExecutionException e) { // a handler outlived the shutdown
                        queue.remove(q);
                        q.verdict.completeExceptionally(new JobfairException("the worker has stopped", e));
                    }
                }
            }
            return q.verdict;
        }

        private void send() {
            while (true) {
                // A burst's first completion sent alone freed one slot, and the next
                // activation asked for one job: the burst goes together.
                handlersGathered();
                List<Queued> batch = new ArrayList<>();
                synchronized (this) {
                    if (queue.isEmpty()) {
                        sending = false;
                        notifyAll();
                        return;
                    }
                    long bytes = 0;
                    while (!queue.isEmpty() && batch.size() < BATCH_MAX_JOBS
                            && (batch.isEmpty() || bytes + queue.peek().bytes <= BATCH_MAX_BYTES)) {
                        Queued q = queue.poll();
                        bytes += q.bytes + 1;
                        batch.add(q);
                    }
                }
                List<String> items = new ArrayList<>(batch.size());
                for (Queued q : batch) items.add(q.item);
                List<Integer> verdicts;
                try {
                    stats.completionBatches.incrementAndGet();
                    verdicts = client.sendCompletions(items);
                } catch (RuntimeException e) {
                    for (Queued q : batch) q.verdict.completeExceptionally(e);
                    continue;
                }
                for (int i = 0; i < batch.size(); i++) batch.get(i).verdict.complete(verdicts.get(i));
            }
        }

        /** Until every queued completion has its verdict; then the sender thread ends. */
        void flush() throws InterruptedException {
            synchronized (this) {
                while (sending) wait();
            }
            sender.shutdown();
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
