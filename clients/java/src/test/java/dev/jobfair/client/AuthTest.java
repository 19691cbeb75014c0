package dev.jobfair.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLHandshakeException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The client's API key against a Jobfair that requires keys, at the http:// and the
 * https:// URL of JOBFAIR_AUTH_URLS (the HTTPS server's certificate issued by the CA in the
 * PEM file JOBFAIR_CA): JOBFAIR_ADMIN_KEY may do everything, JOBFAIR_WORKER_KEY is a worker
 * key scoped to tenant acme. Started by tests/acceptance/test_client_auth.py; skipped when
 * those are not set (the main suite runs against a server without keys).
 */
@Timeout(value = 60, unit = TimeUnit.SECONDS)
class AuthTest {
    static final List<String> URLS =
            Arrays.asList(System.getenv().getOrDefault("JOBFAIR_AUTH_URLS", "").split(","));
    static final String ADMIN = System.getenv("JOBFAIR_ADMIN_KEY");
    static final String WORKER = System.getenv("JOBFAIR_WORKER_KEY");
    static final String CA = System.getenv("JOBFAIR_CA");

    static String url(String scheme) {
        String found = URLS.stream().filter(u -> u.startsWith(scheme + "://")).findFirst().orElse(null);
        assumeTrue(found != null && ADMIN != null && WORKER != null && CA != null,
                "JOBFAIR_AUTH_URLS (with a " + scheme + " URL), JOBFAIR_ADMIN_KEY, JOBFAIR_WORKER_KEY and JOBFAIR_CA");
        return found;
    }

    static Jobfair client(String url, String key, SSLContext tls) {
        return new Jobfair(url, key, 1, Backoff.DEFAULT, tls);
    }

    static void goodBadAndScopedKeys(String url, SSLContext tls) {
        String type = "java-auth-" + Long.toString(System.nanoTime(), 36);
        Jobfair admin = client(url, ADMIN, tls);
        Job mine = admin.createJob(new NewJob(type).tenantId("acme"));
        Job theirs = admin.createJob(new NewJob(type).tenantId("globex"));

        Jobfair worker = client(url, WORKER, tls);
        assertEquals("acme", worker.getJob(mine.key()).tenantId());
        // Another tenant's job is, to this key, a job that does not exist.
        assertThrows(ProblemException.NotFound.class, () -> worker.getJob(theirs.key()));
        List<Job> jobs = worker.activate(type, new Jobfair.Activate(10, 60_000, -1L));
        assertEquals(List.of(mine.key()), jobs.stream().map(Job::key).toList());
        worker.complete(jobs.get(0), Map.of("done", true));
        assertEquals("COMPLETED", admin.getJob(mine.key()).state());
        assertEquals("CREATED", admin.getJob(theirs.key()).state());

        String wrong = WORKER.substring(0, WORKER.length() - 1) + (WORKER.endsWith("x") ? "y" : "x");
        ProblemException refused = assertThrows(ProblemException.Unauthorized.class,
                () -> client(url, wrong, tls).getJob(mine.key()));
        assertEquals(401, refused.status);
        assertThrows(ProblemException.Unauthorized.class, () -> client(url, null, tls).getJob(mine.key()));
    }

    @Test
    void keysOverHttp() {
        goodBadAndScopedKeys(url("http"), null);
    }

    @Test
    void keysOverHttpsTrustingTheServersCa() {
        goodBadAndScopedKeys(url("https"), Jobfair.trusting(Path.of(CA)));
    }

    @Test
    void withoutTheCaTheServersCertificateIsRefused() {
        String url = url("https");
        JobfairException e = assertThrows(JobfairException.class, () -> client(url, ADMIN, null).getJob("1"));
        assertInstanceOf(SSLHandshakeException.class, e.getCause(), e.toString());
    }
}
