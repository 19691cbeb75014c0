package dev.jobfair.client;

import java.util.Map;

/** A job record (API.md "Job record"). Instants are RFC 3339 strings, as on the wire. */
public record Job(
        String key,
        String type,
        String tenantId,
        String state,
        int priority,
        int effectivePriority,
        int retries,
        int activationCount,
        String worker,
        String deadline,
        String runAt,
        Map<String, Object> variables,
        Map<String, Object> customHeaders,
        String errorCode,
        String errorMessage,
        String createdAt,
        String activatedAt,
        String completedAt,
        String idempotencyKey) {

    @SuppressWarnings("unchecked")
    static Job fromJson(Map<String, Object> d) {
        return new Job(
                (String) d.get("jobKey"),
                (String) d.get("type"),
                (String) d.get("tenantId"),
                (String) d.get("state"),
                ((Number) d.get("priority")).intValue(),
                ((Number) d.get("effectivePriority")).intValue(),
                ((Number) d.get("retries")).intValue(),
                ((Number) d.get("activationCount")).intValue(),
                (String) d.get("worker"),
                (String) d.get("deadline"),
                (String) d.get("runAt"),
                (Map<String, Object>) d.getOrDefault("variables", Map.of()),
                (Map<String, Object>) d.getOrDefault("customHeaders", Map.of()),
                (String) d.get("errorCode"),
                (String) d.get("errorMessage"),
                (String) d.get("createdAt"),
                (String) d.get("activatedAt"),
                (String) d.get("completedAt"),
                (String) d.get("idempotencyKey"));
    }
}
