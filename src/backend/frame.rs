//! HTTP/1.1 framing of replies (etcd's JSON gateway, S3): the head, a body by `Content-Length`
//! or chunks, and a buffered connection ([`Conn`]) to read them from.
//! Every number the server sends is parsed strictly (digits only, checked arithmetic) and
//! bounded by [`MAX_REPLY`]; a malformed frame is an error, never a panic or a wrong body.

use std::io::{self, Read};
use std::time::Instant;

use crate::backend::net::Stream;

use serde_json::Value;

/// The most one reply (or one watch message) may take: a status of a long queue of holder
/// records stays well under it.
pub(crate) const MAX_REPLY: usize = 4 << 20;

/// Bytes to read from: a connection's buffer.
pub(crate) trait Source {
    /// Buffered bytes, reading more when there are none; empty at the end of the stream.
    fn available(&mut self) -> io::Result<&[u8]>;
    /// Takes `n` of the bytes [`Source::available`] gave.
    fn consume(&mut self, n: usize);

    /// Reads exactly `out.len()` bytes.
    fn fill(&mut self, mut out: &mut [u8]) -> io::Result<()> {
        while !out.is_empty() {
            let got = self.available()?;
            if got.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection mid-reply",
                ));
            }
            let n = got.len().min(out.len());
            out[..n].copy_from_slice(&got[..n]);
            out = &mut out[n..];
            self.consume(n);
        }
        Ok(())
    }

    /// Reads one line (up to LF, CR dropped) of at most 8 KiB.
    fn read_line(&mut self) -> io::Result<Vec<u8>> {
        let mut line = Vec::new();
        loop {
            let got = self.available()?;
            if got.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                ));
            }
            let (take, done) = match got.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (got.len(), false),
            };
            line.extend_from_slice(&got[..take]);
            self.consume(take);
            if line.len() > 8 << 10 {
                return Err(io::Error::other("an HTTP header line over 8 KiB"));
            }
            if done {
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(line);
            }
        }
    }
}

pub(crate) struct Head {
    pub(crate) status: u16,
    pub(crate) length: Option<usize>,
    pub(crate) chunked: bool,
    /// Every header line, name lowercased (at most 100 lines of at most 8 KiB each).
    pub(crate) fields: Vec<(String, String)>,
}

impl Head {
    /// The value of the header `name` (lowercase), if sent.
    pub(crate) fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A decimal `Content-Length`: digits only, at most [`MAX_REPLY`].
fn content_length(value: &[u8]) -> io::Result<usize> {
    let bad = || io::Error::other("a bad Content-Length");
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    let mut n: usize = 0;
    for &d in value {
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(usize::from(d - b'0')))
            .filter(|&n| n <= MAX_REPLY)
            .ok_or_else(|| io::Error::other("a reply larger than a lock's"))?;
    }
    Ok(n)
}

/// The size of a chunk from its size line (`HEX[;extensions]`): hex digits only, checked,
/// at most [`MAX_REPLY`]; extensions of visible ASCII, spaces and tabs only.
pub(crate) fn chunk_size(line: &[u8]) -> io::Result<usize> {
    let bad = || io::Error::other("bad chunk size");
    let (digits, ext) = match line.iter().position(|&b| b == b';') {
        Some(i) => (&line[..i], &line[i + 1..]),
        None => (line, &[][..]),
    };
    if !ext
        .iter()
        .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b))
    {
        return Err(bad());
    }
    let digits = digits.trim_ascii_end();
    if digits.is_empty() {
        return Err(bad());
    }
    let mut n: usize = 0;
    for &d in digits {
        let v = char::from(d).to_digit(16).ok_or_else(bad)?;
        n = n
            .checked_mul(16)
            .and_then(|n| n.checked_add(v as usize))
            .filter(|&n| n <= MAX_REPLY)
            .ok_or_else(|| io::Error::other("a chunk larger than a lock's reply"))?;
    }
    Ok(n)
}

pub(crate) fn read_head(con: &mut impl Source) -> io::Result<Head> {
    let status_line = String::from_utf8_lossy(&con.read_line()?).into_owned();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            io::Error::other(format!(
                "not an HTTP reply: '{}' (is this the server's client port?)",
                crate::report::clean(&status_line, 80)
            ))
        })?;
    let mut head = Head {
        status,
        length: None,
        chunked: false,
        fields: Vec::new(),
    };
    for _ in 0..100 {
        let line = con.read_line()?;
        if line.is_empty() {
            return Ok(head);
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        head.fields.push((
            String::from_utf8_lossy(name.trim_ascii()).to_ascii_lowercase(),
            String::from_utf8_lossy(value).into_owned(),
        ));
        if name.trim_ascii().eq_ignore_ascii_case(b"content-length") {
            let n = content_length(value)?;
            if head.length.is_some_and(|m| m != n) {
                return Err(io::Error::other("two different Content-Lengths"));
            }
            head.length = Some(n);
        } else if name.trim_ascii().eq_ignore_ascii_case(b"transfer-encoding") {
            head.chunked = value.eq_ignore_ascii_case(b"chunked");
        }
    }
    Err(io::Error::other("more than 100 HTTP header lines"))
}

/// A JSON body (`null` when empty).
pub(crate) fn read_body(con: &mut impl Source, head: &Head) -> io::Result<Value> {
    let body = read_bytes(con, head)?;
    if body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&body).map_err(|e| io::Error::other(format!("bad JSON reply: {e}")))
}

/// A body's bytes, at most [`MAX_REPLY`].
pub(crate) fn read_bytes(con: &mut impl Source, head: &Head) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    if head.chunked {
        loop {
            let size = chunk_size(&con.read_line()?)?;
            let start = body.len();
            let end = start
                .checked_add(size)
                .filter(|&end| end <= MAX_REPLY)
                .ok_or_else(|| io::Error::other("a reply larger than a lock's"))?;
            if size == 0 {
                // The trailers (the gateway sends gRPC's on errors), up to the empty line: all
                // of them must go, or the next reply on this connection starts mid-way.
                let mut trailers = 0;
                while !con.read_line()?.is_empty() {
                    trailers += 1;
                    if trailers > 100 {
                        return Err(io::Error::other("more than 100 HTTP trailer lines"));
                    }
                }
                break;
            }
            body.resize(end, 0);
            con.fill(&mut body[start..end])?;
            if !con.read_line()?.is_empty() {
                return Err(io::Error::other("no CRLF after a chunk"));
            }
        }
    } else {
        let n = head
            .length
            .ok_or_else(|| io::Error::other("an HTTP reply without a length"))?;
        body.resize(n, 0);
        con.fill(&mut body)?;
    }
    Ok(body)
}

/// Moves whole chunks of a stream from `raw` to `data`; whether it moved any. `ended` is set
/// at the last chunk.
pub(crate) fn decode_chunks(
    raw: &mut Vec<u8>,
    data: &mut Vec<u8>,
    ended: &mut bool,
) -> io::Result<bool> {
    let mut moved = false;
    // After the last chunk come trailers, not chunks.
    while !*ended {
        let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") else {
            if raw.len() > 64 {
                return Err(io::Error::other("bad chunk header"));
            }
            return Ok(moved);
        };
        if eol > 64 {
            return Err(io::Error::other("bad chunk header"));
        }
        let size = chunk_size(&raw[..eol])?;
        if size == 0 {
            *ended = true;
            raw.clear();
            return Ok(moved);
        }
        // Bounded: eol <= 64, size <= MAX_REPLY.
        let (start, end) = (eol + 2, eol + 2 + size);
        if raw.len() < end + 2 {
            return Ok(moved);
        }
        if &raw[end..end + 2] != b"\r\n" {
            return Err(io::Error::other("no CRLF after a chunk"));
        }
        data.extend_from_slice(&raw[start..end]);
        raw.drain(..end + 2);
        moved = true;
    }
    Ok(moved)
}

/// A connection with a read buffer: a reply's head is read line by line, and reading a byte
/// at a time from the socket cost two system calls a byte (7 ms a run).
pub(crate) struct Conn {
    pub(crate) s: Stream,
    buf: Box<[u8]>,
    /// `buf[at..end]` is read from the socket and not yet taken.
    at: usize,
    end: usize,
}

impl Conn {
    pub(crate) fn new(s: Stream) -> Conn {
        Conn {
            s,
            buf: vec![0; 16 << 10].into_boxed_slice(),
            at: 0,
            end: 0,
        }
    }

    /// Bounds what follows (see [`Stream::bound`]).
    pub(crate) fn bound(&mut self, deadline: Instant) {
        self.s.bound(deadline, MAX_REPLY);
    }
}

impl Source for Conn {
    /// Reads from the socket when nothing is buffered. A forwarded signal ends the wait
    /// (`net::is_signalled`; nothing retries it).
    fn available(&mut self) -> io::Result<&[u8]> {
        if self.at == self.end {
            // Empty before the read: a read that fails (a deadline) must not bring back
            // bytes already taken.
            (self.at, self.end) = (0, 0);
            self.end = self.s.read(&mut self.buf)?;
        }
        Ok(&self.buf[self.at..self.end])
    }

    fn consume(&mut self, n: usize) {
        self.at += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// Bytes given at most `step` at a time, as a socket might.
    struct Pieces {
        data: Vec<u8>,
        at: usize,
        step: usize,
    }

    impl Source for Pieces {
        fn available(&mut self) -> io::Result<&[u8]> {
            let end = self.data.len().min(self.at + self.step);
            Ok(&self.data[self.at..end])
        }
        fn consume(&mut self, n: usize) {
            self.at += n;
        }
    }

    fn read(data: Vec<u8>, step: usize) -> io::Result<Value> {
        let mut p = Pieces { data, at: 0, step };
        let head = read_head(&mut p)?;
        read_body(&mut p, &head)
    }

    /// `body` in chunks of the sizes `cuts` gives, with extensions on some.
    fn chunked(body: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        let mut rest = body;
        let mut i = 0;
        while !rest.is_empty() {
            let n = cuts
                .get(i)
                .copied()
                .unwrap_or(usize::MAX)
                .clamp(1, rest.len());
            let ext = if i % 2 == 1 { ";name=\"v\"" } else { "" };
            out.extend_from_slice(format!("{n:X}{ext}\r\n").as_bytes());
            out.extend_from_slice(&rest[..n]);
            out.extend_from_slice(b"\r\n");
            rest = &rest[n..];
            i += 1;
        }
        out.extend_from_slice(b"0\r\nGrpc-Trailer: x\r\n\r\n");
        out
    }

    #[test]
    fn the_wrapping_chunk_size_is_an_error() {
        let reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\nfffffffffffffffe\r\nxx";
        assert!(read(reply.to_vec(), 7).is_err());
        assert!(chunk_size(b"fffffffffffffffff").is_err());
        assert!(chunk_size(b"+5").is_err());
        assert!(chunk_size(b"-5").is_err());
        assert!(chunk_size(b"").is_err());
        assert!(chunk_size(b"5;\x01").is_err());
        assert_eq!(chunk_size(b"1a ;x=y").unwrap(), 26);
        assert!(content_length(b"-1").is_err());
        assert!(content_length(b"+1").is_err());
        assert!(content_length(b"99999999999999999999999").is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn arbitrary_replies_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            step in 1usize..64,
        ) {
            let _ = read(bytes.clone(), step);
            let mut framed = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            framed.extend_from_slice(&bytes);
            let _ = read(framed, step);
            let mut raw = bytes;
            let (mut data, mut ended) = (Vec::new(), false);
            let _ = decode_chunks(&mut raw, &mut data, &mut ended);
        }

        #[test]
        fn chunk_sizes_parse_exactly(n in any::<u64>(), text in "\\PC{0,24}") {
            let got = chunk_size(format!("{n:x}").as_bytes());
            match usize::try_from(n) {
                Ok(n) if n <= MAX_REPLY => prop_assert_eq!(got.unwrap(), n),
                _ => prop_assert!(got.is_err()),
            }
            let _ = chunk_size(text.as_bytes());
        }

        #[test]
        fn chunked_bodies_round_trip(
            text in "\\PC{0,300}",
            cuts in proptest::collection::vec(1usize..40, 0..20),
            step in 1usize..64,
        ) {
            let value = json!({ "text": text });
            let body = value.to_string();
            let reply = chunked(body.as_bytes(), &cuts);
            prop_assert_eq!(read(reply.clone(), step).unwrap(), value.clone());
            // The same stream through the watch decoder, fed piece by piece.
            let (mut raw, mut data, mut ended) = (Vec::new(), Vec::new(), false);
            let start = reply.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            for piece in reply[start..].chunks(step) {
                raw.extend_from_slice(piece);
                decode_chunks(&mut raw, &mut data, &mut ended).unwrap();
            }
            prop_assert!(ended);
            prop_assert_eq!(data, body.as_bytes());
            // Cut short anywhere, it is an error, never another value.
            for cut in [1, reply.len() / 2, reply.len() - 3] {
                prop_assert!(read(reply[..cut].to_vec(), step).is_err());
            }
        }
    }
}
