//! The etcd backend: the lock recipe of etcd's clientv3 `concurrency.Mutex` (what `etcdctl lock`
//! and Go programs use), so that `etcdctl lock dlock/KEY` and dlock exclude each other.
//!
//! - The lock of KEY is the prefix `dlock/KEY/`, with `%` in KEY written `%25` and `/` written
//!   `%2F` ([`names`]: else `dlock/a/`'s range would hold `a/b`'s keys). A run grants a lease
//!   (`--ttl` rounded up to whole seconds), and in one transaction creates its own key
//!   `<prefix><lease id in hex>` bound to the lease (its value: dlock's holder record; etcdctl
//!   writes an empty value) and reads the prefix's keys in create-revision order. The own key's
//!   create revision orders the queue and is the fencing token.
//! - Exclusive: held when no key of the prefix is older. Else the run watches only the newest
//!   older key for its deletion (no herd), then looks again, as the Mutex does.
//! - `--shared`: held when every older key is a dlock shared holder; it waits for the newest
//!   older key that is not (so a waiting exclusive run, or an etcdctl lock, keeps new readers
//!   out). `--limit N`: held when fewer than N older keys exist and all are dlock slots of N;
//!   a waiter watches the whole prefix (etcd cannot watch "any of N").
//!   Any key that is not a dlock record is an exclusive holder for every mode; etcdctl's waits
//!   for every older key, dlock's included.
//! - The lease is kept alive every ttl/3 (keep-alive answering TTL 0, the own key gone, or the
//!   own key on another lease, is a loss); Ctrl-C, a timeout or an error revokes it, which
//!   deletes the own key.
//! - A safe `dlock break` moves each holder's key onto a lease of its own as long as the
//!   holder's ([`tombstone`]): the key keeps its place, the holder stops, then deletes it.
//! - Run history ([`history`]): keys under `dlock/%history/KEY/`, `--once-per`'s leased marker
//!   `dlock/%history/KEY` (KEY escaped as for the lock; no lock's range holds them).

mod ground;
mod history;
mod http;
mod names;
mod queue;
mod reply;
mod retention;
mod tombstone;
mod url;

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use self::http::{Client, Endpoints, Error, b64, prefix_end};
use self::names::lock_prefix;
use self::queue::{Entry, Verdict, holders, judge, range_request};
use self::reply::decode;
use self::url::parse_url;
use super::{Backend, BreakHow, Broken, Grant, Lease, Reach, RenewError, Request};
use crate::clock::BootInstant;
use crate::exit::{Interrupted, Unavailable, Usage};
use crate::model::{BackendKind, Key};
use crate::model::{Deadline, Mode, Status};

const DEFAULT_URL: &str = "etcd://127.0.0.1:2379";
/// How long giving a waiter's lease back may take after a signal.
const SIGNALLED_LIMIT: Duration = Duration::from_millis(300);
/// The most keys of one prefix read at once.
const MAX_QUEUE: usize = 10_000;

/// Locks on an etcd cluster.
pub(crate) struct EtcdBackend {
    ends: Endpoints,
    /// The endpoints, without credentials.
    addr: String,
    /// Whether a member ever answered this process (an outage from then on, not "unreachable").
    reach: Reach,
    /// Leases of failed tries that could not be revoked then; revoked by the next try.
    abandoned: std::sync::Mutex<Vec<i64>>,
}

impl EtcdBackend {
    pub(crate) fn open(urls: &[String]) -> anyhow::Result<EtcdBackend> {
        let url = match urls {
            [] => DEFAULT_URL,
            [u] => u.as_str(),
            _ => {
                return Err(Usage(
                    "the etcd backend takes one --url (members separated by commas)".into(),
                )
                .into());
            }
        };
        let ends = parse_url(url)?;
        if ends.tls {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let addr = ends
            .hosts
            .iter()
            .map(|(h, p)| format!("{h}:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        Ok(EtcdBackend {
            ends,
            addr,
            reach: Reach::default(),
            abandoned: std::sync::Mutex::default(),
        })
    }

    fn client(&self) -> Client {
        Client::new(self.ends.clone(), self.reach.clone())
    }

    /// The error for a failed request: an outage (or unreachable, before any answer) for a
    /// transport failure or a cluster that cannot serve for now (no leader), the server's
    /// answer otherwise.
    fn fail(&self, e: Error) -> anyhow::Error {
        match e {
            Error::Transport(e) if crate::backend::net::is_signalled(&e) => {
                Interrupted(libc::SIGINT).into()
            }
            e if e.transient() => self
                .reach
                .transport_error(format!("etcd {}: {e}", self.addr)),
            e => Unavailable(format!("etcd {}: {e}", self.addr)).into(),
        }
    }

    /// The keys of `prefix` in create-revision order, those older than `before` if given.
    fn entries(
        &self,
        c: &mut Client,
        prefix: &[u8],
        before: Option<i64>,
    ) -> anyhow::Result<(Vec<Entry>, i64)> {
        let r = c
            .call("/v3/kv/range", &range_request(prefix, before))
            .map_err(|e| self.fail(e))?;
        let r: reply::Range = decode(&r, "range").map_err(|e| self.bad_reply(e))?;
        let entries = queue::entries(prefix, r.kvs).map_err(Unavailable)?;
        Ok((entries, r.header.revision))
    }

    /// The error for a reply that is not what etcd sends.
    fn bad_reply(&self, why: String) -> anyhow::Error {
        Unavailable(format!("etcd {}: {why}", self.addr)).into()
    }

    /// Revokes `lease` (deleting its key); whether it is gone (revoked now, or before).
    fn revoke(c: &mut Client, lease: i64) -> bool {
        match revoke_lease(c, lease) {
            Ok(()) => true,
            Err(Error::Server { message, .. }) => message.contains("lease not found"),
            Err(_) => false,
        }
    }

    /// Revokes the leases of this process's earlier tries that could not be revoked then (an
    /// outage cut the try off): their keys are older than the next try's and would be waited
    /// for until they expire.
    fn revoke_abandoned(&self, c: &mut Client) {
        let mut abandoned = self.abandoned.lock().unwrap_or_else(|e| e.into_inner());
        abandoned.retain(|&lease| !Self::revoke(c, lease));
    }
}

impl Backend for EtcdBackend {
    /// The keys of `dlock/`, but for the histories' `dlock/%history/` (up to 200 events a key,
    /// which would crowd the locks out of the listing's bound).
    fn list_keys(&self) -> anyhow::Result<Vec<Key>> {
        let mut c = self.client();
        let mut keys: Vec<Key> = Vec::new();
        for (from, to) in names::listing_ranges() {
            let r = c
                .call(
                    "/v3/kv/range",
                    &json!({
                        "key": b64(&from),
                        "range_end": b64(&to),
                        "keys_only": true,
                        "limit": super::MAX_LISTED.to_string(),
                    }),
                )
                .map_err(|e| self.fail(e))?;
            let r: reply::ListedKeys = decode(&r, "range").map_err(|e| self.bad_reply(e))?;
            for key in r.kvs.iter().filter_map(|kv| names::key_of(&kv.key)) {
                if !keys.contains(&key) && keys.len() < super::MAX_LISTED {
                    keys.push(key);
                }
            }
        }
        Ok(keys)
    }

    fn history_keys(&self) -> anyhow::Result<Vec<Key>> {
        self.keys_with_history()
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Etcd
    }

    fn location(&self) -> String {
        self.addr.clone()
    }

    fn unsupported(&self, mode: Mode) -> Option<String> {
        match mode {
            Mode::Limit(n) if n > 256 => Some(format!("--limit {n} is too large (at most 256)")),
            _ => None,
        }
    }

    fn acquire(&self, req: &Request<'_>) -> anyhow::Result<Box<dyn Lease>> {
        let mut c = self.client();
        let prefix = lock_prefix(req.key);
        let ttl = super::ttl_secs_up(req.ttl);
        self.revoke_abandoned(&mut c);
        let sent = BootInstant::now();
        let grant = c
            .call("/v3/lease/grant", &json!({ "TTL": ttl.to_string() }))
            .map_err(|e| self.fail(e))?;
        let grant: reply::Grant = decode(&grant, "lease grant").map_err(|e| self.bad_reply(e))?;
        let lease = grant.id;
        if i64::try_from(ttl).map_or(true, |ttl| grant.ttl < ttl) {
            // Granted: revoke it, or it would hold nothing for its TTL.
            if !Self::revoke(&mut c, lease) {
                let mut abandoned = self.abandoned.lock().unwrap_or_else(|e| e.into_inner());
                abandoned.push(lease);
            }
            anyhow::bail!(
                "etcd {}: the server granted a lease of {}s for {ttl}s",
                self.addr,
                grant.ttl
            );
        }
        // From here on, every way out that is not a held lock revokes the lease, which deletes
        // the own key.
        let started = match req.start.filter(|_| req.mode == Mode::Exclusive) {
            Some(start) => self.alone(&mut c, req, &prefix, lease, start),
            None => Ok(None),
        };
        let result = match started {
            Ok(Some((rev, key, count))) => Ok((rev, key, sent, Some(count))),
            Ok(None) => self
                .queue(&mut c, req, &prefix, lease, sent)
                .map(|(rev, key, sent)| (rev, key, sent, None)),
            Err(e) => Err(e),
        };
        match result {
            Ok((rev, key, sent, started)) => Ok(Box::new(EtcdLease {
                client: c,
                lease,
                key,
                rev,
                ttl: req.ttl,
                acquired_at: sent,
                addr: self.addr.clone(),
                history: (req.mode == Mode::Exclusive).then(|| history::Place::of(req.key)),
                broken: false,
                started,
                past: Vec::new(),
            })),
            Err(e) => {
                // After a signal: quickly, and not ended by the signal itself (its wait took
                // it, and would end every later one at once).
                let _quiet = e.is::<Interrupted>().then(crate::signals::giving_back);
                if e.is::<Interrupted>() {
                    c.hurry(SIGNALLED_LIMIT);
                }
                if !Self::revoke(&mut c, lease) {
                    let mut abandoned = self.abandoned.lock().unwrap_or_else(|e| e.into_inner());
                    abandoned.push(lease);
                }
                Err(e)
            }
        }
    }

    fn status(&self, key: &Key) -> anyhow::Result<Status> {
        let mut c = self.client();
        let prefix = lock_prefix(key);
        let (entries, _) = self.entries(&mut c, &prefix, None)?;
        let n = holders(&entries);
        let mut status = Status {
            held: n > 0,
            server_name: Some(String::from_utf8_lossy(&prefix).into_owned()),
            waiters: Some((entries.len() - n) as u64),
            ..Status::new(
                key,
                self.kind(),
                format!(
                    "{} (prefix {})",
                    self.addr,
                    String::from_utf8_lossy(&prefix)
                ),
            )
        };
        for (i, e) in entries.iter().enumerate() {
            let mut h = e.holder();
            if i < n {
                let ttl = c
                    .call(
                        "/v3/lease/timetolive",
                        &json!({ "ID": e.lease.to_string() }),
                    )
                    .ok();
                h.lease_left_ms = ttl
                    .and_then(|t| decode::<reply::Ttl>(&t, "timetolive").ok())
                    .and_then(|t| u64::try_from(t.ttl).ok())
                    .and_then(|s| s.checked_mul(1000));
                status.holders.push(h);
            } else {
                status.queue.push(h);
            }
        }
        if let Some(first) = entries.first() {
            status.mode = Some(first.mode());
            status.limit = first.mode().limit();
        }
        Ok(status)
    }

    fn purge(&self, key: &Key) -> anyhow::Result<()> {
        let mut c = self.client();
        let prefix = lock_prefix(key);
        // Key by key: the prefix's range also holds keys deeper down, which are not this lock's.
        let (entries, _) = self.entries(&mut c, &prefix, None)?;
        for e in entries {
            c.call("/v3/kv/deleterange", &json!({ "key": b64(&e.key) }))
                .map_err(|e| self.fail(e))?;
        }
        history::Place::of(key).purge(&mut c, &|e| self.fail(e))
    }

    fn prune(&self, older_than: Duration, most: usize) -> anyhow::Result<usize> {
        self.prune_keys(older_than, most)
    }

    fn runs(&self, key: &Key) -> anyhow::Result<Vec<crate::history::Stored>> {
        history::Place::of(key).read(&mut self.client(), &|e| self.fail(e))
    }

    fn doctor(&self, ttl: Duration) -> anyhow::Result<Vec<crate::backend::ground::Finding>> {
        self.checks(ttl)
    }

    fn end_run(&self, key: &Key, end: &[u8]) -> anyhow::Result<()> {
        history::Place::of(key).end(&mut self.client(), &|e| self.fail(e), end)
    }

    /// Safe: each holder's key becomes a tombstone on a lease of the break's own, and the
    /// holders' leases are revoked ([`tombstone`]). Forced: the holders' leases (a tombstone's:
    /// the break's) are revoked, which deletes their keys at once.
    fn break_lock(&self, key: &Key, how: BreakHow) -> anyhow::Result<Broken> {
        if how == BreakHow::Safe {
            return self.break_safely(key);
        }
        let status = self.status(key)?;
        let mut c = self.client();
        let (entries, _) = self.entries(&mut c, &lock_prefix(key), None)?;
        for e in entries.iter().take(holders(&entries)) {
            c.call("/v3/lease/revoke", &json!({ "ID": e.lease.to_string() }))
                .map_err(|err| self.fail(err))
                .with_context(|| format!("cannot revoke lease {:x}", e.lease))?;
        }
        Ok(Broken::now(status))
    }
}

impl EtcdBackend {
    /// Creates the own key and waits for its turn, keeping the lease (granted when `granted`
    /// was sent) alive meanwhile; the key's create revision and name, and when the last
    /// keep-alive was sent (the lease counts from there).
    fn queue(
        &self,
        c: &mut Client,
        req: &Request<'_>,
        prefix: &[u8],
        lease: i64,
        granted: BootInstant,
    ) -> anyhow::Result<(i64, Vec<u8>, BootInstant)> {
        let mut refreshed = granted;
        let mut own = prefix.to_vec();
        own.extend_from_slice(format!("{lease:x}").as_bytes());
        let record = serde_json::to_vec(req.holder)?;
        // The queue is read in the same transaction (one round trip when nobody is ahead, as
        // the Mutex does).
        let queue = json!({ "request_range": range_request(prefix, None) });
        let txn = json!({
            "compare": [{
                "key": b64(&own), "target": "CREATE", "result": "EQUAL", "create_revision": "0"
            }],
            "success": [
                { "request_put": {
                    "key": b64(&own), "value": b64(&record), "lease": lease.to_string()
                }},
                queue,
            ],
            "failure": [{ "request_range": { "key": b64(&own) } }, queue],
        });
        let r = c.call("/v3/kv/txn", &txn).map_err(|e| self.fail(e))?;
        let mut r: reply::Txn = decode(&r, "transaction").map_err(|e| self.bad_reply(e))?;
        let rev = if r.succeeded {
            r.header.revision
        } else {
            // The own key existed (a retried request): its revision, which decoding required.
            let range = r.range(0).map_err(|e| self.bad_reply(e))?;
            match range.kvs.first() {
                Some(kv) if kv.key == own => kv.create_revision,
                _ => return Err(self.bad_reply("a transaction reply without the own key".into())),
            }
        };
        let queued = std::mem::take(&mut r.responses);
        let queued = queued
            .into_iter()
            .nth(1)
            .and_then(|op| op.response_range)
            .ok_or_else(|| self.bad_reply("a transaction reply without its range 1".into()))?;
        let mut read = Some((
            queue::entries(prefix, queued.kvs)
                .map_err(Unavailable)?
                .into_iter()
                .filter(|e| e.rev < rev)
                .collect::<Vec<_>>(),
            r.header.revision,
        ));
        let mut next_keepalive = Instant::now() + req.ttl / 3;
        let mut told = false;
        loop {
            let (older, header) = match read.take() {
                Some(r) => r,
                None => self.entries(c, prefix, Some(rev))?,
            };
            let target = match judge(req.mode, &older) {
                Verdict::Holds => return Ok((rev, own, refreshed)),
                Verdict::Mismatch(theirs) => {
                    return Err(super::mode_mismatch(req.key, req.mode, &theirs.describe()));
                }
                Verdict::Waits(target) => target.map(|i| &older[i]),
            };
            let holder = older[0].holder();
            if req.waited_out() {
                return Err(req.busy(Some(&holder)));
            }
            if !told {
                (req.on_holder)(&holder);
                told = true;
            }
            // Watch for the deletion from now on. Not from the revision just read: a watch
            // that starts in the past is "unsynced", and etcd delivers its events only in a
            // catch-up pass every 100 ms (`dlock bench` measured hand-offs of 60-80 ms). What
            // happened between the read and the watch is checked once the watch exists.
            let (key, range_end) = match target {
                Some(t) => (t.key.clone(), None),
                None => (prefix.to_vec(), Some(prefix_end(prefix))),
            };
            let mut create = json!({
                "key": b64(&key),
                "filters": ["NOPUT"],
            });
            if let Some(end) = range_end {
                create["range_end"] = json!(b64(&end));
            }
            let mut watch = c.watch(create).map_err(|e| self.fail(e))?;
            loop {
                if let Some(sig) = req.interrupted() {
                    return Err(Interrupted(sig).into());
                }
                let until = match req.deadline {
                    Deadline::Now => Instant::now(),
                    Deadline::At(t) => t.min(next_keepalive),
                    Deadline::Never => next_keepalive,
                };
                let msg = watch.next(until).map_err(|e| {
                    if let Some(sig) = req.interrupted() {
                        return Interrupted(sig).into();
                    }
                    self.fail(e)
                })?;
                if let Some(m) = msg {
                    let m: reply::WatchMsg = decode(&m, "watch").map_err(|e| self.bad_reply(e))?;
                    if m.canceled {
                        // etcd keeps the stream open: waiting on would wait for nothing. A
                        // member cut off from its leader is an outage (queue again), anything
                        // else (permission denied) an answer.
                        let retry = m.cancel_reason.contains("leader");
                        let message = format!("the watch was canceled: {}", m.cancel_reason);
                        return Err(self.fail(Error::Server { message, retry }));
                    }
                    // A deletion of what this run waits for (the watch's own range; anything
                    // else a server sends is no reason to look again).
                    let ours = |key: &[u8]| match target {
                        Some(t) => key == t.key.as_slice(),
                        None => queue::in_lock(prefix, key),
                    };
                    if m.events.iter().any(|ev| ours(&ev.kv.key)) {
                        break;
                    }
                    if m.created && m.header.revision > header {
                        // The store moved between the read and the watch: was it a deletion
                        // of what this run waits for? (Keys older than its own only go.)
                        let (left, before) = match target {
                            Some(t) => {
                                let check = json!({ "key": b64(&t.key), "count_only": true });
                                let r = c.call("/v3/kv/range", &check).map_err(|e| self.fail(e))?;
                                let r: reply::Range =
                                    decode(&r, "range").map_err(|e| self.bad_reply(e))?;
                                (usize::try_from(r.count).unwrap_or(0), 1)
                            }
                            // Read, not counted: keys deeper down are in the range, not the lock.
                            None => (self.entries(c, prefix, Some(rev))?.0.len(), older.len()),
                        };
                        if left < before {
                            break;
                        }
                    }
                    continue;
                }
                if Instant::now() >= next_keepalive {
                    // The waiter's key lives on its lease: keep it while waiting.
                    let sent = BootInstant::now();
                    let k = c
                        .call("/v3/lease/keepalive", &json!({ "ID": lease.to_string() }))
                        .map_err(|e| self.fail(e))?;
                    let k: reply::KeepAlive =
                        decode(&k, "keep-alive").map_err(|e| self.bad_reply(e))?;
                    if k.result.ttl <= 0 {
                        return Err(crate::exit::Outage(format!(
                            "etcd {}: the waiting run's lease ran out",
                            self.addr
                        ))
                        .into());
                    }
                    refreshed = sent;
                    next_keepalive = Instant::now() + req.ttl / 3;
                }
                if req.waited_out() {
                    return Err(req.busy(Some(&holder)));
                }
            }
        }
    }
}

/// A held lock: the lease and the own key.
struct EtcdLease {
    client: Client,
    lease: i64,
    key: Vec<u8>,
    rev: i64,
    ttl: Duration,
    acquired_at: BootInstant,
    addr: String,
    /// Where the key's run history lives: exclusive leases only.
    history: Option<history::Place>,
    /// Whether a safe break made our key its tombstone (seen by [`Lease::renew`]).
    broken: bool,
    /// The run's start went in the lock's own transaction, which counted this many events.
    started: Option<i64>,
    /// The oldest events, for the release's transaction to delete (a history over its bound).
    past: Vec<Vec<u8>>,
}

impl Lease for EtcdLease {
    fn grant(&self) -> Grant {
        Grant {
            fence: u64::try_from(self.rev).ok(),
            acquired_at: self.acquired_at,
            held_back_until: None,
        }
    }

    fn ttl(&self) -> Option<Duration> {
        Some(self.ttl)
    }

    /// A keep-alive, then a read of the own key (keys only): gone, or moved to another lease (a
    /// safe break's tombstone, [`tombstone`]), is a loss.
    fn renew(&mut self) -> Result<(), RenewError> {
        let failed = |e: Error| RenewError::Failed(anyhow::anyhow!("etcd {}", e));
        let bad = |e: String| RenewError::Failed(anyhow::anyhow!("etcd {e}"));
        let k = self
            .client
            .call(
                "/v3/lease/keepalive",
                &json!({ "ID": self.lease.to_string() }),
            )
            .map_err(failed)?;
        let k: reply::KeepAlive = decode(&k, "keep-alive").map_err(bad)?;
        let own = tombstone::own_key(&mut self.client, &self.key)
            .map(|kv| kv.filter(|kv| kv.create_revision == self.rev));
        if let Ok(Some(kv)) = &own
            && kv.lease != self.lease
        {
            self.broken = true;
            return Err(RenewError::Lost(format!(
                "etcd {}: dlock break told it to stop (it moved the lock key {} off lease {:x})",
                self.addr,
                crate::report::clean(
                    &String::from_utf8_lossy(&self.key),
                    crate::report::MAX_FIELD
                ),
                self.lease
            )));
        }
        if k.result.ttl <= 0 {
            return Err(RenewError::Lost(format!(
                "etcd {}: lease {:x} expired or was revoked (dlock break --force?)",
                self.addr, self.lease
            )));
        }
        if own.map_err(bad)?.is_none() {
            return Err(RenewError::Lost(format!(
                "etcd {}: the lock key {} was deleted",
                self.addr,
                crate::report::clean(
                    &String::from_utf8_lossy(&self.key),
                    crate::report::MAX_FIELD
                )
            )));
        }
        Ok(())
    }

    fn release(mut self: Box<Self>) -> anyhow::Result<()> {
        if self.broken {
            // Our lease is gone; our key lives on as the break's tombstone until we delete it.
            tombstone::clear(&mut self.client, &self.key, self.rev);
            let _ = revoke_lease(&mut self.client, self.lease);
            return Ok(());
        }
        revoke_lease(&mut self.client, self.lease)
            .map_err(|e| anyhow::anyhow!("etcd {}: {e}", self.addr))
    }

    fn begin_run(
        &mut self,
        start: &[u8],
        once_per: Option<Duration>,
    ) -> anyhow::Result<crate::history::Begun> {
        let Some(place) = &self.history else {
            return Ok(crate::history::Begun::NotKept);
        };
        let fail = |e| anyhow::anyhow!("etcd {}: {e}", self.addr);
        if let Some(count) = self.started.take().filter(|_| once_per.is_none()) {
            self.past = place.past(&mut self.client, &fail, count);
            return Ok(crate::history::Begun::Started);
        }
        place.begin(&mut self.client, &fail, start, once_per)
    }

    /// One transaction deletes the own key (the lock is free: the next waiter proceeds) and
    /// adds the end. The lease, which holds nothing now, is left to run out (its TTL): a revoke
    /// would be a second fsynced write on the way out, which a run without history does not
    /// make either (its revoke is its release). A broken lease is cleared as
    /// [`Lease::release`] clears it.
    fn release_with_end(mut self: Box<Self>, end: &[u8]) -> anyhow::Result<bool> {
        let txn = self
            .history
            .as_ref()
            .map(|h| h.release_txn(&self.key, end, &self.past));
        let Some(txn) = txn else {
            return self.release().map(|()| false);
        };
        if self.broken || self.client.call("/v3/kv/txn", &txn).is_err() {
            return self.release().map(|()| false);
        }
        Ok(true)
    }
}

/// `/v3/lease/revoke`, tried a second time (on a new connection, to the next member) when the
/// first failed in transit: a keep-alive connection the member closed while idle fails the
/// first request on it, and a lease not given back holds the next waiter for a TTL. Revoking
/// twice is harmless ("lease not found").
fn revoke_lease(c: &mut Client, lease: i64) -> Result<(), Error> {
    let body = json!({ "ID": lease.to_string() });
    match c.call("/v3/lease/revoke", &body) {
        Err(e) if e.transient() => match c.call("/v3/lease/revoke", &body) {
            // The first try did revoke it; only its reply was lost.
            Err(Error::Server { message, .. }) if message.contains("lease not found") => Ok(()),
            r => r.map(drop),
        },
        r => r.map(drop),
    }
}
