//! Shell completions and man pages, generated from the clap definitions in [`crate::cli`]. The
//! checked-in copies under `completions/` and `man/` are compared with these by a test.

use clap::CommandFactory;
use clap_complete::{Generator, Shell};
use roff::{Roff, bold, roman};

use crate::cli::{self, Cli};

/// Every shell dlock ships a completion script for.
pub(crate) const SHELLS: [Shell; 5] = [
    Shell::Bash,
    Shell::Zsh,
    Shell::Fish,
    Shell::Elvish,
    Shell::PowerShell,
];

/// The completion script for `shell`.
pub(crate) fn completion(shell: Shell) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "dlock", &mut out);
    if shell == Shell::Bash {
        out = bash_after_double_dash(out);
    }
    out
}

/// What bash completes after `dlock run … --`: a command, then that command's own arguments
/// (bash-completion's `_command_offset`, as `sudo` and `nohup` do; without it, file names).
/// clap_complete's bash script ignores `ValueHint::CommandWithArguments` and offered dlock's
/// own flags there. Inserted before the script's dispatch on the subcommand.
const BASH_AFTER_DOUBLE_DASH: &str = r#"    # After `--` of `dlock run`: a command and its arguments (added by dlock's generate.rs).
    if [[ "${cmd}" == "dlock__subcmd__run" ]]; then
        local j
        for (( j = 2; j < COMP_CWORD; j++ )); do
            if [[ "${COMP_WORDS[j]}" == "--" ]]; then
                if declare -F _command_offset >/dev/null; then
                    _command_offset $(( j + 1 ))
                elif (( COMP_CWORD == j + 1 )); then
                    COMPREPLY=( $(compgen -c -- "${cur}") )
                else
                    COMPREPLY=( $(compgen -f -- "${cur}") )
                fi
                return 0
            fi
        done
    fi

"#;

fn bash_after_double_dash(script: Vec<u8>) -> Vec<u8> {
    let text = String::from_utf8(script).expect("clap_complete writes UTF-8");
    let dispatch = "    case \"${cmd}\" in\n";
    let at = text
        .find(dispatch)
        .expect("clap_complete's bash script dispatches on ${cmd}");
    let mut out = text[..at].to_string();
    out.push_str(BASH_AFTER_DOUBLE_DASH);
    out.push_str(&text[at..]);
    out.into_bytes()
}

/// Every generated file, as (path relative to the repository root, contents).
pub fn all_files() -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = SHELLS
        .iter()
        .map(|&s| {
            (
                format!("completions/{}", s.file_name("dlock")),
                completion(s),
            )
        })
        .collect();
    files.extend(
        man_pages()
            .into_iter()
            .map(|(name, page)| (format!("man/{name}"), page)),
    );
    files
}

/// One man page per (sub)command: `dlock.1`, `dlock-run.1`, ... The main page, `run`, `acquire`
/// and `release` carry EXIT STATUS; the main page also ENVIRONMENT and EXAMPLES.
pub(crate) fn man_pages() -> Vec<(String, Vec<u8>)> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut pages = vec![page(&cmd, true)];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        pages.push(page(sub, false));
    }
    pages
}

fn page(cmd: &clap::Command, main: bool) -> (String, Vec<u8>) {
    // The sections below replace clap's "EXTRA" rendering of after_long_help.
    let cmd = cmd.clone();
    let man = clap_mangen::Man::new(cmd.clone());
    let mut out = Vec::new();
    let render = |out: &mut Vec<u8>| -> std::io::Result<()> {
        man.render_title(out)?;
        man.render_name_section(out)?;
        man.render_synopsis_section(out)?;
        man.render_description_section(out)?;
        if cmd.get_arguments().any(|a| !a.is_hide_set()) {
            man.render_options_section(out)?;
        }
        if cmd.has_subcommands() {
            man.render_subcommands_section(out)?;
        }
        let mut roff = Roff::new();
        match cmd.get_name() {
            "acquire" => section(&mut roff, "EXIT STATUS", cli::ACQUIRE_EXIT_STATUS),
            "release" => section(&mut roff, "EXIT STATUS", cli::RELEASE_EXIT_STATUS),
            "run" => section(&mut roff, "EXIT STATUS", cli::EXIT_STATUS),
            "doctor" => section(&mut roff, "EXIT STATUS", cli::DOCTOR_EXIT_STATUS),
            "check" => section(&mut roff, "EXIT STATUS", cli::CHECK_EXIT_STATUS),
            _ if main => section(&mut roff, "EXIT STATUS", cli::EXIT_STATUS),
            _ => {}
        }
        if main {
            section(&mut roff, "ENVIRONMENT", &cli::environment());
            section(&mut roff, "EXAMPLES", cli::EXAMPLES);
        }
        roff.to_writer(out)?;
        man.render_version_section(out)
    };
    render(&mut out).expect("writing to a Vec cannot fail");
    (man.get_filename(), out)
}

fn section<A: AsRef<str>, B: AsRef<str>>(roff: &mut Roff, title: &str, rows: &[(A, B)]) {
    roff.control("SH", [title]);
    for (term, text) in rows {
        roff.control("TP", []);
        roff.text([bold(term.as_ref())]);
        roff.text([roman(text.as_ref())]);
    }
}
