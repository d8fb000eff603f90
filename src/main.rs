//! The `dlock` binary: see [`dlock_cli::main`].

fn main() -> std::process::ExitCode {
    dlock_cli::main()
}
