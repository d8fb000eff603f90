//! Sessions with the ensemble: connecting, bounding each request in time, retrying one over a
//! connection loss, closing; and the errors they end in.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use zookeeper_client::{Client, SessionState};

use super::{ADMIN_SESSION, CLOSE_TIMEOUT, COMMAND_TIMEOUT, CONNECT_TIMEOUT, ZkBackend, ZkError};
use crate::exit::Unavailable;

/// Runs one request, bounded by [`COMMAND_TIMEOUT`] (a lost reply counts as a connection loss).
pub(super) async fn op<T>(request: impl Future<Output = Result<T, ZkError>>) -> Result<T, ZkError> {
    tokio::time::timeout(COMMAND_TIMEOUT, request)
        .await
        .unwrap_or(Err(ZkError::ConnectionLoss))
}

/// Waits (up to `limit`) until the session is connected again after a connection loss.
pub(super) async fn reconnected(client: &Client, limit: Duration) -> Result<(), ZkError> {
    let mut states = client.state_watcher();
    let until = Instant::now() + limit;
    loop {
        match client.state() {
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => return Ok(()),
            SessionState::Expired => return Err(ZkError::SessionExpired),
            SessionState::AuthFailed => return Err(ZkError::AuthFailed),
            SessionState::Closed => return Err(ZkError::ClientClosed),
            SessionState::Disconnected => {}
        }
        let left = until.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, states.changed()).await.is_err() {
            return Err(ZkError::ConnectionLoss);
        }
    }
}

/// Runs `request` again after connection losses while the session may still be alive.
pub(super) async fn retried<T, F, Fut>(client: &Client, mut request: F) -> Result<T, ZkError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ZkError>>,
{
    let until = Instant::now() + client.session_timeout();
    loop {
        match op(request()).await {
            Err(ZkError::ConnectionLoss) if Instant::now() < until => {
                reconnected(client, until.saturating_duration_since(Instant::now())).await?;
            }
            other => return other,
        }
    }
}

/// Deletes `node` (if any) and closes the session (the server deletes its ephemeral nodes at
/// once and wakes their watchers), waiting briefly for the server to confirm. The two requests
/// leave together: one round trip.
pub(super) async fn close(client: Client, node: Option<&str>) {
    let mut states = client.state_watcher();
    let deleted = node.map(|path| client.delete(path, None));
    drop(client);
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        if let Some(deleted) = deleted {
            let _ = deleted.await;
        }
        while !states.changed().await.is_terminated() {}
    })
    .await;
}

impl ZkBackend {
    pub(super) fn runtime(&self) -> anyhow::Result<Arc<Runtime>> {
        crate::backend::async_runtime(&self.rt, "zk")
    }

    pub(super) fn fail(&self, doing: &str, e: ZkError) -> anyhow::Error {
        match e {
            ZkError::NoAuth => Unavailable(format!(
                "{}: not authorized to {doing}: the lock's nodes belong to other \
                 credentials (give them in DLOCK_URL as zk://user:password@host)",
                self.addr
            ))
            .into(),
            e @ (ZkError::ConnectionLoss
            | ZkError::SessionExpired
            | ZkError::ClientClosed
            | ZkError::NoHosts) => self
                .reach
                .transport_error(format!("{}: cannot {doing}: {e}", self.addr)),
            e => Unavailable(format!("{}: cannot {doing}: {e}", self.addr)).into(),
        }
    }

    /// A new session. Each server is tried once, for at most [`CONNECT_TIMEOUT`].
    pub(super) async fn connect(&self, session_timeout: Duration) -> anyhow::Result<Client> {
        let mut connector = Client::connector()
            .with_session_timeout(session_timeout)
            .with_connection_timeout(CONNECT_TIMEOUT)
            .with_fail_eagerly();
        if let Some(d) = &self.digest {
            connector = connector.with_auth("digest", d.as_bytes());
        }
        let bound = CONNECT_TIMEOUT * (self.servers + 1);
        let client = match tokio::time::timeout(bound, connector.connect(&self.hosts)).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                if matches!(e, ZkError::AuthFailed | ZkError::NoAuth) {
                    return Err(Unavailable(format!("cannot connect to {}: {e}", self.addr)).into());
                }
                let e = match e {
                    ZkError::NoHosts => "no server answered".to_string(),
                    e => e.to_string(),
                };
                return Err(self
                    .reach
                    .transport_error(format!("cannot connect to {}: {e}", self.addr)));
            }
            Err(_) => {
                return Err(self.reach.transport_error(format!(
                    "cannot connect to {}: no answer within {bound:?}",
                    self.addr
                )));
            }
        };
        self.reach.connected();
        Ok(client)
    }

    /// Runs `f` with a short session on this backend's runtime, and closes it.
    pub(super) fn admin<T>(
        &self,
        f: impl AsyncFnOnce(&Client) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let rt = self.runtime()?;
        rt.block_on(async {
            let client = self.connect(ADMIN_SESSION).await?;
            let result = f(&client).await;
            close(client, None).await;
            result
        })
    }
}
