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
