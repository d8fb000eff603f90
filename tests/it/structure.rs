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

/// `text` with comments, string and character literals blanked out (newlines kept, so lines
/// still count), for finding keywords in code only.
fn blank_non_code(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            let end = rest
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |n| i + n);
            blank(&mut out, i, end);
            i = end;
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut j) = (0usize, i);
            while j < b.len() {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if (rest.starts_with(b"r#") || rest.starts_with(b"r\""))
            && (i == 0 || !ident(b[i - 1]) || matches!(b[i - 1], b'b' | b'c'))
        {
            // A raw string: r"…", r#"…"#, … (after b or c too).
            let hashes = rest[1..].iter().take_while(|&&c| c == b'#').count();
            if rest.get(1 + hashes) != Some(&b'"') {
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let body = i + 2 + hashes;
            let end = b[body..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(b.len(), |n| body + n + close.len());
            blank(&mut out, i, end);
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if b[i] == b'\'' {
            // A character literal ('a', '\n', '\u{1F600}', '"'); else a lifetime or a label.
            let end = if rest.get(1) == Some(&b'\\') {
                rest[2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map(|n| i + 3 + n)
            } else {
                let len = std::str::from_utf8(&rest[1..rest.len().min(5)])
                    .or_else(|e| std::str::from_utf8(&rest[1..1 + e.valid_up_to()]))
                    .ok()
                    .and_then(|s| s.chars().next())
                    .map_or(1, char::len_utf8);
                (rest.get(1 + len) == Some(&b'\'')).then_some(i + 2 + len)
            };
            match end {
                Some(end) => {
                    blank(&mut out, i, end);
                    i = end;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// Where `unsafe` is written as code in `text` (a block, a fn, an impl, an extern block, an
/// attribute): 1-based line numbers, and whether a `{` follows (a block or an extern block).
fn unsafe_uses(text: &str) -> Vec<(usize, bool)> {
    let code = blank_non_code(text);
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    code.match_indices("unsafe")
        .filter(|(at, _)| {
            (*at == 0 || !ident(b[at - 1])) && b.get(at + 6).is_none_or(|&c| !ident(c))
        })
        .map(|(at, _)| {
            let line = code[..at].matches('\n').count() + 1;
            let block = code[at + 6..].trim_start().starts_with('{');
            (line, block)
        })
        .collect()
}

/// The unsafe blocks of `text` without a `// SAFETY:` comment right above them (the comment
/// lines just above the block's line, or on that line before it): their line numbers.
fn undocumented_unsafe_blocks(text: &str) -> Vec<usize> {
    let lines: Vec<&str> = text.lines().collect();
    unsafe_uses(text)
        .into_iter()
        .filter(|&(_, block)| block)
        .map(|(line, _)| line)
        .filter(|&line| {
            let here = lines[line - 1];
            if here.split("unsafe").next().unwrap().contains("// SAFETY:") {
                return false;
            }
            !lines[..line - 1]
                .iter()
                .rev()
                .map(|l| l.trim())
                .take_while(|l| l.starts_with("//"))
                .any(|l| l.starts_with("// SAFETY:"))
        })
        .collect()
}

/// `unsafe` is written only in src/sys/ (the one exception: the binary's entry point, which
/// must be the binary's own symbol — in the library it would clash with every test harness's
/// `main` — is `#[unsafe(no_mangle)]` in src/main.rs), and every unsafe block there has its
/// `// SAFETY:` argument right above it.
#[test]
fn unsafe_only_in_sys_and_every_block_argued() {
    let sys = src().join("sys");
    let mut outside = Vec::new();
    let mut unargued = Vec::new();
    for p in files(&src()) {
        let text = std::fs::read_to_string(&p).unwrap();
        if p.starts_with(&sys) {
            for line in undocumented_unsafe_blocks(&text) {
                unargued.push(format!("{}:{line}", p.display()));
            }
            continue;
        }
        for (line, _) in unsafe_uses(&text) {
            let entry_point = p == src().join("main.rs")
                && text.lines().nth(line - 1).unwrap().trim() == "#[unsafe(no_mangle)]";
            if !entry_point {
                outside.push(format!("{}:{line}", p.display()));
            }
        }
    }
    assert!(outside.is_empty(), "unsafe outside src/sys/: {outside:?}");
    assert!(
        unargued.is_empty(),
        "unsafe blocks without a SAFETY comment: {unargued:?}"
    );
}

/// The checks above see code, not comments or strings, and catch each kind of `unsafe`.
#[test]
fn the_unsafe_check_sees_code_only() {
    let quiet = "// unsafe { x }\n/* unsafe /* nested */ unsafe */ let s = \"unsafe {\";\n\
                 let r = r#\"unsafe \" { \"#; let c = '\"'; let l: &'a str = \"x\"; fn unsafe_ok() {}\n\
                 let q = b\"unsafe\"; let e = '\\''; // unsafe";
    assert_eq!(unsafe_uses(quiet), vec![]);
    let loud = "fn f() {\n    unsafe { g() }\n}\nunsafe fn h() {}\nunsafe impl Send for X {}\n\
                unsafe extern \"C\" {}\n#[unsafe(no_mangle)]\n";
    assert_eq!(
        unsafe_uses(loud),
        vec![(2, true), (4, false), (5, false), (6, false), (7, false)]
    );
    let argued = "    // SAFETY: why.\n    // more\n    let x = unsafe { y };\n\
                  let z = unsafe { w };\n    // SAFETY: b\n\n    unsafe { v }\n";
    assert_eq!(undocumented_unsafe_blocks(argued), vec![4, 7]);
}

/// The types a file of src/ defines at its top level (code before its unit tests): name, and
/// whether it is seen crate-wide (`pub` or `pub(crate)`).
fn types_defined(text: &str) -> Vec<(String, bool)> {
    let code = blank_non_code(text.split("#[cfg(test)]").next().unwrap());
    code.lines()
        .filter_map(|l| {
            let (wide, rest) = if let Some(r) = l.strip_prefix("pub(crate) ") {
                (true, r)
            } else if let Some(r) = l.strip_prefix("pub ") {
                (true, r)
            } else if l.starts_with("pub(") {
                (false, l.split_once(") ")?.1)
            } else {
                (false, l)
            };
            let rest = rest.strip_prefix("unsafe ").unwrap_or(rest);
            let (kind, rest) = rest.split_once(' ')?;
            ["struct", "enum", "trait", "type", "union"]
                .contains(&kind)
                .then(|| {
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    (name, wide)
                })
        })
        .collect()
}

/// A type seen crate-wide is defined once in src/ (a reader meeting the name knows which),
/// and the names that meant two things before (issue 42) at most once at any visibility.
#[test]
fn crate_wide_type_names_are_defined_once() {
    let mut wide: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut any: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in files(&src()) {
        let text = std::fs::read_to_string(&p).unwrap();
        let at = p.strip_prefix(src()).unwrap().display().to_string();
        for (name, is_wide) in types_defined(&text) {
            if is_wide {
                wide.entry(name.clone()).or_default().push(at.clone());
            }
            any.entry(name).or_default().push(at.clone());
        }
    }
    let twice: Vec<String> = wide
        .iter()
        .filter(|(_, at)| at.len() > 1)
        .chain(any.iter().filter(|(n, at)| {
            ["Closing", "Ending", "Owner", "Stopping"].contains(&n.as_str()) && at.len() > 1
        }))
        .map(|(n, at)| format!("{n}: {at:?}"))
        .collect();
    assert!(twice.is_empty(), "defined twice: {twice:?}");
    assert!(wide.len() > 50, "{}", wide.len());
}
