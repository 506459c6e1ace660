//! A Redis Cluster (`redis+cluster://`, `rediss+cluster://`): the node's connection is the
//! cluster client's, which sends each lock's commands to the master of its slot and follows
//! the cluster.

use lock_core::driver::scrub;
use lock_core::{Error, Result};
use redis::cluster::ClusterClientBuilder;

use crate::client::RedisNode;
use crate::config::BACKEND;
use crate::conn::Conn;
use crate::RedisConfig;

/// Connects to the cluster that `nodes` belong to (any of them that answers tells the client
/// the rest), with the node's push handler for release announcements, and checks every master
/// (`INFO`: none may evict keys). Release announcements go by sharded pub/sub if every master
/// has it.
pub(crate) async fn connect(config: RedisConfig, nodes: &[(String, u16)]) -> Result<RedisNode> {
    config.check_timeouts()?;
    // The node's parts (push handler, checks, waiters); its one-server connection is lazy,
    // never used: the cluster's replaces it below.
    let (node, _, _) = RedisNode::build(config.clone(), BACKEND, None).await?;
    let mut infos = Vec::with_capacity(nodes.len());
    for (host, port) in nodes {
        infos.push(config.at(host, *port).connection_info()?);
    }
    let handler = node.push_handler();
    let builder = ClusterClientBuilder::new(infos);
    // TLS (`rediss+cluster://`) comes with the nodes' addresses; a private CA is given here,
    // for the nodes the client is told of as well as those listed.
    #[cfg(feature = "tls")]
    let builder = match config.tls_ca_pem().await? {
        Some(pem) => builder.certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        }),
        None => builder,
    };
    let client = builder
        .use_protocol(redis::ProtocolVersion::RESP3)
        .connection_timeout(config.connect_timeout())
        .response_timeout(config.request_timeout())
        .push_sender(move |info: redis::PushInfo| {
            handler(info);
            Ok::<(), std::convert::Infallible>(())
        })
        .build()
        .map_err(|e| {
            Error::config(format!(
                "Redis Cluster {}: {}",
                config.redacted_url(),
                scrub(&e, config.secret())
            ))
        })?;
    let limit = config.connect_timeout() + config.request_timeout();
    let conn = tokio::time::timeout(limit, client.get_async_connection())
        .await
        .map_err(|_| node.unavailable("no node of the cluster answered in time"))?
        .map_err(|e| node.error(&e))?;
    node.install(Conn::Cluster(conn));
    node.verify(config.request_timeout()).await?;
    node.announce_by_shard_if_every_master_can();
    Ok(node)
}
