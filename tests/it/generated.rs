//! completions/ and man/ are generated from the clap definitions and checked in; this fails when
//! they are stale, and rewrites them when asked to.

use std::path::Path;

#[test]
fn completions_and_man_pages_are_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let update = std::env::var_os("DLOCK_UPDATE_GENERATED").is_some();
    let mut stale = Vec::new();
    for (path, contents) in dlock_cli::internals::all_files() {
        let file = root.join(&path);
        if std::fs::read(&file).ok().as_deref() == Some(&contents[..]) {
            continue;
        }
        if update {
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, &contents).unwrap();
        } else {
            stale.push(path);
        }
    }
    assert!(
        stale.is_empty(),
        "stale generated files: {stale:?}\nregenerate with: DLOCK_UPDATE_GENERATED=1 cargo test --test it generated"
    );
}

#[test]
fn completions_subcommand_prints_the_checked_in_script() {
    let out = crate::util::run_ok(crate::util::dlock().args(["completions", "bash"]));
    let checked_in =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("completions/dlock.bash"))
            .unwrap();
    assert_eq!(out.stdout, checked_in);
}

#[test]
fn main_man_page_has_the_required_sections() {
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("man/dlock.1")).unwrap();
    for section in ["EXIT STATUS", "ENVIRONMENT", "EXAMPLES", "SUBCOMMANDS"] {
        assert!(page.contains(section), "man/dlock.1 lacks {section}");
    }
    for sub in ["run", "status", "break", "completions"] {
        assert!(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("man/dlock-{sub}.1"))
                .exists()
        );
    }
}

/// What the checked-in bash completion offers for `words` (the last one being completed), in a
/// directory holding one file `zz-a-file`: bash sources the script and calls `_dlock` as
/// `complete -F` would, without bash-completion loaded.
fn bash_completes(words: &[&str]) -> Vec<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("completions/dlock.bash");
    let dir = crate::util::scratch("bash-completion");
    std::fs::write(dir.join("zz-a-file"), "").unwrap();
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let cword = words.len() - 1;
    let prev = if cword > 0 { words[cword - 1] } else { "" };
    let call = format!(
        "source '{}'; COMP_WORDS=({}); COMP_CWORD={cword}; _dlock dlock '{}' '{prev}'; \
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        quoted.join(" "),
        words[cword],
    );
    let out = std::process::Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &call])
        .current_dir(&dir)
        .env("PATH", "/usr/bin:/bin")
        .output()
        .expect("bash runs");
    assert!(out.status.success(), "{}", crate::util::describe(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// After `--`, bash completes a command and then files, never dlock's own flags (it offered
/// `--ttl` and the rest); a key after `-k` is not a file name.
#[test]
fn bash_completes_commands_after_double_dash_and_no_files_for_a_key() {
    let got = bash_completes(&["dlock", "run", "-k", "x", "--", "ech"]);
    assert!(got.iter().any(|w| w == "echo"), "{got:?}");
    assert!(got.iter().all(|w| w.starts_with("ech")), "{got:?}");
    let got = bash_completes(&["dlock", "run", "-k", "x", "--", "echo", ""]);
    assert_eq!(got, ["zz-a-file"], "the command's arguments are files");
    let got = bash_completes(&["dlock", "run", "-k", "x", "--", "echo", "--"]);
    assert!(!got.iter().any(|w| w == "--ttl"), "{got:?}");
    for opt in ["-k", "--key"] {
        for sub in ["run", "status", "log", "break"] {
            let got = bash_completes(&["dlock", sub, opt, ""]);
            assert!(
                !got.iter().any(|w| w.contains("zz-a-file")),
                "{sub} {opt}: {got:?}"
            );
        }
    }
    // Before `--`, dlock's flags are still offered.
    let got = bash_completes(&["dlock", "run", "--tt"]);
    assert_eq!(got, ["--ttl"]);
}
