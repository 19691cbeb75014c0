package dev.jobfair.client;

import java.util.Map;

/** Throw (or return via {@link Result#error}) from a handler to throw a job error: ERROR_THROWN, no retry. */
public class BusinessError extends RuntimeException {
    public final String code;
    public final Map<String, Object> variables;

    public BusinessError(String code, String message) {
        this(code, message, null);
    }

    public BusinessError(String code, String message, Map<String, Object> variables) {
        super(message == null ? code : message);
        this.code = code;
        this.variables = variables;
    }
}
