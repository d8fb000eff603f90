//! A fake PostgreSQL server that speaks enough of the protocol to get dlock's first statements,
//! and then answers with what a real one never would: text that is not UTF-8, rows without
//! end, or nothing at all.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use crate::util::*;

#[derive(Clone, Copy)]
enum Reply {
    /// The lock try's row holds a cell that is not UTF-8.
    BadUtf8,
    /// Data rows of `n` bytes each, without end, to the first query.
    Endless(usize),
    /// The try says busy; the waiting statement gets no answer, ever.
    NeverGrant,
}

/// Starts the fake on a free loopback port; it serves until the test process ends.
fn start(reply: Reply) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for client in listener.incoming().flatten() {
            thread::spawn(move || {
                let _ = serve(client, reply);
            });
        }
    });
    port
}

fn message(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![kind];
    m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    m.extend_from_slice(body);
    m
}

/// A RowDescription of `n` text columns.
fn columns(n: u16) -> Vec<u8> {
    let mut b = n.to_be_bytes().to_vec();
    for i in 0..n {
        b.extend_from_slice(format!("c{i}\0").as_bytes());
        b.extend_from_slice(&0u32.to_be_bytes()); // table
        b.extend_from_slice(&0u16.to_be_bytes()); // column
        b.extend_from_slice(&25u32.to_be_bytes()); // text
        b.extend_from_slice(&(-1i16).to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes());
        b.extend_from_slice(&0u16.to_be_bytes()); // text format
    }
    message(b'T', &b)
}

fn row(cells: &[&[u8]]) -> Vec<u8> {
    let mut b = (cells.len() as u16).to_be_bytes().to_vec();
    for c in cells {
        b.extend_from_slice(&(c.len() as u32).to_be_bytes());
        b.extend_from_slice(c);
    }
    message(b'D', &b)
}

fn done(tag: &str) -> Vec<u8> {
    message(b'C', format!("{tag}\0").as_bytes())
}

fn ready() -> Vec<u8> {
    message(b'Z', b"I")
}

fn serve(mut c: TcpStream, reply: Reply) -> std::io::Result<()> {
    // SSLRequest or CancelRequest (8 bytes, then 8 more), then the startup message.
    let mut head = [0u8; 8];
    c.read_exact(&mut head)?;
    match u32::from_be_bytes(head[4..].try_into().unwrap()) {
        80877103 => {
            c.write_all(b"N")?;
            let mut len = [0u8; 4];
            c.read_exact(&mut len)?;
            let mut rest = vec![0u8; u32::from_be_bytes(len) as usize - 4];
            c.read_exact(&mut rest)?;
        }
        80877102 => return Ok(()), // a cancel request: taken, and ignored
        _ => {
            let mut rest =
                vec![0u8; u32::from_be_bytes(head[..4].try_into().unwrap()) as usize - 8];
            c.read_exact(&mut rest)?;
        }
    }
    let mut hello = message(b'R', &0u32.to_be_bytes());
    hello.extend(message(b'K', &[0, 0, 0, 1, 0, 0, 0, 2]));
    hello.extend(ready());
    c.write_all(&hello)?;
    loop {
        let mut h = [0u8; 5];
        c.read_exact(&mut h)?;
        let mut body = vec![0u8; u32::from_be_bytes(h[1..].try_into().unwrap()) as usize - 4];
        c.read_exact(&mut body)?;
        if h[0] != b'Q' {
            if h[0] == b'X' {
                return Ok(());
            }
            continue;
        }
        let sql = String::from_utf8_lossy(&body).to_string();
        let mut out = Vec::new();
        if sql.contains("idle_session_timeout") {
            out.extend(done("SET"));
            out.extend(columns(2));
            match reply {
                Reply::BadUtf8 => out.extend(row(&[b"f", b"t\xff\xfe"])),
                Reply::Endless(n) => {
                    c.write_all(&out)?;
                    let r = row(&[b"f", &vec![b'x'; n]]);
                    let mut many = Vec::new();
                    while many.len() < 1 << 16 {
                        many.extend_from_slice(&r);
                    }
                    loop {
                        c.write_all(&many)?;
                    }
                }
                // Not in recovery; the try says busy.
                Reply::NeverGrant => out.extend(row(&[b"f", b"f"])),
            }
            out.extend(done("SELECT 1"));
        } else if sql.contains("pg_advisory_lock(") {
            // The wait: no answer.
            continue;
        } else {
            out.extend(columns(1));
            out.extend(done("SELECT 0"));
        }
        out.extend(ready());
        c.write_all(&out)?;
    }
}

/// `dlock run` against the fake, under a 1 GiB address-space limit.
fn dlock_against(port: u16, extra: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", "ulimit -v 1048576 && exec \"$@\"", "sh"])
        .arg(env!("CARGO_BIN_EXE_dlock"))
        .args(["run", "--backend", "postgres"])
        .arg("--url")
        .arg(format!(
            "postgres://postgres@127.0.0.1:{port}/postgres?sslmode=disable"
        ))
        .args(["--key", &unique_key("fake")])
        .args(extra)
        .args(["--", "true"]);
    cmd
}

/// A cell that is not UTF-8 aborted dlock (exit 134) in the row conversion.
#[test]
fn postgres_cell_that_is_not_utf8_is_an_error() {
    let port = start(Reply::BadUtf8);
    let out = output(&mut dlock_against(port, &["-n"]));
    let line = one_error_line(&out);
    assert_ne!(out.status.code(), Some(134), "{}", describe(&out));
    assert_eq!(out.status.code(), Some(69), "{line}");
}

/// Rows without end (small ones, or of 4 MiB each) in reply to one statement grew dlock to
/// gigabytes; the reply is bounded, and a signal still ends dlock at once.
#[test]
fn postgres_endless_rows_are_refused() {
    for size in [8, (4 << 20) - 64] {
        let port = start(Reply::Endless(size));
        let began = Instant::now();
        let out = output(&mut dlock_against(port, &["-n"]));
        let line = one_error_line(&out);
        assert_eq!(out.status.code(), Some(69), "{size}: {line}");
        assert!(began.elapsed() < Duration::from_secs(5), "{size}: {line}");
        let port = start(Reply::Endless(size));
        let p = Proc::spawn(&mut dlock_against(port, &[]));
        thread::sleep(Duration::from_millis(300));
        let sent = Instant::now();
        p.signal(libc::SIGTERM);
        let (out, _) = p.wait(Duration::from_secs(10));
        let code = out.status.code();
        assert!(
            code == Some(143) || code == Some(69),
            "{size}: {}",
            describe(&out)
        );
        assert!(
            sent.elapsed() < Duration::from_millis(700),
            "{size}: took {:?}",
            sent.elapsed()
        );
    }
}

/// A server that never answers the waiting statement kept `dlock run -w 3s` waiting for ever:
/// the client ends the wait itself (a cancel request) and reports the lock busy.
#[test]
fn postgres_wait_is_bounded_by_the_client() {
    let port = start(Reply::NeverGrant);
    let p = Proc::spawn(&mut dlock_against(port, &["-w", "3s"]));
    let (out, took) = p.wait(Duration::from_secs(15));
    assert_eq!(
        out.status.code(),
        Some(75),
        "took {took:?}: {}",
        describe(&out)
    );
    assert!(took < Duration::from_secs(6), "took {took:?}");
    one_error_line(&out);
}
