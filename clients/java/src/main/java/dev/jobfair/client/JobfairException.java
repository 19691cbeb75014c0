package dev.jobfair.client;

/** Anything that went wrong talking to Jobfair. Unchecked, like the JDK's own I/O wrappers. */
public class JobfairException extends RuntimeException {
    public JobfairException(String message) {
        super(message);
    }

    public JobfairException(String message, Throwable cause) {
        super(message, cause);
    }
}
