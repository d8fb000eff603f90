// A test helper: takes one of Curator's lock recipes on a ZooKeeper path, for the interop tests
// (tests/it/interop.rs). Not part of dlock.
//
//   java Recipes <connect> <path> <recipe> hold <marker>   acquire, write <marker>, wait for stdin EOF, release
//   java Recipes <connect> <path> <recipe> try             exit 0 if it could be had at once (then release), 1 if not
//   java Recipes <connect> <path> <recipe> count <file> <n> n times: acquire, read-sleep-write <file>, release
//
// <recipe>: mutex | write | read | semaphore (InterProcessSemaphoreV2 with 2 leases)

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryOneTime;

public class Recipes {
    interface Held { void release() throws Exception; }

    static Held acquire(CuratorFramework c, String path, String recipe, long waitMs) throws Exception {
        if (recipe.equals("semaphore")) {
            InterProcessSemaphoreV2 s = new InterProcessSemaphoreV2(c, path, 2);
            Lease lease = waitMs < 0 ? s.acquire() : s.acquire(waitMs, TimeUnit.MILLISECONDS);
            return lease == null ? null : lease::close;
        }
        InterProcessMutex m;
        switch (recipe) {
            case "mutex": m = new InterProcessMutex(c, path); break;
            case "write": m = new InterProcessReadWriteLock(c, path).writeLock(); break;
            case "read": m = new InterProcessReadWriteLock(c, path).readLock(); break;
            default: throw new IllegalArgumentException(recipe);
        }
        if (waitMs < 0) {
            m.acquire();
        } else if (!m.acquire(waitMs, TimeUnit.MILLISECONDS)) {
            return null;
        }
        return m::release;
    }

    public static void main(String[] a) throws Exception {
        CuratorFramework c = CuratorFrameworkFactory.newClient(a[0], 10000, 5000, new RetryOneTime(100));
        c.start();
        c.blockUntilConnected();
        String path = a[1], recipe = a[2];
        int code = 0;
        switch (a[3]) {
            case "hold": {
                Held h = acquire(c, path, recipe, -1);
                Files.writeString(Path.of(a[4]), "held\n");
                while (System.in.read() >= 0) {}
                h.release();
                break;
            }
            case "try": {
                Held h = acquire(c, path, recipe, 0);
                if (h == null) code = 1; else h.release();
                break;
            }
            case "count": {
                Path file = Path.of(a[4]);
                for (int i = 0; i < Integer.parseInt(a[5]); i++) {
                    Held h = acquire(c, path, recipe, -1);
                    int n = Integer.parseInt(Files.readString(file).trim());
                    Thread.sleep(5);
                    Files.writeString(file, (n + 1) + "\n");
                    h.release();
                }
                break;
            }
            default: throw new IllegalArgumentException(a[3]);
        }
        c.close();
        System.exit(code);
    }
}
