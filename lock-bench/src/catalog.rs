//! Which subjects each backend has: the distlock driver, reached through `distlock::connect`
//! as an application reaches it, and the baselines measured beside it in the same run. Adding
//! a backend: a [`Backend`] variant (the compiler then asks for its URL, baselines and server
//! counter), its endpoint flag in [`Endpoints`], its baselines in a `*_baselines.rs` of their
//! own.

use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;
use lock_core::{LockOptions, Mode};
use server_probes::servers;

use crate::memory_baselines::TokioMutex;
use crate::subject::{Driver, Subject};

/// A backend to measure. A name that is not one is refused when the arguments are parsed,
/// before anything is measured.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    /// The in-process driver, beside a tokio mutex.
    Memory,
    /// One Redis server.
    Redis,
    /// One Redis server with plain keys, beside redis-py's algorithm on the same keys.
    RedisPlain,
    /// Redlock over the masters of `--redlock-url`.
    Redlock,
    /// A ZooKeeper single node.
    Zookeeper,
    /// A 3-node ZooKeeper ensemble.
    ZookeeperEnsemble,
    /// An etcd single member.
    Etcd,
    /// A 3-member etcd cluster.
    EtcdCluster,
    /// The single member, the driver's locks of one TTL on one lease they share
    /// (`shared_lease=true`); the same baselines.
    EtcdShared,
    /// One PostgreSQL server.
    Postgres,
    /// The same server, the driver's exclusive locks on at most 4 shared sessions
    /// (`shared_sessions=4`); the same baselines.
    PostgresShared,
    /// As `postgres-shared`, and every exclusive waiter polls on those sessions instead of
    /// waiting on one of its own (`wait_sessions=0`); the same baselines.
    PostgresPolling,
}

/// The name a [`ValueEnum`] value has on the command line (and in the results).
pub(crate) fn value_name(v: &impl ValueEnum) -> String {
    v.to_possible_value()
        .map_or_else(String::new, |p| p.get_name().to_string())
}

/// Where the backends' servers are: one flag each, with services.sh's servers
/// (`scripts/servers.tsv`) as defaults.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct Endpoints {
    /// Redis server for the `redis` backend and its baselines.
    #[arg(long, default_value_t = servers::url("redis://{redis}"))]
    redis_url: String,
    /// Masters for the `redlock` backend; its baselines use the same masters.
    #[arg(long, default_value_t = servers::url("redlock://{redlock1},{redlock2},{redlock3},{redlock4},{redlock5}"))]
    redlock_url: String,
    /// ZooKeeper single node for the `zookeeper` backend.
    #[arg(long, default_value_t = servers::addr("zk"))]
    zk_hosts: String,
    /// ZooKeeper ensemble for the `zookeeper-ensemble` backend.
    #[arg(long, default_value_t = servers::url("{zk-ens1},{zk-ens2},{zk-ens3}"))]
    zk_ensemble_hosts: String,
    /// etcd single member for the `etcd` backend.
    #[arg(long, default_value_t = servers::addr("etcd"))]
    etcd_endpoints: String,
    /// etcd 3-member cluster for the `etcd-cluster` backend.
    #[arg(long, default_value_t = servers::url("{etcd-c1},{etcd-c2},{etcd-c3}"))]
    etcd_cluster_endpoints: String,
    /// PostgreSQL server for the `postgres` backend and its baselines (libpq key=value or URL;
    /// the driver gets it as a URL).
    #[arg(long, default_value_t = servers::url("postgres://locker@{pg}/postgres"))]
    pg_url: String,
}

impl Endpoints {
    /// The hosts and row label of a ZooKeeper backend.
    fn zk(&self, backend: Backend) -> Option<(&str, &'static str)> {
        match backend {
            Backend::Zookeeper => Some((&self.zk_hosts, "single node")),
            Backend::ZookeeperEnsemble => Some((&self.zk_ensemble_hosts, "3-node ensemble")),
            _ => None,
        }
    }

    /// The members and row label of an etcd backend.
    pub(crate) fn etcd(&self, backend: Backend) -> Option<(Vec<String>, &'static str)> {
        let (eps, label) = match backend {
            Backend::Etcd | Backend::EtcdShared => (&self.etcd_endpoints, "single member"),
            Backend::EtcdCluster => (&self.etcd_cluster_endpoints, "3-member cluster"),
            _ => return None,
        };
        Some((eps.split(',').map(str::to_string).collect(), label))
    }

    /// The server's own count of processed requests, where the backend has one.
    pub(crate) async fn server_requests(&self, backend: Backend) -> Option<u64> {
        match backend {
            Backend::Memory => None,
            Backend::Redis | Backend::RedisPlain => {
                server_probes::redis_commands_processed(&self.redis_url).await
            }
            Backend::Redlock => {
                let mut total = 0;
                for url in redlock_masters(&self.redlock_url) {
                    total += server_probes::redis_commands_processed(&url).await?;
                }
                Some(total)
            }
            Backend::Zookeeper | Backend::ZookeeperEnsemble => {
                server_probes::zk_packets_received(self.zk(backend)?.0).await
            }
            Backend::Etcd | Backend::EtcdCluster | Backend::EtcdShared => {
                server_probes::etcd_grpc_messages_received(&self.etcd(backend)?.0).await
            }
            Backend::Postgres | Backend::PostgresShared | Backend::PostgresPolling => {
                server_probes::pg_statements(&self.pg_url).await
            }
        }
    }
}

impl Endpoints {
    /// The requests clients sent, as the servers count them: for Redis and Redlock the scripts
    /// run (every distlock request is one, and [`server_requests`](Self::server_requests) counts
    /// the commands inside them too); elsewhere the server's own count.
    pub(crate) async fn client_requests(&self, backend: Backend) -> Option<u64> {
        match backend {
            Backend::Redis | Backend::RedisPlain => {
                server_probes::redis_scripts_run(&self.redis_url).await
            }
            Backend::Redlock => {
                let mut total = 0;
                for url in redlock_masters(&self.redlock_url) {
                    total += server_probes::redis_scripts_run(&url).await?;
                }
                Some(total)
            }
            _ => self.server_requests(backend).await,
        }
    }

    /// Client connections (sessions) the backend's servers have open, where they count them:
    /// etcd's clients multiplex every request on one gRPC connection per member, and the
    /// memory and file drivers have no server.
    pub(crate) async fn server_connections(&self, backend: Backend) -> Option<u64> {
        match backend {
            Backend::Redis | Backend::RedisPlain => {
                server_probes::redis_clients(&self.redis_url).await
            }
            Backend::Redlock => {
                let mut total = 0;
                for url in redlock_masters(&self.redlock_url) {
                    total += server_probes::redis_clients(&url).await?;
                }
                Some(total)
            }
            Backend::Zookeeper | Backend::ZookeeperEnsemble => {
                server_probes::zk_connections(self.zk(backend)?.0).await
            }
            Backend::Postgres | Backend::PostgresShared | Backend::PostgresPolling => {
                server_probes::pg_sessions(&self.pg_url).await
            }
            Backend::Memory | Backend::Etcd | Backend::EtcdCluster | Backend::EtcdShared => None,
        }
    }
}

/// The masters of a `redlock://h1:p1,h2:p2` URL as `redis://` URLs (for the baselines).
fn redlock_masters(url: &str) -> Vec<String> {
    let hosts = url.trim_start_matches("redlock://");
    let hosts = hosts.split(['/', '?']).next().unwrap_or("");
    hosts.split(',').map(|h| format!("redis://{h}")).collect()
}

/// Baselines measured beside `backend`'s driver taking its locks in `mode`, in the order they
/// are listed: the lock family's have their own (none where the backend has no native form).
pub(crate) async fn baselines_for(
    backend: Backend,
    ep: &Endpoints,
    mode: Mode,
) -> Result<Vec<Arc<dyn Subject>>, String> {
    use crate::{etcd_baselines, pg_baselines, redis_baselines, zk_baselines};
    match (backend, mode) {
        (_, Mode::Exclusive) => {}
        (Backend::Postgres | Backend::PostgresShared | Backend::PostgresPolling, Mode::Shared) => {
            return Ok(vec![Arc::new(
                pg_baselines::PgFloor::connect_as(&ep.pg_url, true).await?,
            )])
        }
        (Backend::Redis, Mode::Permits(k)) => {
            return Ok(vec![Arc::new(
                redis_baselines::RawSemaphore::connect(&ep.redis_url, k).await?,
            )])
        }
        _ => return Ok(vec![]),
    }
    Ok(match backend {
        Backend::Memory => vec![Arc::new(TokioMutex::default())],
        Backend::RedisPlain => vec![Arc::new(
            redis_baselines::RawFloor::redis_py(&ep.redis_url, PLAIN_PREFIX).await?,
        )],
        Backend::Redis => vec![
            Arc::new(redis_baselines::RawFloor::connect(&ep.redis_url).await?),
            Arc::new(redis_baselines::Rslock::new(vec![ep.redis_url.clone()])),
        ],
        Backend::Redlock => {
            let masters = redlock_masters(&ep.redlock_url);
            let first = masters.first().cloned().unwrap_or_default();
            let single = distlock::connect(&first).await.map_err(|e| e.to_string())?;
            vec![
                Arc::new(Driver {
                    lock: single,
                    opts: LockOptions::new(Duration::from_secs(10)),
                    label: None,
                }),
                // rslock on one master beside rslock on five: its own cost of the quorum,
                // against which distlock's (the two rows above) is compared.
                Arc::new(redis_baselines::Rslock::new(vec![first])),
                Arc::new(redis_baselines::Rslock::new(masters)),
            ]
        }
        Backend::Zookeeper | Backend::ZookeeperEnsemble => {
            let (hosts, label) = ep.zk(backend).unwrap_or_default();
            vec![Arc::new(
                zk_baselines::ZkRecipe::connect(hosts, label).await?,
            )]
        }
        Backend::Etcd | Backend::EtcdCluster | Backend::EtcdShared => {
            let (eps, label) = ep.etcd(backend).unwrap_or_default();
            vec![
                Arc::new(etcd_baselines::TxnFloor::connect(&eps, label).await?),
                Arc::new(etcd_baselines::LockRpc::connect(&eps, label).await?),
            ]
        }
        Backend::Postgres | Backend::PostgresShared | Backend::PostgresPolling => vec![
            Arc::new(pg_baselines::PgFloor::connect(&ep.pg_url).await?),
            Arc::new(pg_baselines::SqlxLock::connect(&ep.pg_url).await?),
        ],
    })
}

/// The driver for `backend`, taking its locks in `mode`; `None` where the driver does not
/// offer that mode.
pub(crate) async fn driver_subject(
    backend: Backend,
    ep: &Endpoints,
    mode: Mode,
) -> Result<Option<Arc<dyn Subject>>, String> {
    let lock = connect(backend, ep).await?;
    let caps = lock.capabilities();
    let offered = match mode {
        Mode::Shared => caps.shared,
        Mode::Permits(_) => caps.permits,
        _ => true,
    };
    Ok(offered.then(|| {
        Arc::new(Driver {
            lock,
            opts: LockOptions::new(Duration::from_secs(10)).mode(mode),
            label: (backend == Backend::RedisPlain)
                .then_some("distlock redis, plain keys (keys=plain)"),
        }) as Arc<dyn Subject>
    }))
}

/// etcd's own election RPCs on the members of `backend`, with leases of the minimum TTL
/// distlock's leases there get (2 s); `None` on other backends.
pub(crate) async fn etcd_election(
    backend: Backend,
    ep: &Endpoints,
) -> Result<Option<Arc<dyn crate::election::Elector>>, String> {
    let Some((members, _)) = ep.etcd(backend) else {
        return Ok(None);
    };
    let client = distlock::lock_etcd::etcd_client::Client::connect(members, None)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Some(Arc::new(crate::election::EtcdElection {
        client,
        ttl: 2,
    })))
}

/// A distlock client of `backend`, through the facade, as an application would: the URL picks
/// the driver.
pub(crate) async fn connect(
    backend: Backend,
    ep: &Endpoints,
) -> Result<Arc<dyn lock_core::DistributedLock>, String> {
    let url = match backend {
        Backend::Memory => "memory://lock-bench".to_string(),
        Backend::Redis => ep.redis_url.clone(),
        Backend::RedisPlain => format!("{}?keys=plain&prefix={PLAIN_PREFIX}", ep.redis_url),
        Backend::Redlock => ep.redlock_url.clone(),
        Backend::Zookeeper | Backend::ZookeeperEnsemble => {
            format!("zk://{}", ep.zk(backend).unwrap_or_default().0)
        }
        Backend::Etcd | Backend::EtcdCluster => {
            format!(
                "etcd://{}",
                ep.etcd(backend).unwrap_or_default().0.join(",")
            )
        }
        Backend::EtcdShared => format!(
            "etcd://{}?shared_lease=true",
            ep.etcd(backend).unwrap_or_default().0.join(",")
        ),
        Backend::Postgres => format!("{}?sslmode=disable", ep.pg_url),
        Backend::PostgresShared => format!("{}?sslmode=disable&shared_sessions=4", ep.pg_url),
        Backend::PostgresPolling => format!(
            "{}?sslmode=disable&shared_sessions=4&wait_sessions=0",
            ep.pg_url
        ),
    };
    distlock::connect(&url).await.map_err(|e| e.to_string())
}

/// The key prefix of the `redis-plain` backend: distlock and redis-py's algorithm on the same
/// keys.
const PLAIN_PREFIX: &str = "bench-plain:";

/// Another client, to hold the lock in the `foreign-handoff` scenario: redis-py's algorithm
/// on the `redis-plain` keys; on PostgreSQL, another distlock client configured as the
/// subject (so that the hand-off crosses clients: a `postgres-polling` waiter is woken by
/// that client's announced release; a release of a client without `wait_sessions` it would
/// hear of only at its next try).
pub(crate) async fn foreign_holder(
    backend: Backend,
    ep: &Endpoints,
) -> Result<Option<Foreign>, String> {
    Ok(match backend {
        Backend::RedisPlain => Some(Foreign {
            holder: Arc::new(
                crate::redis_baselines::RawFloor::redis_py(&ep.redis_url, PLAIN_PREFIX).await?,
            ),
            baselines: true,
        }),
        Backend::Postgres | Backend::PostgresShared | Backend::PostgresPolling => {
            Some(Foreign {
                holder: Arc::new(Driver {
                    lock: connect(backend, ep).await?,
                    opts: LockOptions::new(Duration::from_secs(10)),
                    label: Some("distlock postgres, another client"),
                }),
                // sqlx and the floor hash names to other keys.
                baselines: false,
            })
        }
        _ => None,
    })
}

/// The `foreign-handoff` scenario's holder, and whether the backend's baselines take the
/// same keys (else only distlock waits for it).
pub(crate) struct Foreign {
    pub(crate) holder: Arc<dyn Subject>,
    pub(crate) baselines: bool,
}
