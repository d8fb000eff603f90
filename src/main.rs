//! The `dlock` binary: see the library's [`dlock_cli::app`].

fn main() -> std::process::ExitCode {
    dlock_cli::app::main()
}
