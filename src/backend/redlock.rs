//! Redlock: the redis backend over N independent masters (`--url` given 3, 5, ... times).
//!
//! Each master gets the single-instance scripts (same keys, same token). A lock is held when a
//! quorum (N/2+1) of masters granted it and, after the time the requests took and the drift
//! margin, at least 90% of the TTL is still valid; otherwise it is released everywhere and tried
//! again after a random 50-250 ms (Redlock has no server-side wake-up across masters). Requests
//! go to all masters in parallel with a short per-node timeout, so a dead master costs little.
//! Renewal needs a quorum. There is no fencing token: independent masters cannot hand out a number
//! that grows across all of them, so `DLOCK_FENCING_TOKEN` is unset and `status` says why.

mod give_back;

use std::time::Duration;

use redis::Script;

use super::redis::Connection;
use super::redis::{ground, history};
use crate::backend::Grant;
use crate::history::{Begun, MAX_EVENTS, Stored};

use super::redis::{
    BROKEN, BROKEN_PREFIX, COMMAND_TIMEOUT, Keys, Node, RENEW, STATUS, acquire_starting,
    break_script, broken_by_tombstones, granted_entry, release_script, script, token,
};
use super::{Backend, BreakHow, Broken, Lease, RenewError, Request};
use crate::clock::{BootInstant, drift_margin};
use crate::exit::{Interrupted, Unavailable, Usage};
use crate::model::{BackendKind, Key};
use crate::model::{Holder, Mode, Status};

/// Why there is no fencing token, for `status`.
const NO_FENCING: &str = "Redlock hands out no fencing token: independent masters cannot agree \
on a number that only grows, so DLOCK_FENCING_TOKEN is unset";

/// Locks on a quorum of independent Redis masters.
pub(crate) struct Redlock {
    nodes: Vec<Node>,
}

/// One master's connection, reconnected after an error.
struct Slot {
    node: Node,
    con: Option<Connection>,
}

impl Slot {
    /// Runs `f` on this master's connection, with `timeout` for the reply.
    fn with<T>(
        &mut self,
        timeout: Duration,
        f: impl FnOnce(&mut Connection) -> redis::RedisResult<T>,
    ) -> anyhow::Result<T> {
        if self.con.is_none() {
            // A short connect timeout too: a black-holed master must not stall the others.
            let connect = (timeout * 4).max(Duration::from_millis(200));
            self.con = Some(self.node.connect_within(connect, timeout)?);
        }
        let con = self.con.as_mut().expect("set above");
        con.set_read_timeout(Some(timeout))?;
        let result = f(con).map_err(|e| {
            self.con = None;
            // A proxy or a replica in this master's place is said as such (and refuses the run).
            ground::refusal(&self.node, &e)
                .unwrap_or_else(|| anyhow::anyhow!("{}: {e}", self.node.addr))
        });
        if result.is_ok() {
            self.node.reach.connected(); // it answered
        }
        result
    }
}

/// Runs `f` on every slot at once, one thread per master; results in slot order.
fn parallel<T: Send>(
    slots: &mut [Slot],
    f: impl Fn(&mut Slot) -> anyhow::Result<T> + Sync,
) -> Vec<anyhow::Result<T>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = slots.iter_mut().map(|slot| s.spawn(|| f(slot))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("request thread panicked")))
            })
            .collect()
    })
}

impl Redlock {
    /// Three, five, ... URLs.
    pub(crate) fn open(urls: &[String]) -> anyhow::Result<Redlock> {
        if urls.len() < 3 || urls.len().is_multiple_of(2) {
            return Err(Usage(format!(
                "Redlock needs an odd number of --url, at least 3 (got {})",
                urls.len()
            ))
            .into());
        }
        let nodes = urls
            .iter()
            .map(|u| Node::parse(u))
            .collect::<Result<Vec<_>, _>>()?;
        if nodes
            .iter()
            .any(|n| n.min_replicas > 0 || n.sentinel.is_some() || !n.seeds.is_empty())
        {
            return Err(Usage(
                "Redlock takes one plain server per --url (no min-replicas, Sentinel or \
                 cluster seeds)"
                    .into(),
            )
            .into());
        }
        Ok(Redlock { nodes })
    }

    fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    fn slots(&self) -> Vec<Slot> {
        self.nodes
            .iter()
            .map(|n| Slot {
                node: n.clone(),
                con: None,
            })
            .collect()
    }

    fn release_all(slots: &mut [Slot], keys: &Keys, token: &str, timeout: Duration) {
        parallel(slots, |slot| {
            let inv = release_script(keys, token);
            slot.with(timeout, |c| inv.invoke::<i64>(c))
        });
    }
}

/// The per-node timeout: short, so that a dead master does not eat the lease (docs/backends.md, Redlock).
fn node_timeout(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(10), Duration::from_millis(50))
}

impl Redlock {
    /// The keys `scan` finds on any master that answers (an error only when none did).
    fn keys_by(
        &self,
        scan: fn(&mut Connection) -> redis::RedisResult<Vec<Key>>,
    ) -> anyhow::Result<Vec<Key>> {
        let mut slots = self.slots();
        let found = parallel(&mut slots, |slot| slot.with(COMMAND_TIMEOUT, scan));
        let mut keys = std::collections::BTreeSet::new();
        let mut failed = None;
        for r in found {
            match r {
                Ok(k) => keys.extend(k),
                Err(e) => failed = Some(e),
            }
        }
        match (keys.is_empty(), failed) {
            (true, Some(e)) => Err(e),
            _ => Ok(keys.into_iter().take(super::MAX_LISTED).collect()),
        }
    }
}

impl Backend for Redlock {
    /// The keys any master that answers knows of.
    fn list_keys(&self) -> anyhow::Result<Vec<Key>> {
        self.keys_by(super::redis::scan_keys)
    }

    /// The keys with a history on any master that answers.
    fn history_keys(&self) -> anyhow::Result<Vec<Key>> {
        self.keys_by(super::redis::scan_history_keys)
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Redis
    }

    fn location(&self) -> String {
        let addrs: Vec<&str> = self.nodes.iter().map(|n| n.addr.as_str()).collect();
        format!("Redlock over {}", addrs.join(", "))
    }

    fn acquire(&self, req: &Request<'_>) -> anyhow::Result<Box<dyn Lease>> {
        let keys = Keys::new(req.key);
        let token = token()?;
        let meta = serde_json::to_string(req.holder)?;
        let ttl_ms = req.ttl.as_millis() as u64;
        let timeout = node_timeout(req.ttl);
        // The run's start, recorded by each master's acquire script when it grants the lock
        // (without a token: one master's fence is none, and the masters' copies must be equal).
        let opening = req.start.map(|o| (o.body(), false));
        let run = req.start.map(|o| o.id.as_str());
        let mut slots = self.slots();
        let mut told_holder = false;
        loop {
            if let Some(sig) = req.interrupt.fired() {
                Self::release_all(&mut slots, &keys, &token, timeout);
                Self::forget_waiter(&mut slots, &keys, &token, timeout);
                return Err(Interrupted(sig).into());
            }
            let waiting_ms = req
                .deadline
                .remaining()
                .map_or(5000, |d| d.as_millis().min(5000) as u64);
            let start = BootInstant::now();
            // Each master's script records the run's start when it grants the lock (its reply
            // carries the entry); the start counts once a quorum granted, and every grant given
            // back below takes its start back first.
            let raw = parallel(&mut slots, |slot| {
                slot.with(timeout, |c| {
                    let reply = acquire_starting(
                        &keys,
                        Mode::Exclusive,
                        &token,
                        ttl_ms,
                        &meta,
                        waiting_ms,
                        opening,
                    )
                    .invoke::<redis::Value>(c)?;
                    let entry = granted_entry(&reply);
                    super::redis::acquire_reply(reply).map(|r| (r, entry))
                })
            });
            let entries: Vec<Option<Vec<u8>>> = raw
                .iter()
                .map(|r| r.as_ref().ok().and_then(|(_, e)| e.clone()))
                .collect();
            let mut replies: Vec<anyhow::Result<_>> =
                raw.into_iter().map(|r| r.map(|(r, _)| r)).collect();
            let give_back = |slots: &mut [Slot], replies: &[anyhow::Result<_>]| {
                give_back::give_back(slots, &keys, &token, &entries, replies, run, timeout);
            };
            // A master that is a proxy or a replica: the set is misconfigured, whatever the
            // others said. Said at once, with every grant given back.
            let refused = replies.iter().position(|r| match r {
                Err(e) => ground::is_refusal(e),
                Ok((1, _, seen)) => seen.is_replica(),
                Ok(_) => false,
            });
            if let Some(i) = refused {
                give_back(&mut slots, &replies);
                Self::forget_waiter(&mut slots, &keys, &token, timeout);
                return Err(match replies.swap_remove(i) {
                    Err(e) => e,
                    Ok(_) => ground::Replica(ground::replica_message(&self.nodes[i].addr)).into(),
                });
            }
            let granted = replies
                .iter()
                .filter(|r| matches!(r, Ok((1, _, _))))
                .count();
            let answered = replies.iter().filter(|r| r.is_ok()).count();
            let elapsed = BootInstant::now().saturating_duration_since(start);
            let validity = req
                .ttl
                .saturating_sub(elapsed)
                .saturating_sub(drift_margin(req.ttl));
            if granted >= self.quorum() && validity >= req.ttl * 9 / 10 {
                if granted < slots.len() {
                    // A master that did not grant it registered us as a waiter there (for up
                    // to 5 s): `status` would count a waiter that is the holder.
                    Self::forget_waiter(&mut slots, &keys, &token, timeout);
                }
                for (r, node) in replies.iter().zip(&self.nodes) {
                    if let Ok((1, _, seen)) = r {
                        // Only the eviction warning is left to say (replicas were refused).
                        let _ = ground::judge_grant(&node.addr, seen);
                    }
                }
                // A quorum that forgot an earlier holder in a restart has a young master in it.
                let held_back_until = replies
                    .iter()
                    .filter_map(|r| match r {
                        Ok((1, _, seen)) => seen.up,
                        _ => None,
                    })
                    .min()
                    .and_then(|up| super::hold_back_until(up, req.ttl));
                // The start counts when a quorum of the grants carried it (a master whose
                // history key is someone else's records none); else `begin_run` writes it (the
                // masters' lists are merged by event, so a second copy shows once).
                let recorded = replies
                    .iter()
                    .zip(&entries)
                    .filter(|(r, e)| matches!(r, Ok((1, _, _))) && e.is_some())
                    .count();
                return Ok(Box::new(RedlockLease {
                    started: recorded >= self.quorum(),
                    slots,
                    keys,
                    token,
                    ttl: req.ttl,
                    quorum: self.quorum(),
                    grant: Grant {
                        fence: None,
                        acquired_at: start,
                        held_back_until,
                    },
                }));
            }
            // Not held (or held too late to be useful): give back what was granted.
            give_back(&mut slots, &replies);
            if answered < self.quorum() {
                let first = replies
                    .into_iter()
                    .find_map(Result::err)
                    .map(|e| format!("{e:#}"));
                let message = format!(
                    "only {answered} of {} Redis masters answered, {} needed ({})",
                    self.nodes.len(),
                    self.quorum(),
                    first.unwrap_or_default()
                );
                // Too few masters: an outage if this process had reached a quorum before.
                let reached = self.nodes.iter().filter(|n| n.reach.was_reached()).count();
                return Err(if reached >= self.quorum() {
                    crate::exit::Outage(message).into()
                } else {
                    Unavailable(message).into()
                });
            }
            let holder = self.holder(&mut slots, &keys, timeout);
            let remaining = req.deadline.remaining();
            if req.waited_out() {
                parallel(&mut slots, |slot| {
                    slot.with(timeout, |c| {
                        redis::cmd("ZREM")
                            .arg(&keys.waiters)
                            .arg(&token)
                            .query::<i64>(c)
                    })
                });
                return Err(req.busy(holder.as_ref()));
            }
            if !told_holder {
                if let Some(h) = &holder {
                    (req.on_holder)(h);
                }
                told_holder = true;
            }
            let nap = Duration::from_millis(super::support::jitter_ms(50, 250));
            req.interrupt.nap(remaining.map_or(nap, |r| r.min(nap)))?;
        }
    }

    fn status(&self, key: &Key) -> anyhow::Result<Status> {
        static ST: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
        let keys = Keys::new(key);
        let mut slots = self.slots();
        let replies = parallel(&mut slots, |slot| {
            slot.with(COMMAND_TIMEOUT, |c| {
                script(&ST, STATUS)
                    .key(&keys.lock)
                    .key(&keys.owner)
                    .key(&keys.waiters)
                    .invoke::<(String, i64, String, String, String, u64)>(c)
            })
        });
        let ok: Vec<_> = replies.iter().filter_map(|r| r.as_ref().ok()).collect();
        if ok.len() < self.quorum() {
            return Err(Unavailable(format!(
                "only {} of {} Redis masters answered",
                ok.len(),
                self.nodes.len()
            ))
            .into());
        }
        let mut status = Status {
            waiters: ok.iter().map(|r| r.5).max(),
            notes: vec![NO_FENCING.into()],
            server_name: Some(keys.lock.clone()),
            ..Status::new(key, self.kind(), self.location())
        };
        if ok.len() < self.nodes.len() {
            status.notes.push(format!(
                "{} of {} masters answered",
                ok.len(),
                self.nodes.len()
            ));
        }
        // Held when a quorum of masters carries the same token (a master where a break turned
        // it into its tombstone, `broken:TOKEN`, carries it too).
        let bare = |t: &str| t.strip_prefix(BROKEN_PREFIX).unwrap_or(t).to_string();
        for r in &ok {
            let same: Vec<_> = ok
                .iter()
                .filter(|o| !o.0.is_empty() && bare(&o.0) == bare(&r.0))
                .collect();
            if same.len() >= self.quorum() {
                status.held = true;
                let mut h = super::read_record(r.2.as_bytes()).unwrap_or_default();
                h.broken = same.iter().any(|o| o.0.starts_with(BROKEN_PREFIX));
                h.lease_left_ms = same
                    .iter()
                    .map(|o| o.1)
                    .min()
                    .and_then(|p| u64::try_from(p).ok());
                status.holders.push(h);
                break;
            }
        }
        // A quorum with a young master in it holds the grant back, as the acquire counted it:
        // the youngest of the masters that carry the holder's token.
        if status.holders.iter().any(|h| h.ttl_ms.is_some()) {
            let token = ok.iter().map(|r| &r.0).find(|t| {
                !t.is_empty() && ok.iter().filter(|o| &o.0 == *t).count() >= self.quorum()
            });
            let carries: Vec<bool> = replies
                .iter()
                .map(|r| r.as_ref().is_ok_and(|r| Some(&r.0) == token))
                .collect();
            let ups = parallel(&mut slots, |slot| {
                slot.with(COMMAND_TIMEOUT, |c| {
                    redis::cmd("INFO").arg("server").query::<String>(c)
                })
            });
            let youngest = ups
                .iter()
                .zip(&carries)
                .filter(|(_, c)| **c)
                .filter_map(|(u, _)| super::redis::uptime(u.as_ref().ok()?))
                .min();
            if let Some(up) = youngest {
                status.mark_held_back(up);
            }
        }
        Ok(status)
    }

    /// As on a single Redis (`redis::broken_by_tombstones`), on every master that answers;
    /// the holder's renewals fail once fewer than a quorum renew.
    fn break_lock(&self, key: &Key, how: BreakHow) -> anyhow::Result<Broken> {
        let status = self.status(key)?;
        let keys = Keys::new(key);
        if how == BreakHow::Force {
            Self::release_all(&mut self.slots(), &keys, "", COMMAND_TIMEOUT);
            return Ok(Broken::now(status));
        }
        let replies = parallel(&mut self.slots(), |slot| {
            slot.with(COMMAND_TIMEOUT, |c| break_script(&keys).invoke::<i64>(c))
        });
        let marked = replies.iter().filter(|r| r.is_ok()).count();
        let n = self.nodes.len();
        // The holder keeps the lock while a quorum renews: a break must reach the rest.
        if marked < n - self.quorum() + 1 {
            return Err(Unavailable(format!(
                "only {marked} of {n} Redis masters answered; the holder may go on holding"
            ))
            .into());
        }
        let left = replies
            .iter()
            .filter_map(|r| r.as_ref().ok().copied())
            .max()
            .unwrap_or(0);
        broken_by_tombstones(status, left)
    }

    /// Every master's events, merged: one copy of each (by its bytes), newest first by the
    /// masters' clocks.
    fn runs(&self, key: &Key) -> anyhow::Result<Vec<Stored>> {
        let keys = Keys::new(key);
        let results = parallel(&mut self.slots(), |slot| {
            slot.with(COMMAND_TIMEOUT, |c| history::read(c, &keys))
        });
        let answered = results.iter().filter(|r| r.is_ok()).count();
        if answered < self.quorum() {
            let first = results.into_iter().find_map(Result::err);
            return Err(first.unwrap_or_else(|| anyhow::anyhow!("no master answered")));
        }
        let mut seen = std::collections::HashSet::new();
        let mut all: Vec<Stored> = results
            .into_iter()
            .flatten()
            .flatten()
            .filter(|s| seen.insert(s.body.clone()))
            .collect();
        all.sort_by_key(|s| std::cmp::Reverse(s.at_ms));
        all.truncate(MAX_EVENTS);
        Ok(all)
    }

    /// On every master that answers; an error only if none did.
    fn end_run(&self, key: &Key, end: &[u8]) -> anyhow::Result<()> {
        let keys = Keys::new(key);
        let results = parallel(&mut self.slots(), |slot| {
            slot.with(COMMAND_TIMEOUT, |c| history::end(c, &keys, end))
        });
        if results.iter().any(|r| r.is_ok()) {
            return Ok(());
        }
        results
            .into_iter()
            .find_map(Result::err)
            .map_or(Ok(()), Err)
    }

    fn doctor(&self, ttl: Duration) -> anyhow::Result<Vec<super::ground::Finding>> {
        super::redis::doctor_redlock(&self.nodes, self.quorum(), ttl)
    }

    fn purge(&self, key: &Key) -> anyhow::Result<()> {
        let keys = Keys::new(key);
        let del = keys.del_all();
        let results = parallel(&mut self.slots(), |slot| {
            slot.with(COMMAND_TIMEOUT, |c| del.query::<i64>(c))
        });
        results.into_iter().try_for_each(|r| r.map(drop))
    }
}

impl Redlock {
    /// Removes this waiter from every master's waiters set (for `status`).
    fn forget_waiter(slots: &mut [Slot], keys: &Keys, token: &str, timeout: Duration) {
        parallel(slots, |slot| {
            slot.with(timeout, |c| {
                redis::cmd("ZREM")
                    .arg(&keys.waiters)
                    .arg(token)
                    .query::<i64>(c)
            })
        });
    }

    /// What the masters know of the holder (the first that answers).
    fn holder(&self, slots: &mut [Slot], keys: &Keys, timeout: Duration) -> Option<Holder> {
        parallel(slots, |slot| {
            slot.with(timeout, |c| {
                redis::cmd("HGET")
                    .arg(&keys.owner)
                    .arg("meta")
                    .query::<Option<String>>(c)
            })
        })
        .into_iter()
        .find_map(|r| super::read_record(r.ok()??.as_bytes()))
    }
}

/// A lock held on a quorum of masters.
struct RedlockLease {
    /// The run's start went in with the acquire, on the quorum that granted it.
    started: bool,
    slots: Vec<Slot>,
    keys: Keys,
    token: String,
    ttl: Duration,
    quorum: usize,
    /// The fencing token, when the acquiring request was sent, any hold-back.
    grant: Grant,
}

impl Lease for RedlockLease {
    fn grant(&self) -> Grant {
        self.grant
    }

    fn ttl(&self) -> Option<Duration> {
        Some(self.ttl)
    }

    fn renew(&mut self) -> Result<(), RenewError> {
        static RN: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
        let (keys, token, ttl_ms) = (&self.keys, &self.token, self.ttl.as_millis() as u64);
        let timeout = (self.ttl / 6).min(COMMAND_TIMEOUT);
        let replies = parallel(&mut self.slots, |slot| {
            slot.with(timeout, |c| {
                script(&RN, RENEW)
                    .key(&keys.lock)
                    .key(&keys.owner)
                    .arg(token)
                    .arg(ttl_ms)
                    .invoke::<i64>(c)
            })
        });
        let held = replies.iter().filter(|r| matches!(r, Ok(1))).count();
        let broken = replies.iter().filter(|r| matches!(r, Ok(BROKEN))).count();
        let gone = broken + replies.iter().filter(|r| matches!(r, Ok(0))).count();
        let n = replies.len();
        if held >= self.quorum {
            return Ok(());
        }
        if gone > n - self.quorum && broken > 0 {
            return Err(RenewError::Lost(format!(
                "dlock break told it to stop (on {broken} of {n} Redis masters)"
            )));
        }
        if gone > n - self.quorum {
            return Err(RenewError::Lost(format!(
                "only {held} of {n} Redis masters still hold the lock ({} needed)",
                self.quorum
            )));
        }
        let first = replies
            .into_iter()
            .find_map(Result::err)
            .map(|e| format!("{e:#}"));
        Err(RenewError::Failed(anyhow::anyhow!(
            "{held} of {n} masters renewed ({} needed): {}",
            self.quorum,
            first.unwrap_or_default()
        )))
    }

    fn release(mut self: Box<Self>) -> anyhow::Result<()> {
        let timeout = node_timeout(self.ttl).max(Duration::from_millis(200));
        Redlock::release_all(&mut self.slots, &self.keys, &self.token, timeout);
        Ok(())
    }

    /// With `--once-per`, every master is asked for its newest start first and nothing is
    /// written unless a quorum answered and none knows a start within DUR (each judged by its
    /// own clock); then the start goes to every master, and counts once a quorum has it. A run
    /// that counted is on a quorum, which meets the quorum the next run asks.
    ///
    /// Each master gets the acquire's short timeout: a master that does not answer must not
    /// hold up every run.
    fn begin_run(&mut self, start: &[u8], once_per: Option<Duration>) -> anyhow::Result<Begun> {
        if std::mem::take(&mut self.started) && once_per.is_none() {
            return Ok(Begun::Started);
        }
        let timeout = node_timeout(self.ttl);
        let (keys, n, quorum) = (&self.keys, self.slots.len(), self.quorum);
        if let Some(within) = once_per {
            let found = parallel(&mut self.slots, |slot| {
                slot.with(timeout, |c| history::last_start(c, keys, within))
            });
            let answered = found.iter().filter(|r| r.is_ok()).count();
            if answered < quorum {
                let first = found.into_iter().find_map(Result::err);
                return Err(anyhow::anyhow!(
                    "only {answered} of {n} masters answered ({quorum} needed): {:#}",
                    first.unwrap_or_else(|| anyhow::anyhow!("no reply"))
                ));
            }
            let youngest = found
                .into_iter()
                .flatten()
                .flatten()
                .filter(|(_, ago)| *ago < within)
                .min_by_key(|(_, ago)| *ago);
            if let Some((last, ago)) = youngest {
                return Ok(Begun::Skip { last, ago });
            }
        }
        let wrote = parallel(&mut self.slots, |slot| {
            slot.with(timeout, |c| history::begin_entry(c, keys, start, None))
        });
        let ok = wrote
            .iter()
            .filter(|r| matches!(r, Ok((Begun::Started, _))))
            .count();
        if ok < quorum {
            // Too few have it to count: take it back where it went, so that it neither makes
            // later runs skip nor shows as a run that never ended.
            let entries: Vec<Option<Vec<u8>>> = wrote
                .iter()
                .map(|r| r.as_ref().ok().and_then(|(_, e)| e.clone()))
                .collect();
            for (slot, entry) in self.slots.iter_mut().zip(&entries) {
                if let Some(entry) = entry {
                    let _ = slot.with(timeout, |c| history::undo(c, keys, entry));
                }
            }
            let first = wrote.into_iter().find_map(Result::err);
            return Err(anyhow::anyhow!(
                "the start was recorded on only {ok} of {n} masters ({quorum} needed): {:#}",
                first.unwrap_or_else(|| anyhow::anyhow!("no reply"))
            ));
        }
        Ok(Begun::Started)
    }

    /// The end and the release in one script per master, all at once.
    fn release_with_end(mut self: Box<Self>, end: &[u8]) -> anyhow::Result<bool> {
        let timeout = node_timeout(self.ttl).max(Duration::from_millis(200));
        let (keys, token) = (&self.keys, &self.token);
        let done = parallel(&mut self.slots, |slot| {
            slot.with(timeout, |c| history::release_end(c, keys, token, end))
        });
        // The masters' lists are merged when read: one that has the end is enough, and a
        // master that did not answer must not cost a second round of writes (new connections
        // with the full command timeout) on every run.
        Ok(done.iter().any(Result::is_ok))
    }
}
