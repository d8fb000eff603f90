//! dlock runs a command while holding a named lock on a local file, Redis, ZooKeeper,
//! MySQL/MariaDB, PostgreSQL, etcd or S3, keeps the lease alive in a background thread, and stops the
//! command — its whole process tree — before the lock could be held by anyone else when the lease
//! is lost.
//!
//! The binary is a thin wrapper around [`start`] ([`main`] for a program started by Rust's runtime). The layers, top down: `cli` (clap types) →
//! `config` (checked configuration) → `app` (the commands) → `lockset` (the locks of one run),
//! `supervise` (the child), `keeper` (the lease) and `backend` (the lock servers); `sys` holds
//! every system call std does not offer, and is the only module with `unsafe` code. `exit` holds
//! the exit-code table. docs/design.md describes the design.
//!
//! This is not a library for other crates: everything is `pub(crate)` except [`main`] and the
//! few items the project's own integration tests drive directly ([`internals`]).

// A build without every network backend (Cargo features) leaves shared support code unused: the
// host-list parser, the plumbing of interruptible network waits, the hold-back. Allowed there;
// the default build, with every backend, is linted in full.
#![cfg_attr(
    not(all(
        feature = "redis",
        feature = "zookeeper",
        feature = "mysql",
        feature = "postgres",
        feature = "etcd",
        feature = "s3"
    )),
    allow(dead_code, unused_imports)
)]

mod app;
mod backend;
mod bench;
mod cli;
mod clock;
mod cmd;
mod config;
mod doctor;
mod events;
mod exit;
mod generate;
mod guard;
mod history;
mod hold;
mod keeper;
mod lockset;
mod model;
mod procs;
mod report;
mod session;
mod signals;
mod stopper;
mod supervise;
mod sys;
mod trace;
mod waiting;

pub use app::{main, start};

/// What the integration tests in `tests/` reach inside for: the supervisor with a lease that
/// cannot be renewed (`tests/supervisor.rs`, which, like `main`, must first let a guardian that
/// executed its binary anew resume), the generated files (`tests/it/generated.rs`) and MySQL's
/// lock names. Not a stable interface.
#[doc(hidden)]
pub mod internals {
    #[cfg(feature = "mysql")]
    pub use crate::backend::mysql::lock_name as mysql_lock_name;
    #[cfg(feature = "mysql")]
    pub use crate::backend::mysql::slot_prefix as mysql_slot_prefix;
    pub use crate::backend::{Grant, Lease, RenewError};
    pub use crate::clock::BootInstant;
    pub use crate::events::Events;
    pub use crate::generate::all_files;
    pub use crate::guard::resume_if_asked as resume_guardian_if_asked;
    pub use crate::keeper::{Keeper, deadline_after};
    pub use crate::model::Key;
    pub use crate::signals::block as block_signals;
    pub use crate::supervise::{LeaseClock, Outcome, Reaper, spawn, supervise};
}
