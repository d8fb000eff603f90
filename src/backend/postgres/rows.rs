//! Statements and what they return, without trusting the server: values go as bind parameters
//! (the extended protocol, one round trip: `query_typed`), never into the SQL text, and every
//! cell is read without a panicking conversion — a cell that is not what its type says (text
//! that is not UTF-8, a number of the wrong size) reads as [`UNREADABLE`]. How many rows and
//! bytes one statement may return is bounded below, in `stream::Checked`.

use std::time::Duration;

use tokio_postgres::types::{FromSql, ToSql, Type};
use tokio_postgres::{Client, Row, SimpleQueryMessage};

use super::PgBackend;

/// Rows of text cells (NULL: `None`).
pub(super) type Rows = Vec<Vec<Option<String>>>;

/// What a cell that cannot be decoded reads as: neither a number nor JSON, so it parses as
/// nothing and a record holding it shows as unreadable.
pub(super) const UNREADABLE: &str = "\u{fffd}";

/// The largest holder record read back whole; a larger one (only a user with write access to
/// `dlock_holders` can make one) reads as unreadable. The SQL applies it (`capped`), so a
/// forged record of megabytes never crosses the wire.
pub(super) const MAX_RECORD: i64 = 64 << 10;

/// SQL: column `col` (a holder record), or '' when it is over [`MAX_RECORD`] bytes.
pub(super) fn capped(col: &str) -> String {
    format!("CASE WHEN octet_length({col}) <= {MAX_RECORD} THEN {col} ELSE '' END")
}

impl PgBackend {
    /// Runs `sql` (one or more statements, text protocol, no values in it but numbers) within
    /// `limit`; returns the rows of every statement, as text.
    pub(super) async fn simple(
        &self,
        client: &Client,
        sql: &str,
        limit: Duration,
        doing: &str,
    ) -> anyhow::Result<Rows> {
        match tokio::time::timeout(limit, client.simple_query(sql)).await {
            Ok(Ok(messages)) => Ok(simple_rows(messages)),
            Ok(Err(e)) => Err(self.fail(doing, e)),
            Err(_) => Err(self.reach.transport_error(format!(
                "{}: cannot {doing}: no answer within {limit:?}",
                self.addr()
            ))),
        }
    }

    /// Runs one statement with `params` bound to `$1`, `$2`, … (extended protocol, in one round
    /// trip) within `limit`; returns its rows as text.
    pub(super) async fn typed(
        &self,
        client: &Client,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        limit: Duration,
        doing: &str,
    ) -> anyhow::Result<Rows> {
        match tokio::time::timeout(limit, client.query_typed(sql, params)).await {
            Ok(Ok(rows)) => Ok(rows.iter().map(typed_row).collect()),
            Ok(Err(e)) => Err(self.fail(doing, e)),
            Err(_) => Err(self.reach.transport_error(format!(
                "{}: cannot {doing}: no answer within {limit:?}",
                self.addr()
            ))),
        }
    }
}

/// The rows of a simple query's result sets, as text cells.
pub(super) fn simple_rows(messages: Vec<SimpleQueryMessage>) -> Rows {
    messages
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(
                (0..r.len())
                    .map(|i| match r.try_get(i) {
                        Ok(c) => c.map(str::to_string),
                        Err(_) => Some(UNREADABLE.to_string()),
                    })
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

/// A cell's bytes as the server sent them (binary format), whatever its type.
struct Raw<'a>(Option<&'a [u8]>);

impl<'a> FromSql<'a> for Raw<'a> {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Raw(Some(raw)))
    }

    fn from_sql_null(_: &Type) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Raw(None))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// A row of the extended protocol (binary cells) as text cells, as the simple protocol shows
/// them: numbers in decimal, booleans as `t`/`f`.
pub(super) fn typed_row(row: &Row) -> Vec<Option<String>> {
    (0..row.len())
        .map(|i| {
            let ty = row.columns()[i].type_();
            match row.try_get::<_, Raw<'_>>(i) {
                Ok(Raw(None)) => None,
                Ok(Raw(Some(b))) => Some(text(ty, b).unwrap_or_else(|| UNREADABLE.to_string())),
                Err(_) => Some(UNREADABLE.to_string()),
            }
        })
        .collect()
}

/// A binary cell of type `ty` as text, if it is what the type says.
fn text(ty: &Type, b: &[u8]) -> Option<String> {
    Some(match *ty {
        Type::INT8 => i64::from_be_bytes(b.try_into().ok()?).to_string(),
        Type::INT4 => i32::from_be_bytes(b.try_into().ok()?).to_string(),
        Type::INT2 => i16::from_be_bytes(b.try_into().ok()?).to_string(),
        Type::BOOL => match b {
            [0] => "f".into(),
            [_] => "t".into(),
            _ => return None,
        },
        Type::TEXT | Type::VARCHAR | Type::NAME | Type::JSON | Type::UNKNOWN => {
            std::str::from_utf8(b).ok()?.to_string()
        }
        _ => return None,
    })
}

/// Cell `i` of `row`, if present and not NULL.
pub(super) fn cell(row: &[Option<String>], i: usize) -> Option<&str> {
    row.get(i).and_then(|c| c.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_cells_are_checked() {
        assert_eq!(text(&Type::INT8, &7i64.to_be_bytes()).as_deref(), Some("7"));
        assert_eq!(text(&Type::INT8, &[1, 2, 3]), None);
        assert_eq!(text(&Type::BOOL, &[1]).as_deref(), Some("t"));
        assert_eq!(text(&Type::TEXT, b"\xff\xfe"), None);
        assert_eq!(
            text(&Type::TEXT, "ключ".as_bytes()).as_deref(),
            Some("ключ")
        );
        assert_eq!(text(&Type::BYTEA, b"x"), None);
    }
}
