package dev.jobfair.client;

import java.io.IOException;
import java.io.InputStream;
import java.net.ConnectException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Consumer;
import java.util.stream.Stream;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/**
 * The HTTP calls of API.md over {@code java.net.http}. Back pressure (503/429 with
 * Retry-After) and connection failures are retried with jittered exponential back-off; no
 * other 4xx is. A request that may have reached the server is sent again only when that
 * is harmless: reads, finish calls (fenced by activationCount) and creations carrying an
 * idempotency key.
 */
public final class Jobfair {
    private final String baseUrl;
    private final String apiKey;
    private final int maxAttempts;
    private final Backoff backoff;
    private final HttpClient http;
    /** Requests sent again after back pressure or a connection failure. */
    public final AtomicInteger retried = new AtomicInteger();

    public Jobfair(String baseUrl) {
        this(baseUrl, null, 6, Backoff.DEFAULT);
    }

    /** @param apiKey sent as {@code Authorization: Bearer <apiKey>}, or null */
    public Jobfair(String baseUrl, String apiKey, int maxAttempts, Backoff backoff) {
        this(baseUrl, apiKey, maxAttempts, backoff, null);
    }

    /**
     * @param apiKey sent as {@code Authorization: Bearer <apiKey>}, or null
     * @param sslContext for an https URL: whom to trust, e.g. {@link #trusting(Path)} a CA
     *     of one's own; null: the JVM's default trust store
     */
    public Jobfair(String baseUrl, String apiKey, int maxAttempts, Backoff backoff, SSLContext sslContext) {
        this.baseUrl = baseUrl.replaceAll("/+$", "");
        this.apiKey = apiKey;
        this.maxAttempts = maxAttempts;
        this.backoff = backoff;
        // HTTP/1.1: an h2c upgrade offer on every request buys nothing from a plain-HTTP server.
        HttpClient.Builder http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1)
                .connectTimeout(Duration.ofSeconds(10));
        if (sslContext != null) http.sslContext(sslContext);
        this.http = http.build();
    }

    /**
     * A TLS context that trusts the CA certificates of a PEM file, and only those: for a
     * server whose certificate a CA outside the JVM's trust store issued.
     */
    public static SSLContext trusting(Path caPem) {
        try (InputStream in = Files.newInputStream(caPem)) {
            KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
            store.load(null, null);
            int n = 0;
            for (Certificate ca : CertificateFactory.getInstance("X.509").generateCertificates(in)) {
                store.setCertificateEntry("ca-" + n++, ca);
            }
            if (n == 0) throw new JobfairException("no certificate in " + caPem);
            TrustManagerFactory trust = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
            trust.init(store);
            SSLContext context = SSLContext.getInstance("TLS");
            context.init(null, trust.getTrustManagers(), null);
            return context;
        } catch (IOException | GeneralSecurityException e) {
            throw new JobfairException("cannot trust the certificates of " + caPem + ": " + e, e);
        }
    }

    /** OpenTelemetry where the application has it, else nothing (Tracing). */
    static final Tracing TRACING = Tracing.load();

    public Backoff backoff() {
        return backoff;
    }

    // -- transport ---------------------------------------------------------------------

    private HttpRequest.Builder request(String path, Duration timeout) {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(baseUrl + path))
                .timeout(timeout)
                .header("User-Agent", "jobfair-client-java/0.1");
        if (apiKey != null) b.header("Authorization", "Bearer " + apiKey);
        TRACING.headers().forEach(b::header);
        return b;
    }

    private HttpRequest build(String method, String path, Object body, Duration timeout) {
        HttpRequest.Builder b = request(path, timeout);
        if (body == null) {
            b.method(method, HttpRequest.BodyPublishers.noBody());
        } else {
            b.header("Content-Type", "application/json");
            String json = body instanceof Encoded e ? e.json() : Json.write(body);
            b.method(method, HttpRequest.BodyPublishers.ofString(json));
        }
        return b.build();
    }

    /** Sends with retries; {@code onStart} receives the in-flight future so it can be cancelled. */
    Object send(String method, String path, Object body, boolean idempotent, Duration timeout,
                Consumer<CompletableFuture<?>> onStart) {
        for (int attempt = 1; ; attempt++) {
            double retryAfter = -1;
            RuntimeException failure;
            try {
                HttpRequest request = build(method, path, body, timeout);
                HttpResponse<String> response;
                if (onStart == null) {
                    // send, not sendAsync: on a machine of one or two cores (a small
                    // container) every sendAsync answer is handed to a thread of its own,
                    // started for it (CompletableFuture's default executor there).
                    response = sendNow(request);
                } else {
                    CompletableFuture<HttpResponse<String>> call =
                            http.sendAsync(request, HttpResponse.BodyHandlers.ofString());
                    onStart.accept(call);
                    response = call.get();
                }
                return answer(response.statusCode(), response.body(),
                        response.headers().firstValue("Retry-After").orElse(null));
            } catch (ProblemException e) {
                if (e.status != 503 && e.status != 429) throw e;
                if (e instanceof ProblemException.OutcomeUnknown && !idempotent) throw e;
                retryAfter = e.retryAfterS;
                failure = e;
            } catch (CancellationException e) {
                throw new JobfairException("request cancelled", e);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new JobfairException("interrupted", e);
            } catch (ExecutionException e) {
                Throwable cause = e.getCause();
                boolean neverSent = cause instanceof ConnectException;
                failure = new JobfairException("request to " + path + " failed: " + cause, cause);
                if (!neverSent && !(idempotent && cause instanceof IOException)) throw failure;
            }
            if (attempt >= maxAttempts) throw failure;
            retried.incrementAndGet();
            try {
                Thread.sleep(backoff.delayMs(attempt - 1, retryAfter));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new JobfairException("interrupted", e);
            }
        }
    }

    /** {@code http.send}, its IOException as sendAsync's ExecutionException (one handling). */
    private HttpResponse<String> sendNow(HttpRequest request) throws InterruptedException, ExecutionException {
        try {
            return http.send(request, HttpResponse.BodyHandlers.ofString());
        } catch (IOException e) {
            throw new ExecutionException(e);
        }
    }

    private Object send(String method, String path, Object body, boolean idempotent) {
        return send(method, path, body, idempotent, Duration.ofSeconds(30), null);
    }

    private static Object answer(int status, String text, String retryAfter) {
        if (status >= 400) throw ProblemException.of(status, text, retryAfter);
        return text == null || text.isEmpty() ? null : Json.parse(text);
    }

    @SuppressWarnings("unchecked")
    private static Map<String, Object> obj(Object o) {
        return (Map<String, Object>) o;
    }

    private static Map<String, Object> fence(Job job) {
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("activationCount", job.activationCount());
        return body;
    }

    // -- producing ---------------------------------------------------------------------

    private volatile boolean idempotentCreates = true;

    /**
     * Whether every job created without an idempotency key is given one of the client's
     * own (the default), so that a create whose outcome is unknown (a 503 outcome-unknown,
     * a connection cut after sending) is sent again safely and made once; off, such jobs
     * are sent without a key and not retried after an unknown outcome.
     */
    public Jobfair idempotentCreates(boolean on) {
        idempotentCreates = on;
        return this;
    }

    /** What a create sends of {@code job}: with a key of the client's own if it has none. */
    private Map<String, Object> keyed(NewJob job) {
        if (job.hasIdempotencyKey() || !idempotentCreates) return job.toJson();
        Map<String, Object> body = new LinkedHashMap<>(job.toJson());
        body.put("idempotencyKey", "auto-" + UUID.randomUUID().toString().replace("-", ""));
        return body;
    }

    public Job createJob(NewJob job) {
        Map<String, Object> body = keyed(job);
        return Job.fromJson(obj(send("POST", "/v2/jobs", body, body.containsKey("idempotencyKey"))));
    }

    /** Up to 10,000 jobs in one round trip, all or nothing; their keys in order. */
    @SuppressWarnings("unchecked")
    public List<String> createJobs(List<NewJob> jobs) {
        List<Object> items = new ArrayList<>();
        boolean safe = true;
        for (NewJob j : jobs) {
            Map<String, Object> body = keyed(j);
            items.add(body);
            safe &= body.containsKey("idempotencyKey");
        }
        Object answer = send("POST", "/v2/jobs/batch", Map.of("jobs", items), safe);
        return (List<String>) obj(answer).get("jobKeys");
    }

    public Job getJob(String key) {
        return Job.fromJson(obj(send("GET", "/v2/jobs/" + key, null, true)));
    }

    public void cancelJob(String key) {
        send("POST", "/v2/jobs/" + key + "/cancel", null, true);
    }

    // -- configuring (operators) ---------------------------------------------------------

    /**
     * A tenant, key or type as one path segment (the names "." and "..", which are valid,
     * spelled so that nothing on the way takes them for dot segments).
     */
    private static String segment(String name) {
        String seg = URLEncoder.encode(name, StandardCharsets.UTF_8).replace("+", "%20");
        return seg.equals(".") || seg.equals("..") ? seg.replace(".", "%2E") : seg;
    }

    /** Set the tenant's whole configuration (weight, cap, minimum, rate limit). */
    public Config.Tenant putTenant(String tenantId, Config.Tenant config) {
        return Config.Tenant.fromJson(obj(send("PUT", "/v2/tenants/" + segment(tenantId), config.toJson(), true)));
    }

    /** Its configuration (the defaults, {@code configured} false, if it has none). */
    public Config.Tenant getTenant(String tenantId) {
        return Config.Tenant.fromJson(obj(send("GET", "/v2/tenants/" + segment(tenantId), null, true)));
    }

    /** Set a fairness key's weight and cap ("&lt;default&gt;": the jobs sent without a key). */
    public Config.Key putKey(String tenantId, String fairnessKey, Config.Key config) {
        String path = "/v2/tenants/" + segment(tenantId) + "/keys/" + segment(fairnessKey);
        return Config.Key.fromJson(obj(send("PUT", path, config.toJson(), true)));
    }

    public Config.Key getKey(String tenantId, String fairnessKey) {
        String path = "/v2/tenants/" + segment(tenantId) + "/keys/" + segment(fairnessKey);
        return Config.Key.fromJson(obj(send("GET", path, null, true)));
    }

    /** Set the type's whole configuration (cap, aging, rate limit, fairness, per-key cap, key ordering). */
    public Config.JobType putJobType(String type, Config.JobType config) {
        return Config.JobType.fromJson(obj(send("PUT", "/v2/job-types/" + segment(type), config.toJson(), true)));
    }

    public Config.JobType getJobType(String type) {
        return Config.JobType.fromJson(obj(send("GET", "/v2/job-types/" + segment(type), null, true)));
    }

    // -- working -----------------------------------------------------------------------

    /** Options of one activation; {@code requestTimeoutMs} null = the server default. */
    public record Activate(int maxJobs, long timeoutMs, Long requestTimeoutMs, String worker, List<String> tenantIds) {
        public Activate(int maxJobs, long timeoutMs, Long requestTimeoutMs) {
            this(maxJobs, timeoutMs, requestTimeoutMs, null, null);
        }
    }

    public List<Job> activate(String type, Activate options) {
        return activate(type, options, null);
    }

    @SuppressWarnings("unchecked")
    List<Job> activate(String type, Activate o, Consumer<CompletableFuture<?>> onStart) {
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("type", type);
        body.put("maxJobs", o.maxJobs());
        body.put("timeout", o.timeoutMs());
        if (o.requestTimeoutMs() != null) body.put("requestTimeout", o.requestTimeoutMs());
        if (o.worker() != null) body.put("worker", o.worker());
        if (o.tenantIds() != null && !o.tenantIds().isEmpty()) body.put("tenantIds", o.tenantIds());
        long waitMs = o.requestTimeoutMs() != null && o.requestTimeoutMs() > 0 ? o.requestTimeoutMs() : 60_000;
        Object answer = send("POST", "/v2/jobs/activate", body, true, Duration.ofMillis(waitMs + 30_000), onStart);
        List<Job> jobs = new ArrayList<>();
        for (Object j : (List<Object>) obj(answer).get("jobs")) jobs.add(Job.fromJson(obj(j)));
        return jobs;
    }

    public void complete(Job job, Map<String, Object> variables) {
        Map<String, Object> body = fence(job);
        if (variables != null) body.put("variables", variables);
        send("POST", "/v2/jobs/" + job.key() + "/complete", body, true);
    }

    /**
     * One job of {@link #completeMany}: its key and activation count (the fence) and the
     * variables to complete it with, or null.
     */
    public record Completion(String jobKey, int activationCount, Map<String, Object> variables) {
        public Completion(Job job, Map<String, Object> variables) {
            this(job.key(), job.activationCount(), variables);
        }

        public Completion(Job job) {
            this(job, null);
        }
    }

    /** A request body already written as JSON. */
    private record Encoded(String json) {}

    /**
     * Up to 1,000 jobs completed in one round trip, each fenced by its activation count.
     * One verdict per job, in order: 204 completed, 404 unknown, 409 not (or no longer)
     * this activation's.
     *
     * @throws IllegalArgumentException when variables have no JSON form (nothing was sent)
     */
    public List<Integer> completeMany(List<Completion> jobs) {
        List<String> items = new ArrayList<>(jobs.size());
        for (Completion c : jobs) items.add(completionItem(c));
        return sendCompletions(items);
    }

    /** One job of a batched completion, written as JSON (so that a batch can be sized by it). */
    static String completionItem(Completion c) {
        Map<String, Object> item = new LinkedHashMap<>();
        item.put("jobKey", c.jobKey());
        item.put("activationCount", c.activationCount());
        if (c.variables() != null) item.put("variables", c.variables());
        return Json.write(item);
    }

    /** {@link #completeMany} of items already written by {@link #completionItem}. */
    @SuppressWarnings("unchecked")
    List<Integer> sendCompletions(List<String> items) {
        String body = "{\"jobs\":[" + String.join(",", items) + "]}";
        Object answer = send("POST", "/v2/jobs/complete", new Encoded(body), true);
        List<Object> results = (List<Object>) obj(answer).get("results");
        if (results.size() != items.size()) {
            throw new JobfairException(results.size() + " verdicts for " + items.size() + " completions");
        }
        List<Integer> verdicts = new ArrayList<>(results.size());
        for (Object r : results) verdicts.add(((Number) obj(r).get("status")).intValue());
        return verdicts;
    }

    public void fail(Job job, Integer retries, String errorMessage, long retryBackOffMs) {
        Map<String, Object> body = fence(job);
        if (retries != null) body.put("retries", retries);
        if (errorMessage != null) body.put("errorMessage", errorMessage.length() > 10_000 ? errorMessage.substring(0, 10_000) : errorMessage);
        body.put("retryBackOff", retryBackOffMs);
        send("POST", "/v2/jobs/" + job.key() + "/fail", body, true);
    }

    public void throwError(Job job, String code, String message, Map<String, Object> variables) {
        Map<String, Object> body = fence(job);
        body.put("errorCode", code);
        if (message != null) body.put("errorMessage", message);
        if (variables != null) body.put("variables", variables);
        send("POST", "/v2/jobs/" + job.key() + "/error", body, true);
    }

    /** Heartbeat: the lease now ends {@code timeoutMs} from now. */
    public void extendLease(Job job, long timeoutMs) {
        Map<String, Object> body = fence(job);
        body.put("changeset", Map.of("timeout", timeoutMs));
        send("PATCH", "/v2/jobs/" + job.key(), body, true);
    }

    /**
     * An SSE stream of activated jobs, at most {@code credit} unfinished at once. Each job
     * goes to {@code onJob} on the calling thread; returns when the server ends the stream
     * or {@link Stream#close()} is called on the handle given to {@code onOpen}.
     */
    public void stream(String type, int credit, long timeoutMs, String worker,
                       Consumer<Job> onJob, Consumer<AutoCloseable> onOpen) {
        StringBuilder q = new StringBuilder("?type=").append(URLEncoder.encode(type, StandardCharsets.UTF_8))
                .append("&maxJobs=").append(credit).append("&timeout=").append(timeoutMs);
        if (worker != null) q.append("&worker=").append(URLEncoder.encode(worker, StandardCharsets.UTF_8));
        HttpRequest req = request("/v2/jobs/stream" + q, Duration.ofDays(365))
                .header("Accept", "text/event-stream").GET().build();
        HttpResponse<Stream<String>> response;
        try {
            response = http.send(req, HttpResponse.BodyHandlers.ofLines());
        } catch (IOException e) {
            throw new JobfairException("stream failed: " + e, e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new JobfairException("interrupted", e);
        }
        try (Stream<String> lines = response.body()) {
            if (response.statusCode() >= 400) {
                throw ProblemException.of(response.statusCode(), String.join("\n", lines.toList()),
                        response.headers().firstValue("Retry-After").orElse(null));
            }
            if (onOpen != null) onOpen.accept(lines::close);
            String event = "message";
            StringBuilder data = new StringBuilder();
            Iterator<String> it = lines.iterator();
            while (it.hasNext()) {
                String line = it.next();
                if (line.isEmpty()) {
                    if (data.length() > 0 && event.equals("job")) onJob.accept(Job.fromJson(Json.parseObject(data.toString())));
                    event = "message";
                    data.setLength(0);
                } else if (line.startsWith(":")) {
                    continue;
                } else if (line.startsWith("event:")) {
                    event = line.substring(6).trim();
                } else if (line.startsWith("data:")) {
                    if (data.length() > 0) data.append('\n');
                    data.append(line.substring(5).stripLeading());
                }
            }
        } catch (java.io.UncheckedIOException e) {
            throw new JobfairException("stream broke: " + e.getMessage(), e);
        }
    }
}
