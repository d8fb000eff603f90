//! AWS Signature Version 4 for S3 requests, over `hmac` and `sha2` (already in dlock's tree).
//!
//! Why not `rusty-s3` (which only signs, and would be the smallest kept crate): measured with
//! `cargo add rusty-s3@0.10` (0.11 needs Rust 1.89; dlock's floor is 1.88), it brings sha2 0.10
//! and digest 0.10 beside the 0.11 dlock uses (deny.toml refuses duplicate majors), plus
//! jiff, instant-xml with its proc-macro, xmlparser and md-5: 9 crates for ~100 lines here,
//! checked against AWS's documented example below.

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

/// An access key (`AWS_ACCESS_KEY_ID` and its secret), with a session token for temporary
/// credentials. Its `Debug` shows the key id only: the secret and token are never printed.
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) key_id: String,
    pub(crate) secret: String,
    pub(crate) token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, secret hidden)", self.key_id)
    }
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex SHA-256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hmac(key: &[u8], data: &str) -> Vec<u8> {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    m.update(data.as_bytes());
    m.finalize().into_bytes().to_vec()
}

/// URI-encodes `s` as SigV4 wants: every byte but `A-Za-z0-9-._~` as `%XX`, and `/` too
/// unless `keep_slash` (an object path).
pub(crate) fn uri_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One request to sign.
pub(crate) struct Signing<'a> {
    pub(crate) method: &'a str,
    /// The path, already URI-encoded.
    pub(crate) path: &'a str,
    /// Query parameters, not encoded.
    pub(crate) query: &'a [(&'a str, String)],
    /// Headers signed beside host and the x-amz- ones (lowercase names).
    pub(crate) headers: &'a [(&'a str, String)],
    pub(crate) host: &'a str,
    pub(crate) region: &'a str,
    /// `YYYYMMDDTHHMMSSZ`.
    pub(crate) amz_date: &'a str,
    pub(crate) payload_sha256: &'a str,
}

/// The query string, encoded and sorted as signed.
pub(crate) fn canonical_query(query: &[(&str, String)]) -> String {
    let mut q: Vec<(String, String)> = query
        .iter()
        .map(|(k, v)| (uri_encode(k, false), uri_encode(v, false)))
        .collect();
    q.sort();
    q.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// The headers to send: `x-amz-date`, `x-amz-content-sha256`, the token's, and
/// `Authorization`.
pub(crate) fn sign(req: &Signing<'_>, creds: &Credentials) -> Vec<(String, String)> {
    let mut headers: Vec<(String, String)> = vec![
        ("host".into(), req.host.to_string()),
        (
            "x-amz-content-sha256".into(),
            req.payload_sha256.to_string(),
        ),
        ("x-amz-date".into(), req.amz_date.to_string()),
    ];
    if let Some(t) = &creds.token {
        headers.push(("x-amz-security-token".into(), t.clone()));
    }
    headers.extend(
        req.headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.trim().to_string())),
    );
    headers.sort();
    let signed: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
    let signed = signed.join(";");
    let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let canonical = format!(
        "{}\n{}\n{}\n{canonical_headers}\n{signed}\n{}",
        req.method,
        req.path,
        canonical_query(req.query),
        req.payload_sha256
    );
    let date = &req.amz_date[..req.amz_date.len().min(8)];
    let scope = format!("{date}/{}/s3/aws4_request", req.region);
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{}\n{scope}\n{}",
        req.amz_date,
        sha256_hex(canonical.as_bytes())
    );
    let k = hmac(format!("AWS4{}", creds.secret).as_bytes(), date);
    let k = hmac(&k, req.region);
    let k = hmac(&k, "s3");
    let k = hmac(&k, "aws4_request");
    let signature = hex(&hmac(&k, &to_sign));
    let mut out: Vec<(String, String)> = headers
        .into_iter()
        .filter(|(k, _)| k.starts_with("x-amz-"))
        .collect();
    out.push((
        "authorization".into(),
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
            creds.key_id
        ),
    ));
    out
}

/// `now` as SigV4's `YYYYMMDDTHHMMSSZ`.
pub(crate) fn amz_date(now: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(now)
        .to_string()
        .replace(['-', ':'], "")
}

/// An HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`) in seconds since the epoch; `None` for
/// anything else.
pub(crate) fn http_date(text: &str) -> Option<u64> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let mut w = text.split_ascii_whitespace().skip(1);
    let (day, month, year, time, zone) = (w.next()?, w.next()?, w.next()?, w.next()?, w.next()?);
    if zone != "GMT" || w.next().is_some() {
        return None;
    }
    let month = MONTHS.iter().position(|m| *m == month)? + 1;
    let day: u8 = day.parse().ok()?;
    let year: u16 = year.parse().ok()?;
    let iso = format!("{year:04}-{month:02}-{day:02}T{time}Z");
    humantime::parse_rfc3339(&iso)
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's documented example ("GET Object", Signature Version 4 for S3: example
    /// calculations): the signature must be the one the documentation prints.
    #[test]
    fn signs_as_aws_documents() {
        let creds = Credentials {
            key_id: "AKIAIOSFODNN7EXAMPLE".into(),
            secret: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
            token: None,
        };
        let empty = sha256_hex(b"");
        let headers = sign(
            &Signing {
                method: "GET",
                path: "/test.txt",
                query: &[],
                headers: &[("range", "bytes=0-9".into())],
                host: "examplebucket.s3.amazonaws.com",
                region: "us-east-1",
                amz_date: "20130524T000000Z",
                payload_sha256: &empty,
            },
            &creds,
        );
        let auth = &headers
            .iter()
            .find(|(k, _)| k == "authorization")
            .unwrap()
            .1;
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
        assert!(!format!("{creds:?}").contains("EXAMPLEKEY"));
    }

    #[test]
    fn dates_read_and_write() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(784111777);
        assert_eq!(amz_date(t), "19941106T084937Z");
        assert_eq!(http_date("Sun, 06 Nov 1994 08:49:37 GMT"), Some(784111777));
        assert_eq!(http_date("Sun, 06 Nov 1994 08:49:37 PST"), None);
        assert_eq!(http_date("Sun, 99 Nov 1994 08:49:37 GMT"), None);
        assert_eq!(http_date(""), None);
    }
}
