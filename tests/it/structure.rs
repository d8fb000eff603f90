//! The shape of the code, checked (docs/design.md, "Module map"): the top-level modules of src/
//! form layers without circles, and no source or test file passes 700 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every .rs file under `dir`.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// A file's code: its unit tests (from `#[cfg(test)]` on) and `//` comments left out.
fn code(p: &Path) -> String {
    let text = std::fs::read_to_string(p).unwrap();
    let text = text.split("#[cfg(test)]").next().unwrap();
    text.lines()
        .map(|l| l.split("//").next().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level module a file of src/ belongs to (a file in src/ or a folder below it).
fn module_of(p: &Path) -> String {
    let rel = p.strip_prefix(src()).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_str()
        .unwrap();
    first.trim_end_matches(".rs").to_string()
}

/// Which top-level modules each one names (`crate::NAME`).
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let all = files(&src());
    let modules: BTreeSet<String> = all.iter().map(|p| module_of(p)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in &all {
        let from = module_of(p);
        if from == "lib" || from == "main" {
            continue;
        }
        let code = code(p);
        for (at, _) in code.match_indices("crate::") {
            let name: String = code[at + 7..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if name != from && modules.contains(&name) {
                edges.entry(from.clone()).or_default().insert(name);
            }
        }
        edges.entry(from).or_default();
    }
    edges
}

#[test]
fn the_top_level_modules_form_layers_without_circles() {
    let edges = imports();
    // Peel off the modules that import no module left, layer by layer.
    let mut left = edges.clone();
    let mut layers = Vec::new();
    while !left.is_empty() {
        let bottom: Vec<String> = left
            .iter()
            .filter(|(_, to)| to.iter().all(|t| !left.contains_key(t)))
            .map(|(m, _)| m.clone())
            .collect();
        assert!(
            !bottom.is_empty(),
            "an import circle among {:?}",
            left.iter()
                .map(|(m, to)| format!(
                    "{m} -> {:?}",
                    to.iter()
                        .filter(|t| left.contains_key(*t))
                        .collect::<Vec<_>>()
                ))
                .collect::<Vec<_>>()
        );
        for m in &bottom {
            left.remove(m);
        }
        layers.push(bottom);
    }
    assert!(layers.len() > 3, "{layers:?}");
}

#[test]
fn no_file_passes_700_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let long: Vec<String> = files(&src())
        .into_iter()
        .chain(files(&root.join("tests")))
        .filter_map(|p| {
            let n = std::fs::read_to_string(&p).unwrap().lines().count();
            (n > 700).then(|| format!("{} ({n})", p.display()))
        })
        .collect();
    assert!(long.is_empty(), "{long:?}");
}
