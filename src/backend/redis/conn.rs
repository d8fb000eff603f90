//! dlock's own Redis connection: redis-rs builds the commands and parses the replies, but the
//! socket is ours, because redis-rs's synchronous connection cannot bound what a server does to
//! it. With its connection, a server that answered one byte a second kept `dlock run -n` waiting
//! forever (each byte restarted the read timeout), a signal stayed unanswered until the reply or
//! the timeout, and a reply announcing a 2 GB string grew dlock to 7.8 GB. Here every request
//! (sending the command and reading the whole reply) has one deadline, checked before every
//! read and write; a reply larger than [`MAX_REPLY`] ends the connection; and on the main thread
//! a forwarded signal ends the wait at once (see [`crate::signals::interrupts_network_waits`]).
//! Every failure is an I/O error to redis-rs, so the callers' error handling is unchanged.

use std::io::{self, Write};
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ConnectionInfo, ConnectionLike, RedisResult, Value};

use crate::backend::net::Stream;

/// The most a reply may hold. A lock reply is a few integers; the largest dlock reads is a
/// `status` of a semaphore with its holders' records (each capped when written, see
/// [`crate::report`]), well under this.
pub(crate) const MAX_REPLY: usize = 4 << 20;

/// One connection to one Redis server.
pub(crate) struct Connection {
    stream: Stream,
    parser: redis::Parser,
    /// How long one request may take.
    timeout: Duration,
    db: i64,
    /// False after any failure: a reply may be half read.
    open: bool,
}

impl Connection {
    /// Connects within `connect` (TCP, TLS and AUTH/SELECT together); each request then has
    /// `timeout`.
    pub(crate) fn open(
        info: &ConnectionInfo,
        connect: Duration,
        timeout: Duration,
    ) -> RedisResult<Connection> {
        let deadline = Instant::now() + connect;
        let stream = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                Stream::tcp(host, *port, false, deadline, MAX_REPLY)?
            }
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                ..
            } => {
                if *insecure {
                    return Err(io::Error::other(
                        "dlock does not skip certificate checks (#insecure); trust the server's CA with SSL_CERT_FILE",
                    )
                    .into());
                }
                Stream::tcp(host, *port, true, deadline, MAX_REPLY)?
            }
            ConnectionAddr::Unix(path) => Stream::unix(path, deadline, MAX_REPLY)?,
            _ => return Err(io::Error::other("unsupported Redis address").into()),
        };
        let settings = info.redis_settings();
        let mut con = Connection {
            stream,
            parser: redis::Parser::new(),
            timeout: connect,
            db: settings.db(),
            open: true,
        };
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password);
            con.request_until(&auth.get_packed_command(), deadline)?
                .extract_error()?;
        }
        if settings.db() != 0 {
            con.request_until(
                &redis::cmd("SELECT").arg(settings.db()).get_packed_command(),
                deadline,
            )?
            .extract_error()?;
        }
        con.timeout = timeout;
        Ok(con)
    }

    /// Sets how long each later request may take (send and whole reply).
    pub(crate) fn set_read_timeout(&mut self, timeout: Option<Duration>) -> RedisResult<()> {
        self.timeout = timeout.unwrap_or(Duration::from_secs(3600));
        Ok(())
    }

    /// Sends `cmd` and reads one reply, all before `deadline`.
    fn request_until(&mut self, cmd: &[u8], deadline: Instant) -> RedisResult<Value> {
        if !self.open {
            return Err(
                io::Error::new(io::ErrorKind::NotConnected, "the connection broke before").into(),
            );
        }
        self.stream.bound(deadline, MAX_REPLY);
        let result = send_and_read(&mut self.stream, &mut self.parser, cmd);
        if result.is_err() {
            self.open = false;
        }
        result
    }
}

fn send_and_read(s: &mut Stream, parser: &mut redis::Parser, cmd: &[u8]) -> RedisResult<Value> {
    s.write_all(cmd)?;
    s.flush()?;
    loop {
        match parser.parse_value(&mut *s)? {
            Value::Push { .. } => continue, // not a reply (RESP3 only)
            v => return Ok(v),
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.request_until(cmd, Instant::now() + self.timeout)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        // dlock sends no pipelines; kept correct anyway: one deadline for all the replies.
        let deadline = Instant::now() + self.timeout;
        let first = self.request_until(cmd, deadline)?;
        let mut replies = vec![first];
        for _ in 1..offset + count {
            self.stream.guard().budget = MAX_REPLY;
            replies.push(self.parser.parse_value(&mut self.stream)?);
        }
        Ok(replies.split_off(offset))
    }

    fn get_db(&self) -> i64 {
        self.db
    }

    fn check_connection(&mut self) -> bool {
        redis::cmd("PING").query::<String>(self).is_ok()
    }

    fn is_open(&self) -> bool {
        self.open
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("redis::Connection")
    }
}
