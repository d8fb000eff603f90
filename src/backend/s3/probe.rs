//! Before the first lock on an endpoint (once per process and bucket): the server must enforce
//! `If-None-Match: *` and `If-Match` on PUT, or no lock there can be sound (several
//! S3-compatible servers accept and ignore them). A server that does not is refused (78)
//! before anything runs; `dlock doctor` says the same.

use std::collections::HashSet;
use std::sync::Mutex;

use super::client::{Client, Cond};
use super::{S3Backend, owner_id};
use crate::backend::ground::Finding;
use crate::exit::Unsound;

/// The probe's object: a leading dot, which no escaped key has.
fn object(b: &S3Backend) -> String {
    format!("{}.dlock-probe", b.place.prefix)
}

const CHECK: &str = "conditional writes";

/// Checks once per process and bucket; an error is the run's refusal.
pub(super) fn ensure(b: &S3Backend, c: &mut Client) -> anyhow::Result<()> {
    static DONE: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let place = b.place.describe();
    if DONE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_default()
        .contains(&place)
    {
        return Ok(());
    }
    if let Some(f) = findings(b, c)?.into_iter().find(|f| f.fix.is_some()) {
        return Err(Unsound(format!("{place}: {}", f.sentence())).into());
    }
    DONE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_default()
        .insert(place);
    Ok(())
}

/// The probe's outcome as `dlock doctor` findings; an error when the server cannot be asked.
pub(super) fn findings(b: &S3Backend, c: &mut Client) -> anyhow::Result<Vec<Finding>> {
    let object = object(b);
    // Two different bodies, written one after the other: their ETags must differ (a renewal
    // must show waiters a new ETag, and `If-Match` must tell versions apart).
    let mut etags = Vec::new();
    let mut body = String::new();
    for _ in 0..2 {
        body = format!("{{\"dlock_probe\":\"{}\"}}", owner_id()?);
        let r = c
            .put(&object, Cond::None, body.as_bytes())
            .map_err(|e| b.transport(e))?;
        if !(200..300).contains(&r.status) {
            return Err(b.refused(&r));
        }
        etags.push(r.etag);
    }
    let fix = "use a server that enforces conditional writes (AWS S3, SeaweedFS 4, ...)";
    let distinct = etags[0].is_some() && etags[1].is_some() && etags[0] != etags[1];
    let stale = etags[0]
        .clone()
        .unwrap_or_else(|| "\"00000000000000000000000000000000\"".into());
    // A 409 is a concurrent write (another process's probe): asked again, a few times. The
    // `If-Match` is the first version's real ETag, now stale.
    let mut ignored = Vec::new();
    for (name, cond) in [
        ("If-None-Match: *", Cond::Absent),
        ("If-Match", Cond::Is(&stale)),
    ] {
        let mut status = 409;
        for _ in 0..5 {
            status = c
                .put(&object, cond, body.as_bytes())
                .map_err(|e| b.transport(e))?
                .status;
            if status != 409 {
                break;
            }
        }
        match status {
            412 => {}
            200..=299 => ignored.push(name),
            s => return Err(b.refused_status(s)),
        }
    }
    if ignored.is_empty() && !distinct {
        return Ok(vec![Finding::unsafe_(
            CHECK,
            "the server gives two versions of an object the same ETag (or none): If-Match \
             cannot tell them apart, so two holders could both win"
                .to_string(),
            fix,
        )]);
    }
    if ignored.is_empty() {
        Ok(vec![Finding::ok(
            CHECK,
            "If-None-Match and If-Match are enforced on PUT",
        )])
    } else {
        Ok(vec![Finding::unsafe_(
            CHECK,
            format!(
                "the server ignores {} on PUT: two holders could both win",
                ignored.join(" and ")
            ),
            fix,
        )])
    }
}
