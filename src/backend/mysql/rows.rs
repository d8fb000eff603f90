//! Statements and what they return, without trusting the server: rows are converted without
//! the driver's panicking conversions (`exec_first`, `from_row` abort on a value of another
//! type, such as bytes that are not UTF-8 where a `String` is asked for), records are read as
//! bytes, and errors are shown in words, not in the driver's `Debug`-like `Display`
//! (`MySqlError { … }`).
//!
//! Values in the SQL text are hex literals (`X'…'`: hex digits only, nothing to escape) or
//! numbers, or go as parameters of a prepared statement; never text as the user wrote it.

use mysql::prelude::Queryable;
use mysql::{Conn, Params};

use crate::model::Holder;
use crate::model::Record;
use crate::signals::HardStop;

/// Runs `sql` (possibly several statements) and returns the first column of the first row of
/// its result sets.
pub(super) fn last_value<T: mysql::prelude::FromValue>(
    con: &mut Conn,
    sql: &str,
) -> mysql::Result<Option<T>> {
    first_row(con, sql, |row| {
        row.get_opt::<T, usize>(0)
            .transpose()
            .map_err(|e| mysql::Error::FromValueError(e.0))
    })
    .map(Option::flatten)
}

/// Runs `sql` (possibly several statements) and returns the first row of the first result set
/// that has one.
pub(super) fn last_row<T: mysql::prelude::FromRow>(
    con: &mut Conn,
    sql: &str,
) -> mysql::Result<Option<T>> {
    first_row(con, sql, |row| {
        mysql::from_row_opt(row).map_err(|e| mysql::Error::FromRowError(e.0))
    })
}

/// The first row of `sql`'s result sets, converted; every later row is read and dropped (the
/// connection must be drained), within [`HARD_LIMIT`].
pub(super) fn first_row<T>(
    con: &mut Conn,
    sql: &str,
    convert: impl Fn(mysql::Row) -> mysql::Result<T>,
) -> mysql::Result<Option<T>> {
    let _stop = HardStop::arm(super::HARD_LIMIT, "mysql");
    let mut result = con.query_iter(sql)?;
    let mut value = None;
    while let Some(set) = result.iter() {
        for row in set {
            let row = row?;
            if value.is_none() {
                value = Some(convert(row)?);
            }
        }
    }
    Ok(value)
}

pub(super) fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Runs one prepared statement with `params` and returns its first row, converted without
/// panicking (`exec_first` panics on a value it cannot convert); later rows are read and
/// dropped, within [`super::HARD_LIMIT`].
pub(super) fn exec_row<T: mysql::prelude::FromRow>(
    con: &mut Conn,
    sql: &str,
    params: impl Into<Params>,
) -> mysql::Result<Option<T>> {
    let _stop = HardStop::arm(super::HARD_LIMIT, "mysql");
    let mut result = con.exec_iter(sql, params)?;
    let mut value = None;
    while let Some(set) = result.iter() {
        for row in set {
            let row = row?;
            if value.is_none() {
                value =
                    Some(mysql::from_row_opt(row).map_err(|e| mysql::Error::FromRowError(e.0))?);
            }
        }
    }
    Ok(value)
}

/// A holder record as dlock writes it: JSON in ASCII, every other character escaped
/// (`\uXXXX`), so that it fits a column of any character set — a latin1 `dlock_locks` (the
/// default of MariaDB before 11.6 and of MySQL 5.7) refused a key or command outside latin1.
pub(super) fn record_text(holder: &Record) -> serde_json::Result<String> {
    let json = serde_json::to_string(holder)?;
    let mut out = String::with_capacity(json.len());
    let mut units = [0u16; 2];
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            // Outside ASCII only inside strings, where an escape means the same character.
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    Ok(out)
}

/// A record read back as bytes (a column an administrator altered to a BLOB can hold any):
/// the holder, or `None` when it is not a record (shown as unreadable).
pub(super) fn parse_record(bytes: &[u8]) -> Option<Holder> {
    crate::backend::read_record(bytes)
}

/// A driver error in words: the server's message and code, the I/O error, and so on, without
/// the driver's wrapping (`MySqlError { ERROR … }`).
pub(super) fn err_text(e: &mysql::Error) -> String {
    use mysql::Error as E;
    match e {
        E::IoError(e) => io_text(e),
        // A read timeout surfaces as EAGAIN: a server that sent no MySQL greeting (another
        // service on the port) or went silent.
        E::CodecError(c) => {
            match std::error::Error::source(c).and_then(|s| s.downcast_ref::<std::io::Error>()) {
                Some(e) => io_text(e),
                None => format!("bad packet from the server: {c}"),
            }
        }
        E::MySqlError(e) => format!("{} (error {}, SQLSTATE {})", e.message, e.code, e.state),
        E::DriverError(e) => e.to_string(),
        E::UrlError(e) => format!("bad URL: {}", url_text(e)),
        E::TlsError(e) => format!("TLS: {e}"),
        E::FromRowError(_) | E::FromValueError(_) => {
            "the server's reply holds a value of an unexpected type".into()
        }
    }
}

/// An I/O error of the connection in words; a timeout (EAGAIN from a socket read timeout) says
/// that the server did not answer as MySQL does in time.
fn io_text(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            "no answer in time (is it a MySQL/MariaDB server, and is this its port?)".into()
        }
        _ => crate::report::io_words(e),
    }
}

/// A URL error in words (the driver's `Display` of a parse error is `URL ParseError { … }`).
pub(super) fn url_text(e: &mysql::UrlError) -> String {
    match e {
        mysql::UrlError::ParseError(p) => p.to_string(),
        e => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_ascii_and_read_back_whole() {
        let h = Record {
            key: Some("ключ🔒".into()),
            command: Some("echo déjà \"vu\"".into()),
            ..Record::default()
        };
        let text = record_text(&h).unwrap();
        assert!(text.is_ascii(), "{text}");
        let back = parse_record(text.as_bytes()).unwrap();
        assert_eq!(back.key, h.key);
        assert_eq!(back.command, h.command);
        assert!(parse_record(b"\xff{\"").is_none());
    }

    #[test]
    fn errors_are_words() {
        let e = mysql::Error::MySqlError(mysql::MySqlError {
            state: "22007".into(),
            code: 1366,
            message: "Incorrect string value".into(),
        });
        let t = err_text(&e);
        assert!(!t.contains("MySqlError"), "{t}");
        assert!(
            t.contains("Incorrect string value") && t.contains("1366"),
            "{t}"
        );
    }
}
