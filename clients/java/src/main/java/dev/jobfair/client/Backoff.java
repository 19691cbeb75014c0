package dev.jobfair.client;

import java.util.concurrent.ThreadLocalRandom;

/** Exponential back-off: {@code base * factor^attempt} ms, at most {@code max}. */
public record Backoff(long baseMs, double factor, long maxMs) {
    public static final Backoff DEFAULT = new Backoff(200, 2, 30_000);

    public long exactMs(int attempt) {
        return (long) Math.min(maxMs, baseMs * Math.pow(factor, attempt));
    }

    /** Jittered (upper half of the exact value), never sooner than Retry-After. */
    public long delayMs(int attempt, double retryAfterS) {
        long ceiling = exactMs(attempt);
        double delay = ceiling / 2.0 + ThreadLocalRandom.current().nextDouble() * ceiling / 2.0;
        if (retryAfterS > 0) delay = Math.max(delay, retryAfterS * 1000 * (1 + ThreadLocalRandom.current().nextDouble() * 0.2));
        return (long) delay;
    }
}
