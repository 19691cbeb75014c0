package dev.jobfair.client;

import java.util.LinkedHashMap;
import java.util.Map;

/**
 * Operators' configuration records (API.md "Operators"): a tenant's, a fairness key's and
 * a job type's. A PUT sets the whole configuration: a null field is sent as null (no cap,
 * no minimum, no limit), so read, change and put back ({@code with...}) to change one
 * field alone. {@code paused} and {@code configured} are answered, never sent.
 */
public final class Config {
    private Config() {}

    /** A token bucket: {@code perSecond} activations a second on average, {@code burst} at once. */
    public record RateLimit(double perSecond, double burst) {
        Map<String, Object> toJson() {
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("perSecond", perSecond);
            out.put("burst", burst);
            return out;
        }

        static RateLimit fromJson(Object o) {
            if (o == null) return null;
            Map<?, ?> d = (Map<?, ?>) o;
            return new RateLimit(((Number) d.get("perSecond")).doubleValue(), ((Number) d.get("burst")).doubleValue());
        }
    }

    private static Object rate(RateLimit limit) {
        return limit == null ? null : limit.toJson();
    }

    private static Integer integer(Map<String, Object> d, String field) {
        Object v = d.get(field);
        return v == null ? null : ((Number) v).intValue();
    }

    private static boolean flag(Map<String, Object> d, String field, boolean otherwise) {
        Object v = d.get(field);
        return v == null ? otherwise : (Boolean) v;
    }

    /**
     * A tenant's share (weight 1-10,000), its cap on ACTIVATED jobs of every type, its
     * guaranteed minimum of them (at most the cap) and its rate limit.
     */
    public record Tenant(int weight, Integer maxActiveJobs, Integer minActiveJobs, RateLimit rateLimit,
                         boolean paused, boolean configured) {
        public Tenant(int weight, Integer maxActiveJobs, Integer minActiveJobs, RateLimit rateLimit) {
            this(weight, maxActiveJobs, minActiveJobs, rateLimit, false, false);
        }

        /** The defaults: weight 1, no cap, no minimum, no limit. */
        public Tenant() {
            this(1, null, null, null);
        }

        public Tenant withWeight(int w) { return new Tenant(w, maxActiveJobs, minActiveJobs, rateLimit); }
        public Tenant withMaxActiveJobs(Integer n) { return new Tenant(weight, n, minActiveJobs, rateLimit); }
        public Tenant withMinActiveJobs(Integer n) { return new Tenant(weight, maxActiveJobs, n, rateLimit); }
        public Tenant withRateLimit(RateLimit r) { return new Tenant(weight, maxActiveJobs, minActiveJobs, r); }

        Map<String, Object> toJson() {
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("weight", weight);
            out.put("maxActiveJobs", maxActiveJobs);
            out.put("minActiveJobs", minActiveJobs);
            out.put("rateLimit", rate(rateLimit));
            return out;
        }

        static Tenant fromJson(Map<String, Object> d) {
            return new Tenant(((Number) d.get("weight")).intValue(), integer(d, "maxActiveJobs"),
                    integer(d, "minActiveJobs"), RateLimit.fromJson(d.get("rateLimit")),
                    flag(d, "paused", false), flag(d, "configured", true));
        }
    }

    /** A fairness key's weight inside its tenant and its cap on ACTIVATED jobs of every type. */
    public record Key(int weight, Integer maxActiveJobs, boolean configured) {
        public Key(int weight, Integer maxActiveJobs) {
            this(weight, maxActiveJobs, false);
        }

        Map<String, Object> toJson() {
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("weight", weight);
            out.put("maxActiveJobs", maxActiveJobs);
            return out;
        }

        static Key fromJson(Map<String, Object> d) {
            return new Key(((Number) d.get("weight")).intValue(), integer(d, "maxActiveJobs"),
                    flag(d, "configured", true));
        }
    }

    /**
     * A job type's cap, aging (null: the server's defaults), rate limit, what its lanes are
     * charged by ("activations", "workerTime" or "cost"; null: activations), its cap per
     * fairness key, and {@code keyOrdering "fifo"} for each key's jobs one at a time in
     * creation order.
     */
    public record JobType(Integer maxActiveJobs, Integer agingIntervalMs, Integer agingStep, RateLimit rateLimit,
                          String fairnessBy, Integer maxActivePerKey, String keyOrdering,
                          boolean paused, boolean configured) {
        public JobType(Integer maxActiveJobs, Integer agingIntervalMs, Integer agingStep, RateLimit rateLimit,
                       String fairnessBy, Integer maxActivePerKey, String keyOrdering) {
            this(maxActiveJobs, agingIntervalMs, agingStep, rateLimit, fairnessBy, maxActivePerKey, keyOrdering,
                    false, false);
        }

        /** The defaults: no cap, the server's aging, no limit, by activations, no per-key cap, by priority. */
        public JobType() {
            this(null, null, null, null, null, null, null);
        }

        public JobType withMaxActiveJobs(Integer n) {
            return new JobType(n, agingIntervalMs, agingStep, rateLimit, fairnessBy, maxActivePerKey, keyOrdering);
        }
        public JobType withMaxActivePerKey(Integer n) {
            return new JobType(maxActiveJobs, agingIntervalMs, agingStep, rateLimit, fairnessBy, n, keyOrdering);
        }
        public JobType withKeyOrdering(String ordering) {
            return new JobType(maxActiveJobs, agingIntervalMs, agingStep, rateLimit, fairnessBy, maxActivePerKey, ordering);
        }

        Map<String, Object> toJson() {
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("maxActiveJobs", maxActiveJobs);
            if (agingIntervalMs != null) out.put("agingIntervalMs", agingIntervalMs);
            if (agingStep != null) out.put("agingStep", agingStep);
            out.put("rateLimit", rate(rateLimit));
            if (fairnessBy != null) out.put("fairnessBy", fairnessBy);
            out.put("maxActivePerKey", maxActivePerKey);
            out.put("keyOrdering", keyOrdering);
            return out;
        }

        static JobType fromJson(Map<String, Object> d) {
            return new JobType(integer(d, "maxActiveJobs"), integer(d, "agingIntervalMs"), integer(d, "agingStep"),
                    RateLimit.fromJson(d.get("rateLimit")), (String) d.get("fairnessBy"),
                    integer(d, "maxActivePerKey"), (String) d.get("keyOrdering"),
                    flag(d, "paused", false), flag(d, "configured", true));
        }
    }
}
