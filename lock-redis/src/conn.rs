//! `Conn`: the connection a node's commands go over — one server's, or a Redis Cluster's.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// The connection a [`RedisNode`](crate::raw::RedisNode) sends its commands over: one server's
/// self-reconnecting connection, or a Redis Cluster's, which sends each command to the master
/// serving its keys' slot (every lock's keys share one, by their hash tag) and follows the
/// cluster's redirections (`MOVED`, `ASK`) and topology changes. Cheap to clone (clones share
/// the connection).
#[derive(Clone)]
pub enum Conn {
    /// One server (standalone, or the master the sentinels name).
    Server(ConnectionManager),
    /// A Redis Cluster (`redis+cluster://`).
    Cluster(ClusterConnection),
}

impl Conn {
    /// Subscribes to `channel` (RESP3: its messages arrive through the connection's push
    /// handler). On a cluster the subscription goes to the node of the channel's slot: with
    /// `sharded` (`SSUBSCRIBE`), the master of the slot, which alone hears the lock scripts'
    /// `SPUBLISH`; without, any node, which the lock scripts' `PUBLISH` reaches from every
    /// node.
    pub(crate) async fn subscribe(&mut self, channel: &str, sharded: bool) -> RedisResult<()> {
        match (self, sharded) {
            (Conn::Server(c), false) => c.subscribe(channel).await,
            (Conn::Server(_), true) => Err(one_server_has_no_shards()),
            (Conn::Cluster(c), false) => c.subscribe(channel).await,
            (Conn::Cluster(c), true) => c.ssubscribe(channel).await,
        }
    }

    /// `INFO`: the server's text; on a cluster, every master's (a map of node to text), or with
    /// `key` the text of the master of its slot.
    pub(crate) async fn info(&mut self, key: Option<&str>) -> RedisResult<Value> {
        let info = redis::cmd("INFO");
        match (self, key) {
            (Conn::Cluster(c), Some(key)) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                c.route_command(info, to).await
            }
            (this, _) => info.query_async(this).await,
        }
    }

    /// Ends the subscription to `channel` (made `sharded` or not).
    pub(crate) async fn unsubscribe(&mut self, channel: &str, sharded: bool) -> RedisResult<()> {
        match (self, sharded) {
            (Conn::Server(c), false) => c.unsubscribe(channel).await,
            (Conn::Server(_), true) => Err(one_server_has_no_shards()),
            (Conn::Cluster(c), false) => c.unsubscribe(channel).await,
            (Conn::Cluster(c), true) => c.sunsubscribe(channel).await,
        }
    }
}

/// Sharded pub/sub asked of one server's connection: only a cluster's announces by shard.
fn one_server_has_no_shards() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Client,
        "sharded pub/sub on one server's connection (only a cluster announces by shard)",
    ))
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Server(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Server(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Server(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}
