//! The holder's watcher thread: it turns the handle's socket, the owner's pidfd (or a look at
//! /proc every [`super::owner::OWNER_CHECK`] without pidfds) and the caller's acknowledgement
//! into events for the holder's main thread.

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use super::handle;
use crate::events::{Event, Events, HolderEvent};
use crate::sys;

/// The descriptors the watcher thread turns into events.
pub(super) struct Watched {
    /// `dlock acquire`, until it acknowledges the handle.
    pub(super) caller: Option<UnixStream>,
    /// The handle's socket, and its path (bound anew if a cleaner removes it).
    pub(super) listener: UnixListener,
    pub(super) socket: PathBuf,
    /// A request came: the socket is not put back any more.
    pub(super) asked: bool,
    /// The owner, until it exits.
    pub(super) owner: Option<OwnerWatch>,
}

/// How the watcher learns that the owner exited.
pub(super) enum OwnerWatch {
    /// Its pidfd becomes readable.
    Fd(std::os::fd::OwnedFd),
    /// No pidfds (Linux < 5.3): /proc is looked at every [`super::owner::OWNER_CHECK`].
    Scan(crate::procs::Proc),
}

/// Starts the watcher thread.
pub(super) fn watch(mut w: Watched, events: Events) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("dlock-holder".into())
        .spawn(move || {
            loop {
                let mut fds = vec![w.listener.as_fd()];
                let caller_at = w.caller.as_ref().map(|c| {
                    fds.push(c.as_fd());
                    fds.len() - 1
                });
                let mut timeout = handle::SOCKET_CHECK.as_millis() as i32;
                let mut owner_gone = false;
                let owner_at = match &w.owner {
                    Some(OwnerWatch::Fd(o)) => {
                        fds.push(o.as_fd());
                        Some(fds.len() - 1)
                    }
                    Some(OwnerWatch::Scan(p)) => {
                        owner_gone = p.has_exited();
                        timeout = timeout.min(super::owner::OWNER_CHECK.as_millis() as i32);
                        None
                    }
                    None => None,
                };
                let Ok(ready) = sys::poll_readable(&fds, if owner_gone { 0 } else { timeout })
                else {
                    return;
                };
                let is = |i: Option<usize>| i.is_some_and(|i| ready.get(i) == Some(&true));
                let (caller, owner) = (is(caller_at), is(owner_at) || owner_gone);
                let listener = ready.first() == Some(&true);
                drop(fds);
                if caller {
                    let mut byte = [0u8; 1];
                    let acked = w
                        .caller
                        .as_ref()
                        .is_some_and(|mut c| matches!(c.read(&mut byte), Ok(1)) && byte[0] == b'1');
                    w.caller = None;
                    events.send(Event::Holder(if acked {
                        HolderEvent::CallerAcked
                    } else {
                        HolderEvent::CallerGone
                    }));
                }
                if owner {
                    w.owner = None;
                    events.send(Event::Holder(HolderEvent::OwnerExited));
                }
                // Not once a release has asked: it removes the socket as the holder ends.
                if !w.asked
                    && let Some(l) = handle::rebind_if_gone(&w.socket)
                {
                    w.listener = l;
                    continue;
                }
                if listener
                    && let Ok((stream, _)) = w.listener.accept()
                    && let Some(request) = handle::read_request(&stream)
                {
                    w.asked = true;
                    events.send(Event::Holder(HolderEvent::Request(stream, request)));
                }
            }
        })
        .map(|_| ())
}
