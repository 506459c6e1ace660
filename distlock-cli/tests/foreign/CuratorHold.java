// A Curator lock holder for the interoperability tests (distlock-cli/tests/interop.rs):
//   java CuratorHold <connect-string> <lock-path> <release-file> [mutex|read|write]
// An InterProcessMutex, or InterProcessReadWriteLock's read or write lock. Prints "acquired"
// once it holds the lock, releases once <release-file> exists, then exits.
import java.io.File;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.retry.RetryOneTime;

public class CuratorHold {
    public static void main(String[] args) throws Exception {
        CuratorFramework client =
            CuratorFrameworkFactory.newClient(args[0], 10000, 5000, new RetryOneTime(100));
        client.start();
        String kind = args.length > 3 ? args[3] : "mutex";
        InterProcessMutex mutex;
        if (kind.equals("mutex")) {
            mutex = new InterProcessMutex(client, args[1]);
        } else {
            InterProcessReadWriteLock rw = new InterProcessReadWriteLock(client, args[1]);
            mutex = kind.equals("read") ? rw.readLock() : rw.writeLock();
        }
        mutex.acquire();
        System.out.println("acquired");
        System.out.flush();
        File release = new File(args[2]);
        while (!release.exists()) {
            Thread.sleep(20);
        }
        mutex.release();
        client.close();
        System.out.println("released");
    }
}
