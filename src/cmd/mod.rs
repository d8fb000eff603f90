//! One module per subcommand that app.rs dispatches to (the others still live in app.rs).

pub(crate) mod break_lock;
