package dev.jobfair.client;

import java.util.Map;

/** An RFC 9457 problem answer. Subclasses name the kinds a caller branches on. */
public class ProblemException extends JobfairException {
    public final int status;
    public final String type;
    public final String title;
    public final String detail;
    /** Seconds the server asked us to wait (503/429), or -1. */
    public final double retryAfterS;

    public ProblemException(int status, Map<String, Object> body, double retryAfterS) {
        super(status + " " + body.getOrDefault("title", "") + ": " + body.getOrDefault("detail", ""));
        this.status = status;
        this.type = String.valueOf(body.getOrDefault("type", "about:blank"));
        this.title = String.valueOf(body.getOrDefault("title", ""));
        this.detail = String.valueOf(body.getOrDefault("detail", ""));
        this.retryAfterS = retryAfterS;
    }

    /** 400: malformed or out of range; nothing changed. */
    public static final class InvalidArgument extends ProblemException {
        InvalidArgument(int s, Map<String, Object> b, double r) { super(s, b, r); }
    }

    /** 401: missing or invalid API key. */
    public static final class Unauthorized extends ProblemException {
        Unauthorized(int s, Map<String, Object> b, double r) { super(s, b, r); }
    }

    /** 403: the key may not touch this tenant, job type or operation. */
    public static final class Forbidden extends ProblemException {
        Forbidden(int s, Map<String, Object> b, double r) { super(s, b, r); }
    }

    /** 404: no such job. */
    public static final class NotFound extends ProblemException {
        NotFound(int s, Map<String, Object> b, double r) { super(s, b, r); }
    }

    /** 409: the job is not in a state that allows this. */
    public static class Conflict extends ProblemException {
        Conflict(int s, Map<String, Object> b, double r) { super(s, b, r); }
    }

    /** 409 urn:jobfair:stale-activation: this activation is no longer current. */
    public static final class StaleActivation extends Conflict {
        StaleActivation(int s, Map<String, Object> b, double r) { super(s, b, r); }
    }

    /** 503 or 429: back pressure, or the database unavailable; nothing changed. */
    public static final class ResourceExhausted extends ProblemException {
        ResourceExhausted(int s, Map<String, Object> b, double r) { super(s, b, r); }
    }

    /**
     * 503 urn:jobfair:outcome-unknown: the server's database went away while the call's
     * changes were being committed; they may or may not have been made. Retried only when
     * sending the call twice is harmless; otherwise read before creating again.
     */
    public static final class OutcomeUnknown extends ProblemException {
        OutcomeUnknown(int s, Map<String, Object> b, double r) { super(s, b, r); }
    }

    static final String OUTCOME_UNKNOWN = "urn:jobfair:outcome-unknown";

    static ProblemException of(int status, String text, String retryAfter) {
        Map<String, Object> body;
        try {
            body = Json.parseObject(text);
        } catch (RuntimeException notJson) {
            body = Map.of("title", "HTTP_ERROR", "detail", text.length() > 500 ? text.substring(0, 500) : text);
        }
        double wait = -1;
        if (retryAfter != null) {
            try {
                wait = Math.max(0, Double.parseDouble(retryAfter));
            } catch (NumberFormatException ignored) {
                wait = -1;
            }
        }
        return switch (status) {
            case 400 -> new InvalidArgument(status, body, wait);
            case 401 -> new Unauthorized(status, body, wait);
            case 403 -> new Forbidden(status, body, wait);
            case 404 -> new NotFound(status, body, wait);
            case 409 -> "urn:jobfair:stale-activation".equals(body.get("type"))
                    ? new StaleActivation(status, body, wait)
                    : new Conflict(status, body, wait);
            case 503 -> OUTCOME_UNKNOWN.equals(body.get("type"))
                    ? new OutcomeUnknown(status, body, wait)
                    : new ResourceExhausted(status, body, wait);
            case 429 -> new ResourceExhausted(status, body, wait);
            default -> new ProblemException(status, body, wait);
        };
    }
}
