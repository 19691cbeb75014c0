// Two tenants, one queue: a flood of 1,000 jobs, then a trickle of 10.
// Build the client (clients/java/build.sh), then
//   java -cp clients/java/build/jobfair-client.jar clients/examples/TwoTenants.java [URL]
// With a FIFO queue the trickle's jobs would wait behind the whole flood; Jobfair's fair
// share hands them out within the first few dozen activations.
import dev.jobfair.client.Jobfair;
import dev.jobfair.client.NewJob;
import dev.jobfair.client.Worker;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CountDownLatch;

public class TwoTenants {
    static final int FLOOD = 1000;
    static final int TRICKLE = 10;

    public static void main(String[] args) throws Exception {
        Jobfair jf = new Jobfair(args.length > 0 ? args[0] : "http://127.0.0.1:8080");
        String type = "demo-" + UUID.randomUUID().toString().substring(0, 8);
        List<NewJob> flood = new ArrayList<>();
        for (int i = 0; i < FLOOD; i++) flood.add(new NewJob(type).tenantId("flood"));
        jf.createJobs(flood);
        List<NewJob> trickle = new ArrayList<>();
        for (int i = 0; i < TRICKLE; i++) trickle.add(new NewJob(type).tenantId("trickle"));
        jf.createJobs(trickle);
        System.out.printf("queued %d jobs of tenant 'flood', then %d of tenant 'trickle'%n", FLOOD, TRICKLE);

        List<String> order = Collections.synchronizedList(new ArrayList<>());
        CountDownLatch done = new CountDownLatch(FLOOD + TRICKLE);
        Worker worker = new Worker(jf, type, job -> {
            order.add(job.tenantId());
            done.countDown();
            return null;
        }, new Worker.Options().concurrency(4).requestTimeoutMs(1000));
        Thread running = new Thread(worker::run);
        running.start();
        done.await();
        worker.stop();
        running.join();

        List<Integer> positions = new ArrayList<>();
        for (int i = 0; i < order.size(); i++) if (order.get(i).equals("trickle")) positions.add(i + 1);
        System.out.printf("trickle jobs were handled at positions %s of %d%n", positions, order.size());
        System.out.printf("TRICKLE_DONE_BY=%d (a FIFO queue would need %d)%n", positions.get(positions.size() - 1), FLOOD + TRICKLE);
    }
}
