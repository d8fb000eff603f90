//! Waiting without polling: a waiter blocks in `BLPOP` on a connection of its own.

use super::COMMAND_TIMEOUT;
use std::time::Duration;

use super::{Connection, Keys, Node};

/// Takes a waiter that gives up off the waiter lists (for `status`, and so that a writer that
/// stopped waiting no longer keeps shared holders out).
pub(super) fn forget_waiter(
    con: &mut Connection,
    keys: &Keys,
    token: &str,
) -> redis::RedisResult<()> {
    redis::pipe()
        .cmd("ZREM")
        .arg(&keys.waiters)
        .arg(token)
        .ignore()
        .cmd("ZREM")
        .arg(&keys.wwait)
        .arg(token)
        .ignore()
        .query(con)
}

/// The connection a waiter blocks on (never the lock's own connection).
pub(super) struct Waiter {
    pub(super) con: Connection,
    /// The server it is connected to.
    pub(super) node: Node,
    /// `CLIENT ID` there, for `CLIENT UNBLOCK` (by a waker, for a waiter off the main thread).
    pub(super) id: i64,
}

impl Waiter {
    pub(super) fn new(node: &Node) -> anyhow::Result<Waiter> {
        let mut con = node.connect(COMMAND_TIMEOUT)?;
        let id = client_id(&mut con)
            .map_err(|e| node.error(format!("{}: CLIENT ID (to wait)", node.addr), e))?;
        Ok(Waiter {
            con,
            node: node.clone(),
            id,
        })
    }

    /// BLPOP the wake-up list for at most `d`.
    pub(super) fn block(&mut self, signal: &str, d: Duration) -> redis::RedisResult<()> {
        // The socket must outwait the server-side timeout, or the reply is lost.
        self.con.set_read_timeout(Some(d + COMMAND_TIMEOUT))?;
        let secs = (d.as_secs_f64() * 1000.0).ceil() / 1000.0;
        let _: Option<(String, String)> = redis::cmd("BLPOP")
            .arg(signal)
            .arg(secs.max(0.001))
            .query(&mut self.con)?;
        if self.con.addr().to_string() != self.node.addr {
            // The slot moved and the BLPOP followed it: CLIENT UNBLOCK must go there now.
            self.node = self.node.at(self.con.addr());
            self.con.set_read_timeout(Some(COMMAND_TIMEOUT))?;
            self.id = client_id(&mut self.con)?;
        }
        Ok(())
    }
}

/// The connection's `CLIENT ID`: from its first command's probe if that got it, else asked.
pub(super) fn client_id(con: &mut Connection) -> redis::RedisResult<i64> {
    if let Some(id) = con.client_id() {
        return Ok(id);
    }
    redis::cmd("CLIENT").arg("ID").query(con)
}
