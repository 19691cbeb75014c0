package dev.jobfair.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.net.httpserver.HttpServer;
import io.opentelemetry.api.GlobalOpenTelemetry;
import io.opentelemetry.api.common.AttributeKey;
import io.opentelemetry.api.trace.Span;
import io.opentelemetry.api.trace.SpanContext;
import io.opentelemetry.api.trace.SpanKind;
import io.opentelemetry.api.trace.StatusCode;
import io.opentelemetry.api.trace.propagation.W3CTraceContextPropagator;
import io.opentelemetry.context.Scope;
import io.opentelemetry.context.propagation.ContextPropagators;
import io.opentelemetry.sdk.OpenTelemetrySdk;
import io.opentelemetry.sdk.common.CompletableResultCode;
import io.opentelemetry.sdk.trace.SdkTracerProvider;
import io.opentelemetry.sdk.trace.data.SpanData;
import io.opentelemetry.sdk.trace.export.SimpleSpanProcessor;
import io.opentelemetry.sdk.trace.export.SpanExporter;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The client's tracing through OpenTelemetry's SDK, against the live Jobfair at
 * JOBFAIR_URL: one trace from the producer's span, through the job the server keeps, to
 * the worker's handler and its finish. build.sh compiles and runs it where the SDK's jars
 * are. The spans go to an exporter of the test's own (the SDK's testing module is not in
 * the local repository).
 */
@Timeout(value = 120, unit = TimeUnit.SECONDS)
class OpenTelemetryTracingTest {
    static final String URL = System.getenv("JOBFAIR_URL");
    static final String RUN = JobfairClientTest.RUN;
    static final List<SpanData> SPANS = new CopyOnWriteArrayList<>();

    static {
        // A request before the application sets OpenTelemetry up: the client must not
        // take the global (the SDK's buildAndRegisterGlobal below would then throw).
        new Jobfair(URL).createJob(new NewJob("java-traced-early-" + RUN));
        SpanExporter collect = new SpanExporter() {
            @Override public CompletableResultCode export(Collection<SpanData> spans) {
                SPANS.addAll(spans);
                return CompletableResultCode.ofSuccess();
            }
            @Override public CompletableResultCode flush() { return CompletableResultCode.ofSuccess(); }
            @Override public CompletableResultCode shutdown() { return CompletableResultCode.ofSuccess(); }
        };
        OpenTelemetrySdk.builder()
                .setTracerProvider(SdkTracerProvider.builder().addSpanProcessor(SimpleSpanProcessor.create(collect)).build())
                .setPropagators(ContextPropagators.create(W3CTraceContextPropagator.getInstance()))
                .buildAndRegisterGlobal();
    }

    final Jobfair jf = new Jobfair(URL);

    static String traceparent(SpanContext c) {
        return "00-" + c.getTraceId() + "-" + c.getSpanId() + "-" + c.getTraceFlags().asHex();
    }

    static SpanData exported(String name, String jobKey) {
        return SPANS.stream()
                .filter(s -> s.getName().equals(name) && jobKey.equals(s.getAttributes().get(AttributeKey.stringKey("jobfair.job_key"))))
                .findFirst()
                .orElseThrow(() -> new AssertionError("no span " + name + " of job " + jobKey + " in " + SPANS));
    }

    /** A proxy to Jobfair that notes each request's method, path and traceparent header. */
    static final class Recorder implements AutoCloseable {
        final HttpServer server;
        final ExecutorService threads = Executors.newFixedThreadPool(4);
        final HttpClient http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();
        final Map<String, String> traceparents = new ConcurrentHashMap<>(); // "POST /v2/jobs/1/complete" -> header

        Recorder(String target) throws IOException {
            server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
            server.setExecutor(threads);
            server.createContext("/", exchange -> {
                String call = exchange.getRequestMethod() + " " + exchange.getRequestURI();
                String header = exchange.getRequestHeaders().getFirst("traceparent");
                traceparents.put(call, header == null ? "" : header);
                byte[] body = exchange.getRequestBody().readAllBytes();
                HttpRequest.Builder forward = HttpRequest.newBuilder(URI.create(target + exchange.getRequestURI()))
                        .method(exchange.getRequestMethod(), HttpRequest.BodyPublishers.ofByteArray(body));
                String type = exchange.getRequestHeaders().getFirst("Content-Type");
                if (type != null) forward.header("Content-Type", type);
                try {
                    HttpResponse<byte[]> answer = http.send(forward.build(), HttpResponse.BodyHandlers.ofByteArray());
                    answer.headers().firstValue("Content-Type").ifPresent(v -> exchange.getResponseHeaders().set("Content-Type", v));
                    byte[] out = answer.body();
                    exchange.sendResponseHeaders(answer.statusCode(), out.length == 0 ? -1 : out.length);
                    exchange.getResponseBody().write(out);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                } finally {
                    exchange.close();
                }
            });
            server.start();
        }

        String url() {
            return "http://127.0.0.1:" + server.getAddress().getPort();
        }

        @Override
        public void close() {
            server.stop(0);
            threads.shutdownNow();
        }
    }

    @Test
    @SuppressWarnings("try") // the scope is only closed
    void oneTraceSpansTheProducerTheJobAndTheWorker() throws Exception {
        String type = "java-traced-" + RUN;
        Span signup = GlobalOpenTelemetry.getTracer("producer").spanBuilder("signup").startSpan();
        Job ok;
        Job boom;
        try (Scope ignored = signup.makeCurrent()) {
            ok = jf.createJob(new NewJob(type).tenantId("acme").variables(Map.of("boom", false)));
            boom = jf.createJob(new NewJob(type).tenantId("acme").variables(Map.of("boom", true)));
        } finally {
            signup.end();
        }
        SpanContext producer = signup.getSpanContext();
        // The create carried the producer's span; the server keeps it with each job.
        assertEquals(traceparent(producer), ok.customHeaders().get("traceparent"));
        assertEquals(traceparent(producer), boom.customHeaders().get("traceparent"));
        Job untraced = jf.createJob(new NewJob(type));
        assertFalse(untraced.customHeaders().containsKey("traceparent"));
        Job garbled = jf.createJob(new NewJob(type).customHeaders(Map.of("traceparent", "not a traceparent")));

        Map<String, SpanContext> seen = new ConcurrentHashMap<>();
        CountDownLatch all = new CountDownLatch(4);
        try (Recorder proxy = new Recorder(URL)) {
            // Each finish sent on its own, from the handler's span (batches carry none).
            Worker w = new Worker(new Jobfair(proxy.url()), type, job -> {
                seen.put(job.key(), Span.current().getSpanContext());
                all.countDown();
                if (Boolean.TRUE.equals(job.variables().get("boom"))) throw new IllegalStateException("the mail server said no");
                return Map.of();
            }, new Worker.Options().concurrency(2).batchCompletion(false).failBackoff(new Backoff(60_000, 1, 60_000)));
            Thread t = new Thread(w::run, "traced-worker");
            t.start();
            assertTrue(all.await(60, TimeUnit.SECONDS));
            w.stop();
            t.join();

            // The handler ran in a consumer span, a child of the producer's, linked to it.
            SpanData handled = exported(type + " process", ok.key());
            assertEquals(SpanKind.CONSUMER, handled.getKind());
            assertEquals(producer.getTraceId(), handled.getTraceId());
            assertEquals(producer.getSpanId(), handled.getParentSpanId());
            assertEquals(List.of(traceparent(producer)), handled.getLinks().stream().map(l -> traceparent(l.getSpanContext())).toList());
            assertEquals(handled.getSpanContext(), seen.get(ok.key()));
            assertEquals("acme", handled.getAttributes().get(AttributeKey.stringKey("jobfair.tenant")));
            assertEquals(1L, handled.getAttributes().get(AttributeKey.longKey("jobfair.activation_count")));
            // Its completion went out in that span.
            assertEquals(traceparent(handled.getSpanContext()), proxy.traceparents.get("POST /v2/jobs/" + ok.key() + "/complete"));

            // A handler's exception: the span says so, and the fail is in it.
            SpanData failed = exported(type + " process", boom.key());
            assertEquals(StatusCode.ERROR, failed.getStatus().getStatusCode());
            assertTrue(failed.getEvents().stream().anyMatch(e -> e.getName().equals("exception")));
            assertEquals(producer.getTraceId(), failed.getTraceId());
            assertEquals(traceparent(failed.getSpanContext()), proxy.traceparents.get("POST /v2/jobs/" + boom.key() + "/fail"));

            // A job with no trace, or one that cannot be read: a trace of its own, unlinked.
            for (Job own : List.of(untraced, garbled)) {
                SpanData root = exported(type + " process", own.key());
                assertFalse(root.getParentSpanContext().isValid(), own.customHeaders().toString());
                assertTrue(root.getLinks().isEmpty());
                assertNotNull(seen.get(own.key()));
                assertEquals(root.getTraceId(), seen.get(own.key()).getTraceId());
            }
            // Long polls carry no trace: the worker's loop is in none.
            assertTrue(proxy.traceparents.entrySet().stream()
                    .filter(e -> e.getKey().startsWith("POST /v2/jobs/activate"))
                    .allMatch(e -> e.getValue().isEmpty()), proxy.traceparents.toString());
        }
    }
}
