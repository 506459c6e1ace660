//! Redis Sentinel: the master of a replicated deployment, found through its sentinels and
//! followed when they fail it over (`redis+sentinel://`).
//!
//! A sentinel answers `SENTINEL get-master-addr-by-name` with the master's address, and
//! publishes `+switch-master <name> <old-ip> <old-port> <new-ip> <new-port>` on its own
//! pub/sub when a failover promotes a replica. The node asks at connect, listens for switches
//! on one sentinel at a time, and asks again whenever its connection to the master drops
//! (a switch may have been published while nobody listened). Whatever the sentinels say, a
//! server is used only once it says it is a master itself (`INFO`'s role, checked by
//! [`RedisNode::verify`](crate::client::RedisNode::verify)): a sentinel's view can lag.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{Error, Result};
use redis::Value;

use crate::client::RedisNode;
use crate::config::{Sentinels, BACKEND};
use crate::RedisConfig;

/// How long to wait between two rounds of questions to the sentinels while none names a
/// master that answers as one (a failover in progress).
const ASK_AGAIN: Duration = Duration::from_millis(200);

/// How often the sentinels are asked again anyway: a switch published while the listener
/// was reconnecting, or while the master's connection hung without dropping (a frozen
/// master), is learned this late at worst.
const RECHECK: Duration = Duration::from_secs(2);

/// The task that follows a Sentinel deployment's master for a node (and its leases); stopped
/// when the last of them drops it.
pub(crate) struct Follower(tokio::task::AbortHandle);

impl Drop for Follower {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Follower {
    /// Starts following for `node` (which must be connected to the master the sentinels
    /// named): listens for switches, asks again every [`RECHECK`] and whenever the master's
    /// connection drops, and moves the node to each new master ([`RedisNode::switch_to`]).
    pub(crate) fn start(node: RedisNode, tls: Transport) -> Arc<Follower> {
        Arc::new(Follower(
            tokio::spawn(follow(node.detached(), tls)).abort_handle(),
        ))
    }
}

/// How the sentinels are reached: as the servers are (`redis+sentinel://` or
/// `rediss+sentinel://`).
pub(crate) enum Transport {
    Plain,
    /// TLS, trusting this CA (a PEM: `tls_ca_file`) if given, else the public roots.
    Tls(Option<Vec<u8>>),
}

async fn follow(node: RedisNode, tls: Transport) {
    let Some(sentinels) = node.config().sentinels().cloned() else {
        return;
    };
    let tls = &tls;
    let timeout = node.config().connect_timeout();
    let mut current = (node.config().host().to_string(), node.config().port());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let listening = async {
        loop {
            let switch = sentinels.next_switch(timeout, tls).await;
            let gone = switch.is_none();
            if tx.send(switch).is_err() {
                return;
            }
            if gone {
                tokio::time::sleep(ASK_AGAIN).await;
            }
        }
    };
    let following = async {
        let mut tick = tokio::time::interval(RECHECK);
        loop {
            let hint = tokio::select! {
                m = rx.recv() => m.flatten(),
                _ = tick.tick() => None,
                () = node.target().dropped.notified() => None,
            };
            let addr = match hint {
                Some(addr) => addr,
                None => match sentinels.master_addr(timeout, tls).await {
                    Ok(addr) => addr,
                    Err(_) => continue,
                },
            };
            if addr == current {
                continue;
            }
            match node.switch_to(&addr.0, addr.1).await {
                Ok(()) => {
                    tracing::info!(
                        master = %sentinels.master,
                        from = %format_args!("{}:{}", current.0, current.1),
                        to = %format_args!("{}:{}", addr.0, addr.1),
                        "followed a Sentinel failover"
                    );
                    current = addr;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "the master the sentinels named is not ready");
                    tokio::time::sleep(ASK_AGAIN).await;
                    node.target().dropped.notify_one();
                }
            }
        }
    };
    tokio::select! {
        () = listening => {}
        () = following => {}
    }
}

impl Sentinels {
    /// The master's address as the first sentinel that answers gives it, asking each in turn
    /// (each bounded by `timeout`). `Config` if a sentinel answers that it knows no master by
    /// this name; `Unavailable` if none answers.
    pub(crate) async fn master_addr(
        &self,
        timeout: Duration,
        tls: &Transport,
    ) -> Result<(String, u16)> {
        let (mut failures, mut refused) = (Vec::new(), None);
        for (host, port) in &self.hosts {
            let asking = async {
                let mut conn = self
                    .client(host, *port, tls)?
                    .get_multiplexed_async_connection()
                    .await?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.master)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await
            };
            match tokio::time::timeout(timeout, asking).await {
                Ok(Ok(Some(addr))) => return Ok(addr),
                Ok(Ok(None)) => {
                    return Err(Error::config(format!(
                        "the sentinel at {host}:{port} knows no master named {:?}: check the \
                         name in the URL's path (redis+sentinel://sentinels/MASTER)",
                        self.master
                    )))
                }
                // Another sentinel may still answer; this is the error if none does.
                Ok(Err(e)) if refused_login(&e) => {
                    refused.get_or_insert(self.login_refused(host, *port, &e));
                }
                Ok(Err(e)) => failures.push(format!("{host}:{port}: {}", self.scrub(&e))),
                Err(_) => failures.push(format!("{host}:{port}: no answer within {timeout:?}")),
            }
        }
        if let Some(e) = refused {
            return Err(e);
        }
        Err(Error::unavailable(
            BACKEND,
            format!(
                "no sentinel named the master {:?}: {}",
                self.master,
                failures.join("; ")
            ),
        ))
    }

    /// Waits for the next `+switch-master` of this master on one of the sentinels (tried in
    /// turn, each connection bounded by `timeout`) and returns the new address; `None` when
    /// the sentinel's connection dropped or none could be reached (a switch may have been
    /// missed: ask [`master_addr`](Self::master_addr) again).
    pub(crate) async fn next_switch(
        &self,
        timeout: Duration,
        tls: &Transport,
    ) -> Option<(String, u16)> {
        for (host, port) in &self.hosts {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<redis::PushInfo>();
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout))
                .set_push_sender(tx);
            let subscribed = async {
                let mut conn = self
                    .client(host, *port, tls)?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                conn.subscribe("+switch-master").await?;
                Ok::<_, redis::RedisError>(conn)
            };
            let Ok(Ok(_conn)) = tokio::time::timeout(timeout * 2, subscribed).await else {
                continue;
            };
            while let Some(push) = rx.recv().await {
                match push.kind {
                    redis::PushKind::Message => {
                        let payload = push.data.get(1).and_then(|v| match v {
                            Value::BulkString(b) => std::str::from_utf8(b).ok(),
                            Value::SimpleString(s) => Some(s.as_str()),
                            _ => None,
                        });
                        if let Some(addr) = payload.and_then(|p| switched_to(p, &self.master)) {
                            return Some(addr);
                        }
                    }
                    redis::PushKind::Disconnection => return None,
                    _ => {}
                }
            }
            return None;
        }
        None
    }
}

/// The new address in a `+switch-master` payload, if it is about `master`.
fn switched_to(payload: &str, master: &str) -> Option<(String, u16)> {
    let mut words = payload.split_whitespace();
    if words.next()? != master {
        return None;
    }
    let (_, _) = (words.next()?, words.next()?);
    let host = words.next()?.to_string();
    let port = words.next()?.parse().ok()?;
    Some((host, port))
}

impl Sentinels {
    /// A client for the sentinel at `host:port`, speaking RESP3 (its pushes carry the
    /// switches), over `tls`, logging in with the sentinels' own user and password if
    /// they want one.
    fn client(&self, host: &str, port: u16, tls: &Transport) -> redis::RedisResult<redis::Client> {
        use redis::IntoConnectionInfo;
        let (addr, ca) = match tls {
            Transport::Plain => (redis::ConnectionAddr::Tcp(host.to_string(), port), None),
            #[cfg(feature = "tls")]
            Transport::Tls(ca) => (
                redis::ConnectionAddr::TcpTls {
                    host: host.to_string(),
                    port,
                    insecure: false,
                    tls_params: None,
                },
                ca.clone(),
            ),
            // The URL's parser refuses rediss+sentinel:// without the feature.
            #[cfg(not(feature = "tls"))]
            Transport::Tls(ca) => (
                redis::ConnectionAddr::Tcp(host.to_string(), port),
                ca.clone(),
            ),
        };
        let info = addr.into_connection_info()?;
        let mut settings =
            redis::RedisConnectionInfo::default().set_protocol(redis::ProtocolVersion::RESP3);
        if let Some(u) = &self.user {
            settings = settings.set_username(u);
        }
        if let Some(p) = &self.password {
            settings = settings.set_password(p.expose());
        }
        crate::client::open_client(info.set_redis_settings(settings), ca)
    }

    /// `e`'s text without the sentinels' password.
    fn scrub(&self, e: &redis::RedisError) -> String {
        lock_core::driver::scrub(e, self.password.as_ref())
    }

    /// The sentinel at `host:port` refused this client's login (or wants one): what to set.
    fn login_refused(&self, host: &str, port: u16, e: &redis::RedisError) -> Error {
        let hint = match (&self.user, &self.password) {
            (_, None) => "it wants a password: give the sentinels' own as sentinel_password= \
                 (the URL's user info is the Redis servers')"
                .to_string(),
            (user, Some(_)) => format!(
                "check sentinel_password= (and sentinel_user=, now {:?})",
                user.as_deref().unwrap_or("default")
            ),
        };
        Error::unauthenticated(
            BACKEND,
            format!(
                "the sentinel at {host}:{port} refused the login: {hint}; it said: {}",
                self.scrub(e)
            ),
        )
    }
}

/// Whether a sentinel's answer says the login is wrong or missing.
fn refused_login(e: &redis::RedisError) -> bool {
    let text = e.to_string();
    matches!(e.kind(), redis::ErrorKind::AuthenticationFailed)
        || ["NOAUTH", "WRONGPASS", "NOPERM", "invalid password"]
            .iter()
            .any(|w| text.contains(w))
}

/// Connects to the master the sentinels of `config` name now, and follows it from then on
/// (the node, its clones and its leases keep the follower alive).
pub(crate) async fn connect(config: RedisConfig, sentinels: &Sentinels) -> Result<RedisNode> {
    let tls = match config.is_tls() {
        true => Transport::Tls(config.tls_ca_pem().await?),
        false => Transport::Plain,
    };
    let (host, port) = sentinels
        .master_addr(config.connect_timeout(), &tls)
        .await?;
    let node = RedisNode::connect(config.at(&host, port)).await?;
    let follower = Follower::start(node.clone(), tls);
    Ok(node.keeping(follower))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_is_read_for_its_own_master_only() {
        let p = "distlock 127.0.0.1 16401 127.0.0.1 16402";
        assert_eq!(
            switched_to(p, "distlock"),
            Some(("127.0.0.1".to_string(), 16402))
        );
        assert_eq!(switched_to(p, "other"), None);
        assert_eq!(switched_to("distlock 127.0.0.1 16401", "distlock"), None);
        assert_eq!(switched_to("distlock a 1 b notaport", "distlock"), None);
    }
}
