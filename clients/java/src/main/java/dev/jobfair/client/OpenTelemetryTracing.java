package dev.jobfair.client;

import io.opentelemetry.api.GlobalOpenTelemetry;
import io.opentelemetry.api.common.AttributeKey;
import io.opentelemetry.api.trace.Span;
import io.opentelemetry.api.trace.SpanBuilder;
import io.opentelemetry.api.trace.SpanContext;
import io.opentelemetry.api.trace.SpanKind;
import io.opentelemetry.api.trace.StatusCode;
import io.opentelemetry.context.Context;
import io.opentelemetry.context.Scope;
import io.opentelemetry.context.propagation.TextMapGetter;
import io.opentelemetry.context.propagation.TextMapPropagator;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * {@link Tracing} through OpenTelemetry's global instance, read at every use by
 * {@code getOrNoop()}, which never sets it: an application that sets up its SDK after the
 * client's first request is traced all the same, and its {@code buildAndRegisterGlobal()}
 * does not find the global taken by a no-op (as {@code get()} would leave it). Loaded
 * by name, so that the client runs without the API (this file is compiled only where the
 * API is: build.sh leaves it out otherwise).
 */
final class OpenTelemetryTracing implements Tracing {
    static final String HEADER = "traceparent";

    private static final TextMapGetter<Map<String, String>> GETTER = new TextMapGetter<>() {
        @Override public Iterable<String> keys(Map<String, String> carrier) { return carrier.keySet(); }
        @Override public String get(Map<String, String> carrier, String key) { return carrier == null ? null : carrier.get(key); }
    };

    private static TextMapPropagator propagator() {
        return GlobalOpenTelemetry.getOrNoop().getPropagators().getTextMapPropagator();
    }

    @Override
    public Map<String, String> headers() {
        Context current = Context.current();
        if (!Span.fromContext(current).getSpanContext().isValid()) return Map.of();
        Map<String, String> carrier = new LinkedHashMap<>();
        propagator().inject(current, carrier, Map::put);
        return carrier;
    }

    @Override
    public Handling handling(Job job) {
        SpanBuilder span = GlobalOpenTelemetry.getOrNoop().getTracer("jobfair-client-java")
                .spanBuilder(job.type() + " process")
                .setSpanKind(SpanKind.CONSUMER)
                .setAttribute("jobfair.job_key", job.key())
                .setAttribute("jobfair.type", job.type())
                .setAttribute(AttributeKey.stringKey("jobfair.tenant"), job.tenantId())
                .setAttribute("jobfair.activation_count", job.activationCount());
        if (job.customHeaders().get(HEADER) instanceof String kept) {
            Context parent = propagator().extract(Context.root(), Map.of(HEADER, kept), GETTER);
            SpanContext linked = Span.fromContext(parent).getSpanContext();
            if (linked.isValid()) span.setParent(parent).addLink(linked);
        }
        Span started = span.startSpan();
        Scope scope = started.makeCurrent();
        return new Handling() {
            @Override
            public void failed(Throwable error) {
                started.recordException(error);
                started.setStatus(StatusCode.ERROR, String.valueOf(error.getMessage()));
            }

            @Override
            public void close() {
                scope.close();
                started.end();
            }
        };
    }
}
