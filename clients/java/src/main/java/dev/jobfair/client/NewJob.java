package dev.jobfair.client;

import java.util.LinkedHashMap;
import java.util.Map;

/** A job to create. Unset fields take the server's defaults. */
public final class NewJob {
    private final Map<String, Object> fields = new LinkedHashMap<>();

    public NewJob(String type) {
        fields.put("type", type);
    }

    public NewJob tenantId(String tenantId) { fields.put("tenantId", tenantId); return this; }
    public NewJob priority(int priority) { fields.put("priority", priority); return this; }
    public NewJob retries(int retries) { fields.put("retries", retries); return this; }
    public NewJob variables(Map<String, Object> variables) { fields.put("variables", variables); return this; }
    public NewJob customHeaders(Map<String, Object> headers) { fields.put("customHeaders", headers); return this; }
    public NewJob runAt(String rfc3339) { fields.put("runAt", rfc3339); return this; }
    public NewJob delayMs(long delay) { fields.put("delay", delay); return this; }
    public NewJob idempotencyKey(String key) { fields.put("idempotencyKey", key); return this; }
    /** Divides the tenant's share among its keys (an end user, a project). */
    public NewJob fairnessKey(String key) { fields.put("fairnessKey", key); return this; }
    /** A positive number, charged where the job type is fair by cost (default 1). */
    public NewJob cost(double cost) { fields.put("cost", cost); return this; }

    boolean hasIdempotencyKey() {
        return fields.containsKey("idempotencyKey");
    }

    Map<String, Object> toJson() {
        return fields;
    }
}
