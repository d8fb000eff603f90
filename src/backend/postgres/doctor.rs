//! `dlock doctor` for PostgreSQL: the server, a standby, idle_session_timeout, what stands
//! between (a pooler by transaction or statement, pgpool-II, a proxy), the restart hold-back and
//! a statement_timeout that would cut a wait.

use std::time::Duration;

use super::rows::cell;
use super::{COMMAND_TIMEOUT, PgBackend, Session, ground};
use crate::backend::ground::{Finding, hold_back};

impl PgBackend {
    /// The checks; an error only when the server cannot be reached or asked.
    pub(super) fn checks(&self, ttl: Duration) -> anyhow::Result<Vec<Finding>> {
        self.runtime()?.block_on(async {
            let s = self.connect("dlock doctor").await?;
            let sql = format!(
                "SELECT current_setting('server_version'), pg_is_in_recovery(), \
                   floor(extract(epoch FROM now() - pg_postmaster_start_time()))::bigint, \
                   current_setting('idle_session_timeout', true), \
                   current_setting('statement_timeout'), {}",
                ground::claim(&s, "'direct'::text")
            );
            let rows = self
                .simple(&s.client, &sql, COMMAND_TIMEOUT, "ask the server")
                .await?;
            let row = rows.first().ok_or_else(|| anyhow::anyhow!("no answer"))?;
            let text = |i| cell(row, i).unwrap_or_default().to_string();
            let mut found = vec![Finding::ok(
                "server",
                format!("PostgreSQL {} at {}", text(0), self.addr()),
            )];
            found.push(if text(1) == "t" {
                Finding::unsafe_(
                    "standby",
                    "the server is a standby (in recovery): its advisory locks are its own",
                    "point dlock at the primary",
                )
            } else {
                Finding::ok("standby", "a primary (not in recovery)")
            });
            found.push(if cell(row, 3).is_none() {
                Finding::unsafe_(
                    "idle_session_timeout",
                    "the server is older than PostgreSQL 14: nothing ends a cut-off holder's \
                     session, so its lock would outlive its lease",
                    "use PostgreSQL 14 or later",
                )
            } else {
                Finding::ok(
                    "idle_session_timeout",
                    format!(
                        "a cut-off holder's session ends {} s after its last statement",
                        super::ttl_secs(ttl)
                    ),
                )
            });
            found.push(self.between(&s, cell(row, 5)).await);
            let uptime = text(2).parse::<u64>().unwrap_or(0);
            found.push(hold_back(uptime, ttl));
            let statement_timeout = text(4);
            found.push(if matches!(statement_timeout.as_str(), "0" | "") {
                Finding::ok(
                    "statement_timeout",
                    "0: a wait for the lock is not cut short",
                )
            } else {
                Finding::warn(
                    "statement_timeout",
                    format!(
                        "{statement_timeout}: the server cancels a wait for the lock that long \
                         (the run fails, 69)"
                    ),
                    "set statement_timeout = 0 for dlock's role, or wait less (--wait)",
                )
            });
            Ok(found)
        })
    }

    /// What stands between, from the first statement's answer ([`ground::claim`]: "direct",
    /// or NULL behind a proxy or on a session holding another client's lock) and a probe where
    /// it is not direct or cannot be told (a Unix socket to something else).
    async fn between(&self, s: &Session, claim: Option<&str>) -> Finding {
        const CHECK: &str = "pooling";
        let probe = match (claim, s.reached) {
            (Some(_), ground::Reached::Tcp(_)) => {
                return Finding::ok(
                    CHECK,
                    "a direct connection (the server sees this client's own port, and the \
                     backend is the one its key names)",
                );
            }
            (Some(_), ground::Reached::Unix) => {
                return Finding::ok(
                    CHECK,
                    "a direct connection (a Unix socket; the backend is the one its key names)",
                );
            }
            (None, _) => match self.behind_proxy(s).await {
                Ok(p) => p,
                Err(e) => return unsafe_pooling(e.to_string()),
            },
        };
        if probe == ground::Probe::NoAnswer {
            return Finding::unknown(
                CHECK,
                "a second client got no server connection within half a second (a session \
                 pool with no free connection?)",
            );
        }
        if probe == ground::Probe::Pooled {
            let mode = if self.statement_mode().await {
                "statement"
            } else {
                "transaction"
            };
            return unsafe_pooling(format!(
                "{} pools by {mode}: a session advisory lock would stay on a server connection \
                 that other clients get (pool_mode={mode})",
                self.addr()
            ));
        }
        if let Ok(rows) = self
            .simple(&s.client, "SHOW pool_version", COMMAND_TIMEOUT, "ask")
            .await
        {
            let version = rows.first().and_then(|r| cell(r, 0)).unwrap_or_default();
            return Finding::ok(
                CHECK,
                format!(
                    "pgpool-II {version}: each client keeps its own server connection, and lock \
                     statements go to the primary"
                ),
            );
        }
        Finding::ok(
            CHECK,
            "a proxy or pooler between (the backend is not the one the key names, or the \
             server sees another client port); it keeps one server connection per client \
             (session pooling)",
        )
    }

    /// Whether the pooler refuses a transaction block (PgBouncer's statement mode).
    async fn statement_mode(&self) -> bool {
        let Ok(c) = self.connect("dlock doctor").await else {
            return false;
        };
        let refused = async {
            c.client.simple_query("BEGIN").await?;
            c.client.simple_query("SELECT 1").await?;
            c.client.simple_query("COMMIT").await
        };
        match tokio::time::timeout(COMMAND_TIMEOUT, refused).await {
            Ok(Err(e)) => super::db_text(&e).contains("statement pooling"),
            _ => false,
        }
    }
}

fn unsafe_pooling(found: String) -> Finding {
    Finding::unsafe_(
        "pooling",
        found,
        "use pool_mode=session, or connect to PostgreSQL directly",
    )
}
