//! What a Redis server's `INFO` says that matters for locks: who it is, whether it is a
//! master, whether it can evict keys.

/// What `INFO` says about a server that matters for locks.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ServerFacts {
    pub(crate) run_id: Option<String>,
    pub(crate) maxmemory: u64,
    pub(crate) policy: String,
    /// `master` or `slave` (Redis's word for a replica).
    role: String,
    /// The master of a replica, `host:port` as `INFO` gives them.
    master: [Option<String>; 2],
    /// `cluster_enabled:1`: a Redis Cluster node.
    pub(crate) cluster: bool,
    /// `redis_version`'s major number (Valkey reports the Redis version it is compatible
    /// with there).
    major: Option<u32>,
}

impl ServerFacts {
    /// The `INFO` text of each server in `reply`: one server's, or a cluster's masters' (a map
    /// of node to text). A server's error in a cluster's map is kept as the error.
    pub(crate) fn texts(reply: redis::Value) -> Vec<Result<String, String>> {
        let text = |v: redis::Value| match v {
            redis::Value::BulkString(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
            redis::Value::VerbatimString { text, .. } => Ok(text),
            redis::Value::SimpleString(s) => Ok(s),
            other => Err(format!("{other:?}")),
        };
        match reply {
            redis::Value::Map(nodes) => nodes.into_iter().map(|(_, v)| text(v)).collect(),
            one => vec![text(one)],
        }
    }

    pub(crate) fn parse(info: &str) -> Self {
        let mut f = ServerFacts {
            policy: "noeviction".into(),
            ..ServerFacts::default()
        };
        for line in info.lines() {
            match line.trim_end().split_once(':') {
                Some(("run_id", v)) => f.run_id = Some(v.to_string()),
                Some(("maxmemory", v)) => f.maxmemory = v.parse().unwrap_or(u64::MAX),
                Some(("maxmemory_policy", v)) => f.policy = v.to_string(),
                Some(("role", v)) => f.role = v.to_string(),
                Some(("master_host", v)) => f.master[0] = Some(v.to_string()),
                Some(("master_port", v)) => f.master[1] = Some(v.to_string()),
                Some(("cluster_enabled", v)) => f.cluster = v == "1",
                Some(("redis_version", v)) => {
                    f.major = v.split('.').next().and_then(|m| m.parse().ok());
                }
                _ => {}
            }
        }
        f
    }

    /// Whether the server has sharded pub/sub (`SPUBLISH`, `SSUBSCRIBE`: Redis and Valkey
    /// 7.0 and later).
    pub(crate) fn sharded_pubsub(&self) -> bool {
        self.major.is_some_and(|m| m >= 7)
    }

    /// The master of a server that is a replica (`?` for what `INFO` leaves out).
    pub(crate) fn replica_of(&self) -> Option<String> {
        (self.role != "master" && !self.role.is_empty()).then(|| {
            let [host, port] = self.master.clone().map(|v| v.unwrap_or_else(|| "?".into()));
            format!("{host}:{port}")
        })
    }

    /// Which of the lock's keys the server may evict, if any. No `maxmemory` means no eviction
    /// whatever the policy; `volatile-*` evicts keys with a TTL (a held lock's), `allkeys-*`
    /// any key (also the fencing counter); an unknown policy is assumed to evict anything.
    pub(crate) fn eviction_risk(&self) -> Option<&'static str> {
        if self.maxmemory == 0 || self.policy == "noeviction" {
            None
        } else if self.policy.starts_with("volatile-") {
            Some("held locks' keys")
        } else {
            Some("held locks' keys and the fencing counter")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(maxmemory: u64, policy: &str) -> ServerFacts {
        ServerFacts::parse(&format!(
            "# Server\r\nrun_id:abc\r\n# Memory\r\nmaxmemory:{maxmemory}\r\nmaxmemory_policy:{policy}\r\n"
        ))
    }

    #[test]
    fn reads_identity_and_memory_policy() {
        let f = facts(67108864, "allkeys-lru");
        assert_eq!(f.run_id.as_deref(), Some("abc"));
        assert_eq!((f.maxmemory, f.policy.as_str()), (67108864, "allkeys-lru"));
    }

    #[test]
    fn reads_whether_the_server_is_a_replica() {
        let replica = "# Replication\r\nrole:slave\r\nmaster_host:10.0.0.5\r\nmaster_port:6379\r\n";
        let f = ServerFacts::parse(replica);
        assert_eq!(f.replica_of().as_deref(), Some("10.0.0.5:6379"));
        let master = ServerFacts::parse("# Replication\r\nrole:master\r\nconnected_slaves:1\r\n");
        assert_eq!(master.replica_of(), None);
        assert_eq!(
            facts(0, "noeviction").replica_of(),
            None,
            "no role line: not a replica"
        );
    }

    #[test]
    fn sharded_pubsub_from_the_major_version() {
        let at = |v: &str| ServerFacts::parse(&format!("# Server\r\nredis_version:{v}\r\n"));
        assert!(at("7.0.15").sharded_pubsub());
        assert!(at("7.2.4").sharded_pubsub(), "Valkey's compatible version");
        assert!(at("10.0.0").sharded_pubsub());
        assert!(!at("6.2.14").sharded_pubsub());
        assert!(!at("x").sharded_pubsub(), "unreadable: assumed without");
        assert!(!facts(0, "noeviction").sharded_pubsub(), "no version line");
    }

    #[test]
    fn eviction_risk_follows_maxmemory_and_policy() {
        assert_eq!(facts(0, "allkeys-lru").eviction_risk(), None);
        assert_eq!(facts(1 << 20, "noeviction").eviction_risk(), None);
        // Every evicting policy is a risk; the counter is at risk unless only volatile keys
        // (those with a TTL) can be evicted, and an unknown policy is assumed the worst.
        let policies = [
            ("volatile-lru", false),
            ("volatile-lfu", false),
            ("volatile-random", false),
            ("volatile-ttl", false),
            ("allkeys-lru", true),
            ("allkeys-lfu", true),
            ("allkeys-random", true),
            ("something-new", true),
        ];
        for (p, counter) in policies {
            let r = facts(1 << 20, p).eviction_risk();
            assert!(
                r.is_some_and(|r| r.contains("counter") == counter),
                "{p}: {r:?}"
            );
        }
    }
}
