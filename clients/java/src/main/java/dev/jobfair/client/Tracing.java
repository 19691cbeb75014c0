package dev.jobfair.client;

import java.util.Map;

/**
 * OpenTelemetry, where the application has its API on the class path (an SDK set up as
 * the global one, or the Java agent): requests carry the current span as a W3C
 * {@code traceparent} header, so a create hands the producer's trace to the server, which
 * keeps it with the job; a worker runs each handler, and its finish, in a span
 * ("&lt;type&gt; process", a consumer span) whose parent is the trace the job keeps, linked to it
 * too. One trace then spans producer, server and worker (docs/tracing.md).
 *
 * <p>The client has no dependency of its own on OpenTelemetry: {@link #load()} uses
 * {@code OpenTelemetryTracing} (compiled where the API is, as build.sh and the pom do) only
 * when the API is there, and otherwise does nothing.
 */
interface Tracing {
    /** The current span's context as headers ({@code traceparent}, {@code tracestate}); none without one. */
    Map<String, String> headers();

    /** Opens the span a handler of {@code job} runs in, current on this thread until closed. */
    Handling handling(Job job);

    /** A handler's span. */
    interface Handling extends AutoCloseable {
        /** Records that the handler failed (an exception or a business error). */
        void failed(Throwable error);

        /** Ends the span and restores the thread's context. */
        @Override
        void close();
    }

    Handling NOTHING = new Handling() {
        @Override public void failed(Throwable error) {}
        @Override public void close() {}
    };

    Tracing NONE = new Tracing() {
        @Override public Map<String, String> headers() { return Map.of(); }
        @Override public Handling handling(Job job) { return NOTHING; }
    };

    /** OpenTelemetry's when its API and this client's bridge to it are both present, else {@link #NONE}. */
    static Tracing load() {
        ClassLoader loader = Tracing.class.getClassLoader();
        try {
            // getOrNoop (the API's 1.62 has it) reads the global without setting it.
            Class.forName("io.opentelemetry.api.GlobalOpenTelemetry", false, loader).getMethod("getOrNoop");
            return (Tracing) Class.forName("dev.jobfair.client.OpenTelemetryTracing", true, loader)
                    .getDeclaredConstructor()
                    .newInstance();
        } catch (ReflectiveOperationException | LinkageError e) {
            return NONE;
        }
    }
}
