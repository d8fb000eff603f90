//! One module per subcommand that app.rs dispatches to.

pub(crate) mod break_lock;
pub(crate) mod check;
pub(crate) mod log;
pub(crate) mod metrics;
pub(crate) mod run;
pub(crate) mod status;
