// A Curator lock holder for the interoperability tests (distlock-cli/tests/interop.rs):
//   java CuratorHold <connect-string> <lock-path> <release-file> [mutex|read|write]
//   java CuratorHold <connect-string> <lock-path> <release-file> elect <participant-id>
//   java CuratorHold <connect-string> <lock-path> - leader
// An InterProcessMutex, or InterProcessReadWriteLock's read or write lock; or a
// LeaderSelector (built on the mutex, the participant id as its node's data). Prints
// "acquired" once it holds the lock (leads), releases (relinquishes) once <release-file>
// exists, then exits. With `leader`, prints "leader=<id>" of the current leader and exits.
import java.io.File;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderSelector;
import org.apache.curator.framework.recipes.leader.LeaderSelectorListenerAdapter;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.retry.RetryOneTime;

public class CuratorHold {
    static void holdUntil(String path) throws InterruptedException {
        System.out.println("acquired");
        System.out.flush();
        File release = new File(path);
        while (!release.exists()) {
            Thread.sleep(20);
        }
    }

    public static void main(String[] args) throws Exception {
        CuratorFramework client =
            CuratorFrameworkFactory.newClient(args[0], 10000, 5000, new RetryOneTime(100));
        client.start();
        String kind = args.length > 3 ? args[3] : "mutex";
        if (kind.equals("leader")) {
            LeaderSelector s = new LeaderSelector(client, args[1], new LeaderSelectorListenerAdapter() {
                public void takeLeadership(CuratorFramework c) {}
            });
            System.out.println("leader=" + s.getLeader().getId());
            client.close();
            return;
        }
        if (kind.equals("elect")) {
            final Object done = new Object();
            final boolean[] finished = {false};
            LeaderSelector s = new LeaderSelector(client, args[1], new LeaderSelectorListenerAdapter() {
                public void takeLeadership(CuratorFramework c) throws Exception {
                    holdUntil(args[2]);
                    synchronized (done) {
                        finished[0] = true;
                        done.notifyAll();
                    }
                }
            });
            s.setId(args[4]);
            s.start();
            synchronized (done) {
                while (!finished[0]) {
                    done.wait();
                }
            }
            s.close();
            client.close();
            System.out.println("released");
            return;
        }
        InterProcessMutex mutex;
        if (kind.equals("mutex")) {
            mutex = new InterProcessMutex(client, args[1]);
        } else {
            InterProcessReadWriteLock rw = new InterProcessReadWriteLock(client, args[1]);
            mutex = kind.equals("read") ? rw.readLock() : rw.writeLock();
        }
        mutex.acquire();
        holdUntil(args[2]);
        mutex.release();
        client.close();
        System.out.println("released");
    }
}
