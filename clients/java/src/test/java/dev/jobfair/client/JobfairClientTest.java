package dev.jobfair.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.net.httpserver.HttpServer;
import java.net.InetSocketAddress;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The Java client against a live Jobfair at JOBFAIR_URL (started, on embedded PostgreSQL,
 * by tests/acceptance/test_client_java.py): lease sweep and promotion every 50 ms, at most
 * 3 waiting long polls.
 */
@Timeout(value = 120, unit = TimeUnit.SECONDS)
class JobfairClientTest {
    static final String URL = System.getenv("JOBFAIR_URL");
    /** A suffix per run: job types of an earlier run against the same server never mix in. */
    static final String RUN = Long.toString(System.currentTimeMillis(), 36);
    final Jobfair jf = new Jobfair(URL);

    Map<String, Integer> states(List<String> keys) {
        Map<String, Integer> counts = new HashMap<>();
        for (String k : keys) counts.merge(jf.getJob(k).state(), 1, Integer::sum);
        return counts;
    }

    Thread runInBackground(Worker w) {
        Thread t = new Thread(w::run, "worker-under-test");
        t.start();
        return t;
    }

    @Test
    void producerApiAndTypedErrors() {
        Job job = jf.createJob(new NewJob("java-mail-" + RUN).tenantId("acme").priority(70).variables(Map.of("to", "a@b")));
        assertEquals("CREATED", job.state());
        assertEquals(70, job.priority());
        Job a = jf.createJob(new NewJob("java-mail-" + RUN).idempotencyKey("k1"));
        Job b = jf.createJob(new NewJob("java-mail-" + RUN).idempotencyKey("k1"));
        assertEquals(a.key(), b.key());
        List<String> keys = jf.createJobs(List.of(
                new NewJob("java-mail-" + RUN).variables(Map.of("n", 0)),
                new NewJob("java-mail-" + RUN).variables(Map.of("n", 1))));
        assertEquals(Map.of("n", 1L), jf.getJob(keys.get(1)).variables());
        jf.cancelJob(keys.get(0));
        assertEquals("CANCELED", jf.getJob(keys.get(0)).state());
        assertThrows(ProblemException.Conflict.class, () -> jf.cancelJob(keys.get(0)));
        ProblemException.NotFound missing = assertThrows(ProblemException.NotFound.class, () -> jf.getJob("4242"));
        assertEquals("urn:jobfair:not-found", missing.type);
        assertThrows(ProblemException.InvalidArgument.class, () -> jf.createJob(new NewJob("no spaces")));

        Job active = jf.activate("java-mail-" + RUN, new Jobfair.Activate(1, 60_000, -1L)).get(0);
        jf.extendLease(active, 120_000);
        jf.complete(active, Map.of("sent", true));
        Job stale = new Job(active.key(), active.type(), active.tenantId(), active.state(), 0, 0, 0,
                active.activationCount() + 1, null, null, null, Map.of(), Map.of(), null, null, null, null, null, null);
        assertThrows(ProblemException.StaleActivation.class, () -> jf.complete(stale, null));
        assertThrows(ProblemException.Conflict.class, () -> jf.complete(active, null));
        assertEquals("COMPLETED", jf.getJob(active.key()).state());
    }

    void drain(Worker.Mode mode) throws Exception {
        String type = "java-drain-" + mode + "-" + RUN;
        List<NewJob> batch = new ArrayList<>();
        for (int i = 0; i < 1000; i++) batch.add(new NewJob(type).tenantId("t" + (i % 3)));
        List<String> keys = jf.createJobs(batch);
        Map<String, AtomicInteger> seen = new ConcurrentHashMap<>();
        AtomicInteger running = new AtomicInteger();
        AtomicInteger peak = new AtomicInteger();
        CountDownLatch all = new CountDownLatch(1000);
        Worker w = new Worker(jf, type, job -> {
            peak.accumulateAndGet(running.incrementAndGet(), Math::max);
            seen.computeIfAbsent(job.key(), k -> new AtomicInteger()).incrementAndGet();
            running.decrementAndGet();
            all.countDown();
            return Map.of("handled", 1);
        }, new Worker.Options().concurrency(4).mode(mode).requestTimeoutMs(1000));
        Thread t = runInBackground(w);
        assertTrue(all.await(90, TimeUnit.SECONDS));
        w.stop();
        t.join();
        assertEquals(Set.copyOf(keys), seen.keySet());
        assertTrue(seen.values().stream().allMatch(n -> n.get() == 1));
        assertTrue(peak.get() <= 4, "peak " + peak.get());
        assertEquals(1000, w.stats.completed.get());
        assertEquals(Map.of("COMPLETED", 1000), states(keys));
    }

    @Test
    void configurationRoundTripsEveryFieldAndBadValuesAreInvalidArguments() {
        String tenant = ("cfg-" + RUN).substring(0, Math.min(31, ("cfg-" + RUN).length()));
        assertTrue(!jf.getTenant(tenant).configured());
        Config.Tenant wanted = new Config.Tenant(3, 10, 2, new Config.RateLimit(5, 10));
        Config.Tenant got = jf.putTenant(tenant, wanted);
        assertEquals(new Config.Tenant(3, 10, 2, new Config.RateLimit(5, 10), false, true), got);
        assertEquals(got, jf.getTenant(tenant));
        ProblemException.InvalidArgument tooMany = assertThrows(ProblemException.InvalidArgument.class,
                () -> jf.putTenant(tenant, got.withMinActiveJobs(11)));
        assertTrue(tooMany.detail.contains("minActiveJobs"), tooMany.detail);
        assertEquals(got, jf.getTenant(tenant));
        // The whole configuration: what is null is cleared.
        Config.Tenant cleared = jf.putTenant(tenant, new Config.Tenant().withWeight(2));
        assertEquals(new Config.Tenant(2, null, null, null, false, true), cleared);

        // "." and ".." are valid names: sent as names, not as dot segments.
        for (String odd : List.of(".", "..")) {
            assertEquals(7, jf.putTenant(odd, new Config.Tenant().withWeight(7)).weight());
            assertEquals(7, jf.getTenant(odd).weight());
            assertEquals(5, jf.putKey(odd, odd, new Config.Key(5, null)).weight());
            assertEquals(5, jf.getKey(odd, odd).weight());
        }
        assertEquals(2, jf.getTenant(tenant).weight());

        Config.Key key = jf.putKey(tenant, "user:7", new Config.Key(4, 1));
        assertEquals(new Config.Key(4, 1, true), key);
        assertEquals(key, jf.getKey(tenant, "user:7"));

        String type = "billing/java-" + RUN; // a type may have a '/'
        Config.JobType fifo = new Config.JobType(50, 1000, 5, null, "cost", 2, "fifo");
        Config.JobType gotType = jf.putJobType(type, fifo);
        assertEquals(new Config.JobType(50, 1000, 5, null, "cost", 2, "fifo", false, true), gotType);
        assertEquals(gotType, jf.getJobType(type));
        ProblemException.InvalidArgument lifo = assertThrows(ProblemException.InvalidArgument.class,
                () -> jf.putJobType(type, fifo.withKeyOrdering("lifo")));
        assertTrue(lifo.detail.contains("keyOrdering"), lifo.detail);
        ProblemException.InvalidArgument zero = assertThrows(ProblemException.InvalidArgument.class,
                () -> jf.putJobType(type, fifo.withMaxActivePerKey(0)));
        assertTrue(zero.detail.contains("maxActivePerKey"), zero.detail);
        assertEquals(gotType, jf.getJobType(type));
    }

    @Test
    void createsWhoseAnswersAreLostAreMadeOnceEach() throws Exception {
        // A proxy resets the connection of every other create once the server has answered
        // it (tests/answer_dropper.py): the jobs were made, and the client cannot know it.
        String dropping = System.getenv("JOBFAIR_DROPPING_URL");
        org.junit.jupiter.api.Assumptions.assumeTrue(dropping != null, "JOBFAIR_DROPPING_URL is not set");
        Jobfair client = new Jobfair(dropping, null, 6, new Backoff(1, 5, 1));
        String type = "java-idem-" + RUN;
        List<String> keys = new ArrayList<>();
        for (int i = 0; i < 10; i++) keys.add(client.createJob(new NewJob(type).tenantId("t")).key());
        for (int b = 0; b < 3; b++) {
            List<NewJob> batch = new ArrayList<>();
            for (int i = 0; i < 10; i++) batch.add(new NewJob(type).tenantId("t"));
            keys.addAll(client.createJobs(batch));
        }
        assertTrue(client.retried.get() >= 5, client.retried.get() + " retries");
        assertEquals(40, Set.copyOf(keys).size());
        HttpClient http = HttpClient.newHttpClient();
        String listed = http.send(HttpRequest.newBuilder(URI.create(URL + "/v2/jobs?limit=1000&type=" + type)).build(),
                HttpResponse.BodyHandlers.ofString()).body();
        Set<String> made = new java.util.HashSet<>();
        Matcher m = Pattern.compile("\"jobKey\":\"(\\d+)\"").matcher(listed);
        while (m.find()) made.add(m.group(1));
        assertEquals(Set.copyOf(keys), made);
    }

    @Test
    void fourHandlersDrainThousandJobsEachOnceByPolling() throws Exception {
        drain(Worker.Mode.POLL);
    }

    @Test
    void fourHandlersDrainThousandJobsEachOnceByStream() throws Exception {
        drain(Worker.Mode.STREAM);
    }

    Worker drainTwenty(String type, int n, boolean batchCompletion) throws Exception {
        List<NewJob> batch = new ArrayList<>();
        for (int i = 0; i < n; i++) batch.add(new NewJob(type));
        List<String> keys = jf.createJobs(batch);
        Map<String, AtomicInteger> seen = new ConcurrentHashMap<>();
        AtomicInteger running = new AtomicInteger();
        AtomicInteger peak = new AtomicInteger();
        CountDownLatch all = new CountDownLatch(n);
        Worker w = new Worker(jf, type, job -> {
            peak.accumulateAndGet(running.incrementAndGet(), Math::max);
            seen.computeIfAbsent(job.key(), k -> new AtomicInteger()).incrementAndGet();
            Thread.sleep(1);
            running.decrementAndGet();
            all.countDown();
            return Map.of("handled", 1);
        }, new Worker.Options().concurrency(20).requestTimeoutMs(1000).batchCompletion(batchCompletion));
        Thread t = runInBackground(w);
        assertTrue(all.await(60, TimeUnit.SECONDS));
        w.stop();
        t.join();
        assertEquals(Set.copyOf(keys), seen.keySet());
        assertTrue(seen.values().stream().allMatch(c -> c.get() == 1));
        assertTrue(peak.get() <= 20, "peak " + peak.get());
        assertEquals(n, w.stats.completed.get());
        assertEquals(0, w.stats.conflicts.get());
        assertEquals(Map.of("COMPLETED", n), states(keys));
        return w;
    }

    @Test
    void completionsGoInBatchesOrOnePerJobWhenOff() throws Exception {
        Worker batched = drainTwenty("java-batch-" + RUN, 200, true);
        int batches = batched.stats.completionBatches.get();
        assertTrue(batches >= 1 && batches < 200, batches + " batches for 200 jobs");
        Worker single = drainTwenty("java-single-" + RUN, 60, false);
        assertEquals(0, single.stats.completionBatches.get());
    }

    @Test
    void aBatchHasAVerdictPerJobStaleOnesAre409() {
        String type = "java-verdicts-" + RUN;
        jf.createJobs(List.of(new NewJob(type).variables(Map.of("n", 0)), new NewJob(type).variables(Map.of("n", 1)),
                new NewJob(type).variables(Map.of("n", 2))));
        List<Job> got = new ArrayList<>(jf.activate(type, new Jobfair.Activate(3, 60_000, -1L)));
        got.sort((x, y) -> Long.compare((Long) x.variables().get("n"), (Long) y.variables().get("n")));
        Job a = got.get(0), b = got.get(1), c = got.get(2);
        jf.complete(a, null);
        Jobfair.Completion stale = new Jobfair.Completion(c.key(), c.activationCount() + 1, null);
        assertEquals(List.of(409, 204, 409), jf.completeMany(List.of(
                new Jobfair.Completion(a), new Jobfair.Completion(b, Map.of("done", true)), stale)));
        assertEquals(List.of(204, 409), jf.completeMany(List.of(new Jobfair.Completion(c), new Jobfair.Completion(b))));
        assertEquals(Map.of("n", 1L, "done", true), jf.getJob(b.key()).variables());
        assertEquals(Map.of("COMPLETED", 3), states(List.of(a.key(), b.key(), c.key())));
    }

    @Test
    void aHandlerExceptionFailsTheJobAndItIsRetried() throws Exception {
        Job job = jf.createJob(new NewJob("java-flaky-" + RUN).retries(3));
        List<Integer> attempts = new ArrayList<>();
        CountDownLatch done = new CountDownLatch(1);
        Worker w = new Worker(jf, "java-flaky-" + RUN, j -> {
            synchronized (attempts) {
                attempts.add(j.activationCount());
            }
            if (j.activationCount() == 1) throw new IllegalStateException("first try breaks");
            done.countDown();
            return Map.of("ok", true);
        }, new Worker.Options().requestTimeoutMs(500).failBackoff(new Backoff(100, 2, 1000)));
        Thread t = runInBackground(w);
        assertTrue(done.await(30, TimeUnit.SECONDS));
        w.stop();
        t.join();
        Job after = jf.getJob(job.key());
        assertEquals(List.of(1, 2), attempts);
        assertEquals("COMPLETED", after.state());
        assertEquals(2, after.retries());
        assertEquals("IllegalStateException: first try breaks", after.errorMessage());
    }

    @Test
    void aResultWithNoJsonFormFailsTheJobAndItIsRetried() throws Exception {
        Job job = jf.createJob(new NewJob("java-nan-" + RUN).retries(3));
        CountDownLatch done = new CountDownLatch(1);
        Worker w = new Worker(jf, "java-nan-" + RUN, j -> {
            if (j.activationCount() == 1) return Map.of("ratio", Double.NaN);
            done.countDown();
            return Map.of("ratio", 0.5);
        }, new Worker.Options().requestTimeoutMs(500).failBackoff(new Backoff(100, 2, 1000)));
        Thread t = runInBackground(w);
        assertTrue(done.await(30, TimeUnit.SECONDS));
        w.stop();
        t.join();
        Job after = jf.getJob(job.key());
        assertEquals("COMPLETED", after.state());
        assertEquals(Map.of("ratio", 0.5), after.variables());
        assertEquals(2, after.retries());
        assertEquals("IllegalArgumentException: JSON has no number NaN", after.errorMessage());
    }

    @Test
    void aBusinessErrorThrowsAJobError() throws Exception {
        Job job = jf.createJob(new NewJob("java-pay-" + RUN));
        CountDownLatch called = new CountDownLatch(1);
        Worker w = new Worker(jf, "java-pay-" + RUN, j -> {
            called.countDown();
            throw new BusinessError("CARD_DECLINED", "insufficient funds", Map.of("declined", true));
        }, new Worker.Options().requestTimeoutMs(500));
        Thread t = runInBackground(w);
        assertTrue(called.await(30, TimeUnit.SECONDS));
        w.stop();
        t.join();
        Job after = jf.getJob(job.key());
        assertEquals("ERROR_THROWN", after.state());
        assertEquals("CARD_DECLINED", after.errorCode());
        assertEquals(1, w.stats.errorsThrown.get());
    }

    @Test
    void aSlowHandlerKeepsItsLeaseByHeartbeat() throws Exception {
        // Lease 600 ms, handler 2.5 s, lease sweep every 50 ms: without the heartbeat a rival
        // polling for the job would get it.
        Job job = jf.createJob(new NewJob("java-slow-" + RUN));
        CountDownLatch started = new CountDownLatch(1);
        CountDownLatch finished = new CountDownLatch(1);
        Worker w = new Worker(jf, "java-slow-" + RUN, j -> {
            started.countDown();
            Thread.sleep(2500);
            finished.countDown();
            return Map.of("count", j.activationCount());
        }, new Worker.Options().timeoutMs(600).requestTimeoutMs(500));
        Thread t = runInBackground(w);
        assertTrue(started.await(30, TimeUnit.SECONDS));
        List<Job> rivalSaw = new ArrayList<>();
        while (finished.getCount() > 0) rivalSaw.addAll(jf.activate("java-slow-" + RUN, new Jobfair.Activate(1, 60_000, 200L)));
        w.stop();
        t.join();
        Job after = jf.getJob(job.key());
        assertEquals(List.of(), rivalSaw);
        assertEquals("COMPLETED", after.state());
        assertEquals(1, after.activationCount());
        assertEquals(0, w.stats.conflicts.get());
    }

    @Test
    void shutdownMidDrainLosesNothing() throws Exception {
        List<NewJob> batch = new ArrayList<>();
        for (int i = 0; i < 200; i++) batch.add(new NewJob("java-shut-" + RUN));
        List<String> keys = jf.createJobs(batch);
        Map<String, AtomicInteger> handled = new ConcurrentHashMap<>();
        CountDownLatch twenty = new CountDownLatch(20);
        CountDownLatch everything = new CountDownLatch(200);
        Worker.Handler handler = j -> {
            Thread.sleep(20);
            handled.computeIfAbsent(j.key(), k -> new AtomicInteger()).incrementAndGet();
            twenty.countDown();
            everything.countDown();
            return null;
        };
        Worker first = new Worker(jf, "java-shut-" + RUN, handler, new Worker.Options().concurrency(4).requestTimeoutMs(500));
        Thread t1 = runInBackground(first);
        assertTrue(twenty.await(30, TimeUnit.SECONDS));
        first.stop();
        t1.join();
        Map<String, Integer> afterStop = states(keys);
        assertEquals(null, afterStop.get("ACTIVATED"), afterStop.toString());
        assertTrue(first.stats.completed.get() < 200);
        Worker second = new Worker(jf, "java-shut-" + RUN, handler, new Worker.Options().concurrency(4).requestTimeoutMs(500));
        Thread t2 = runInBackground(second);
        assertTrue(everything.await(60, TimeUnit.SECONDS));
        second.stop();
        t2.join();
        assertEquals(200, handled.size());
        assertTrue(handled.values().stream().allMatch(n -> n.get() == 1));
        assertEquals(Map.of("COMPLETED", 200), states(keys));
    }

    int waiting() throws Exception {
        HttpClient http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();
        String metrics = http.send(HttpRequest.newBuilder(URI.create(URL + "/metrics")).build(),
                HttpResponse.BodyHandlers.ofString()).body();
        Matcher m = Pattern.compile("^jobfair_waiters (\\d+)(?:\\.0)?$", Pattern.MULTILINE).matcher(metrics);
        return m.find() ? Integer.parseInt(m.group(1)) : 0;
    }

    @Test
    void a503IsRetriedNoSoonerThanRetryAfterAndOther4xxAreNot() throws Exception {
        HttpClient http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();
        HttpRequest hold = HttpRequest.newBuilder(URI.create(URL + "/v2/jobs/activate"))
                .header("Content-Type", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(
                        "{\"type\":\"java-idle-" + RUN + "\",\"maxJobs\":1,\"timeout\":1000,\"requestTimeout\":1500}"))
                .build();
        List<CompletableFuture<HttpResponse<String>>> holders = new ArrayList<>();
        for (int i = 0; i < 3; i++) holders.add(http.sendAsync(hold, HttpResponse.BodyHandlers.ofString()));
        while (waiting() < 3) Thread.sleep(10); // the server's gauge; there is no event to await
        Jobfair impatient = new Jobfair(URL, null, 1, Backoff.DEFAULT);
        ProblemException.ResourceExhausted refused = assertThrows(ProblemException.ResourceExhausted.class,
                () -> impatient.activate("java-later-" + RUN, new Jobfair.Activate(1, 60_000, 5_000L)));
        assertEquals(1.0, refused.retryAfterS);
        Jobfair patient = new Jobfair(URL);
        CompletableFuture<List<Job>> later = CompletableFuture.supplyAsync(
                () -> patient.activate("java-later-" + RUN, new Jobfair.Activate(1, 60_000, 10_000L)));
        for (CompletableFuture<HttpResponse<String>> h : holders) assertEquals("{\"jobs\":[]}", h.get().body());
        jf.createJob(new NewJob("java-later-" + RUN));
        assertEquals(1, later.get(30, TimeUnit.SECONDS).size());
        assertTrue(patient.retried.get() >= 1);
        Jobfair strict = new Jobfair(URL);
        assertThrows(ProblemException.InvalidArgument.class,
                () -> strict.activate("bad type!", new Jobfair.Activate(1, 60_000, -1L)));
        assertEquals(0, strict.retried.get());
    }

    @Test
    void theApiKeyIsSentAsABearerToken() throws Exception {
        // Jobfair's own auth is not built yet: the JDK's HTTP server records the header.
        AtomicReference<String> seen = new AtomicReference<>();
        HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        server.createContext("/", exchange -> {
            seen.set(exchange.getRequestHeaders().getFirst("Authorization"));
            exchange.getRequestBody().readAllBytes();
            byte[] body = "{\"jobs\": []}".getBytes(StandardCharsets.UTF_8);
            exchange.getResponseHeaders().add("Content-Type", "application/json");
            exchange.sendResponseHeaders(200, body.length);
            exchange.getResponseBody().write(body);
            exchange.close();
        });
        server.start();
        try {
            Jobfair keyed = new Jobfair("http://127.0.0.1:" + server.getAddress().getPort(), "jf_secret", 1, Backoff.DEFAULT);
            assertEquals(List.of(), keyed.activate("t", new Jobfair.Activate(1, 1000, -1L)));
        } finally {
            server.stop(0);
        }
        assertNotNull(seen.get());
        assertEquals("Bearer jf_secret", seen.get());
    }

    @Test
    void anUnknownOutcomeIsRetriedOnlyWhereSendingTwiceIsSafe() throws Exception {
        // The JDK's HTTP server answers the first two calls as a server whose database went
        // away at commit would, then accepts.
        java.util.concurrent.atomic.AtomicInteger calls = new java.util.concurrent.atomic.AtomicInteger();
        HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        server.createContext("/", exchange -> {
            exchange.getRequestBody().readAllBytes();
            boolean first = calls.incrementAndGet() <= 2;
            byte[] body = (first
                    ? "{\"type\":\"urn:jobfair:outcome-unknown\",\"title\":\"OUTCOME_UNKNOWN\",\"status\":503}"
                    : "{\"jobKeys\":[\"1\"]}").getBytes(StandardCharsets.UTF_8);
            exchange.getResponseHeaders().add("Content-Type", first ? "application/problem+json" : "application/json");
            exchange.sendResponseHeaders(first ? 503 : 201, body.length);
            exchange.getResponseBody().write(body);
            exchange.close();
        });
        server.start();
        try {
            Jobfair client = new Jobfair("http://127.0.0.1:" + server.getAddress().getPort(), null, 5, new Backoff(1, 1, 1))
                    .idempotentCreates(false);
            // Without idempotency keys (the client's own turned off) a second send could
            // create the jobs twice: not retried.
            assertThrows(ProblemException.OutcomeUnknown.class, () -> client.createJobs(List.of(new NewJob("t"))));
            assertEquals(1, calls.get());
            // With them, it is sent again and gets the keys.
            assertEquals(List.of("1"), client.createJobs(List.of(new NewJob("t").idempotencyKey("k"))));
            assertEquals(3, calls.get());
            // By default the client gives each job a key of its own: sent again, and made once.
            calls.set(1);
            Jobfair keyed = new Jobfair("http://127.0.0.1:" + server.getAddress().getPort(), null, 5, new Backoff(1, 1, 1));
            assertEquals(List.of("1"), keyed.createJobs(List.of(new NewJob("t"))));
            assertEquals(3, calls.get());
        } finally {
            server.stop(0);
        }
    }

    @Test
    void connectionErrorsAreRetriedUntilTheServerIsUp() throws Exception {
        int port;
        try (java.net.ServerSocket probe = new java.net.ServerSocket(0)) {
            port = probe.getLocalPort(); // nothing listens there once it is closed
        }
        Jobfair client = new Jobfair("http://127.0.0.1:" + port, null, 20, new Backoff(100, 2, 1000));
        CompletableFuture<List<Job>> call = CompletableFuture.supplyAsync(
                () -> client.activate("t", new Jobfair.Activate(1, 1000, -1L)));
        while (client.retried.get() < 1) Thread.sleep(10); // the client's counter
        HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", port), 0);
        server.createContext("/", exchange -> {
            exchange.getRequestBody().readAllBytes();
            byte[] body = "{\"jobs\": []}".getBytes(StandardCharsets.UTF_8);
            exchange.sendResponseHeaders(200, body.length);
            exchange.getResponseBody().write(body);
            exchange.close();
        });
        server.start();
        try {
            assertEquals(List.of(), call.get(30, TimeUnit.SECONDS));
        } finally {
            server.stop(0);
        }
        assertTrue(client.retried.get() >= 1);
    }

    @Test
    void jsonRoundTrips() {
        String text = "{\"a\":[1,2.5,\"x\\\"y\\n\",true,null,{\"b\":\"\\u00e9\"}],\"c\":-3}";
        Object parsed = Json.parse(text);
        assertEquals(text.replace("\\u00e9", "\u00e9"), Json.write(parsed));
        assertThrows(IllegalArgumentException.class, () -> Json.parse("{\"a\":1"));
    }
}
