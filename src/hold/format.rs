//! How `dlock acquire` prints what its caller needs — the handle and the `DLOCK_*` variables —
//! for each place it is used: a POSIX shell's `eval`, JSON, GitHub Actions' `$GITHUB_ENV` file
//! and systemd's `EnvironmentFile=`. Values are the caller's keys and dlock's own numbers; each
//! format quotes them so that no key can break out of its value.

use serde::{Deserialize, Serialize};

use crate::cli::Format;

/// What the holder tells `dlock acquire` once the lock is held.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Granted {
    /// The handle `dlock release` takes.
    pub handle: String,
    /// The holder process.
    pub holder_pid: u32,
    /// The backend's name.
    pub backend: String,
    /// The keys, as given.
    pub keys: Vec<String>,
    /// Each key's fencing token, where the backend has one.
    pub tokens: Vec<Option<u64>>,
    /// The variables to set, in order.
    pub vars: Vec<(String, String)>,
}

/// `granted` in `format`, ending in a newline.
pub(crate) fn render(granted: &Granted, format: Format) -> String {
    let vars = &granted.vars;
    match format {
        Format::Sh => vars
            .iter()
            .map(|(k, v)| format!("export {k}={}\n", sh_quote(v)))
            .collect(),
        Format::Env => vars
            .iter()
            .map(|(k, v)| format!("{k}={}\n", double_quote(v)))
            .collect(),
        Format::Github => vars.iter().map(|(k, v)| github_line(k, v)).collect(),
        Format::Json => {
            let env: serde_json::Map<String, serde_json::Value> = vars
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect();
            let value = serde_json::json!({
                "handle": granted.handle,
                "holder_pid": granted.holder_pid,
                "backend": granted.backend,
                "keys": granted.keys,
                "fencing_tokens": granted.tokens,
                "env": env,
            });
            value.to_string() + "\n"
        }
    }
}

/// `'text'` for a POSIX shell: nothing inside single quotes is special but the quote itself.
fn sh_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// `"text"` with `\`, `"`, `$` and `` ` `` escaped: read alike by systemd's environment files
/// and by a POSIX shell's `.`.
fn double_quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        if matches!(c, '\\' | '"' | '$' | '`') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// One `$GITHUB_ENV` entry: `NAME=value`, or for a value of several lines the heredoc form
/// with a delimiter that no line of the value equals.
fn github_line(name: &str, value: &str) -> String {
    if !value.contains(['\n', '\r']) {
        return format!("{name}={value}\n");
    }
    let mut delimiter = String::from("DLOCK_EOF");
    while value.lines().any(|l| l == delimiter) {
        delimiter.push('_');
    }
    format!("{name}<<{delimiter}\n{value}\n{delimiter}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(vars: &[(&str, &str)]) -> Granted {
        Granted {
            handle: "/tmp/h".into(),
            holder_pid: 7,
            backend: "file".into(),
            keys: vec!["k".into()],
            tokens: vec![Some(3)],
            vars: vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn shell_quoting_keeps_quotes_and_dollars_literal() {
        let g = granted(&[("DLOCK_KEY", "it's $HOME `x`")]);
        assert_eq!(
            render(&g, Format::Sh),
            "export DLOCK_KEY='it'\\''s $HOME `x`'\n"
        );
        assert_eq!(
            render(&g, Format::Env),
            "DLOCK_KEY=\"it's \\$HOME \\`x\\`\"\n"
        );
    }

    #[test]
    fn github_uses_a_delimiter_no_line_equals() {
        let g = granted(&[("DLOCK_KEYS", "a\nDLOCK_EOF"), ("DLOCK_KEY", "a")]);
        assert_eq!(
            render(&g, Format::Github),
            "DLOCK_KEYS<<DLOCK_EOF_\na\nDLOCK_EOF\nDLOCK_EOF_\nDLOCK_KEY=a\n"
        );
    }

    #[test]
    fn json_has_the_handle_and_the_variables() {
        let g = granted(&[("DLOCK_KEY", "k")]);
        let v: serde_json::Value = serde_json::from_str(&render(&g, Format::Json)).unwrap();
        assert_eq!(v["handle"], "/tmp/h");
        assert_eq!(v["env"]["DLOCK_KEY"], "k");
        assert_eq!(v["fencing_tokens"][0], 3);
    }
}
