//! dlock runs a command while holding a named lock on a local file, Redis, ZooKeeper or
//! MySQL/MariaDB, keeps the lease alive in a background thread, and stops the command before the
//! lock could be held by anyone else when the lease is lost.
//!
//! The binary is a thin wrapper around [`app::main`]. The layers, top down: [`cli`] (clap types)
//! → [`config`] (checked configuration) → [`app`] (the commands) → [`supervise`] (the child),
//! [`keeper`] (the lease) and [`backend`] (the lock servers). [`exit`] holds the exit-code table.

pub mod app;
pub mod backend;
pub mod bench;
pub mod cli;
pub mod clock;
pub mod config;
pub mod exit;
pub mod generate;
pub mod keeper;
pub mod lockset;
pub mod report;
pub mod signals;
pub mod supervise;
mod sys;
